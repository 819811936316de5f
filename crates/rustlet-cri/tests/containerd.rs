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

/// The runtime's relist announces a pod whose container exited by itself (upstream's PLEG
/// event), once; its own actions and an unchanged relist announce nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_announces_an_exit_once_and_nothing_else() {
    use k8s_openapi::api::core::v1::{Container, Pod};
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let Some(containerd) = PrivateContainerd::start("a_relist_announces_an_exit_once").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let mut events = runtime
        .changes()
        .expect("the CRI runtime announces changes");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "once", "namespace": "default", "uid": "uid-once"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "c", "image": BUSYBOX_IMAGE,
            "command": ["/bin/sh", "-c", "read x < /dev/null; exit 4"]
        }]}
    }))
    .unwrap();
    let container: Container = pod.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    runtime
        .start_container(&pod, &container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::new("uid-once");
    // The process exits by itself; relists (real time, bounded) until one announces it.
    let mut announced = None;
    for _ in 0..500 {
        runtime.relist().await.unwrap();
        if let Ok(got) = events.try_recv() {
            announced = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(announced, Some(uid.clone()), "{}", containerd.log());
    let status = runtime.pod_status(&uid).await;
    assert!(
        matches!(
            status.containers[0].state,
            InstanceState::Exited { exit_code: 4, .. }
        ),
        "{status:?}"
    );
    // Nothing changed since: nothing announced.
    runtime.relist().await.unwrap();
    assert!(events.try_recv().is_err());
    // The runtime's own action (the kill) is in the cache already: a relist after it has
    // nothing to announce.
    runtime
        .kill_pod(&pod, Duration::from_secs(1))
        .await
        .unwrap();
    runtime.relist().await.unwrap();
    assert!(events.try_recv().is_err());
    runtime.remove_pod(&uid).await;
    assert!(
        runtime
            .client()
            .list_pod_sandboxes()
            .await
            .unwrap()
            .is_empty()
    );
}
