//! The kubelet's container log manager run by the agent: `rustlet_server`'s
//! `ContainerLogManager` over the `Runtime` trait (`running_container_logs`,
//! `reopen_container_log`: CRI `ListContainers`, `ContainerStatus.log_path`,
//! `ReopenContainerLog`), so that `rustlet-server` never names `rustlet-pods`.

use std::sync::Arc;

use rustlet_pods::Runtime;
use rustlet_server::logs::reader::StatusError;
use rustlet_server::logs::rotation::{ContainerLog, ContainerLogManagerConfig};
use rustlet_server::logs::{ContainerLogManager, LogRuntime};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// The runtime as the log manager asks it.
pub struct RuntimeLogs(pub Arc<dyn Runtime>);

#[async_trait::async_trait]
impl LogRuntime for RuntimeLogs {
    async fn running_container_logs(&self) -> Result<Vec<ContainerLog>, StatusError> {
        Ok(self
            .0
            .running_container_logs()
            .await?
            .into_iter()
            .map(|c| ContainerLog {
                id: c.id,
                log_path: c.path,
            })
            .collect())
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), StatusError> {
        Ok(self.0.reopen_container_log(id).await?)
    }
}

/// Rotates the runtime's container logs until `cancel` (upstream: `containerLogManager.Start`).
pub async fn run(
    runtime: Arc<dyn Runtime>,
    config: ContainerLogManagerConfig,
    cancel: CancellationToken,
) {
    info!(
        max_size = config.policy.max_size,
        max_files = config.policy.max_files,
        workers = config.max_workers,
        monitor_interval = ?config.monitor_interval,
        "container log rotation"
    );
    let manager = ContainerLogManager::new(RuntimeLogs(runtime), config);
    tokio::select! {
        () = cancel.cancelled() => {}
        () = manager.run() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::jiff::Timestamp;
    use rustlet_cri::testing::{BUSYBOX_IMAGE, PrivateContainerd, scratch};
    use rustlet_cri::{CriConfig, CriRuntime};
    use rustlet_pods::runtime::ContainerKind;
    use rustlet_server::logs::rotation::{LogRotatePolicy, WallClock};
    use rustlet_server::logs::{ContainerRunning, LogOptions, LogReader, parse_pod_log_query};
    use tokio::io::AsyncReadExt as _;

    use super::*;

    /// A wall clock the test moves (rotated files are named by the second).
    #[derive(Clone)]
    struct TestClock(Arc<Mutex<Timestamp>>);

    impl WallClock for TestClock {
        fn now(&self) -> Timestamp {
            *self.0.lock().unwrap()
        }
    }

    struct Flag(AtomicBool);

    #[async_trait::async_trait]
    impl ContainerRunning for Flag {
        async fn is_running(&self) -> Result<bool, StatusError> {
            Ok(self.0.load(Ordering::SeqCst))
        }
    }

    /// Waits (real time, bounded: a real containerd) until `path` holds `text`.
    async fn wait_for_text(path: &std::path::Path, text: &str) -> String {
        for _ in 0..1000 {
            let content = std::fs::read_to_string(path).unwrap_or_default();
            if content.contains(text) {
                return content;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{text:?} not in {} within 10 s", path.display());
    }

    /// The next `len` bytes a follow wrote (within 30 s).
    async fn followed(rx: &mut tokio::io::DuplexStream, len: usize) -> String {
        let mut got = vec![0u8; len];
        tokio::time::timeout(Duration::from_secs(30), rx.read_exact(&mut got))
            .await
            .expect("the follow's lines")
            .unwrap();
        String::from_utf8(got).unwrap()
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        out.sort();
        out
    }

    /// Issue 26 item 3: the agent's log manager over a real containerd (upstream:
    /// `TestRotateLogs` end to end): a container's log above `containerLogMaxSize` is renamed
    /// and containerd reopens a new one (`ReopenContainerLog`) it keeps writing; the next
    /// rotation gzips the older rotated file and keeps the latest one plain; the log reader
    /// reads the live file, and a follow begun before the rotations reads every line once, the
    /// renamed file to its end and then the new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_containerd_log_above_the_max_size_is_rotated_and_reopened() {
        let Some(containerd) =
            PrivateContainerd::start("a_containerd_log_above_the_max_size_is_rotated").await
        else {
            return;
        };
        let root = scratch(&containerd, "root");
        let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), &root), None)
            .await
            .unwrap();
        // Each phase waits for its file: `/tmp/1` and `/tmp/2`, made by exec.
        let script = "i=0; while [ $i -lt 100 ]; do echo before-$i; i=$((i+1)); done; \
            while [ ! -e /tmp/1 ]; do sleep 0.05; done; echo middle; \
            while [ ! -e /tmp/2 ]; do sleep 0.05; done; echo after; exec sleep 1000";
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "chatty", "namespace": "default", "uid": "uid-rotate"},
            "spec": {
                "hostNetwork": true,
                "containers": [{"name": "main", "image": BUSYBOX_IMAGE,
                    "command": ["/bin/sh", "-c", script]}]
            }
        }))
        .unwrap();
        let uid = rustlet_core::PodUid::of(&pod);
        let runtime_dyn: Arc<dyn Runtime> = runtime.clone();
        runtime.run_pod_sandbox(&pod).await.unwrap();
        let container = &pod.spec.as_ref().unwrap().containers[0];
        runtime
            .start_container(&pod, container, ContainerKind::Regular, &[])
            .await
            .unwrap();
        let id = runtime.pod_status(&uid).await.containers[0].id.clone();
        let log = runtime.container_log(&id).await.unwrap().path;
        let dir = log.parent().unwrap().to_owned();
        wait_for_text(&log, "before-99").await;

        // A follow from the start, through both rotations.
        let running = Arc::new(Flag(AtomicBool::new(true)));
        let (mut tx, mut rx) = tokio::io::duplex(1 << 16);
        let follow = {
            let api = parse_pod_log_query("follow=true").unwrap();
            let reader = LogReader::new(&log, LogOptions::new(&api, Timestamp::now()));
            let running = Arc::clone(&running);
            tokio::spawn(async move { reader.read_logs(running.as_ref(), &mut tx).await })
        };
        // The follow has the file open (it gave its lines) before the first rotation: a follow
        // that starts while the file is renamed and not yet made again finds no file.
        let before: String = (0..100).map(|i| format!("before-{i}\n")).collect();
        assert_eq!(followed(&mut rx, before.len()).await, before);

        let clock = TestClock(Arc::new(Mutex::new(
            "2026-12-03T15:00:00Z".parse().unwrap(),
        )));
        let manager = ContainerLogManager::new(
            RuntimeLogs(runtime_dyn.clone()),
            ContainerLogManagerConfig {
                policy: LogRotatePolicy::new(16, 5).unwrap(),
                monitor_interval: Duration::from_secs(10),
                max_workers: 1,
            },
        )
        .with_clock(clock.clone());
        manager.rotate_logs().await.unwrap();
        assert_eq!(names(&dir), ["0.log", "0.log.20261203-150000"]);
        let rotated = std::fs::read_to_string(dir.join("0.log.20261203-150000")).unwrap();
        assert!(rotated.contains("before-0\n") && rotated.contains("before-99\n"));

        // containerd writes the reopened file.
        let exec = |cmd: &str| {
            let (runtime, id, cmd) = (runtime_dyn.clone(), id.clone(), cmd.to_owned());
            async move {
                let out = runtime
                    .exec_sync(&id, &["touch".to_owned(), cmd], Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(out.exit_code, 0, "{}", out.output);
            }
        };
        exec("/tmp/1").await;
        let live = wait_for_text(&log, "middle").await;
        assert!(!live.contains("before-"), "{live}");

        // The second rotation: the first rotated file is gzipped, the latest stays plain.
        *clock.0.lock().unwrap() = "2026-12-03T15:00:10Z".parse().unwrap();
        manager.rotate_logs().await.unwrap();
        assert_eq!(
            names(&dir),
            ["0.log", "0.log.20261203-150000.gz", "0.log.20261203-150010"]
        );
        exec("/tmp/2").await;
        wait_for_text(&log, "after").await;

        // The reader reads the live file only.
        let mut out = Vec::new();
        let api = parse_pod_log_query("").unwrap();
        LogReader::new(&log, LogOptions::new(&api, Timestamp::now()))
            .read_logs(&Flag(AtomicBool::new(false)), &mut out)
            .await
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "after\n");
        // So does the symlink's reader.
        let link = root.join("container-logs").join(format!(
            "chatty_default_main-{}.log",
            id.split_once("://").unwrap().1
        ));
        assert_eq!(std::fs::read_link(&link).unwrap(), log);

        // The follow saw every line once, in order, across both rotations.
        let want = "middle\nafter\n";
        assert_eq!(followed(&mut rx, want.len()).await, want);
        running.0.store(false, Ordering::SeqCst);
        let stats = tokio::time::timeout(Duration::from_secs(30), follow)
            .await
            .expect("the follow ends")
            .unwrap()
            .unwrap();
        assert_eq!(stats.reopened, 2);

        runtime
            .kill_pod(&pod, Duration::from_secs(0))
            .await
            .unwrap();
        runtime.remove_pod(&uid).await;
    }
}
