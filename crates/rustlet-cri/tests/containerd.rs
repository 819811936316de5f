//! Real containers on a private containerd: the client's calls and the test helper's image.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;
use rustlet_cri::CriClient;
use rustlet_cri::testing::{
    BUSYBOX_IMAGE, NAMED_USER_IMAGE, NUMERIC_USER_IMAGE, PrivateContainerd, scratch,
};

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

/// Issue 24 item 8 on real containers: a container whose state containerd lost across a
/// restart (its CRI status checkpoint gone: `CONTAINER_UNKNOWN`) is an unknown instance, not
/// one that exited with code 0; its process runs on, and killing the pod stops it (the
/// process's TERM trap gives the exit code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_unknown_is_an_unknown_instance_not_an_exit() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let Some(mut containerd) =
        PrivateContainerd::start("container_unknown_is_an_unknown_instance_not_an_exit").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "lost", "namespace": "default", "uid": "uid-lost"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "c", "image": BUSYBOX_IMAGE,
            "command": ["/bin/sh", "-c", "trap 'exit 7' TERM; while true; do sleep 1 & wait $!; done"]
        }]}
    }))
    .unwrap();
    let container: Container = pod.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    runtime
        .start_container(&pod, &container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::new("uid-lost");
    runtime.relist().await.unwrap();
    let before = runtime.pod_status(&uid).await;
    assert!(
        matches!(before.containers[0].state, InstanceState::Running { .. }),
        "{before:?}"
    );

    containerd
        .lose_container_state(&before.containers[0].id)
        .await;
    let raw = runtime
        .client()
        .container_status(before.containers[0].id.trim_start_matches("containerd://"))
        .await
        .unwrap();
    assert_eq!(
        raw.state,
        cri::ContainerState::ContainerUnknown as i32,
        "{raw:?}\n{}",
        containerd.log()
    );
    runtime.relist().await.unwrap();
    let lost = runtime.pod_status(&uid).await;
    assert_eq!(lost.containers.len(), 1, "{lost:?}");
    assert_eq!(lost.containers[0].id, before.containers[0].id);
    assert_eq!(lost.containers[0].state, InstanceState::Unknown, "{lost:?}");

    // The process ran on: StopContainer's TERM reaches its trap.
    runtime
        .kill_pod(&pod, Duration::from_secs(10))
        .await
        .unwrap();
    runtime.relist().await.unwrap();
    let stopped = runtime.pod_status(&uid).await;
    assert!(
        matches!(
            stopped.containers[0].state,
            InstanceState::Exited { exit_code: 7, .. }
        ),
        "{stopped:?}"
    );
    runtime.remove_pod(&uid).await;
}

/// What a test container prints about itself: `id`, then its status lines.
const REPORT: &str =
    "id; grep -E '^(Uid|Gid|Groups|CapEff|NoNewPrivs|Seccomp):' /proc/self/status; ";

/// Prints how many read-only `/proc/sys` mounts the container has (1 with the default masks).
const PROC_SYS_READ_ONLY: &str = "grep -c ' /proc/sys ro,' /proc/self/mountinfo; ";

/// Starts each container of `pod` (its sandbox first), waits until all exited (real time,
/// bounded: real processes) and returns each one's stdout lines, by container name.
async fn run_to_exit(
    runtime: &rustlet_cri::CriRuntime,
    root: &std::path::Path,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> std::collections::HashMap<String, Vec<String>> {
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let uid = rustlet_core::PodUid::of(pod);
    runtime.run_pod_sandbox(pod).await.unwrap();
    let containers = &pod.spec.as_ref().unwrap().containers;
    for c in containers {
        runtime
            .start_container(pod, c, ContainerKind::Regular, &[])
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    }
    for _ in 0..1000 {
        runtime.relist().await.unwrap();
        let status = runtime.pod_status(&uid).await;
        let exited = status
            .containers
            .iter()
            .filter(|c| matches!(c.state, InstanceState::Exited { .. }))
            .count();
        if exited == containers.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    containers
        .iter()
        .map(|c| {
            let m = &pod.metadata;
            let log = root.join(format!(
                "pod-logs/{}_{}_{uid}/{}/0.log",
                m.namespace.as_deref().unwrap_or("default"),
                m.name.as_deref().unwrap_or_default(),
                c.name
            ));
            let lines = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                // `<time> stdout F <text>`: stdout only (stderr interleaves at random).
                .filter_map(|l| {
                    let mut fields = l.splitn(4, ' ');
                    let stream = fields.nth(1)?;
                    (stream == "stdout").then(|| fields.nth(1).map(str::to_owned))?
                })
                .collect();
            (c.name.clone(), lines)
        })
        .collect()
}

/// The value of a `/proc/self/status` field in what a container printed (`Uid:\t1000\t...`:
/// the words after the name).
fn status_field(lines: &[String], name: &str) -> Vec<String> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn own_status_field(name: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap()
        .trim()
        .to_owned()
}

/// Issue 24 item 2 (upstream `determineEffectiveSecurityContext`, `generatePodSandboxLinuxConfig`):
/// the pod's `securityContext` reaches a container that sets none (user, group, `fsGroup` and
/// `supplementalGroups` as groups, no capabilities for a non-root user, the sandbox's sysctl,
/// the default masked and read-only paths, none with `procMount: Unmasked`, a `Localhost`
/// seccomp profile from `<root>/seccomp`);
/// a container's own fields win (root with only the capabilities it adds, `no_new_privs`, the
/// runtime's seccomp filter, a read-only root filesystem); a privileged container gets every
/// capability (its sandbox is privileged too, or containerd refuses it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_and_the_containers_security_context_reach_the_process() {
    use rustlet_cri::testing::BUSYBOX_IMAGE as IMAGE;
    use rustlet_cri::{CriConfig, CriRuntime};

    let Some(containerd) =
        PrivateContainerd::start("the_pods_and_the_containers_security_context_reach").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "secure", "namespace": "default", "uid": "uid-secure"},
        "spec": {
            "securityContext": {
                "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                "supplementalGroups": [4000],
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}]
            },
            "containers": [
                {"name": "pod-level", "image": IMAGE, "command": ["/bin/sh", "-c",
                    format!("{REPORT} {PROC_SYS_READ_ONLY} cat /proc/sys/net/ipv4/ip_unprivileged_port_start")]},
                {"name": "unmasked", "image": IMAGE, "command": ["/bin/sh", "-c", PROC_SYS_READ_ONLY],
                 "securityContext": {"procMount": "Unmasked"}},
                {"name": "localhost", "image": IMAGE, "command": ["/bin/sh", "-c",
                    "grep Seccomp: /proc/self/status; mkdir /tmp/x 2>/dev/null && echo mkdir allowed || echo mkdir denied"],
                 "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "deny-mkdir.json"}}},
                {"name": "own", "image": IMAGE, "command": ["/bin/sh", "-c",
                    format!("{REPORT} touch /written 2>/dev/null && echo rootfs writable || echo rootfs read-only")],
                 "securityContext": {
                    "runAsUser": 0, "runAsGroup": 0,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "NET_BIND_SERVICE"]},
                    "allowPrivilegeEscalation": false,
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "readOnlyRootFilesystem": true
                 }},
                {"name": "privileged", "image": IMAGE, "command": ["/bin/sh", "-c", REPORT],
                 "securityContext": {"privileged": true, "runAsUser": 0}}
            ]
        }
    }))
    .unwrap();
    // A `Localhost` profile is a file beneath `<root>/seccomp`.
    std::fs::create_dir_all(root.join("seccomp")).unwrap();
    std::fs::write(
        root.join("seccomp/deny-mkdir.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let out = run_to_exit(&runtime, &root, &pod).await;
    let log = || containerd.log();

    let lines = &out["pod-level"];
    // As upstream's documentation shows it: containerd adds the primary group (`Merge`).
    assert_eq!(
        lines.first().map(String::as_str),
        Some("uid=1000 gid=3000 groups=2000,3000,4000"),
        "{lines:?}\n{}",
        log()
    );
    assert_eq!(status_field(lines, "Uid"), ["1000"; 4], "{lines:?}");
    assert_eq!(status_field(lines, "Gid"), ["3000"; 4], "{lines:?}");
    assert_eq!(status_field(lines, "Groups"), ["2000", "3000", "4000"]);
    assert_eq!(status_field(lines, "CapEff"), ["0000000000000000"]);
    assert_eq!(status_field(lines, "NoNewPrivs"), ["0"]);
    // No profile: Unconfined, as upstream without `seccompDefault`.
    assert_eq!(status_field(lines, "Seccomp"), ["0"]);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("80"),
        "the sandbox's sysctl"
    );
    // The default masks: `/proc/sys` is mounted read-only; `procMount: Unmasked` has none.
    assert_eq!(lines[lines.len() - 2], "1", "{lines:?}");
    assert_eq!(out["unmasked"], ["0"]);
    assert_eq!(out["localhost"], ["Seccomp:\t2", "mkdir denied"], "{out:?}");

    let lines = &out["own"];
    assert_eq!(status_field(lines, "Uid"), ["0"; 4], "{lines:?}");
    assert_eq!(status_field(lines, "Gid"), ["0"; 4], "{lines:?}");
    let groups = status_field(lines, "Groups");
    assert!(
        groups.contains(&"2000".to_owned()) && groups.contains(&"4000".to_owned()),
        "{lines:?}"
    );
    // CAP_CHOWN (0) and CAP_NET_BIND_SERVICE (10) only.
    assert_eq!(
        status_field(lines, "CapEff"),
        ["0000000000000401"],
        "{lines:?}"
    );
    assert_eq!(status_field(lines, "NoNewPrivs"), ["1"], "{lines:?}");
    assert_eq!(status_field(lines, "Seccomp"), ["2"], "{lines:?}");
    assert_eq!(
        lines.last().map(String::as_str),
        Some("rootfs read-only"),
        "{lines:?}"
    );

    let lines = &out["privileged"];
    assert_eq!(status_field(lines, "Uid"), ["0"; 4], "{lines:?}\n{}", log());
    assert_eq!(
        status_field(lines, "CapEff"),
        [own_status_field("CapEff")],
        "{lines:?}"
    );
}

