//! Tests of the container log manager: upstream's `TestRotateLogs`, `TestCleanupUnusedLog`,
//! `TestRemoveExcessLog`, `TestCompressLog`, `TestRotateContainerLogs`-style reopen failures,
//! and the `run` loop under paused time.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::sync::{Arc, Mutex};

use flate2::read::GzDecoder;

use super::*;

/// A fake runtime: its running containers, and a reopen that creates the file anew (as
/// containerd does) unless told to fail. With a gate, each reopen waits for a permit; the
/// listings' (paused) times and the reopens in progress are recorded.
#[derive(Default)]
struct FakeRuntime {
    containers: Mutex<Vec<ContainerLog>>,
    reopened: Mutex<Vec<String>>,
    fail_reopen: Mutex<bool>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    listed_at: Mutex<Vec<tokio::time::Instant>>,
    in_flight: Mutex<(usize, usize)>,
}

#[async_trait::async_trait]
impl LogRuntime for Arc<FakeRuntime> {
    async fn running_container_logs(&self) -> Result<Vec<ContainerLog>, StatusError> {
        self.listed_at
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        Ok(self.containers.lock().unwrap().clone())
    }
    async fn reopen_container_log(&self, id: &str) -> Result<(), StatusError> {
        if *self.fail_reopen.lock().unwrap() {
            return Err("reopen refused".into());
        }
        if let Some(gate) = &self.gate {
            {
                let mut n = self.in_flight.lock().unwrap();
                n.0 += 1;
                n.1 = n.1.max(n.0);
            }
            gate.acquire().await.unwrap().forget();
            self.in_flight.lock().unwrap().0 -= 1;
        }
        self.reopened.lock().unwrap().push(id.to_owned());
        let path = self
            .containers
            .lock()
            .unwrap()
            .iter()
            .find(|c| c.id == id)
            .unwrap()
            .log_path
            .clone();
        std::fs::File::create(path)?;
        Ok(())
    }
}

/// Wall time that moves with tokio's (paused) clock.
struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl WallClock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = k8s_openapi::jiff::SignedDuration::try_from(self.start.elapsed()).unwrap();
        self.base.checked_add(elapsed).unwrap()
    }
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn set<const N: usize>(names: [&str; N]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn gunzip(path: &Path) -> String {
    let mut s = String::new();
    GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// upstream: `TestRotateLogs`: only running containers' logs at or above the size are
/// rotated; leftovers are cleaned, the excess removed oldest first, the rest compressed, the
/// live file renamed and reopened; a missing live file is reopened. Then the `run` loop rotates
/// again one (paused) interval later.
#[tokio::test(start_paused = true)]
async fn test_rotate_logs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = |name: &str| d.join(name);
    std::fs::write(log("test-log-1"), "a log line longer than the limit\n").unwrap();
    std::fs::write(log("test-log-1.20200101-000000.gz"), "old").unwrap();
    std::fs::write(log("test-log-1.20200101-000001"), "older rotated").unwrap();
    std::fs::write(
        log("test-log-1.20200101-000002.tmp"),
        "interrupted compression",
    )
    .unwrap();
    std::fs::write(
        log("test-log-1.20200101-000003"),
        "compressed but not removed",
    )
    .unwrap();
    std::fs::write(log("test-log-1.20200101-000003.gz"), "compressed").unwrap();
    std::fs::write(log("test-log-2"), "small").unwrap();
    std::fs::write(
        log("test-log-3"),
        "an exited container's log, longer than the limit\n",
    )
    .unwrap();
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.containers.lock().unwrap() = vec![
        ContainerLog {
            id: "container-1".into(),
            log_path: log("test-log-1"),
        },
        ContainerLog {
            id: "container-2".into(),
            log_path: log("test-log-2"),
        },
        ContainerLog {
            id: "container-4".into(),
            log_path: log("test-log-4"),
        },
    ];
    let config = ContainerLogManagerConfig {
        policy: LogRotatePolicy::new(10, 3).unwrap(),
        monitor_interval: Duration::from_secs(10),
        max_workers: 1,
    };
    let clock = TokioClock {
        base: "2026-12-03T15:00:00Z".parse().unwrap(),
        start: tokio::time::Instant::now(),
    };
    let manager =
        Arc::new(ContainerLogManager::new(Arc::clone(&runtime), config).with_clock(clock));
    let runner = Arc::clone(&manager);
    let task = tokio::spawn(async move { runner.run().await });
    // The first pass runs at once.
    tokio::time::sleep(Duration::from_millis(1)).await;
    while runtime.reopened.lock().unwrap().len() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        names(d),
        set([
            "test-log-1",
            "test-log-1.20200101-000003.gz",
            "test-log-1.20261203-150000",
            "test-log-2",
            "test-log-3",
            "test-log-4",
        ])
    );
    assert_eq!(
        *runtime.reopened.lock().unwrap(),
        ["container-1", "container-4"]
    );
    assert_eq!(
        std::fs::read_to_string(log("test-log-1")).unwrap(),
        "",
        "reopened anew"
    );
    assert_eq!(
        std::fs::read_to_string(log("test-log-1.20261203-150000")).unwrap(),
        "a log line longer than the limit\n",
        "the latest rotated file stays uncompressed"
    );

    // The live file grows again; one interval later it is rotated, and the previous one is
    // compressed while the excess goes (MaxFiles 3: one rotated file besides the new one).
    std::fs::write(log("test-log-1"), "the second log, longer than the limit\n").unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    while runtime.reopened.lock().unwrap().len() < 3 {
        tokio::task::yield_now().await;
    }
    task.abort();
    assert_eq!(
        names(d),
        set([
            "test-log-1",
            "test-log-1.20261203-150000.gz",
            "test-log-1.20261203-150010",
            "test-log-2",
            "test-log-3",
            "test-log-4",
        ])
    );
    assert_eq!(
        gunzip(&log("test-log-1.20261203-150000.gz")),
        "a log line longer than the limit\n"
    );
}

