//! Status manager benchmarks (criterion for CPU cost; a virtual-time simulation for draining).
//!
//! ```sh
//! cargo bench -p rustlet-status --features test-util --bench status
//! ```
//!
//! * `set_pod_status/5_containers`: one accepted update of a 5-container pod (target < 5 µs),
//!   beside one deep copy of the status, R11's comparison alone and one status freed alone.
//! * `full_batch/10000_unchanged`: the 10 s batch over 10,000 synced, unchanged pods (target
//!   < 5 ms, zero API calls), beside upstream's shape of the same work (copy, normalise and
//!   compare every pod's API status on every tick).
//! * `status_patch/5_containers_*`: building the strategic merge patch of a pod that started
//!   and of a readiness change, beside the floor of both statuses as JSON trees, diffed.
//! * The drain table: 1,000 changed pods through a fake API with 5 ms latency, upstream's shape
//!   (GET + PATCH, one pod at a time) against ours, in virtual time, with API calls per change.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use rustlet_core::deletion::FixedDeletionSafety;
use rustlet_core::equality::is_pod_status_by_kubelet_equal;
use rustlet_core::normalize::normalize_status;
use rustlet_core::testutil::{cond, running, status_in, test_pod};
use rustlet_core::{FeatureGates, PodUid};
use rustlet_status::testing::{FakePodManager, FakePodStatusClient, ManualSync};
use rustlet_status::{PodManager, StatusManager, StatusManagerConfig, StatusManagerDeps};

fn runtime(paused: bool) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time();
    if paused {
        builder.start_paused(true);
    }
    builder.build().expect("runtime")
}