/// Issue 24 item 2 (upstream `verifyRunAsNonRoot`): a pod that must not run as root, whose
/// image runs as root, is refused with `CreateContainerConfigError` and upstream's message; no
/// container is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_non_root_refuses_an_image_that_runs_as_root() {
    use rustlet_cri::testing::BUSYBOX_IMAGE as IMAGE;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, RuntimeError};

    let Some(containerd) =
        PrivateContainerd::start("run_as_non_root_refuses_an_image_that_runs_as_root").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nonroot", "namespace": "default", "uid": "uid-nonroot"},
        "spec": {
            "hostNetwork": true,
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sleep", "1"]}]
        }
    }))
    .unwrap();
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let err = runtime
        .start_container(&pod, &container, ContainerKind::Regular, &[])
        .await
        .unwrap_err();
    match err {
        RuntimeError::ContainerWaiting {
            reason, message, ..
        } => {
            assert_eq!(reason, "CreateContainerConfigError");
            assert_eq!(
                message,
                "container has runAsNonRoot and image will run as root (pod: \"nonroot_default(uid-nonroot)\", container: main)"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(runtime.client().list_containers().await.unwrap().is_empty());

    // An image whose user is a name cannot be checked: refused too. A numeric non-root one
    // passes.
    let named = Container {
        name: "named".into(),
        image: Some(NAMED_USER_IMAGE.into()),
        ..container.clone()
    };
    match runtime
        .start_container(&pod, &named, ContainerKind::Regular, &[])
        .await
        .unwrap_err()
    {
        RuntimeError::ContainerWaiting {
            reason, message, ..
        } => {
            assert_eq!(reason, "CreateContainerConfigError");
            assert_eq!(
                message,
                "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"nonroot_default(uid-nonroot)\", container: named)"
            );
        }
        other => panic!("{other:?}"),
    }
    let numeric = Container {
        name: "numeric".into(),
        image: Some(NUMERIC_USER_IMAGE.into()),
        ..container
    };
    runtime
        .start_container(&pod, &numeric, ContainerKind::Regular, &[])
        .await
        .unwrap();
    assert_eq!(runtime.client().list_containers().await.unwrap().len(), 1);
}

/// Issue 24 item 2 (upstream `getImageUser` and `determineEffectiveSecurityContext`): a
/// container without `runAsUser` runs as its image's user, from the runtime's image status:
/// by UID, or by name (resolved by the runtime in the image's `/etc/passwd`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_without_run_as_user_runs_as_its_images_user() {
    use rustlet_cri::{CriConfig, CriRuntime};

    let Some(containerd) =
        PrivateContainerd::start("a_container_without_run_as_user_runs_as_its_images_user").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "users", "namespace": "default", "uid": "uid-users"},
        "spec": {
            "hostNetwork": true,
            "containers": [
                {"name": "numeric", "image": NUMERIC_USER_IMAGE, "command": ["/bin/sh", "-c", "id"]},
                {"name": "named", "image": NAMED_USER_IMAGE, "command": ["/bin/sh", "-c", "id"]}
            ]
        }
    }))
    .unwrap();
    let out = run_to_exit(&runtime, &root, &pod).await;
    assert_eq!(
        out["numeric"],
        ["uid=1234 gid=0(root) groups=0(root)"],
        "{out:?}"
    );
    assert_eq!(
        out["named"],
        ["uid=65534(nobody) gid=65534(nogroup) groups=65534(nogroup)"],
        "{out:?}"
    );
}

/// Issue 24 item 2: a pod with `runAsGroup` and no `runAsUser` runs, its containers with the
/// image's user and the pod's group (containerd 1.6 refuses such a group on the sandbox, which
/// therefore gets none: a deviation written at `sandbox_linux_config`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_run_as_group_alone_runs_with_the_images_user() {
    use rustlet_cri::{CriConfig, CriRuntime};

    let Some(containerd) = PrivateContainerd::start("a_pod_with_run_as_group_alone_runs").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "group", "namespace": "default", "uid": "uid-group"},
        "spec": {
            "hostNetwork": true,
            "securityContext": {"runAsGroup": 3000},
            "containers": [
                {"name": "root", "image": BUSYBOX_IMAGE, "command": ["/bin/sh", "-c", "id"]},
                {"name": "numeric", "image": NUMERIC_USER_IMAGE, "command": ["/bin/sh", "-c", "id"]}
            ]
        }
    }))
    .unwrap();
    let out = run_to_exit(&runtime, &root, &pod).await;
    assert_eq!(out["root"], ["uid=0(root) gid=3000 groups=3000"], "{out:?}");
    assert_eq!(out["numeric"], ["uid=1234 gid=3000 groups=3000"], "{out:?}");
}

/// Issue 25 item 2: the node's `containerRuntimeVersion` and Ready come from CRI `Version` and
/// `Status` (upstream `VersionInfo`, `updateRuntimeUp`): containerd names itself and its
/// version, and says whether it and its network are ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_reports_its_type_version_and_conditions() {
    use rustlet_core::node_status::{NETWORK_READY, RUNTIME_READY};
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;

    let Some(containerd) =
        PrivateContainerd::start("the_runtime_reports_its_type_version_and_conditions").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    assert_eq!(runtime.type_name(), "containerd");
    let version = runtime.version().await.unwrap();
    let client = CriClient::connect(containerd.endpoint(), Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(version, client.version().await.unwrap().version);
    assert!(!version.is_empty());
    let conditions = runtime.status().await.unwrap();
    let runtime_ready = conditions
        .iter()
        .find(|c| c.type_ == RUNTIME_READY)
        .unwrap_or_else(|| panic!("{conditions:?}"));
    assert!(runtime_ready.status, "{conditions:?}");
    assert!(
        conditions.iter().any(|c| c.type_ == NETWORK_READY),
        "{conditions:?}"
    );
}

/// Issue 26 item 2: the node's server reaches a container through the runtime: CRI
/// `ContainerStatus`' `log_path` names the file containerd writes (`<root>/pod-logs/
/// <namespace>_<name>_<uid>/<container>/<attempt>.log`) and whether the instance runs; `Exec`, `Attach` and
/// `PortForward` answer with the URL of containerd's stream server; an unknown container is
/// `NotFound` (the server answers 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_names_a_containers_log_file_and_its_stream_urls() {
    use rustlet_cri::testing::BUSYBOX_IMAGE as IMAGE;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState, RuntimeError, Streams};

    let Some(containerd) =
        PrivateContainerd::start("the_runtime_names_a_containers_log_file_and_its").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "talk", "namespace": "default", "uid": "uid-talk"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": IMAGE,
                "command": ["/bin/sh", "-c", "echo hello; exec sleep 1000"]}]
        }
    }))
    .unwrap();
    let uid = rustlet_core::PodUid::of(&pod);
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    runtime
        .start_container(&pod, container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    runtime.relist().await.unwrap();
    let status = runtime.pod_status(&uid).await;
    let instance = status.containers.first().expect("the container");
    assert!(matches!(instance.state, InstanceState::Running { .. }));
    let id = instance.id.clone();

    let log = runtime.container_log(&id).await.unwrap();
    assert_eq!(
        log.path,
        root.join("pod-logs/default_talk_uid-talk/main/0.log")
    );
    assert!(log.running);

    let streams = Streams {
        stdout: true,
        stderr: true,
        ..Default::default()
    };
    for url in [
        runtime
            .exec_stream(&id, &["true".to_owned()], streams)
            .await
            .unwrap(),
        runtime.attach_stream(&id, streams).await.unwrap(),
        runtime.port_forward_stream(&uid, &[]).await.unwrap(),
    ] {
        let url: http::Uri = url.parse().unwrap();
        assert_eq!(url.scheme_str(), Some("http"), "{url}");
        assert!(url.port_u16().is_some(), "{url}");
    }
    let missing = runtime
        .exec_stream("containerd://nope", &["true".to_owned()], streams)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, RuntimeError::NotFound { .. }),
        "{missing}"
    );
    runtime
        .kill_pod(&pod, Duration::from_secs(0))
        .await
        .unwrap();
    runtime.remove_pod(&uid).await;
}

/// Waits (real time, bounded: a real containerd) until `done` holds, relisting in between.
async fn relist_until(runtime: &rustlet_cri::CriRuntime, what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        runtime.relist().await.unwrap();
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 10 s");
}