/// upstream: `TestCleanupUnusedLog` (`filterUnusedLogs`).
#[test]
fn test_cleanup_unused_log() {
    let logs: Vec<PathBuf> = ["l.1", "l.1.gz", "l.2.tmp", "l.3", "l.4.gz", "l.5.gz.tmp"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let (in_use, unused) = filter_unused_logs(&logs);
    assert_eq!(in_use, ["l.1.gz", "l.3", "l.4.gz"].map(PathBuf::from));
    assert_eq!(unused, ["l.1", "l.2.tmp", "l.5.gz.tmp"].map(PathBuf::from));
}

/// upstream: `TestRemoveExcessLog`: the oldest go first; `MaxFiles - 2` rotated files stay.
#[test]
fn test_remove_excess_log() {
    for (max_files, want) in [
        (2usize, vec![]),
        (3, vec!["l.3"]),
        (4, vec!["l.2.gz", "l.3"]),
        (9, vec!["l.1", "l.2.gz", "l.3"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let logs: Vec<PathBuf> = ["l.3", "l.1", "l.2.gz"]
            .iter()
            .map(|n| dir.path().join(n))
            .collect();
        for l in &logs {
            std::fs::write(l, "x").unwrap();
        }
        let kept = remove_excess_logs(logs, max_files).unwrap();
        let want: Vec<PathBuf> = want.iter().map(|n| dir.path().join(n)).collect();
        assert_eq!(kept, want, "max_files={max_files}");
        let left: Vec<String> = names(dir.path()).into_iter().collect();
        assert_eq!(
            left,
            want.iter()
                .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        );
    }
}

/// upstream: `TestCompressLog`: `log` becomes `log.gz` with the same content and mode, and no
/// temporary file is left.
#[test]
fn test_compress_log() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("test-log.20200101-000000");
    std::fs::write(&log, "test log content\n").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o640)).unwrap();
    compress_log(&log).unwrap();
    assert_eq!(names(dir.path()), set(["test-log.20200101-000000.gz"]));
    let gz = dir.path().join("test-log.20200101-000000.gz");
    assert_eq!(gunzip(&gz), "test log content\n");
    assert_eq!(
        std::fs::metadata(&gz).unwrap().permissions().mode() & 0o777,
        0o640
    );
}

