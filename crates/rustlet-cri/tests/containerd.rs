//! Real containers on a private containerd: the client's calls and the test helper's image.

use std::time::Duration;

use k8s_cri::v1 as cri;
use rustlet_cri::CriClient;
use rustlet_cri::testing::{BUSYBOX_IMAGE, PrivateContainerd, scratch};

fn host_network_sandbox(name: &str, uid: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_writes_through_a_bind_mounted_host_directory() {
    let Some(containerd) =
        PrivateContainerd::start("a_container_writes_through_a_bind_mounted_host_directory").await
    else {
        return;
    };
    let client = CriClient::connect(containerd.endpoint(), Duration::from_secs(30))
        .await
        .expect("version check");
    let version = client.version().await.unwrap();
    assert_eq!(version.name, "containerd");
    assert_eq!(version.api_version, "v1");

    let data = scratch(&containerd, "data");
    let sandbox_config = host_network_sandbox("writer", "uid-1");
    let sandbox = client
        .run_pod_sandbox(sandbox_config.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log()));
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "w".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: BUSYBOX_IMAGE.into(),
            ..Default::default()
        }),
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo hello > /data/out.txt".into(),
        ],
        mounts: vec![cri::Mount {
            container_path: "/data".into(),
            host_path: data.display().to_string(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let id = client
        .create_container(&sandbox, config, sandbox_config)
        .await
        .unwrap();
    client.start_container(&id).await.unwrap();
    // The process runs by itself: wait (real time, bounded) for it to exit.
    let mut status = client.container_status(&id).await.unwrap();
    for _ in 0..500 {
        if status.state == cri::ContainerState::ContainerExited as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = client.container_status(&id).await.unwrap();
    }
    assert_eq!(status.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 0);
    assert_eq!(
        std::fs::read_to_string(data.join("out.txt")).unwrap(),
        "hello\n"
    );
    client.remove_container(&id).await.unwrap();
    assert!(
        client
            .container_status(&id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    client.stop_pod_sandbox(&sandbox).await.unwrap();
    client.remove_pod_sandbox(&sandbox).await.unwrap();
    assert!(client.list_pod_sandboxes().await.unwrap().is_empty());
}