/// Issue 26 item 3: the kubelet's log layout (upstream: `BuildPodLogsDirectory`,
/// `BuildContainerLogsDirectory`, `legacyLogSymlink`): containerd writes
/// `<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restartCount>.log`; each started
/// container gets `<containerLogsDir>/<pod>_<namespace>_<container>-<id>.log` pointing at it;
/// the container GC removes a dead instance's log and symlink; the pod's removal removes its
/// log directory and its symlinks, but nothing beneath a mount point in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_log_layout_and_symlinks_come_and_go_with_the_containers() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let Some(containerd) =
        PrivateContainerd::start("the_kubelets_log_layout_and_symlinks_come_and_go").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let pod_logs = scratch(&containerd, "var-log-pods");
    let links = containerd.dir().join("var-log-containers");
    let runtime = CriRuntime::connect(
        CriConfig {
            pod_logs_dir: pod_logs.clone(),
            container_logs_dir: links.clone(),
            ..CriConfig::new(containerd.endpoint(), &root)
        },
        None,
    )
    .await
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "team-a", "uid": "uid-layout"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", "echo run"]}]
        }
    }))
    .unwrap();
    let uid = rustlet_core::PodUid::of(&pod);
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let pod_dir = pod_logs.join("team-a_web-1_uid-layout");
    runtime.run_pod_sandbox(&pod).await.unwrap();
    // Three instances one after the other: the third makes the first garbage (the newest two
    // of a name are kept, the second is `lastState`).
    let mut ids = Vec::new();
    for attempt in 0..3 {
        runtime
            .start_container(&pod, container, ContainerKind::Regular, &[])
            .await
            .unwrap();
        let status = runtime.pod_status(&uid).await;
        let id = status.containers[0].id.clone();
        let raw = id.split_once("://").unwrap().1.to_owned();
        let log = pod_dir.join(format!("main/{attempt}.log"));
        assert_eq!(runtime.container_log(&id).await.unwrap().path, log);
        let link = links.join(format!("web-1_team-a_main-{raw}.log"));
        assert_eq!(std::fs::read_link(&link).unwrap(), log, "the symlink");
        if attempt < 2 {
            relist_until(&runtime, "the instance exits", || {
                futures::executor::block_on(runtime.pod_status(&uid))
                    .containers
                    .iter()
                    .all(|c| matches!(c.state, InstanceState::Exited { .. }))
            })
            .await;
        }
        ids.push((raw, log, link));
    }
    let (first_log, first_link) = (ids[0].1.clone(), ids[0].2.clone());
    relist_until(&runtime, "the first instance's log and symlink go", || {
        !first_log.exists() && std::fs::symlink_metadata(&first_link).is_err()
    })
    .await;
    for (_, log, link) in &ids[1..] {
        assert!(log.exists(), "{}", log.display());
        assert!(
            std::fs::symlink_metadata(link).is_ok(),
            "{}",
            link.display()
        );
    }

    // A mount point inside the pod's log directory: the removal stops there.
    let mount = pod_dir.join("main/mnt");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&mount)
        .status()
        .unwrap();
    assert!(mounted.success());
    std::fs::write(mount.join("keep"), "x").unwrap();
    runtime
        .kill_pod(&pod, Duration::from_secs(0))
        .await
        .unwrap();
    runtime.remove_pod(&uid).await;
    assert!(mount.join("keep").exists(), "nothing beneath a mount point");
    for (_, _, link) in &ids {
        assert!(
            std::fs::symlink_metadata(link).is_err(),
            "{}",
            link.display()
        );
    }
    let unmounted = std::process::Command::new("umount")
        .arg(&mount)
        .status()
        .unwrap();
    assert!(unmounted.success());
    // Without the mount, the next removal takes the whole directory.
    runtime.remove_pod(&uid).await;
    assert!(!pod_dir.exists());
}

/// upstream `calcRestartCountByLogDir`: a container the runtime knows no instance of (its
/// state cleared by a reboot, or every instance removed) takes its restart count from the log
/// directory its earlier instances left, so it neither appends to an old log nor has its log
/// removed with an old instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_unknown_to_the_runtime_continues_the_log_directorys_restart_count() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::ContainerKind;

    let Some(containerd) =
        PrivateContainerd::start("a_container_unknown_continues_the_restart_count").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let pod_logs = scratch(&containerd, "var-log-pods");
    let runtime = CriRuntime::connect(
        CriConfig {
            pod_logs_dir: pod_logs.clone(),
            ..CriConfig::new(containerd.endpoint(), &root)
        },
        None,
    )
    .await
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "team-a", "uid": "uid-count"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", "echo new; sleep 1000"]}]
        }
    }))
    .unwrap();
    // What two earlier instances left (the second's log rotated once).
    let dir = pod_logs.join("team-a_web-1_uid-count/main");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("0.log"), "old 0\n").unwrap();
    std::fs::write(dir.join("1.log.20261204-000000"), "old 1\n").unwrap();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    runtime
        .start_container(&pod, container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::of(&pod);
    let id = runtime.pod_status(&uid).await.containers[0].id.clone();
    assert_eq!(
        runtime.container_log(&id).await.unwrap().path,
        dir.join("2.log")
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("0.log")).unwrap(),
        "old 0\n"
    );
    runtime
        .kill_pod(&pod, Duration::from_secs(0))
        .await
        .unwrap();
    runtime.remove_pod(&uid).await;
}

/// Issue 26 item 5: `/stats/summary`'s pods come from CRI: the running pod with its sandbox's
/// time, its running container with CPU time and a working set from `ListContainerStats`, the
/// pod's figures from `ListPodSandboxStats` (or its containers'), and the image filesystem
/// from `ImageFsInfo`; a removed pod has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_reports_a_running_pods_cpu_and_memory() {
    use rustlet_cri::testing::BUSYBOX_IMAGE as IMAGE;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::ContainerKind;

    let Some(containerd) =
        PrivateContainerd::start("the_runtime_reports_a_running_pods_cpu_and_memory").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "busy", "namespace": "default", "uid": "uid-busy"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": IMAGE,
                "command": ["/bin/sh", "-c",
                    "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 1000"]}]
        }
    }))
    .unwrap();
    let uid = rustlet_core::PodUid::of(&pod);
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    runtime
        .start_container(&pod, container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let pods = runtime.pod_usage().await.unwrap();
    assert_eq!(pods.len(), 1, "{pods:?}");
    let usage = &pods[0];
    assert_eq!(
        (
            usage.uid.as_str(),
            usage.name.as_str(),
            usage.namespace.as_str()
        ),
        ("uid-busy", "busy", "default")
    );
    assert_eq!(usage.containers.len(), 1, "{usage:?}");
    let main = &usage.containers[0];
    assert_eq!(main.name, "main");
    assert!(main.id.starts_with("containerd://"), "{}", main.id);
    assert!(main.created_at >= usage.created_at, "{usage:?}");
    let cpu = main.cpu.expect("the container's CPU");
    assert!(cpu.usage_core_nanos.unwrap_or(0) > 0, "{cpu:?}");
    let memory = main.memory.expect("the container's memory");
    assert!(memory.working_set.unwrap_or(0) > 0, "{memory:?}");
    assert!(usage.cpu.and_then(|c| c.usage_core_nanos).unwrap_or(0) > 0);
    assert!(usage.memory.and_then(|m| m.working_set).unwrap_or(0) > 0);
    let images = runtime.image_fs_usage().await.unwrap();
    // containerd sums the snapshots' use in the background: the mount point is there at once.
    assert!(
        images
            .iter()
            .any(|fs| fs.mountpoint.contains("snapshotter") && fs.used_bytes.is_some()),
        "{images:?}"
    );
    runtime
        .kill_pod(&pod, Duration::from_secs(0))
        .await
        .unwrap();
    runtime.remove_pod(&uid).await;
    assert!(runtime.pod_usage().await.unwrap().is_empty());
}

/// The runtime's pod with one container whose `lifecycle` is `lifecycle` (host network,
/// `/hooks` bound from `hooks`), its sandbox started.
async fn hooked_pod(
    runtime: &rustlet_cri::CriRuntime,
    name: &str,
    lifecycle: serde_json::Value,
) -> k8s_openapi::api::core::v1::Pod {
    use rustlet_pods::Runtime;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "c",
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "lifecycle": lifecycle
            }]
        }
    }))
    .unwrap();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    pod
}

fn hooks_mount(hooks: &std::path::Path) -> Vec<rustlet_volume::subpath::ContainerMount> {
    vec![rustlet_volume::subpath::ContainerMount {
        name: "hooks".into(),
        container_path: "/hooks".into(),
        host_path: hooks.to_owned(),
        read_only: false,
        recursive_read_only: false,
        propagation: Default::default(),
    }]
}

