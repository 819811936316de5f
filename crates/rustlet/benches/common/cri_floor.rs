//! The raw CRI floor the container benches set beside the agent: the same pods made by raw CRI
//! calls on the same containerd, from one client, all at once (RunPodSandbox, CreateContainer,
//! StartContainer; no volumes, no statuses, no API server), then torn down.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use rustlet_cri::CriClient;
use rustlet_cri::testing::PrivateContainerd;

/// What the floor measured.
pub struct Floor {
    /// Per pod, from the batch's start to its StartContainer's answer; sorted.
    pub per_pod: Vec<Duration>,
    /// From the batch's start to the last answer.
    pub whole: Duration,
}

/// `pods` sandboxes with one busybox container each running `command`, on the pod network
/// (CNI), made at once through [`CriClient`]; stopped and removed before it returns.
pub fn raw_cri_pods(containerd: &PrivateContainerd, pods: usize, command: &[&str]) -> Floor {
    let endpoint = containerd.endpoint().to_owned();
    let logs = containerd.dir().join(format!("floor-{pods}"));
    std::fs::create_dir_all(&logs).unwrap();
    let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(60))
                .await
                .unwrap();
            let start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..pods {
                let (client, logs, command) = (client.clone(), logs.clone(), command.clone());
                tasks.spawn(async move {
                    let sandbox = cri::PodSandboxConfig {
                        metadata: Some(cri::PodSandboxMetadata {
                            name: format!("floor{i}"),
                            uid: format!("floor-{i}"),
                            namespace: "default".into(),
                            attempt: 0,
                        }),
                        hostname: format!("floor{i}"),
                        log_directory: logs.display().to_string(),
                        ..Default::default()
                    };
                    let id = client.run_pod_sandbox(sandbox.clone()).await.unwrap();
                    let config = cri::ContainerConfig {
                        metadata: Some(cri::ContainerMetadata {
                            name: "c".into(),
                            attempt: 0,
                        }),
                        image: Some(cri::ImageSpec {
                            image: rustlet_cri::testing::BUSYBOX_IMAGE.into(),
                            ..Default::default()
                        }),
                        command,
                        log_path: format!("c{i}.log"),
                        ..Default::default()
                    };
                    let c = client.create_container(&id, config, sandbox).await.unwrap();
                    client.start_container(&c).await.unwrap();
                    (start.elapsed(), id)
                });
            }
            let mut per_pod = Vec::new();
            let mut sandboxes = Vec::new();
            while let Some(done) = tasks.join_next().await {
                let (at, id) = done.unwrap();
                per_pod.push(at);
                sandboxes.push(id);
            }
            let whole = start.elapsed();
            per_pod.sort();
            for id in sandboxes {
                client.stop_pod_sandbox(&id).await.unwrap();
                client.remove_pod_sandbox(&id).await.unwrap();
            }
            Floor { per_pod, whole }
        })
}
