//! emptyDir (upstream `pkg/volume/emptydir`, V82-V88): a directory in the pod's volume dir, or a
//! tmpfs there for `medium: Memory`, with a `ready` marker under the pod's plugin dir.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};
use rustlet_core::PodUid;
use rustlet_core::quantity::quantity_ceil;
use rustlet_mount::{TmpfsOptions, UnmountMode, remove_all_one_filesystem};

use crate::mounter::Mounter;
use crate::plugin::{
    Made, PluginError, PodDirs, VolumeError, VolumeHost, VolumeMounter, VolumePlugin,
    VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// Upstream plugin name.
pub const PLUGIN_NAME: &str = "kubernetes.io/empty-dir";

/// The storage medium of an emptyDir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (`medium: ""`).
    Default,
    /// tmpfs (`medium: Memory`).
    Memory,
}

/// The emptyDir plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyDirPlugin;

fn memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| -> Option<u64> {
        c.resources
            .as_ref()?
            .limits
            .as_ref()?
            .get("memory")
            .and_then(quantity_ceil)
            .and_then(|v| u64::try_from(v).ok())
    };
    // Errata 3: only when every regular container declares a memory limit.
    let regular: Option<Vec<u64>> = spec.containers.iter().map(limit).collect();
    let sum: u64 = regular?.into_iter().sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(limit)
        .max()
        .unwrap_or(0);
    Some(sum.max(init))
}

/// V85: the tmpfs size of a Memory emptyDir: the pod's memory limit, else node allocatable
/// memory (a pod limit above it is ignored), lowered to `sizeLimit` when that is smaller.
pub fn memory_size(pod: &Pod, volume: &Volume, node_allocatable: Option<u64>) -> Option<u64> {
    let mut size = match (memory_limit(pod), node_allocatable) {
        (Some(pod), Some(node)) if pod > 0 => Some(pod.min(node)),
        (Some(pod), None) if pod > 0 => Some(pod),
        (_, node) => node,
    };
    let size_limit = volume
        .empty_dir
        .as_ref()?
        .size_limit
        .as_ref()
        .and_then(quantity_ceil)
        .and_then(|v| u64::try_from(v).ok());
    if let Some(limit) = size_limit.filter(|l| *l > 0)
        && size.is_none_or(|s| limit < s)
    {
        size = Some(limit);
    }
    size
}

impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.volume().is_some_and(|v| v.empty_dir.is_some())
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let invalid = |reason: &str| PluginError::invalid_spec(PLUGIN_NAME, reason);
        let volume = spec
            .volume()
            .ok_or_else(|| invalid("not an inline volume"))?;
        let source = volume
            .empty_dir
            .as_ref()
            .ok_or_else(|| invalid("no emptyDir source"))?;
        let medium = match source.medium.as_deref().unwrap_or("") {
            "" => Medium::Default,
            "Memory" => Medium::Memory,
            other => return Err(invalid(&format!("unsupported medium {other:?}"))),
        };
        let uid = PodUid::of(pod);
        Ok(Box::new(EmptyDir {
            dir: host.pod_volume_dir(&uid, PLUGIN_NAME, &volume.name)?,
            meta_dir: host.pod_plugin_dir(&uid, PLUGIN_NAME, &volume.name)?,
            medium,
            size: match medium {
                Medium::Memory => memory_size(pod, volume, host.node_allocatable_memory),
                Medium::Default => None,
            },
            mounter: host.mounter.clone(),
            ownership: crate::plugin::pod_ownership(pod, false),
        }))
    }

    /// A minimal inline spec; the medium is Memory when a tmpfs is mounted there, so that
    /// SetUp adopts it instead of mounting a second tmpfs on top.
    fn construct_volume_spec(
        &self,
        inner_name: &str,
        mount_path: &Path,
        host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        let tmpfs = host
            .mounter
            .list()
            .map_err(|e| PluginError::invalid_spec(PLUGIN_NAME, e.to_string()))?
            .iter()
            .any(|m| m.mount_point == mount_path && m.fstype == "tmpfs");
        Ok(VolumeSpec::pod(Volume {
            name: inner_name.to_owned(),
            empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                medium: tmpfs.then(|| "Memory".to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(EmptyDir {
            dir: host.pod_volume_dir(pod_uid, PLUGIN_NAME, inner_name)?,
            meta_dir: host.pod_plugin_dir(pod_uid, PLUGIN_NAME, inner_name)?,
            medium: Medium::Default,
            size: None,
            mounter: host.mounter.clone(),
            ownership: None,
        }))
    }
}

/// An emptyDir at a given directory: this plugin's, or the one a content volume (configMap,
/// secret) wraps (V92).
pub(crate) struct EmptyDir {
    pub(crate) dir: PathBuf,
    pub(crate) meta_dir: PathBuf,
    pub(crate) medium: Medium,
    pub(crate) size: Option<u64>,
    pub(crate) mounter: Arc<dyn Mounter>,
    /// The pod's fsGroup, applied when the volume is set up (V110).
    pub(crate) ownership: Option<rustlet_mount::ownership::Ownership>,
}

fn fail(what: &str, path: &Path, err: impl std::fmt::Display) -> VolumeError {
    VolumeError::Final(format!("{what} {}: {err}", path.display()))
}

impl EmptyDir {
    pub(crate) fn is_tmpfs_mount(&self) -> Result<bool, VolumeError> {
        match self.mounter.is_tmpfs_mount_point(&self.dir) {
            Ok(mounted) => Ok(mounted),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(fail("checking for a tmpfs on", &self.dir, e)),
        }
    }

    fn ready(&self) -> bool {
        self.meta_dir.join("ready").exists()
    }
}

impl VolumeMounter for EmptyDir {
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        self.set_up_in(&PodDirs::default())
    }

    fn set_up_in(&self, dirs: &PodDirs) -> Result<(), VolumeError> {
        // Issue 29: the directory is made first. A directory this call made is new: nothing is
        // mounted on it and its marker (if a stale one survived) says nothing, so the checks
        // below (a `statx` of the marker and of the directory, a `statfs` and two `stat`s of
        // the tmpfs check) are skipped; an existing one takes the checking path.
        if self.make_dir(dirs, &self.dir)? == Made::New {
            return self.set_up_new(dirs);
        }
        // V83: idempotent; a Memory volume is set up again when its tmpfs is gone (reboot).
        if self.ready() && (self.medium == Medium::Default || self.is_tmpfs_mount()?) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| fail("creating", &self.dir, e))?;
        // V84: the permission bits exactly 0777, whatever the umask; as upstream's `setupDir`,
        // the mode is set only when those bits differ, which keeps a tmpfs root's sticky bit.
        let mode = std::fs::metadata(&self.dir)
            .map_err(|e| fail("reading the mode of", &self.dir, e))?
            .permissions()
            .mode();
        if mode & 0o777 != 0o777 {
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| fail("chmod", &self.dir, e))?;
        }
        // V85: a tmpfs with no `mode=`, so its root is the kernel's 1777, as upstream's (a
        // missing subPath inside it is made with that mode: upstream's specs expect the
        // sticky bit there).
        if self.medium == Medium::Memory && !self.is_tmpfs_mount()? {
            let options = TmpfsOptions {
                size_bytes: self.size,
                mode: None,
            };
            self.mounter
                .tmpfs(&self.dir, options)
                .map_err(|e| fail("mounting tmpfs on", &self.dir, e))?;
        }
        crate::plugin::apply_ownership(&self.dir, self.ownership)?;
        std::fs::create_dir_all(&self.meta_dir).map_err(|e| fail("creating", &self.meta_dir, e))?;
        std::fs::write(self.meta_dir.join("ready"), b"")
            .map_err(|e| fail("writing the ready marker in", &self.meta_dir, e))?;
        Ok(())
    }
}