/// Issue 27 (node features), upstream "[sig-node] Container Lifecycle Hook should execute
/// poststart exec hook properly" and "... prestop exec hook properly" (upstream:
/// `startContainer`, `killContainer`, `executePreStopHook`): the `postStart` hook has run in
/// the container when `start_container` returns, the `preStop` hook runs in it before it is
/// stopped, and then it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poststart_and_prestop_exec_hooks_run_in_the_container() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let Some(containerd) = PrivateContainerd::start("poststart_and_prestop_exec_hooks").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let hooks = scratch(&containerd, "hooks");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod = hooked_pod(
        &runtime,
        "hooked",
        serde_json::json!({
            "postStart": {"exec": {"command": ["/bin/sh", "-c", "echo poststart > /hooks/poststart"]}},
            "preStop": {"exec": {"command": ["/bin/sh", "-c", "echo prestop > /hooks/prestop"]}}
        }),
    )
    .await;
    let container = &pod.spec.as_ref().unwrap().containers[0];
    runtime
        .start_container(
            &pod,
            container,
            ContainerKind::Regular,
            &hooks_mount(&hooks),
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(hooks.join("poststart")).unwrap(),
        "poststart\n"
    );
    assert!(!hooks.join("prestop").exists());
    runtime
        .kill_pod(&pod, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(hooks.join("prestop")).unwrap(),
        "prestop\n"
    );
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&pod)).await;
    assert!(
        matches!(status.containers[0].state, InstanceState::Exited { .. }),
        "{status:?}"
    );
}

/// The events a runtime recorded: `(kind, reason, message)`.
#[derive(Default)]
struct Recorded(std::sync::Mutex<Vec<(rustlet_volume::events::EventKind, String, String)>>);

impl Recorded {
    fn events(&self) -> Vec<(rustlet_volume::events::EventKind, String, String)> {
        self.0.lock().unwrap().clone()
    }
}

impl rustlet_volume::events::EventRecorder for Recorded {
    fn event(
        &self,
        _pod: &k8s_openapi::api::core::v1::Pod,
        kind: rustlet_volume::events::EventKind,
        reason: &str,
        message: &str,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((kind, reason.to_owned(), message.to_owned()));
    }
}

/// Issue 27 (node features), upstream `startContainer` (`FailedPostStartHook`): a failed
/// `postStart` hook is a `FailedPostStartHook` Warning event (`PostStartHook failed`, not the
/// hook's output) and a `Killing` event, kills the container and is its `PostStartHookError`
/// with the hook's output; upstream "Lifecycle Sleep Hook" (`executePreStopHook`): a `preStop`
/// hook that outlives the grace period does not hold the container's stop (the sleep here is
/// 1000 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_poststart_hook_kills_the_container_and_prestop_ends_with_the_grace_period() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::runtime::{ContainerKind, InstanceState};
    use rustlet_pods::{Runtime, RuntimeError};

    let Some(containerd) = PrivateContainerd::start("a_failed_poststart_hook_kills").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let hooks = scratch(&containerd, "hooks");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let recorded = std::sync::Arc::new(Recorded::default());
    runtime.set_event_recorder(recorded.clone());
    let pod = hooked_pod(
        &runtime,
        "failing",
        serde_json::json!({
            "postStart": {"exec": {"command": ["/bin/sh", "-c", "echo failing; echo broken >&2; exit 3"]}},
            "preStop": {"sleep": {"seconds": 1000}}
        }),
    )
    .await;
    let mut pod = pod;
    // The kill after the failed hook gets this grace period: the sleep is cut after it.
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    let error = runtime
        .start_container(
            &pod,
            &container,
            ContainerKind::Regular,
            &hooks_mount(&hooks),
        )
        .await
        .unwrap_err();
    match &error {
        RuntimeError::ContainerWaiting {
            reason, message, ..
        } => {
            assert_eq!(reason, "PostStartHookError");
            // upstream's `handlerRunner.Run` message, word for word: the CRI client's exit
            // error names the stderr, the message is stdout then stderr.
            assert_eq!(
                message,
                "Exec lifecycle hook ([/bin/sh -c echo failing; echo broken >&2; exit 3]) for \
                 Container \"c\" in Pod \"failing_default(uid-failing)\" failed - error: command \
                 '/bin/sh -c echo failing; echo broken >&2; exit 3' exited with 3: broken\n, \
                 message: \"failing\\nbroken\\n\""
            );
        }
        other => panic!("{other:?}"),
    }
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&pod)).await;
    assert!(
        matches!(status.containers[0].state, InstanceState::Exited { .. }),
        "{status:?}"
    );
    use rustlet_volume::events::EventKind;
    assert_eq!(
        recorded.events(),
        vec![
            (
                EventKind::Warning,
                "FailedPostStartHook".to_owned(),
                "PostStartHook failed".to_owned()
            ),
            (
                EventKind::Normal,
                "Killing".to_owned(),
                "FailedPostStartHook".to_owned()
            ),
        ]
    );
}

/// Issue 27 (node features), upstream `executePreStopHook` (`FailedPreStopHook`): a `preStop`
/// hook that fails is a `FailedPreStopHook` Warning event (`PreStopHook failed`, not the
/// hook's output), and the container is stopped all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prestop_hook_is_a_failed_prestop_hook_event_and_the_container_stops() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};
    use rustlet_volume::events::EventKind;

    let Some(containerd) = PrivateContainerd::start("a_failed_prestop_hook").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let hooks = scratch(&containerd, "hooks");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let recorded = std::sync::Arc::new(Recorded::default());
    runtime.set_event_recorder(recorded.clone());
    let pod = hooked_pod(
        &runtime,
        "prestop-fails",
        serde_json::json!({
            "preStop": {"exec": {"command": ["/bin/sh", "-c", "echo secret-output; exit 7"]}}
        }),
    )
    .await;
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    runtime
        .start_container(
            &pod,
            &container,
            ContainerKind::Regular,
            &hooks_mount(&hooks),
        )
        .await
        .unwrap();
    assert_eq!(recorded.events(), vec![]);
    runtime
        .kill_pod(&pod, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        recorded.events(),
        vec![(
            EventKind::Warning,
            "FailedPreStopHook".to_owned(),
            "PreStopHook failed".to_owned()
        )]
    );
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&pod)).await;
    assert!(
        matches!(status.containers[0].state, InstanceState::Exited { .. }),
        "{status:?}"
    );
}

/// Issue 27, upstream "[sig-node] Containers Lifecycle when A pod with restartable init
/// containers is terminating when The PreStop hooks don't exit should terminate sidecars
/// simultaneously if prestop doesn't exit" (upstream `executePreStopHook`: a hook that outlives
/// the grace period goes on in its goroutine): an exec `preStop` hook that never ends runs on
/// past the grace period until the container, which ignores SIGTERM, is killed
/// `minimumGracePeriodInSeconds` (2 s) later; the stop does not wait for the hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prestop_exec_hook_outliving_the_grace_period_runs_until_the_container_is_killed() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};

    let Some(containerd) = PrivateContainerd::start("a_prestop_exec_hook_outliving").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let hooks = scratch(&containerd, "hooks");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "looping", "namespace": "default", "uid": "uid-looping"},
        "spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "c",
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", "trap '' TERM; while true; do sleep 1; done"],
                "lifecycle": {"preStop": {"exec": {"command": [
                    "/bin/sh", "-c", "while true; do echo beat >> /hooks/beats; sleep 0.1; done"
                ]}}}
            }]
        }
    }))
    .unwrap();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    runtime
        .start_container(
            &pod,
            container,
            ContainerKind::Regular,
            &hooks_mount(&hooks),
        )
        .await
        .unwrap();
    let grace = Duration::from_secs(2);
    let start = std::time::SystemTime::now();
    let begun = std::time::Instant::now();
    runtime.kill_pod(&pod, grace).await.unwrap();
    let took = begun.elapsed();
    // The grace period for the hook, then at least 2 s for the stop, ended by SIGKILL.
    assert!(took >= Duration::from_secs(4), "stopped after {took:?}");
    assert!(took < Duration::from_secs(20), "stopped after {took:?}");
    let last_beat = std::fs::metadata(hooks.join("beats"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(start)
        .unwrap();
    // Killed with the container (about 4 s), not at the end of the grace period (2 s).
    assert!(
        last_beat > grace + Duration::from_millis(1500),
        "the hook's last beat {last_beat:?} after the stop began (grace period {grace:?})"
    );
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&pod)).await;
    assert!(
        matches!(
            status.containers[0].state,
            InstanceState::Exited { exit_code: 137, .. }
        ),
        "{status:?}"
    );
}