fn five_container_pod(i: usize) -> Pod {
    let mut pod = test_pod();
    pod.metadata.name = Some(format!("pod-{i}"));
    pod.metadata.uid = Some(format!("uid-{i}"));
    pod.spec = Some(PodSpec {
        containers: (0..5)
            .map(|c| Container {
                name: format!("c{c}"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    pod
}

fn five_container_status(message: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        message: Some(message.into()),
        conditions: Some(vec![
            cond("Ready", "True"),
            cond("ContainersReady", "True"),
            cond("PodScheduled", "True"),
        ]),
        container_statuses: Some(
            (0..5)
                .map(|c| ContainerStatus {
                    ready: true,
                    ..status_in(&format!("c{c}"), running())
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn manager(config: StatusManagerConfig) -> (StatusManager, FakePodStatusClient, FakePodManager) {
    let client = FakePodStatusClient::new();
    let pods = FakePodManager::new();
    let deps = StatusManagerDeps::new(
        Some(Arc::new(client.clone())),
        Arc::new(pods.clone()),
        Arc::new(FixedDeletionSafety::default()),
    );
    (StatusManager::new(deps, config), client, pods)
}

fn bench_set_pod_status(c: &mut Criterion) {
    let (manager, _client, pods) = manager(StatusManagerConfig::default());
    let pod = five_container_pod(0);
    pods.add_pod(pod.clone());
    let statuses = [five_container_status("a"), five_container_status("b")];
    let mut i = 0usize;
    // Batches of 100 inputs (~0.5 MB): with `SmallInput` criterion cloned a tenth of a sample's
    // iterations ahead (hundreds of MB), so each call met a cold, freshly faulted input and the
    // figure followed the machine's page-fault and memory latency (1.8-4.3 µs for the same
    // binary within an hour) rather than the call; an agent hands over a status it just made.
    const BATCH: BatchSize = BatchSize::NumIterations(100);
    c.bench_function("set_pod_status/5_containers", |b| {
        b.iter_batched(
            || {
                i += 1;
                statuses[i % 2].clone()
            },
            |status| black_box(manager.set_pod_status(&pod, status)),
            BATCH,
        )
    });
    // The floor: one deep copy of the status, which upstream's SetPodStatus makes too.
    c.bench_function("set_pod_status/5_containers_floor_deep_copy", |b| {
        b.iter(|| black_box(statuses[0].clone()))
    });
    // What the accepted path cannot skip, each alone (issue 29: how close its floor is): R11's
    // field-by-field comparison of the new status with the cached one (two equal statuses: the
    // whole walk), and freeing the cached status the new one replaces (the free half of the
    // deep copy above).
    let gates = FeatureGates::default();
    let twin = statuses[0].clone();
    c.bench_function("set_pod_status/5_containers_r11_compare_alone", |b| {
        b.iter(|| black_box(is_pod_status_by_kubelet_equal(&statuses[0], &twin, &gates)))
    });
    c.bench_function("set_pod_status/5_containers_free_alone", |b| {
        b.iter_batched(|| statuses[0].clone(), drop, BATCH)
    });
    c.bench_function("set_pod_status/5_containers_unchanged", |b| {
        b.iter_batched(
            || statuses[i % 2].clone(),
            |status| black_box(manager.set_pod_status(&pod, status)),
            BATCH,
        )
    });
}

/// 10,000 pods synced, the watch caught up, and one full batch run (the first: a scan).
fn steady_pods(
    rt: &tokio::runtime::Runtime,
    full_scan_every: u32,
) -> (
    StatusManager,
    FakePodStatusClient,
    FakePodManager,
    ManualSync,
) {
    let (manager, client, pods) = manager(StatusManagerConfig {
        api_qps: f64::INFINITY,
        full_scan_every,
        ..StatusManagerConfig::default()
    });
    let mut sync = ManualSync::take(&manager);
    for i in 0..PODS {
        let stored = client.put_pod(five_container_pod(i));
        pods.add_pod(stored.clone());
        manager.set_pod_status(&stored, five_container_status("steady"));
    }
    rt.block_on(sync.kick_batches());
    for i in 0..PODS {
        pods.add_pod(client.pod("new", &format!("pod-{i}")).expect("stored")); // the watch catches up
    }
    rt.block_on(sync.full_batch());
    (manager, client, pods, sync)
}

const PODS: usize = 10_000;

fn bench_full_batch(c: &mut Criterion) {
    let rt = runtime(false);
    // Three selections of the same tick: the default (pods that changed; every 30th batch
    // scans every pod: the mean includes it), a batch between scans, and the scan alone
    // (every batch scans, as upstream's does).
    for (name, every) in [
        (
            "full_batch/10000_unchanged",
            StatusManagerConfig::default().full_scan_every,
        ),
        ("full_batch/10000_unchanged_between_scans", u32::MAX),
        ("full_batch/10000_unchanged_every_pod_scanned", 1),
    ] {
        let (_manager, client, _pods, mut sync) = steady_pods(&rt, every);
        let calls_before = client.actions().len();
        c.bench_function(name, |b| {
            b.iter(|| assert_eq!(rt.block_on(sync.full_batch()), 0))
        });
        assert_eq!(
            client.actions().len(),
            calls_before,
            "zero API calls in steady state"
        );
    }
    let (manager, _client, pods, _sync) = steady_pods(&rt, 1);

    // Upstream's shape of the same tick: copy, normalise and compare every pod's API status.
    let gates = FeatureGates::default();
    let cached: Vec<(PodUid, PodStatus)> = (0..PODS)
        .map(|i| {
            let uid = PodUid::new(format!("uid-{i}"));
            let status = manager.get_versioned_status(&uid).expect("cached").status;
            (uid, status)
        })
        .collect();
    c.bench_function("full_batch/10000_unchanged_upstream_shape", |b| {
        b.iter(|| {
            let mut reconcile = 0;
            for (uid, status) in &cached {
                let pod = pods.pod_by_uid(uid).expect("pod");
                let mut api = pod.status.clone().unwrap_or_default();
                normalize_status(pod.spec.as_ref(), &mut api);
                if !is_pod_status_by_kubelet_equal(&api, status, &gates) {
                    reconcile += 1;
                }
            }
            assert_eq!(reconcile, 0);
        })
    });
}

/// The patch of a 5-container pod going from `ContainerCreating` to Running (what a storm's
/// status syncs build) and of a readiness change, beside a floor: both statuses turned into
/// JSON trees and diffed, without the empty lists dropped or the patch's metadata.
fn bench_status_patch(c: &mut Criterion) {
    let running = five_container_status("");
    let mut creating = running.clone();
    creating.phase = Some("Pending".into());
    for status in creating.container_statuses.iter_mut().flatten() {
        status.ready = false;
        status.state = Some(k8s_openapi::api::core::v1::ContainerState {
            waiting: Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    for condition in creating.conditions.iter_mut().flatten() {
        if condition.type_ != "PodScheduled" {
            condition.status = "False".into();
        }
    }
    c.bench_function("status_patch/5_containers_pending_to_running", |b| {
        b.iter(|| {
            rustlet_core::patch::status_patch(
                "uid",
                Some("7"),
                black_box(&creating),
                black_box(&running),
            )
        })
    });
    // A readiness probe failing in one container of a running pod: two conditions and one
    // container status change.
    let mut unready = running.clone();
    for condition in unready.conditions.iter_mut().flatten() {
        if condition.type_ != "PodScheduled" {
            condition.status = "False".into();
        }
    }
    if let Some(first) = unready.container_statuses.iter_mut().flatten().next() {
        first.ready = false;
    }
    c.bench_function("status_patch/5_containers_one_unready", |b| {
        b.iter(|| {
            rustlet_core::patch::status_patch(
                "uid",
                Some("7"),
                black_box(&running),
                black_box(&unready),
            )
        })
    });
    c.bench_function("status_patch/5_containers_floor_trees_and_diff", |b| {
        b.iter(|| {
            let tree = |s: &PodStatus| match serde_json::to_value(s) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => unreachable!(),
            };
            rustlet_core::patch::diff_with_keys(
                &tree(black_box(&creating)),
                tree(black_box(&running)),
                &rustlet_core::patch::MERGE_KEYS,
            )
        })
    });
}

/// Drains `pods` changed pods through a fake API with 5 ms latency; returns virtual seconds and
/// API calls per change.
fn drain(config: StatusManagerConfig, count: usize) -> (f64, f64) {
    let rt = runtime(true);
    rt.block_on(async {
        let (manager, client, pods) = manager(config);
        let mut sync = ManualSync::take(&manager);
        client.set_latency(Duration::from_millis(5));
        for i in 0..count {
            let stored = client.put_pod(five_container_pod(i));
            pods.add_pod(stored.clone());
            manager.set_pod_status(&stored, five_container_status("changed"));
        }
        let start = tokio::time::Instant::now();
        sync.kick_batches().await;
        let elapsed = (tokio::time::Instant::now() - start).as_secs_f64();
        (elapsed, client.actions().len() as f64 / count as f64)
    })
}

fn drain_report() {
    let kubelet_limit = |c: StatusManagerConfig| StatusManagerConfig {
        api_qps: 50.0,
        api_burst: 100,
        ..c
    };
    let unlimited = |c: StatusManagerConfig| StatusManagerConfig {
        api_qps: f64::INFINITY,
        ..c
    };
    let rows = [
        (
            "upstream shape: GET+PATCH, 1 at a time, no client limit",
            unlimited(StatusManagerConfig::upstream()),
        ),
        (
            "rustlet: watch-cache PATCH, 16 at a time, no client limit",
            unlimited(StatusManagerConfig::default()),
        ),
        (
            "upstream shape, kubelet limit 50 QPS / 100 burst",
            kubelet_limit(StatusManagerConfig::upstream()),
        ),
        (
            "rustlet, kubelet limit 50 QPS / 100 burst",
            kubelet_limit(StatusManagerConfig::default()),
        ),
    ];
    println!("\ndrain of 1000 changed pods, fake API with 5 ms latency (virtual time)");
    println!("| configuration | time to drain | API calls per change |");
    println!("|---|---|---|");
    for (name, config) in rows {
        let (seconds, calls) = drain(config, 1000);
        println!("| {name} | {seconds:.2} s | {calls:.2} |");
    }
    println!();
}

fn main() {
    drain_report();
    let mut c = Criterion::default().configure_from_args();
    bench_set_pod_status(&mut c);
    bench_full_batch(&mut c);
    bench_status_patch(&mut c);
    c.final_summary();
}