impl EmptyDir {
    /// `mkdir -p` of one of this volume's directories through the hop's [`PodDirs`]; the pod
    /// directory is the volume directory's ancestor three levels up
    /// (`pods/<uid>/volumes/<plugin>/<name>`).
    fn make_dir(&self, dirs: &PodDirs, dir: &Path) -> Result<Made, VolumeError> {
        let pod_dir = self.dir.ancestors().nth(3).unwrap_or(&self.dir);
        dirs.make(pod_dir, dir)
            .map_err(|e| fail("creating", dir, e))
    }

    /// SetUp on a directory this call made (see [`VolumeMounter::set_up`]): V84's mode, V85's
    /// tmpfs, V87's ownership and the marker, with no check of what cannot be there yet.
    fn set_up_new(&self, dirs: &PodDirs) -> Result<(), VolumeError> {
        // V84: made with 0777 less the umask; one chmod instead of a `statx` and a chmod.
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| fail("chmod", &self.dir, e))?;
        if self.medium == Medium::Memory {
            let options = TmpfsOptions {
                size_bytes: self.size,
                mode: None,
            };
            self.mounter
                .tmpfs(&self.dir, options)
                .map_err(|e| fail("mounting tmpfs on", &self.dir, e))?;
        }
        crate::plugin::apply_ownership(&self.dir, self.ownership)?;
        self.make_dir(dirs, &self.meta_dir)?;
        // The marker in one `mknod` (no open and close); one left from an earlier SetUp is
        // as good.
        let ready = self.meta_dir.join("ready");
        match nix::sys::stat::mknod(
            &ready,
            nix::sys::stat::SFlag::S_IFREG,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            0,
        ) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
            Err(e) => Err(fail("writing the ready marker in", &self.meta_dir, e)),
        }
    }
}

impl VolumeUnmounter for EmptyDir {
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    /// V88: the ready marker first; a tmpfs is unmounted; then the directory is removed
    /// without ever crossing a mount point.
    fn tear_down(&self) -> Result<(), VolumeError> {
        if self.meta_dir.exists() {
            std::fs::remove_dir_all(&self.meta_dir)
                .map_err(|e| fail("removing", &self.meta_dir, e))?;
        }
        if !crate::plugin::exists(&self.dir) {
            return Ok(());
        }
        if self.is_tmpfs_mount()? {
            self.mounter
                .unmount(&self.dir, UnmountMode::Normal)
                .map_err(|e| VolumeError::Uncertain(e.to_string()))?;
        }
        remove_all_one_filesystem(&self.dir).map_err(|e| fail("removing", &self.dir, e))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use rustlet_mount::LinuxMounter;
    use rustlet_mount::fake::FakeMounter;

    use super::*;
    use crate::testing::pod;

    fn memory_volume(name: &str, size_limit: Option<&str>) -> VolumeSpec {
        VolumeSpec::pod(Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: size_limit.map(|s| Quantity(s.into())),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn host(root: &Path, mounter: Arc<dyn Mounter>) -> VolumeHost {
        VolumeHost {
            root_dir: root.to_owned(),
            mounter,
            node_allocatable_memory: Some(8 << 30),
        }
    }

    /// Issue 24 item 1: a UID or volume name that is not one path component gets no mounter
    /// nor unmounter (a `..` UID would have `<root>/pods` as its directory, and its teardown
    /// would remove every pod's data), whatever intake let through.
    #[test]
    fn a_uid_or_volume_name_that_is_not_one_path_component_gets_no_directory() {
        let root = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let host = host(root.path(), Arc::new(fake.clone()));
        for uid in ["..", ".", "", "a/b", "a\0b"] {
            let err = EmptyDirPlugin
                .new_mounter(&crate::testing::empty_dir("cache"), &pod(uid), &host)
                .err()
                .expect("refused");
            assert!(matches!(err, PluginError::UnsafePath(_)), "{uid:?}: {err}");
            let err = EmptyDirPlugin
                .new_unmounter("cache", &PodUid::new(uid), &host)
                .err()
                .expect("refused");
            assert!(err.to_string().contains("pod UID"), "{uid:?}: {err}");
        }
        for name in ["..", "../../etc"] {
            let err = EmptyDirPlugin
                .new_unmounter(name, &PodUid::new("uid-1"), &host)
                .err()
                .expect("refused");
            assert!(err.to_string().contains("volume name"), "{name:?}: {err}");
        }
        assert!(fake.actions().is_empty(), "nothing mounted or unmounted");
    }

    #[test]
    fn v84_default_medium_is_a_0777_directory_with_a_ready_marker_and_tears_down() {
        let root = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let host = host(root.path(), Arc::new(fake.clone()));
        let p = pod("uid-1");
        let mounter = EmptyDirPlugin
            .new_mounter(&crate::testing::empty_dir("cache"), &p, &host)
            .unwrap();
        let dir = root
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
        assert_eq!(mounter.path(), dir);
        mounter.set_up().unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o777
        );
        assert!(
            root.path()
                .join("pods/uid-1/plugins/kubernetes.io~empty-dir/cache/ready")
                .exists()
        );
        std::fs::write(dir.join("data"), "kept across SetUp").unwrap();
        mounter.set_up().unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("data")).unwrap(),
            "kept across SetUp",
            "V83: idempotent"
        );
        assert!(fake.actions().is_empty(), "no mount for the default medium");

        let unmounter = EmptyDirPlugin
            .new_unmounter("cache", &PodUid::new("uid-1"), &host)
            .unwrap();
        unmounter.tear_down().unwrap();
        assert!(!dir.exists());
        assert!(
            !root
                .path()
                .join("pods/uid-1/plugins/kubernetes.io~empty-dir/cache")
                .exists()
        );
        unmounter.tear_down().unwrap();
    }