/// Issue 27, the same spec (upstream `killContainer`: the turn in the termination ordering is
/// waited for only `if gracePeriod > 0` after the `preStop` hook, the 2 s minimum given after):
/// a sidecar whose never-ending `preStop` hook used up the grace period does not wait for the
/// regular container (whose hook never ends either) to stop: both are killed together, the
/// minimum after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_whose_prestop_hook_used_up_the_grace_period_stops_without_waiting_its_turn() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::ContainerKind;

    let Some(containerd) = PrivateContainerd::start("a_sidecar_whose_prestop_hook").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let hooks = scratch(&containerd, "hooks");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let container = |name: &str| {
        serde_json::json!({
            "name": name,
            "image": BUSYBOX_IMAGE,
            "command": ["/bin/sh", "-c", "trap '' TERM; while true; do sleep 1; done"],
            "lifecycle": {"preStop": {"exec": {"command": [
                "/bin/sh", "-c",
                format!("while true; do echo beat >> /hooks/{name}; sleep 0.1; done")
            ]}}}
        })
    };
    let mut sidecar = container("sidecar");
    sidecar["restartPolicy"] = "Always".into();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sidecar-hooks", "namespace": "default", "uid": "uid-sidecar-hooks"},
        "spec": {
            "hostNetwork": true,
            "initContainers": [sidecar],
            "containers": [container("main")]
        }
    }))
    .unwrap();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let init = spec.init_containers.as_ref().unwrap();
    runtime
        .start_container(&pod, &init[0], ContainerKind::Init, &hooks_mount(&hooks))
        .await
        .unwrap();
    runtime
        .start_container(
            &pod,
            &spec.containers[0],
            ContainerKind::Regular,
            &hooks_mount(&hooks),
        )
        .await
        .unwrap();
    let start = std::time::SystemTime::now();
    let begun = std::time::Instant::now();
    runtime
        .kill_pod(&pod, Duration::from_secs(2))
        .await
        .unwrap();
    let took = begun.elapsed();
    let last_beat = |name: &str| {
        std::fs::metadata(hooks.join(name))
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(start)
            .unwrap()
    };
    let (main, sidecar) = (last_beat("main"), last_beat("sidecar"));
    // Both hooks run 2 s, both containers get the 2 s minimum: killed at about 4 s together
    // (the sidecar waiting for the main container's stop would be killed 2 s later).
    assert!(
        main.abs_diff(sidecar) < Duration::from_secs(1),
        "the main container's hook ended at {main:?}, the sidecar's at {sidecar:?}"
    );
    assert!(took < Duration::from_millis(5500), "stopped after {took:?}");
}

/// Issue 27 (node features), upstream "[sig-node] Container Runtime blackbox test on terminated
/// container should report termination message if TerminationMessagePath is set as non-root
/// user and at a non-default path", "... from log output if TerminationMessagePolicy
/// FallbackToLogsOnError is set" and "... as empty when pod succeeds and
/// TerminationMessagePolicy FallbackToLogsOnError is set" (upstream `makeMounts`,
/// `convertToKubeContainerStatus`): what an exited container wrote to its
/// `terminationMessagePath`, or with `FallbackToLogsOnError` printed before it failed, is its
/// termination message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_containers_termination_message_is_its_file_or_its_logs_tail() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::InstanceState;

    let Some(containerd) = PrivateContainerd::start("termination_message").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "terminated", "namespace": "default", "uid": "uid-terminated"},
        "spec": {
            "hostNetwork": true,
            "containers": [
                {"name": "file", "image": BUSYBOX_IMAGE,
                 "command": ["/bin/sh", "-c", "echo -n DONE > /dev/termination-custom-log"],
                 "securityContext": {"runAsUser": 1000},
                 "terminationMessagePath": "/dev/termination-custom-log",
                 "terminationMessagePolicy": "File"},
                {"name": "logs", "image": BUSYBOX_IMAGE,
                 "command": ["/bin/sh", "-c", "echo -n DONE; exit 1"],
                 "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "FallbackToLogsOnError"},
                {"name": "success", "image": BUSYBOX_IMAGE,
                 "command": ["/bin/sh", "-c", "echo -n DONE"],
                 "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
            ]
        }
    }))
    .unwrap();
    run_to_exit(&runtime, &root, &pod).await;
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&pod)).await;
    let message = |name: &str| {
        let instance = status
            .containers
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name}: {status:?}"));
        match &instance.state {
            InstanceState::Exited { message, .. } => message.clone(),
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(message("file"), "DONE");
    assert_eq!(message("logs"), "DONE");
    assert_eq!(message("success"), "");
}

/// Issue 27 (node features), upstream "[sig-node] Kubelet when scheduling an agnhost Pod with
/// hostAliases should write entries to /etc/hosts", "... when hostNetwork is enabled" and
/// "KubeletManagedEtcHosts should test kubelet managed /etc/hosts file" (upstream `makeMounts`,
/// `ensureHostsFile`): a pod-network container's `/etc/hosts` is the kubelet-managed file with
/// its IP, host name and `hostAliases`; a host-network one's is the node's file under its own
/// header, with the `hostAliases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_etc_hosts_is_the_kubelet_managed_file_with_host_aliases() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;

    let Some(containerd) = PrivateContainerd::start("etc_hosts").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let node_hosts = containerd.dir().join("node-hosts");
    std::fs::write(&node_hosts, "127.0.0.1\tlocalhost\n10.9.8.7\tthe-node\n").unwrap();
    let runtime = CriRuntime::connect(
        CriConfig {
            node_hosts_file: node_hosts,
            ..CriConfig::new(containerd.endpoint(), &root)
        },
        None,
    )
    .await
    .unwrap();
    let pod = |name: &str, host_network: bool| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {
                "hostNetwork": host_network,
                "hostAliases": [{"ip": "123.45.67.89", "hostnames": ["foo", "bar"]}],
                "containers": [{"name": "c", "image": BUSYBOX_IMAGE,
                                "command": ["/bin/cat", "/etc/hosts"]}]
            }
        }))
        .unwrap()
    };
    let on_pod_network = pod("managed", false);
    let lines = run_to_exit(&runtime, &root, &on_pod_network)
        .await
        .remove("c");
    let lines = lines.unwrap();
    assert_eq!(lines[0], "# Kubernetes-managed hosts file.", "{lines:?}");
    assert!(
        lines.contains(&"123.45.67.89\tfoo\tbar".to_owned()),
        "{lines:?}"
    );
    let ip = runtime
        .pod_status(&rustlet_core::PodUid::of(&on_pod_network))
        .await
        .sandbox
        .and_then(|s| s.ip)
        .expect("a pod IP");
    assert!(lines.contains(&format!("{ip}\tmanaged")), "{lines:?}");

    let on_host_network = pod("host", true);
    let lines = run_to_exit(&runtime, &root, &on_host_network)
        .await
        .remove("c")
        .unwrap();
    assert_eq!(
        lines,
        [
            "# Kubernetes-managed hosts file (host network).",
            "127.0.0.1\tlocalhost",
            "10.9.8.7\tthe-node",
            "",
            "# Entries added by HostAliases.",
            "123.45.67.89\tfoo\tbar",
        ]
    );
}

/// Issue 27 (node features), upstream "[sig-node] Override hostname of Pod a pod with
/// hostname and hostnameOverride fields will have hostnameOverride as hostname" (and the
/// subdomain case; `GeneratePodHostNameAndDomain`, `GetNodenameForKernel`,
/// `ensureHostsFile`): the container's host name (and `hostname -f`, through `/etc/hosts`, as
/// the spec reads them) is `hostnameOverride` whatever `hostname` and `subdomain` say, and its
/// `/etc/hosts` names the pod IP with it alone; without the override,
/// `setHostnameAsFQDN` makes the host name the FQDN under the cluster domain, which the hosts
/// file names first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_override_is_the_containers_host_name_and_its_etc_hosts_entry() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;

    let Some(containerd) = PrivateContainerd::start("hostname_override").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(
        CriConfig {
            cluster_domain: "cluster.local".into(),
            ..CriConfig::new(containerd.endpoint(), &root)
        },
        None,
    )
    .await
    .unwrap();
    let pod = |name: &str, spec: serde_json::Value| -> k8s_openapi::api::core::v1::Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c", "image": BUSYBOX_IMAGE,
            "command": ["/bin/sh", "-c", "echo $(hostname)';'$(hostname -f)';'; cat /etc/hosts"]}]);
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": spec
        }))
        .unwrap()
    };
    let pod_ip = async |p: &k8s_openapi::api::core::v1::Pod| {
        runtime
            .pod_status(&rustlet_core::PodUid::of(p))
            .await
            .sandbox
            .and_then(|s| s.ip)
            .expect("a pod IP")
    };

    let overridden = pod(
        "overridden",
        serde_json::json!({"hostname": "custom-host", "subdomain": "t",
                           "hostnameOverride": "override.example.host"}),
    );
    let lines = run_to_exit(&runtime, &root, &overridden)
        .await
        .remove("c")
        .unwrap();
    // The spec's own check: `echo $(hostname)';'$(hostname -f)';'`.
    assert_eq!(
        lines[0], "override.example.host;override.example.host;",
        "{lines:?}"
    );
    assert_eq!(lines[1], "# Kubernetes-managed hosts file.", "{lines:?}");
    let ip = pod_ip(&overridden).await;
    assert_eq!(
        lines.last().unwrap(),
        &format!("{ip}\toverride.example.host"),
        "{lines:?}"
    );

    let fqdn = pod(
        "fqdn",
        serde_json::json!({"hostname": "custom-host", "subdomain": "t",
                           "setHostnameAsFQDN": true}),
    );
    let lines = run_to_exit(&runtime, &root, &fqdn)
        .await
        .remove("c")
        .unwrap();
    assert_eq!(
        lines[0], "custom-host.t.ns.svc.cluster.local;custom-host.t.ns.svc.cluster.local;",
        "{lines:?}"
    );
    let ip = pod_ip(&fqdn).await;
    assert_eq!(
        lines.last().unwrap(),
        &format!("{ip}\tcustom-host.t.ns.svc.cluster.local\tcustom-host"),
        "{lines:?}"
    );
}

