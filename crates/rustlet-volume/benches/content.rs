//! Content volume benchmarks (real mounts and files; run as root in a private mount namespace):
//!
//! ```sh
//! cargo xtask bench
//! # or: unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//! #     cargo bench -p rustlet-volume --features test-util --bench content
//! ```
//!
//! 1. A ConfigMap changes → its new content is visible in a mounted configMap volume: ours
//!    (the change announcement sets the volume up again at once) against upstream's shape (the
//!    periodic remount), measured in the same run. Upstream's period is 60-90 s (the pod sync);
//!    it is run here at 1 s so the run stays short: its latency is bounded by the period, so
//!    upstream's real figure is this one scaled by 60 to 90.
//! 2. One AtomicWriter update of a 10-file, 10 KiB payload against the raw write of the same
//!    bytes in place (the floor).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::PodUid;
use rustlet_mount::LinuxMounter;
use rustlet_mount::atomic_writer::{AtomicWriter, FileProjection};
use rustlet_mount::testing::privileged_dir;
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::objects::{
    ObjectChange, ObjectError, ServiceAccountToken, TokenRequestKey, VolumeObjects,
};
use rustlet_volume::plugins::builtin_plugins;
use rustlet_volume::testing::{FakePods, FakeRecorder, FakeVolumeObjects, pod_with_volumes};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Upstream's shape: the same objects, but no change is announced to the volume manager.
struct Unannounced(Arc<FakeVolumeObjects>, broadcast::Sender<ObjectChange>);

#[async_trait]
impl VolumeObjects for Unannounced {
    fn register_pod(&self, pod: &Pod) {
        self.0.register_pod(pod);
    }
    fn unregister_pod(&self, pod: &Pod) {
        self.0.unregister_pod(pod);
    }
    async fn config_map(&self, ns: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError> {
        self.0.config_map(ns, name).await
    }
    async fn secret(&self, ns: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        self.0.secret(ns, name).await
    }
    async fn persistent_volume_claim(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        self.0.persistent_volume_claim(ns, name).await
    }
    async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        self.0.persistent_volume(name).await
    }
    async fn service_account_token(
        &self,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, ObjectError> {
        self.0.service_account_token(key).await
    }
    fn forget_tokens_of(&self, pod: &PodUid) {
        self.0.forget_tokens_of(pod);
    }
    fn changes(&self) -> broadcast::Receiver<ObjectChange> {
        self.1.subscribe()
    }
}

fn config_map(value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("app".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("app.conf".into(), value.into())])),
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// Median and p99 of change → visible over `rounds` changes.
async fn change_latency(root: &Path, announced: bool, rounds: usize) -> (Duration, Duration) {
    let fake = Arc::new(FakeVolumeObjects::default());
    fake.put_config_map(config_map("v0"));
    let objects: Arc<dyn VolumeObjects> = if announced {
        fake.clone()
    } else {
        Arc::new(Unannounced(fake.clone(), broadcast::channel(1).0))
    };
    let pods = Arc::new(FakePods::default());
    let manager = Arc::new(VolumeManager::new(
        VolumeManagerDeps {
            pods: pods.clone(),
            states: pods.clone(),
            mounter: Arc::new(LinuxMounter::new()),
            plugins: builtin_plugins(),
            events: Arc::new(FakeRecorder::default()),
            node: Arc::new(rustlet_volume::node::NothingAttached),
            objects: Some(objects),
        },
        VolumeManagerConfig {
            remount_period: Duration::from_secs(1),
            ..VolumeManagerConfig::new(root)
        },
    ));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    let mut pod = (*pod_with_volumes(
        "content-pod",
        vec![Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "app".into(),
                default_mode: Some(0o644),
                ..Default::default()
            }),
            ..Default::default()
        }],
    ))
    .clone();
    pod.metadata.namespace = Some("ns".into());
    let pod = Arc::new(pod);
    pods.add(pod.clone());
    manager.pod_updated();
    manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let file = root.join("pods/content-pod/volumes/kubernetes.io~configmap/config/app.conf");
    let mut samples = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let value = format!("v{round}");
        let started = Instant::now();
        fake.put_config_map(config_map(&value));
        loop {
            if std::fs::read_to_string(&file).is_ok_and(|v| v == value) {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        samples.push(started.elapsed());
    }
    cancel.cancel();
    task.await.unwrap();
    pods.remove("content-pod");
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn payload(round: usize) -> BTreeMap<String, FileProjection> {
    (0..10)
        .map(|i| {
            let data = format!("{round:08}").repeat(128).into_bytes();
            (
                format!("file-{i}"),
                FileProjection {
                    data,
                    mode: 0o644,
                    fs_user: None,
                },
            )
        })
        .collect()
}

/// Median and p99 of one AtomicWriter update, and of the raw in-place write of the same bytes.
fn writer_cost(root: &Path, rounds: usize) -> [(Duration, Duration); 2] {
    let atomic = root.join("atomic");
    let raw = root.join("raw");
    std::fs::create_dir_all(&atomic).unwrap();
    std::fs::create_dir_all(&raw).unwrap();
    let writer = AtomicWriter::new(&atomic).unwrap();
    let mut ours = Vec::with_capacity(rounds);
    let mut floor = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let files = payload(round);
        let started = Instant::now();
        assert!(writer.write(&files).unwrap());
        ours.push(started.elapsed());
        let started = Instant::now();
        for (name, file) in &files {
            std::fs::write(raw.join(name), &file.data).unwrap();
        }
        floor.push(started.elapsed());
    }
    ours.sort();
    floor.sort();
    [
        (percentile(&ours, 0.5), percentile(&ours, 0.99)),
        (percentile(&floor, 0.5), percentile(&floor, 0.99)),
    ]
}

fn main() {
    let Some(dir) = privileged_dir("content volume benchmarks") else {
        return;
    };
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick { 3 } else { 50 };
    let root = dir.path().to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("1. ConfigMap change → new content visible in the mounted volume ({rounds} changes)");
    println!("| shape | median | p99 |");
    println!("|---|---|---|");
    let (median, p99) = rt.block_on(change_latency(&root.join("ours"), true, rounds));
    println!(
        "| rustlet (change announced) | {} | {} |",
        ms(median),
        ms(p99)
    );
    let upstream_rounds = if quick { 2 } else { 10 };
    let (median, p99) = rt.block_on(change_latency(
        &root.join("upstream"),
        false,
        upstream_rounds,
    ));
    println!(
        "| upstream's shape, periodic remount at 1 s ({upstream_rounds} changes; upstream runs it every 60-90 s) | {} | {} |",
        ms(median),
        ms(p99)
    );
    let rounds = if quick { 10 } else { 1000 };
    let [(ours_median, ours_p99), (raw_median, raw_p99)] = writer_cost(&root, rounds);
    println!("\n2. One update of a 10-file, 10 KiB payload ({rounds} updates)");
    println!("| writer | median | p99 |");
    println!("|---|---|---|");
    println!(
        "| AtomicWriter (new version, `..data` swap) | {} | {} |",
        us(ours_median),
        us(ours_p99)
    );
    println!(
        "| floor: raw write of the same bytes in place (not atomic) | {} | {} |",
        us(raw_median),
        us(raw_p99)
    );
}