    #[test]
    fn v85_memory_medium_mounts_tmpfs_once_and_remounts_after_a_reboot() {
        let root = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let host = host(root.path(), Arc::new(fake.clone()));
        let p = pod("uid-2");
        let mounter = EmptyDirPlugin
            .new_mounter(&memory_volume("mem", Some("64Mi")), &p, &host)
            .unwrap();
        mounter.set_up().unwrap();
        mounter.set_up().unwrap();
        let mounts = fake.mounts();
        assert_eq!(mounts.len(), 1, "idempotent");
        assert_eq!(mounts[0].fstype, "tmpfs");
        assert!(mounts[0].options.contains(&format!("size={}", 64u64 << 20)));
        // The tmpfs is gone (reboot) but the ready marker is not: SetUp mounts again.
        fake.unmount(&mounter.path(), UnmountMode::Normal).unwrap();
        mounter.set_up().unwrap();
        assert_eq!(fake.mounts().len(), 1);
        EmptyDirPlugin
            .new_unmounter("mem", &PodUid::new("uid-2"), &host)
            .unwrap()
            .tear_down()
            .unwrap();
        assert!(fake.mounts().is_empty());
        assert!(!mounter.path().exists());
    }

    fn pod_with_memory_limits(limits: &[Option<&str>]) -> Pod {
        let containers = limits
            .iter()
            .enumerate()
            .map(|(i, l)| Container {
                name: format!("c{i}"),
                resources: l.map(|l| ResourceRequirements {
                    limits: Some(BTreeMap::from([("memory".to_owned(), Quantity(l.into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        Pod {
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn v85_errata3_tmpfs_size() {
        const MI: u64 = 1 << 20;
        let volume = |limit: Option<&str>| memory_volume("m", limit).volume().unwrap().clone();
        let node = Some(1024 * MI);
        // Every container limited: the sum.
        assert_eq!(
            memory_size(
                &pod_with_memory_limits(&[Some("100Mi"), Some("50Mi")]),
                &volume(None),
                node
            ),
            Some(150 * MI)
        );
        // One container unlimited: node allocatable.
        assert_eq!(
            memory_size(
                &pod_with_memory_limits(&[Some("100Mi"), None]),
                &volume(None),
                node
            ),
            Some(1024 * MI)
        );
        // A pod limit above node allocatable is ignored.
        assert_eq!(
            memory_size(&pod_with_memory_limits(&[Some("4Gi")]), &volume(None), node),
            Some(1024 * MI)
        );
        // sizeLimit lowers it.
        assert_eq!(
            memory_size(
                &pod_with_memory_limits(&[Some("100Mi")]),
                &volume(Some("10Mi")),
                node
            ),
            Some(10 * MI)
        );
        assert_eq!(
            memory_size(
                &pod_with_memory_limits(&[Some("100Mi")]),
                &volume(Some("1Gi")),
                node
            ),
            Some(100 * MI)
        );
    }

    #[test]
    fn v88_tear_down_stops_at_a_mount_point_inside_the_volume() {
        let Some(t) = rustlet_mount::testing::privileged_dir(
            "v88_tear_down_stops_at_a_mount_point_inside_the_volume",
        ) else {
            return;
        };
        let host = host(t.path(), Arc::new(LinuxMounter::new()));
        let mounter = EmptyDirPlugin
            .new_mounter(&crate::testing::empty_dir("cache"), &pod("uid-3"), &host)
            .unwrap();
        mounter.set_up().unwrap();
        let inner = mounter.path().join("someone-mounted-here");
        std::fs::create_dir(&inner).unwrap();
        let outside = t.mkdir("precious");
        std::fs::write(outside.join("data"), "user data").unwrap();
        LinuxMounter::new()
            .bind(&outside, &inner, rustlet_mount::BindAccess::ReadWrite)
            .unwrap();
        let err = EmptyDirPlugin
            .new_unmounter("cache", &PodUid::new("uid-3"), &host)
            .unwrap()
            .tear_down()
            .unwrap_err();
        assert!(err.to_string().contains("mount point"), "{err}");
        assert_eq!(
            std::fs::read_to_string(outside.join("data")).unwrap(),
            "user data"
        );
    }

    #[test]
    fn memory_empty_dir_on_a_real_tmpfs_keeps_data_across_set_up() {
        let Some(t) = rustlet_mount::testing::privileged_dir(
            "memory_empty_dir_on_a_real_tmpfs_keeps_data_across_set_up",
        ) else {
            return;
        };
        let linux = LinuxMounter::new();
        let host = host(t.path(), Arc::new(linux.clone()));
        let mounter = EmptyDirPlugin
            .new_mounter(&memory_volume("mem", Some("2Mi")), &pod("uid-4"), &host)
            .unwrap();
        mounter.set_up().unwrap();
        let fs = nix::sys::statfs::statfs(&mounter.path()).unwrap();
        assert_eq!(fs.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
        assert_eq!(fs.blocks() * fs.block_size() as u64, 2 << 20);
        // Upstream's tmpfs root: the kernel's 1777 (the sticky bit included), kept by a
        // second set-up.
        let mode = || {
            std::fs::metadata(mounter.path())
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode(), 0o1777, "{:o}", mode());
        std::fs::write(mounter.path().join("f"), "in memory").unwrap();
        mounter.set_up().unwrap();
        assert_eq!(mode(), 0o1777, "{:o}", mode());
        assert_eq!(
            std::fs::read_to_string(mounter.path().join("f")).unwrap(),
            "in memory"
        );
        assert_eq!(
            linux
                .list()
                .unwrap()
                .iter()
                .filter(|m| m.mount_point == mounter.path())
                .count(),
            1
        );
        EmptyDirPlugin
            .new_unmounter("mem", &PodUid::new("uid-4"), &host)
            .unwrap()
            .tear_down()
            .unwrap();
        assert!(!mounter.path().exists());
    }
}