/// The Services of [`a_containers_environment_has_the_services_variables`].
struct FixedServices(Option<Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>>);

impl rustlet_cri::ServiceSource for FixedServices {
    fn services(&self) -> Option<Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>> {
        self.0.clone()
    }
}

/// Issue 27 (node features), upstream "[sig-node] Pods should contain environment variables
/// for services" (`makeEnvironmentVariables`, `getServiceEnvVarMap`): a container's
/// environment has the variables of the `kubernetes` Service of `default` and of the Services
/// of its namespace; before the Services were listed once, a pod from the API does not start
/// (`CreateContainerConfigError`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_environment_has_the_services_variables() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::runtime::ContainerKind;
    use rustlet_pods::{Runtime, RuntimeError};

    let Some(containerd) = PrivateContainerd::start("service_env").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let service = |namespace: &str, name: &str, ip: &str, port: i32| {
        std::sync::Arc::new(
            serde_json::from_value::<k8s_openapi::api::core::v1::Service>(serde_json::json!({
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterIP": ip, "ports": [{"port": port, "protocol": "TCP"}]}
            }))
            .unwrap(),
        )
    };
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "client", "namespace": "ns1", "uid": "uid-client"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "env", "image": BUSYBOX_IMAGE,
                            "command": ["/bin/sh", "-c", "env | sort"]}]
        }
    }))
    .unwrap();
    runtime.set_services(std::sync::Arc::new(FixedServices(None)));
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let container = &pod.spec.as_ref().unwrap().containers[0];
    match runtime
        .start_container(&pod, container, ContainerKind::Regular, &[])
        .await
    {
        Err(RuntimeError::ContainerWaiting { reason, .. }) => {
            assert_eq!(reason, "CreateContainerConfigError");
        }
        other => panic!("{other:?}"),
    }

    // A second runtime over the same containerd, whose Services were listed.
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    runtime.set_services(std::sync::Arc::new(FixedServices(Some(vec![
        service("default", "kubernetes", "10.0.0.1", 443),
        service("ns1", "fooservice", "10.0.0.7", 8765),
        service("ns2", "elsewhere", "10.0.0.8", 80),
    ]))));
    let lines = run_to_exit(&runtime, &root, &pod)
        .await
        .remove("env")
        .unwrap();
    for expected in [
        "KUBERNETES_SERVICE_HOST=10.0.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "FOOSERVICE_SERVICE_HOST=10.0.0.7",
        "FOOSERVICE_SERVICE_PORT=8765",
        "FOOSERVICE_PORT=tcp://10.0.0.7:8765",
        "FOOSERVICE_PORT_8765_TCP_PROTO=tcp",
        "FOOSERVICE_PORT_8765_TCP=tcp://10.0.0.7:8765",
        "FOOSERVICE_PORT_8765_TCP_ADDR=10.0.0.7",
    ] {
        assert!(
            lines.contains(&expected.to_owned()),
            "{expected}: {lines:?}"
        );
    }
    assert!(
        !lines.iter().any(|l| l.starts_with("ELSEWHERE_")),
        "{lines:?}"
    );
}

/// Issue 27 (harness 2): an image built by `oci_layout_tar` from two layers (busybox with
/// every applet, as the conformance busybox image has them, then a file layer) runs as its
/// config says: the `Entrypoint` with the `Cmd` as its arguments, as the config's `User`, with
/// the upper layer's files and busybox's applets; the conformance images (agnhost's
/// `Entrypoint ["/agnhost"]`, `Cmd ["pause"]`; nonroot's `User 1234`) are built so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_images_entrypoint_cmd_user_and_layers_reach_the_container() {
    use rustlet_cri::testing::{
        LayerEntry, OciImage, all_busybox_applets, busybox_layer, layer, oci_layout_tar,
    };
    use rustlet_cri::{CriConfig, CriRuntime};

    let Some(containerd) =
        PrivateContainerd::start("an_images_entrypoint_cmd_user_and_layers_reach").await
    else {
        return;
    };
    let applets = all_busybox_applets();
    assert!(applets.len() > 100, "{applets:?}");
    let busybox = busybox_layer(&applets.iter().map(String::as_str).collect::<Vec<_>>());
    let upper = layer(&[
        LayerEntry::Dir {
            path: "greeting",
            mode: 0o755,
        },
        LayerEntry::File {
            path: "greeting/hello.txt",
            mode: 0o644,
            data: b"hello from the upper layer\n",
        },
        LayerEntry::Symlink {
            path: "hello",
            target: "greeting/hello.txt",
        },
    ]);
    let name = "registry.example/layered:1.0";
    let tar = scratch(&containerd, "images").join("layered.tar");
    std::fs::write(
        &tar,
        oci_layout_tar(&[OciImage {
            name,
            entrypoint: &["/bin/sh", "-c"],
            cmd: &["cat /hello; id -u; true && basename /bin/busybox"],
            user: "1234",
            env: &["PATH=/bin"],
            layers: &[&busybox, &upper],
        }]),
    )
    .unwrap();
    containerd.import(&tar);

    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "layered", "namespace": "default", "uid": "uid-layered"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": name}]
        }
    }))
    .unwrap();
    let out = run_to_exit(&runtime, &root, &pod).await;
    assert_eq!(
        out["main"],
        ["hello from the upper layer", "1234", "busybox"],
        "{out:?}\n{}",
        containerd.log()
    );
}

/// Runs `pod`'s one container through the CRI runtime and relists (real time, bounded: 30 s)
/// until `done` holds for its instance.
async fn run_until(
    runtime: &rustlet_cri::CriRuntime,
    pod: &k8s_openapi::api::core::v1::Pod,
    done: impl Fn(&rustlet_pods::runtime::ContainerInstance) -> bool,
) -> rustlet_pods::runtime::ContainerInstance {
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::ContainerKind;

    let container: Container = pod.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(pod).await.unwrap();
    runtime
        .start_container(pod, &container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::new(pod.metadata.uid.as_deref().unwrap());
    let mut last = None;
    for _ in 0..300 {
        runtime.relist().await.unwrap();
        let status = runtime.pod_status(&uid).await;
        if let Some(instance) = status.containers.into_iter().next() {
            if done(&instance) {
                return instance;
            }
            last = Some(instance);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never reached: {last:?}");
}

/// Upstream's kubelet sends a container's memory limit through CRI
/// (`generateLinuxContainerResources`): a container that allocates past it is killed by the
/// kernel, and containerd's reason for the exit, `OOMKilled`, is the instance's reason (the
/// `OOMKilled` termination reason of the container's status). Without the limit the
/// allocation succeeds and the container completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_allocating_past_its_memory_limit_is_oom_killed() {
    use k8s_openapi::api::core::v1::Pod;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::InstanceState;

    let Some(containerd) = PrivateContainerd::start("a_container_past_its_memory_limit").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "oom", "namespace": "default", "uid": "uid-oom"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "c", "image": BUSYBOX_IMAGE,
            // One 256 MiB buffer, filled from /dev/zero, under a 32 MiB limit.
            "command": ["/bin/busybox", "dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
            "resources": {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}},
        }]}
    }))
    .unwrap();
    let instance = run_until(&runtime, &pod, |i| {
        matches!(i.state, InstanceState::Exited { .. })
    })
    .await;
    assert!(
        matches!(
            &instance.state,
            InstanceState::Exited { exit_code: 137, reason, .. } if reason == "OOMKilled"
        ),
        "{instance:?}\n{}",
        containerd.log()
    );
    runtime
        .kill_pod(&pod, Duration::from_secs(1))
        .await
        .unwrap();
    runtime
        .remove_pod(&rustlet_core::PodUid::new("uid-oom"))
        .await;
}

/// The host pid of the process of the container `id`: the one whose cgroup path (in
/// `/proc/<pid>/cgroup`) ends with the container's ID (containerd's cgroupfs path).
fn pid_of_container(id: &str) -> Option<(u32, String)> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).ok()?;
            cgroups
                .lines()
                .any(|l| l.ends_with(id))
                .then_some((pid, cgroups))
        })
}

/// The path of the v1 hierarchy `controller` in a `/proc/<pid>/cgroup` text.
fn cgroup_path<'a>(cgroups: &'a str, controller: &str) -> &'a str {
    cgroups
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then_some(path)
        })
        .unwrap_or_else(|| panic!("no {controller} cgroup in {cgroups}"))
}

