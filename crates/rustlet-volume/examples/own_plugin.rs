//! rustlet-volume as a library: a volume manager with a volume plugin of your own, on the fake
//! mounter (an in-memory mount table), so it runs anywhere without root.
//!
//! Run with `cargo run -p rustlet-volume --features test-util --example own_plugin`
//! (`test-util` brings the fake mounter and the in-memory pod source).
//!
//! The plugin serves inline CSI volumes of the driver `hello.example.com`: its SetUp mounts a
//! small tmpfs at the pod's volume directory and writes `greeting.txt` into it; its TearDown
//! unmounts and removes the directory. A pod using one comes and goes; the manager mounts the
//! volume before `wait_for_attach_and_mount` returns and unmounts it once the pod is gone.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{CSIVolumeSource, Pod, Volume};
use rustlet_core::{PodUid, UniquePodName};
use rustlet_mount::fake::FakeMounter;
use rustlet_mount::{MountPointCheck, TmpfsOptions};
use rustlet_volume::events::NoEvents;
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::node::NothingAttached;
use rustlet_volume::plugin::{VolumeError, VolumeHost, VolumeMounter, VolumeUnmounter};
use rustlet_volume::plugins::builtin_plugins;
use rustlet_volume::testing::{FakePods, pod_with_volumes};
use rustlet_volume::{Mounter, PluginError, VolumePlugin, VolumeSpec};
use tokio_util::sync::CancellationToken;

const PLUGIN: &str = "example.com/hello";
const DRIVER: &str = "hello.example.com";

/// The plugin: which volumes it serves and how to set one up and tear it down.
struct HelloPlugin;

impl VolumePlugin for HelloPlugin {
    fn name(&self) -> &str {
        PLUGIN
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.volume()
            .and_then(|v| v.csi.as_ref())
            .is_some_and(|csi| csi.driver == DRIVER)
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        Ok(Box::new(HelloVolume {
            path: host.pod_volume_dir(&PodUid::of(pod), PLUGIN, spec.name())?,
            mounter: host.mounter.clone(),
        }))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(HelloVolume {
            path: host.pod_volume_dir(pod_uid, PLUGIN, inner_name)?,
            mounter: host.mounter.clone(),
        }))
    }
}

/// One pod's volume.
struct HelloVolume {
    path: PathBuf,
    mounter: Arc<dyn Mounter>,
}

impl VolumeMounter for HelloVolume {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        let failed = |e: &dyn std::fmt::Display| VolumeError::Final(format!("hello SetUp: {e}"));
        std::fs::create_dir_all(&self.path).map_err(|e| failed(&e))?;
        // Idempotent: a second SetUp of a mounted volume changes nothing.
        if !self
            .mounter
            .is_mount_point(&self.path)
            .map_err(|e| failed(&e))?
        {
            let options = TmpfsOptions {
                size_bytes: Some(1 << 20),
                mode: Some(0o755),
            };
            self.mounter
                .tmpfs(&self.path, options)
                .map_err(|e| failed(&e))?;
        }
        std::fs::write(self.path.join("greeting.txt"), "hello from a plugin\n")
            .map_err(|e| failed(&e))
    }
}

impl VolumeUnmounter for HelloVolume {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn tear_down(&self) -> Result<(), VolumeError> {
        // Unmounts, then removes the directory only if it is empty: never across a mount.
        let _ = std::fs::remove_file(self.path.join("greeting.txt"));
        self.mounter
            .cleanup_mount_point(&self.path, MountPointCheck::Exact)
            .map_err(|e| VolumeError::Final(format!("hello TearDown: {e}")))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root = tempfile::tempdir().expect("a temp root dir");
    let fake = Arc::new(FakeMounter::new());
    let pods = Arc::new(FakePods::default());
    let mut plugins = builtin_plugins();
    plugins.register(Arc::new(HelloPlugin));

    let manager = Arc::new(VolumeManager::new(
        VolumeManagerDeps {
            pods: pods.clone(),
            states: pods.clone(),
            mounter: fake.clone(),
            plugins,
            events: Arc::new(NoEvents),
            node: Arc::new(NothingAttached),
            objects: None,
        },
        VolumeManagerConfig::new(root.path()),
    ));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));

    // A pod with one volume of the plugin's driver arrives.
    let pod = pod_with_volumes(
        "uid-1",
        vec![Volume {
            name: "greeting".to_owned(),
            csi: Some(CSIVolumeSource {
                driver: DRIVER.to_owned(),
                ..CSIVolumeSource::default()
            }),
            ..Volume::default()
        }],
    );
    pods.add(pod.clone());
    manager.pod_updated();
    manager
        .wait_for_attach_and_mount(&pod)
        .await
        .expect("the volume is mounted");

    let name = UniquePodName::from(PodUid::of(&pod));
    for (outer, info) in manager.get_mounted_volumes_for_pod(&name) {
        println!(
            "mounted {outer} ({}) at {}",
            info.volume_name,
            info.path.display()
        );
        let greeting = std::fs::read_to_string(info.path.join("greeting.txt"))
            .expect("the plugin wrote its file");
        print!("  greeting.txt: {greeting}");
    }
    for m in fake.mounts() {
        println!("fake mount table: {m:?}");
    }
    assert_eq!(fake.mounts().len(), 1);

    // The pod stops and goes: the manager tears the volume down.
    pods.set_terminating("uid-1");
    pods.set_runtime_removed("uid-1");
    pods.remove("uid-1");
    manager.pod_updated();
    manager
        .wait_for_unmount(&pod)
        .await
        .expect("the volume is unmounted");
    println!("after the pod left: {} mounts", fake.mounts().len());
    assert!(fake.mounts().is_empty());

    cancel.cancel();
    task.await.expect("the manager stops cleanly");
}