/// upstream: `rotateLatestLog`: when `ReopenContainerLog` fails the rotated file is renamed
/// back, so the next pass tries again and the reader's file stays in place.
#[tokio::test]
async fn test_rotate_latest_log_renames_back_when_reopen_fails() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("0.log");
    std::fs::write(&log, "a log longer than the limit\n").unwrap();
    let runtime = Arc::new(FakeRuntime::default());
    *runtime.containers.lock().unwrap() = vec![ContainerLog {
        id: "c".into(),
        log_path: log.clone(),
    }];
    *runtime.fail_reopen.lock().unwrap() = true;
    let config = ContainerLogManagerConfig {
        policy: LogRotatePolicy::new(1, 5).unwrap(),
        ..Default::default()
    };
    let manager = ContainerLogManager::new(Arc::clone(&runtime), config);
    let err = manager.rotate_latest_log("c", &log).await.unwrap_err();
    assert!(
        matches!(err, RotationError::Reopen { ref id, .. } if id == "c"),
        "{err}"
    );
    assert_eq!(names(dir.path()), set(["0.log"]));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "a log longer than the limit\n"
    );
    // A whole pass logs the failure and leaves the file as it was.
    manager.rotate_logs().await.unwrap();
    assert_eq!(names(dir.path()), set(["0.log"]));
    *runtime.fail_reopen.lock().unwrap() = false;
    manager.rotate_logs().await.unwrap();
    assert_eq!(names(dir.path()).len(), 2);
}

/// upstream: `NewContainerLogManager`: `MaxFiles` must be more than 1.
#[test]
fn max_files_must_be_more_than_one() {
    assert_eq!(
        LogRotatePolicy::new(1, 1).unwrap_err().to_string(),
        "invalid MaxFiles 1, must be > 1"
    );
    assert_eq!(
        LogRotatePolicy::default(),
        LogRotatePolicy {
            max_size: 10 * 1024 * 1024,
            max_files: 5
        }
    );
}

/// upstream: `TestClean`: the live and every rotated log of the container go, others stay.
#[tokio::test]
async fn test_clean() {
    let dir = tempfile::tempdir().unwrap();
    for n in [
        "0.log",
        "0.log.20200101-000000.gz",
        "0.log.20200101-000001",
        "1.log",
    ] {
        std::fs::write(dir.path().join(n), "x").unwrap();
    }
    clean_logs(&dir.path().join("0.log")).await.unwrap();
    assert_eq!(names(dir.path()), set(["1.log"]));
}

/// upstream: `Start` with `containerLogMaxWorkers` and `containerLogMonitorInterval`: the loop
/// lists at once and then every interval, never while a pass is still working, and works on at
/// most `max_workers` containers at a time however many are due (paused time).
#[tokio::test(start_paused = true)]
async fn the_loop_honours_the_interval_and_max_workers() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runtime = Arc::new(FakeRuntime {
        gate: Some(Arc::clone(&gate)),
        ..FakeRuntime::default()
    });
    let mut containers = Vec::new();
    for i in 0..5 {
        let log_path = dir.path().join(format!("c{i}.log"));
        std::fs::write(&log_path, "longer than the limit\n").unwrap();
        containers.push(ContainerLog {
            id: format!("c{i}"),
            log_path,
        });
    }
    *runtime.containers.lock().unwrap() = containers;
    let config = ContainerLogManagerConfig {
        policy: LogRotatePolicy::new(10, 5).unwrap(),
        monitor_interval: Duration::from_secs(10),
        max_workers: 2,
    };
    let manager = Arc::new(ContainerLogManager::new(Arc::clone(&runtime), config));
    let start = tokio::time::Instant::now();
    let runner = Arc::clone(&manager);
    let task = tokio::spawn(async move { runner.run().await });
    let in_flight = || runtime.in_flight.lock().unwrap().0;
    // Three intervals pass while the first pass waits on its reopens: two workers busy, no
    // third one, and no second listing.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(in_flight(), 2);
    assert_eq!(runtime.listed_at.lock().unwrap().len(), 1);
    // Every reopen may finish: the pass ends having rotated each container once, at once.
    gate.add_permits(1000);
    for _ in 0..10_000 {
        if runtime.reopened.lock().unwrap().len() == 5 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(runtime.reopened.lock().unwrap().len(), 5);
    let done = tokio::time::Instant::now();
    assert_eq!(
        runtime.in_flight.lock().unwrap().1,
        2,
        "never more than two at once"
    );
    // The files are small again: the next passes come one interval apart.
    tokio::time::sleep(Duration::from_secs(25)).await;
    task.abort();
    let listed: Vec<Duration> = runtime
        .listed_at
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    let after = done - start;
    assert_eq!(
        listed,
        [
            Duration::ZERO,
            after,
            after + Duration::from_secs(10),
            after + Duration::from_secs(20)
        ]
    );
    assert_eq!(runtime.reopened.lock().unwrap().len(), 5);
}