/// Upstream `calculateLinuxResources` on real containers: a container with a 250m CPU limit
/// and a 48 MiB memory limit (and 100m, 32 MiB requests) runs in a cgroup with a 25 ms CFS
/// quota per 100 ms period, 102 CPU shares and a 48 MiB memory limit, read from the host's
/// cgroup files of the process's cgroups (`/proc/<pid>/cgroup`). Its OOM score adjustment is
/// the burstable one of its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_cgroup_has_the_cpu_quota_and_memory_limit_it_asked_for() {
    use k8s_openapi::api::core::v1::Pod;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::InstanceState;

    if !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        // A cgroup v2 host: the v1 files read here are not there.
        assert!(
            std::env::var_os("RUSTLET_REQUIRE_PRIVILEGED").is_none(),
            "this test reads cgroup v1 files"
        );
        return;
    }
    let Some(containerd) = PrivateContainerd::start("a_containers_cgroup_has_its_limits").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let config = CriConfig::new(containerd.endpoint(), &root);
    let memory_capacity = config.node_resources.memory_capacity;
    let runtime = CriRuntime::connect(config, None).await.unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "limits", "namespace": "default", "uid": "uid-limits"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "c", "image": BUSYBOX_IMAGE,
            "command": ["sleep", "600"],
            "resources": {
                "limits": {"cpu": "250m", "memory": "48Mi"},
                "requests": {"cpu": "100m", "memory": "32Mi"},
            },
        }]}
    }))
    .unwrap();
    let instance = run_until(&runtime, &pod, |i| {
        matches!(i.state, InstanceState::Running { .. })
    })
    .await;
    let id = instance.id.trim_start_matches("containerd://");
    let (pid, cgroups) =
        pid_of_container(id).unwrap_or_else(|| panic!("no process in a cgroup of {id}"));
    let read = |controller: &str, file: &str| -> i64 {
        let path = format!(
            "/sys/fs/cgroup/{controller}{}/{file}",
            cgroup_path(&cgroups, controller)
        );
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), 25_000, "{cgroups}");
    assert_eq!(read("cpu", "cpu.cfs_period_us"), 100_000);
    assert_eq!(read("cpu", "cpu.shares"), 102);
    assert_eq!(read("memory", "memory.limit_in_bytes"), 48 << 20);
    let oom_score_adj: i64 = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        oom_score_adj,
        (1000 - (32 << 20) * 1000 / memory_capacity).clamp(3, 999)
    );
    runtime
        .kill_pod(&pod, Duration::from_secs(1))
        .await
        .unwrap();
    runtime
        .remove_pod(&rustlet_core::PodUid::new("uid-limits"))
        .await;
}

/// Removes a test's private cgroup root from every cgroup v1 hierarchy (what the agent leaves
/// there, as upstream's kubelet leaves them: the QoS cgroups), also when the test fails.
struct PrivateCgroupRoot(String);

impl Drop for PrivateCgroupRoot {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for entry in entries.flatten() {
            let base = entry.path().join(self.0.trim_start_matches('/'));
            for dir in [
                "kubepods/burstable/poduid-cgroup",
                "kubepods/burstable",
                "kubepods/besteffort",
                "kubepods",
                "",
            ] {
                let _ = std::fs::remove_dir(base.join(dir));
            }
        }
    }
}

/// Upstream's pod container manager (`cgroupsPerQOS`, the `cgroupfs` driver): a burstable
/// pod's cgroup is `<root>/kubepods/burstable/pod<uid>`, made before its sandbox with the
/// pod's CPU shares, quota and memory limit; the container's process runs inside it (its
/// `/proc/<pid>/cgroup`), and the pod's removal removes it. The root is private to the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_containers_run_in_its_qos_classs_pod_cgroup_which_goes_with_the_pod() {
    use k8s_openapi::api::core::v1::Pod;
    use rustlet_cri::cgroups::PodCgroupsConfig;
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::InstanceState;

    if !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        assert!(
            std::env::var_os("RUSTLET_REQUIRE_PRIVILEGED").is_none(),
            "this test reads cgroup v1 files"
        );
        return;
    }
    // Dropped after the containerd (whose drop ends what is left running in it).
    let cgroup_root = PrivateCgroupRoot(format!("/rustlet-test-{}", std::process::id()));
    let Some(containerd) =
        PrivateContainerd::start("a_pods_containers_run_in_its_pod_cgroup").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(
        CriConfig {
            pod_cgroups: Some(PodCgroupsConfig {
                mount: "/sys/fs/cgroup".into(),
                root: cgroup_root.0.clone(),
            }),
            ..CriConfig::new(containerd.endpoint(), &root)
        },
        None,
    )
    .await
    .unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cg", "namespace": "default", "uid": "uid-cgroup"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "c", "image": BUSYBOX_IMAGE,
            "command": ["sleep", "600"],
            "resources": {
                "limits": {"cpu": "300m", "memory": "40Mi"},
                "requests": {"cpu": "200m", "memory": "20Mi"},
            },
        }]}
    }))
    .unwrap();
    let instance = run_until(&runtime, &pod, |i| {
        matches!(i.state, InstanceState::Running { .. })
    })
    .await;
    let pod_cgroup = format!("{}/kubepods/burstable/poduid-cgroup", cgroup_root.0);
    let id = instance.id.trim_start_matches("containerd://");
    let (_, cgroups) =
        pid_of_container(id).unwrap_or_else(|| panic!("no process in a cgroup of {id}"));
    // The sandbox's process (upstream: the pod's `cgroup_parent`) and the container's.
    let (_, sandbox_cgroups) = pid_of_container(&instance.sandbox_id)
        .unwrap_or_else(|| panic!("no process in a cgroup of {}", instance.sandbox_id));
    for controller in ["cpu", "memory", "pids"] {
        assert_eq!(
            cgroup_path(&cgroups, controller),
            format!("{pod_cgroup}/{id}"),
            "{cgroups}"
        );
        assert_eq!(
            cgroup_path(&sandbox_cgroups, controller),
            format!("{pod_cgroup}/{}", instance.sandbox_id),
            "{sandbox_cgroups}"
        );
    }
    let read = |controller: &str, file: &str| -> i64 {
        let path = format!("/sys/fs/cgroup/{controller}{pod_cgroup}/{file}");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    // The pod's: 200m of shares, a 300m quota, a 40 MiB limit (every container has limits).
    assert_eq!(read("cpu", "cpu.shares"), 204);
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), 30_000);
    assert_eq!(read("memory", "memory.limit_in_bytes"), 40 << 20);
    runtime
        .kill_pod(&pod, Duration::from_secs(1))
        .await
        .unwrap();
    runtime
        .remove_pod(&rustlet_core::PodUid::new("uid-cgroup"))
        .await;
    for controller in ["cpu", "memory", "pids", "systemd", "unified"] {
        let dir = format!("/sys/fs/cgroup/{controller}{pod_cgroup}");
        assert!(!std::path::Path::new(&dir).exists(), "{dir} is left");
    }
    // The QoS cgroup stays, as upstream's.
    assert!(
        std::path::Path::new(&format!(
            "/sys/fs/cgroup/memory{}/kubepods/burstable",
            cgroup_root.0
        ))
        .is_dir()
    );
}

/// Issue 27 (the conformance harness): an image pulled whether present or not (upstream's
/// Containers Lifecycle image-update specs run their containers with `imagePullPolicy:
/// Always`) is served by the test helper's registry in containerd's network namespace, as its
/// own registry would serve it; with no registry reachable the same pull fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_of_a_test_image_is_served_by_the_local_registry() {
    let Some(containerd) =
        PrivateContainerd::start("a_pull_of_a_test_image_is_served_by_the_local_registry").await
    else {
        return;
    };
    let client = CriClient::connect(containerd.endpoint(), Duration::from_secs(30))
        .await
        .expect("version check");
    let name = "registry.rustlet.invalid/e2e-test-images/mirrored:1.0";
    let own = rustlet_cri::testing::layer(&[rustlet_cri::testing::LayerEntry::File {
        path: "mirrored",
        mode: 0o644,
        data: name.as_bytes(),
    }]);
    let layers: [&[u8]; 1] = [&own];
    let tar = scratch(&containerd, "images").join("mirrored.tar");
    std::fs::write(
        &tar,
        rustlet_cri::testing::oci_layout_tar(&[rustlet_cri::testing::OciImage {
            name,
            entrypoint: &[],
            cmd: &["sh"],
            user: "",
            env: &[],
            layers: &layers,
        }]),
    )
    .unwrap();
    let sandbox_config = host_network_sandbox("puller", "uid-pull");
    let unserved = client
        .pull_image(name, sandbox_config.clone(), Duration::from_secs(30))
        .await;
    assert!(unserved.is_err(), "pulled with no registry: {unserved:?}");

    let registry = containerd.serve_registry(&tar).unwrap();
    let image_ref = client
        .pull_image(name, sandbox_config.clone(), Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log()));
    let image = client
        .image_status(name)
        .await
        .unwrap()
        .expect("the pulled image");
    assert_eq!(image.id, image_ref);
    assert!(image.repo_tags.contains(&name.to_owned()), "{image:?}");
    // Pulled again (the policy's every start), the same image.
    let again = client
        .pull_image(name, sandbox_config.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again, image_ref);
    drop(registry);
    let gone = client
        .pull_image(name, sandbox_config, Duration::from_secs(30))
        .await;
    assert!(gone.is_err(), "pulled with the registry gone: {gone:?}");
}

