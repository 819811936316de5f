//! rustlet-cri as a library: talk to a CRI runtime (containerd, CRI-O) with `CriClient`: list
//! its pod sandboxes, then run one container in a sandbox of its own and read its log.
//!
//! Run with `cargo run -p rustlet-cri --example run_container -- ENDPOINT [IMAGE]`, e.g.
//! `sudo target/debug/examples/run_container unix:///run/containerd/containerd.sock`.
//! The image (default `docker.io/library/busybox:latest`) must be pullable or present and
//! have `/bin/sh`. The sandbox uses the host's network (no CNI needed) and is removed after,
//! with its container. Without an endpoint it says how to run it and exits with success.

use std::time::Duration;

use k8s_cri::v1 as cri;
use rustlet_cri::{CriClient, CriError};

/// The default image.
const BUSYBOX: &str = "docker.io/library/busybox:latest";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(endpoint) = args.next() else {
        println!(
            "usage: run_container ENDPOINT [IMAGE], e.g. unix:///run/containerd/containerd.sock \
             (needs a CRI runtime and, for containerd's socket, root). Nothing was run."
        );
        return;
    };
    let image = args.next().unwrap_or_else(|| BUSYBOX.to_owned());
    match run(&endpoint, &image).await {
        Ok(exit_code) => println!("the container exited with {exit_code}"),
        Err(err) => {
            eprintln!("run_container: {err}");
            std::process::exit(1);
        }
    }
}

/// Lists the sandboxes at `endpoint`, runs `echo hello from CRI` in `image` and returns its
/// exit code once it has exited (everything it created is removed).
pub async fn run(endpoint: &str, image: &str) -> Result<i32, CriError> {
    let client = CriClient::connect(endpoint, Duration::from_secs(10)).await?;
    let version = client.version().await?;
    println!(
        "runtime: {} {} (CRI {})",
        version.name, version.version, version.api_version
    );
    for sandbox in client.list_pod_sandboxes().await? {
        let name = sandbox.metadata.map(|m| m.name).unwrap_or_default();
        println!("sandbox {} {name} state {}", sandbox.id, sandbox.state);
    }

    let logs = tempfile::tempdir().expect("a log directory");
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "rustlet-cri-example".to_owned(),
            uid: format!("rustlet-cri-example-{}", std::process::id()),
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        log_directory: logs.path().display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..cri::NamespaceOption::default()
                }),
                ..cri::LinuxSandboxSecurityContext::default()
            }),
            ..cri::LinuxPodSandboxConfig::default()
        }),
        ..cri::PodSandboxConfig::default()
    };

    if client.image_status(image).await?.is_none() {
        println!("pulling {image}");
        client
            .pull_image(image, sandbox_config.clone(), Duration::from_secs(300))
            .await?;
    }
    let sandbox = client.run_pod_sandbox(sandbox_config.clone()).await?;
    println!("ran sandbox {sandbox}");
    let result = run_in(&client, &sandbox, &sandbox_config, image, logs.path()).await;
    // Clean up whatever happened.
    client.stop_pod_sandbox(&sandbox).await?;
    client.remove_pod_sandbox(&sandbox).await?;
    println!("removed sandbox {sandbox}");
    result
}

async fn run_in(
    client: &CriClient,
    sandbox: &str,
    sandbox_config: &cri::PodSandboxConfig,
    image: &str,
    logs: &std::path::Path,
) -> Result<i32, CriError> {
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "hello".to_owned(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.to_owned(),
            ..cri::ImageSpec::default()
        }),
        command: vec!["/bin/sh".to_owned()],
        args: vec!["-c".to_owned(), "echo hello from CRI".to_owned()],
        log_path: "hello.log".to_owned(),
        ..cri::ContainerConfig::default()
    };
    let container = client
        .create_container(sandbox, config, sandbox_config.clone())
        .await?;
    client.start_container(&container).await?;
    println!("started container {container}");

    // Poll until it has exited (at most 30 s).
    let mut exit_code = None;
    for _ in 0..300 {
        let status = client.container_status(&container).await?;
        if status.state == cri::ContainerState::ContainerExited as i32 {
            exit_code = Some(status.exit_code);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(logs.join("hello.log")).unwrap_or_default();
    for line in log.lines() {
        println!("log: {line}");
    }
    client.remove_container(&container).await?;
    Ok(exit_code.unwrap_or(-1))
}