/// Starts `name` of `pod` with `mounts` and waits (real time, bounded) until it exited;
/// returns its exit code.
async fn run_container_to_exit(
    runtime: &rustlet_cri::CriRuntime,
    pod: &k8s_openapi::api::core::v1::Pod,
    name: &str,
    mounts: &[rustlet_volume::subpath::ContainerMount],
) -> Result<i32, String> {
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::{ContainerKind, InstanceState};
    let spec = pod.spec.as_ref().unwrap();
    let container = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap();
    runtime
        .start_container(pod, container, ContainerKind::Init, mounts)
        .await
        .map_err(|e| e.to_string())?;
    let uid = rustlet_core::PodUid::of(pod);
    for _ in 0..1000 {
        runtime.relist().await.unwrap();
        let status = runtime.pod_status(&uid).await;
        let (newest, _) = status.instances(name);
        if let Some(InstanceState::Exited { exit_code, .. }) = newest.map(|i| &i.state) {
            return Ok(*exit_code);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} did not exit");
}

/// Issue 27 (node features), upstream `translateMountPropagation` and `MakeRShared`
/// ("[sig-node] Mount recursive read-only [LinuxOnly] ... should accept non-recursive
/// read-only mounts"): a privileged container's tmpfs mounted below a `Bidirectional` volume
/// mount appears in the volume's directory on the host and, under a non-recursive read-only
/// mount of the volume in the next container, stays writable. containerd refuses the
/// `Bidirectional` mount while the root directory is not a shared mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_propagation_reaches_the_volume_directory_and_the_next_container() {
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_volume::subpath::{ContainerMount, MountPropagation};

    let Some(containerd) =
        PrivateContainerd::start("bidirectional_propagation_reaches_the_volume_directory").await
    else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    runtime.status().await.unwrap();
    assert!(
        runtime.runtime_handlers().is_empty() && !runtime.supports_recursive_read_only_mounts(),
        "containerd 1.6 names no handlers: {:?}",
        runtime.runtime_handlers()
    );
    let volume = root.join("pods/uid-propagation/volumes/kubernetes.io~empty-dir/mnt");
    std::fs::create_dir_all(&volume).unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "propagation", "namespace": "default", "uid": "uid-propagation"},
        "spec": {
            "hostNetwork": true,
            "initContainers": [
                {"name": "mount", "image": BUSYBOX_IMAGE,
                 "command": ["sh", "-euxc", "mkdir -p /mnt/tmpfs && mount -t tmpfs none /mnt/tmpfs"],
                 "securityContext": {"privileged": true}},
                {"name": "test", "image": BUSYBOX_IMAGE,
                 "command": ["sh", "-euxc", "touch /mnt-ro/tmpfs/foo"]}
            ],
            "containers": [{"name": "completion", "image": BUSYBOX_IMAGE}]
        }
    }))
    .unwrap();
    runtime.run_pod_sandbox(&pod).await.unwrap();
    let mount = |path: &str, read_only, propagation| ContainerMount {
        name: "mnt".into(),
        container_path: path.into(),
        host_path: volume.clone(),
        read_only,
        recursive_read_only: false,
        propagation,
    };
    let bidirectional = [mount("/mnt", false, MountPropagation::Bidirectional)];

    // The root directory on a private mount: containerd refuses a Bidirectional mount.
    let err = run_container_to_exit(&runtime, &pod, "mount", &bidirectional)
        .await
        .unwrap_err();
    assert!(err.contains("not a shared mount"), "{err}");

    let mounter = rustlet_mount::LinuxMounter::new();
    mounter.make_rshared(&root).unwrap();
    let code = run_container_to_exit(&runtime, &pod, "mount", &bidirectional).await;
    assert_eq!(code, Ok(0), "{}", containerd.log());
    assert!(
        mounter.is_tmpfs_mount_point(&volume.join("tmpfs")).unwrap(),
        "the container's tmpfs is in the volume's directory on the host"
    );
    let read_only = [mount("/mnt-ro", true, MountPropagation::Private)];
    let code = run_container_to_exit(&runtime, &pod, "test", &read_only).await;
    assert_eq!(code, Ok(0), "the tmpfs below a read-only mount is writable");
    assert!(volume.join("tmpfs/foo").exists());
}

/// A device plugin with one healthy device `dev0` whose `Allocate` mounts `file` at
/// `/device/<id>` and sets `DEVICE_IDS` (as upstream's e2e test plugin mounts a temp file per
/// device).
struct OneDevicePlugin {
    file: std::path::PathBuf,
}

type DeviceList = std::pin::Pin<
    Box<
        dyn futures::Stream<
                Item = Result<rustlet_cri::deviceplugin::pb::ListAndWatchResponse, tonic::Status>,
            > + Send,
    >,
>;

#[tonic::async_trait]
impl rustlet_cri::deviceplugin::pb::device_plugin_server::DevicePlugin for OneDevicePlugin {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<rustlet_cri::deviceplugin::pb::Empty>,
    ) -> Result<tonic::Response<rustlet_cri::deviceplugin::pb::DevicePluginOptions>, tonic::Status>
    {
        Ok(tonic::Response::new(Default::default()))
    }

    type ListAndWatchStream = DeviceList;

    async fn list_and_watch(
        &self,
        _: tonic::Request<rustlet_cri::deviceplugin::pb::Empty>,
    ) -> Result<tonic::Response<DeviceList>, tonic::Status> {
        use futures::StreamExt;
        use rustlet_cri::deviceplugin::pb;
        let list = pb::ListAndWatchResponse {
            devices: vec![pb::Device {
                id: "dev0".into(),
                health: "Healthy".into(),
                topology: None,
            }],
        };
        // One list, then the stream stays open.
        let stream =
            futures::stream::once(async move { Ok(list) }).chain(futures::stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<rustlet_cri::deviceplugin::pb::PreferredAllocationRequest>,
    ) -> Result<
        tonic::Response<rustlet_cri::deviceplugin::pb::PreferredAllocationResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(Default::default()))
    }

    async fn allocate(
        &self,
        request: tonic::Request<rustlet_cri::deviceplugin::pb::AllocateRequest>,
    ) -> Result<tonic::Response<rustlet_cri::deviceplugin::pb::AllocateResponse>, tonic::Status>
    {
        use rustlet_cri::deviceplugin::pb;
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| pb::ContainerAllocateResponse {
                envs: [("DEVICE_IDS".to_owned(), r.devices_ids.join(","))].into(),
                mounts: r
                    .devices_ids
                    .iter()
                    .map(|id| pb::Mount {
                        container_path: format!("/device/{id}"),
                        host_path: self.file.display().to_string(),
                        read_only: true,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        Ok(tonic::Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<rustlet_cri::deviceplugin::pb::PreStartContainerRequest>,
    ) -> Result<
        tonic::Response<rustlet_cri::deviceplugin::pb::PreStartContainerResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(Default::default()))
    }
}

/// Issue 27, upstream e2e "Device Plugin Failures: will set allocatable to zero when a single
/// device became unhealthy, but capacity will stay at 1" (its pod) and the device manager's
/// `GetDeviceRunContainerOptions`: a container whose limits name a registered device plugin
/// resource gets a device through the plugin's `Allocate`, whose variable and mount reach the
/// process; a second pod finds none left and waits with `CreateContainerConfigError` and
/// upstream's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_device_plugin_resource_is_allocated_and_reaches_the_process() {
    use rustlet_cri::deviceplugin::{DeviceManager, VERSION, pb};
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::Runtime;
    use rustlet_pods::runtime::ContainerKind;

    let Some(containerd) = PrivateContainerd::start("device_plugin").await else {
        return;
    };
    let root = scratch(&containerd, "root");
    let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
        .await
        .unwrap();
    let dir = containerd.dir().join("device-plugins");
    let manager = DeviceManager::new(&dir);
    let cancel = tokio_util::sync::CancellationToken::new();
    manager.start(cancel.clone()).await.unwrap();
    let file = containerd.dir().join("device-file");
    std::fs::write(&file, "the device\n").unwrap();
    let listener = tokio::net::UnixListener::bind(dir.join("one.sock")).unwrap();
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    let plugin =
        pb::device_plugin_server::DevicePluginServer::new(OneDevicePlugin { file: file.clone() });
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(plugin)
            .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned()),
    );
    const RESOURCE: &str = "test.device/one";
    manager
        .register(pb::RegisterRequest {
            version: VERSION.into(),
            endpoint: "one.sock".into(),
            resource_name: RESOURCE.into(),
            options: None,
        })
        .await
        .unwrap();
    for _ in 0..500 {
        if manager.resources().allocatable.get(RESOURCE) == Some(&1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(manager.resources().allocatable.get(RESOURCE), Some(&1));
    runtime.set_device_manager(manager.clone());
    let pod = |name: &str| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {
                "hostNetwork": true,
                "containers": [{"name": "c", "image": BUSYBOX_IMAGE,
                                "command": ["/bin/sh", "-c", "echo ids=$DEVICE_IDS; cat /device/dev0"],
                                "resources": {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}}}]
            }
        }))
        .unwrap()
    };
    let first = pod("first");
    let lines = run_to_exit(&runtime, &root, &first)
        .await
        .remove("c")
        .unwrap();
    assert_eq!(lines, ["ids=dev0", "the device"]);
    assert_eq!(
        manager.container_devices("uid-first", "c"),
        std::collections::BTreeMap::from([(RESOURCE.to_owned(), vec!["dev0".to_owned()])])
    );

    let second = pod("second");
    runtime.run_pod_sandbox(&second).await.unwrap();
    let container = second.spec.as_ref().unwrap().containers[0].clone();
    let err = runtime
        .start_container(&second, &container, ContainerKind::Regular, &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0"
        )),
        "{err}"
    );
    assert!(err.contains("CreateContainerConfigError"), "{err}");
    cancel.cancel();
    let _ = serving.await;
}
