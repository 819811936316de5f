//! Volume plugins and the plugin manager (upstream `volume.VolumePlugin`,
//! `VolumePluginMgr.FindPluginBySpec`).
//!
//! This part is what the caches need: which plugin serves a spec, whether it is attachable or
//! device-mountable (which decides whether pods share a volume entry), and whether it needs a
//! periodic remount. SetUp and TearDown come with the reconciler.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use rustlet_core::{PodUid, UniquePodName, UniqueVolumeName, UnsafePathComponent, path_component};

use crate::mounter::Mounter;
use crate::spec::VolumeSpec;

/// What plugins get from the agent (upstream `VolumeHost`): the root directory and the mount
/// backend.
#[derive(Clone)]
pub struct VolumeHost {
    /// The agent's root directory (upstream `/var/lib/kubelet`).
    pub root_dir: PathBuf,
    /// The mount backend.
    pub mounter: Arc<dyn Mounter>,
    /// The node's allocatable memory in bytes, the size of a Memory emptyDir whose pod has no
    /// memory limit (V85).
    pub node_allocatable_memory: Option<u64>,
}

impl std::fmt::Debug for VolumeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeHost")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl VolumeHost {
    /// `<root>/pods/<uid>`; refused for a UID that is not one path component.
    pub fn pod_dir(&self, pod_uid: &PodUid) -> Result<PathBuf, UnsafePathComponent> {
        Ok(self.pod_path(pod_uid.as_path_component()?, 0))
    }

    /// `<root>/pods/<uid>` with room for `more` bytes after it: every path of a pod is built by
    /// pushes into one allocation (issue 29: each `join` copied the whole path into a new one,
    /// five times for each directory of each volume of a storm's pods).
    fn pod_path(&self, uid: &str, more: usize) -> PathBuf {
        let root = self.root_dir.as_os_str().len();
        let mut dir = PathBuf::with_capacity(root + "/pods/".len() + uid.len() + more);
        dir.push(&self.root_dir);
        dir.push("pods");
        dir.push(uid);
        dir
    }

    /// `<root>/pods/<uid>/volumes/<escaped plugin>/<inner name>`: where a volume is mounted.
    pub fn pod_volume_dir(
        &self,
        pod_uid: &PodUid,
        plugin: &str,
        inner_name: &str,
    ) -> Result<PathBuf, UnsafePathComponent> {
        self.pod_subdir(pod_uid, "volumes", plugin, inner_name)
    }

    /// `<root>/plugins/<plugin>/mounts/<volume>`: the global (device) mount path of an
    /// attachable volume, upstream's in-tree layout.
    pub fn plugin_global_mount_dir(&self, plugin: &str, volume: &str) -> PathBuf {
        self.root_dir
            .join("plugins")
            .join(plugin)
            .join("mounts")
            .join(volume)
    }

    /// `<root>/pods/<uid>/plugins/<escaped plugin>/<inner name>`: per-pod plugin state.
    pub fn pod_plugin_dir(
        &self,
        pod_uid: &PodUid,
        plugin: &str,
        inner_name: &str,
    ) -> Result<PathBuf, UnsafePathComponent> {
        self.pod_subdir(pod_uid, "plugins", plugin, inner_name)
    }

    /// `<root>/pods/<uid>/<kind>/<escaped plugin>/<inner name>`.
    fn pod_subdir(
        &self,
        pod_uid: &PodUid,
        kind: &str,
        plugin: &str,
        inner_name: &str,
    ) -> Result<PathBuf, UnsafePathComponent> {
        let uid = pod_uid.as_path_component()?;
        let name = path_component("volume name", inner_name)?;
        let mut dir = self.pod_path(uid, kind.len() + plugin.len() + name.len() + 3);
        dir.push(kind);
        push_escaped_plugin_name(&mut dir, plugin);
        dir.push(name);
        Ok(dir)
    }
}

/// Pushes [`escape_plugin_name`] of `plugin` onto `dir` as one component, without a `String`
/// of its own.
fn push_escaped_plugin_name(dir: &mut PathBuf, plugin: &str) {
    let mut parts = plugin.split('/');
    dir.push(parts.next().unwrap_or_default());
    for part in parts {
        let text = dir.as_mut_os_string();
        text.push("~");
        text.push(part);
    }
}

/// A failed SetUp or TearDown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// Nothing was left mounted; retrying after the cause is fixed helps.
    #[error("{0}")]
    Final(String),
    /// Something may have been left mounted (the outcome is unknown): the volume is recorded as
    /// uncertain, mounted again before use and torn down before removal.
    #[error("{0}")]
    Uncertain(String),
}

/// Sets a volume up for one pod (upstream `volume.Mounter`).
pub trait VolumeMounter: Send + Sync {
    /// Where the volume appears for the pod (what the runtime bind-mounts into containers).
    fn path(&self) -> PathBuf;
    /// Makes the volume ready at [`Self::path`]. Idempotent.
    fn set_up(&self) -> Result<(), VolumeError>;
    /// [`Self::set_up`] as one of a pod's SetUps run together, `dirs` knowing which of the
    /// pod's directories the earlier ones made (issue 29: each made once, no probing).
    fn set_up_in(&self, dirs: &PodDirs) -> Result<(), VolumeError> {
        let _ = dirs;
        self.set_up()
    }
}

/// Whether [`PodDirs::make`] made a directory or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// This call made it (mode 0777 before the umask).
    New,
    /// It was there (a directory or not: the caller's checks say).
    Existed,
}

/// The directories one blocking-pool hop of a pod's SetUps made (issue 29), so that each is
/// made once with one `mkdir` and none is probed: the first directory asked for under
/// `pods/<uid>` makes the pod directory; when that is new, everything under it is known to be
/// missing and is made top-down, each component once. When the pod directory was there (a
/// later hop, a restart), a directory is tried with one `mkdir` and its parents made only
/// when it says they are missing. Per hop, on one thread; never shared.
#[derive(Debug, Default)]
pub struct PodDirs {
    /// Directories known to be there (made by this hop, or the pod directory found).
    made: std::cell::RefCell<Vec<PathBuf>>,
    /// Pod directories this hop made: nothing under them existed.
    new_pods: std::cell::RefCell<Vec<PathBuf>>,
    /// `mkdir` calls made.
    mkdirs: std::cell::Cell<usize>,
}

impl PodDirs {
    /// The `mkdir` calls this hop made.
    pub fn mkdirs(&self) -> usize {
        self.mkdirs.get()
    }

    fn mkdir_once(&self, dir: &Path) -> std::io::Result<Made> {
        self.mkdirs.set(self.mkdirs.get() + 1);
        mkdir_once(dir)
    }
}

fn mkdir_once(dir: &Path) -> std::io::Result<Made> {
    match std::fs::DirBuilder::new().create(dir) {
        Ok(()) => Ok(Made::New),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Made::Existed),
        Err(e) => Err(e),
    }
}

impl PodDirs {
    /// `mkdir -p dir` with mode 0777 (less the umask), `pod_dir` its pod's directory
    /// (`pods/<uid>`, an ancestor of `dir`; otherwise `dir` is made as if no hop knew it).
    pub fn make(&self, pod_dir: &Path, dir: &Path) -> std::io::Result<Made> {
        let Ok(below) = dir.strip_prefix(pod_dir) else {
            return self.probe(dir);
        };
        if !self.made.borrow().iter().any(|d| d == pod_dir) {
            if self.probe(pod_dir)? == Made::New {
                self.new_pods.borrow_mut().push(pod_dir.to_owned());
            }
            self.made.borrow_mut().push(pod_dir.to_owned());
        }
        if below.as_os_str().is_empty() {
            return Ok(Made::Existed);
        }
        let fresh = self.new_pods.borrow().iter().any(|d| d == pod_dir);
        let known = |d: &Path| self.made.borrow().iter().any(|m| m == d);
        if !fresh && !dir.parent().is_some_and(known) {
            let made = self.probe(dir)?;
            self.made.borrow_mut().push(dir.to_owned());
            return Ok(made);
        }
        // Top-down from the pod directory, each missing component once (`EEXIST` is another
        // hop of the same pod, running at the same time).
        let mut path = pod_dir.to_owned();
        let mut last = Made::Existed;
        for component in below.components() {
            path.push(component);
            if known(&path) {
                last = Made::Existed;
                continue;
            }
            last = self.mkdir_once(&path)?;
            self.made.borrow_mut().push(path.clone());
        }
        Ok(last)
    }

    /// One `mkdir`; its parents made (`MkdirAll`) only when it says they are missing.
    fn probe(&self, dir: &Path) -> std::io::Result<Made> {
        match self.mkdir_once(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = dir.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                self.mkdir_once(dir)
            }
            other => other,
        }
    }
}

/// Tears a volume down for one pod (upstream `volume.Unmounter`); works from the name alone,
/// so that reconstructed volumes can be torn down.
pub trait VolumeUnmounter: Send + Sync {
    /// Where the volume is.
    fn path(&self) -> PathBuf;
    /// Unmounts and removes what SetUp made. Idempotent; never removes across a mount point.
    fn tear_down(&self) -> Result<(), VolumeError>;
}

/// The device side of an attachable or device-mountable plugin (upstream `Attacher` +
/// `DeviceMounter` + `DeviceUnmounter`): the volume is attached to the node by the attach/detach
/// controller, then mounted once at a global path that every pod's SetUp binds from.
pub trait DeviceMounter: Send + Sync {
    /// Waits until the device the node status names is usable; returns its path
    /// (upstream `WaitForAttach`).
    fn wait_for_attach(&self, spec: &VolumeSpec, device_path: &str) -> Result<String, VolumeError>;
    /// The global mount path of the volume (upstream `GetDeviceMountPath`).
    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf, VolumeError>;
    /// Mounts the device at the global path (upstream `MountDevice`). Idempotent.
    fn mount_device(
        &self,
        spec: &VolumeSpec,
        device_path: &str,
        device_mount_path: &Path,
    ) -> Result<(), VolumeError>;
    /// Unmounts the global path (upstream `UnmountDevice`).
    fn unmount_device(&self, device_mount_path: &Path) -> Result<(), VolumeError>;
}

/// The pod's fsGroup ownership for a volume (V110), if it asks for one.
pub fn pod_ownership(pod: &Pod, read_only: bool) -> Option<rustlet_mount::ownership::Ownership> {
    use rustlet_mount::ownership::{ChangePolicy, Ownership};
    let context = pod.spec.as_ref()?.security_context.as_ref()?;
    let gid = u32::try_from(context.fs_group?).ok()?;
    let policy = match context.fs_group_change_policy.as_deref() {
        Some("OnRootMismatch") => ChangePolicy::OnRootMismatch,
        _ => ChangePolicy::Always,
    };
    Some(Ownership {
        gid,
        read_only,
        policy,
    })
}

/// Applies [`pod_ownership`] to a volume directory; one bad entry is logged by the walk, a
/// volume that cannot be opened fails the SetUp.
pub fn apply_ownership(
    dir: &Path,
    ownership: Option<rustlet_mount::ownership::Ownership>,
) -> Result<(), VolumeError> {
    let Some(ownership) = ownership else {
        return Ok(());
    };
    rustlet_mount::ownership::set_volume_ownership(dir, ownership)
        .map(drop)
        .map_err(|e| {
            VolumeError::Final(format!(
                "setting fsGroup ownership of {}: {e}",
                dir.display()
            ))
        })
}

/// A path helper for plugins and tests.
pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Why no single plugin serves a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// Upstream: `no volume plugin matched`.
    #[error("no volume plugin matched name: {0}")]
    NoPlugin(String),
    /// Upstream: `multiple volume plugins matched`.
    #[error("multiple volume plugins matched: {0}")]
    MultiplePlugins(String),
    /// The plugin does not implement this operation.
    #[error("plugin {plugin} does not support {operation}")]
    Unsupported {
        /// The plugin.
        plugin: String,
        /// The operation.
        operation: &'static str,
    },
    /// The pod's UID or the volume's name cannot name a directory.
    #[error(transparent)]
    UnsafePath(#[from] UnsafePathComponent),
    /// The spec is not one this plugin can serve.
    #[error("invalid volume spec for plugin {plugin}: {reason}")]
    InvalidSpec {
        /// The plugin.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The plugin could not name the volume.
    #[error("failed to get volume name of {volume} from plugin {plugin}: {reason}")]
    VolumeName {
        /// The spec name.
        volume: String,
        /// The plugin.
        plugin: String,
        /// Why.
        reason: String,
    },
}

impl PluginError {
    /// [`PluginError::InvalidSpec`] from `plugin`.
    pub fn invalid_spec(plugin: &str, reason: impl Into<String>) -> Self {
        Self::InvalidSpec {
            plugin: plugin.to_owned(),
            reason: reason.into(),
        }
    }
}

/// A volume plugin, as the caches see it.
pub trait VolumePlugin: Send + Sync {
    /// The plugin name, e.g. `kubernetes.io/empty-dir`.
    fn name(&self) -> &str;
    /// Whether this plugin serves the spec.
    fn can_support(&self, spec: &VolumeSpec) -> bool;
    /// Attachable plugins attach the volume to the node first; pods then share one entry.
    fn is_attachable(&self) -> bool {
        false
    }
    /// Device-mountable plugins mount a global (staging) path first; pods then share one entry.
    fn is_device_mountable(&self) -> bool {
        false
    }
    /// Whether containers always mount it read-only (upstream `GetAttributes().ReadOnly`:
    /// configMap, secret, downwardAPI, projected).
    fn mounts_read_only(&self) -> bool {
        false
    }
    /// Whether SetUp must run again periodically (configMap, secret, projected, downwardAPI).
    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        false
    }
    /// The volume's name within the plugin, shared by every pod (upstream `GetVolumeName`).
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String, PluginError> {
        Ok(spec.name().to_owned())
    }

    /// A mounter for this spec and pod (upstream `NewMounter`).
    fn new_mounter(
        &self,
        _spec: &VolumeSpec,
        _pod: &Pod,
        _host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        Err(PluginError::Unsupported {
            plugin: self.name().to_owned(),
            operation: "NewMounter",
        })
    }

    /// Rebuilds a spec from what is on disk after a restart (upstream `ConstructVolumeSpec`):
    /// enough to tear the volume down, or to adopt it when its pod comes back.
    fn construct_volume_spec(
        &self,
        _inner_name: &str,
        _mount_path: &Path,
        _host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        Err(PluginError::Unsupported {
            plugin: self.name().to_owned(),
            operation: "ConstructVolumeSpec",
        })
    }

    /// The device side, for attachable or device-mountable plugins.
    fn new_device_mounter(
        &self,
        _host: &VolumeHost,
    ) -> Result<Box<dyn DeviceMounter>, PluginError> {
        Err(PluginError::Unsupported {
            plugin: self.name().to_owned(),
            operation: "NewDeviceMounter",
        })
    }

    /// An unmounter for the volume with this inner name in this pod (upstream `NewUnmounter`).
    fn new_unmounter(
        &self,
        _inner_name: &str,
        _pod_uid: &PodUid,
        _host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Err(PluginError::Unsupported {
            plugin: self.name().to_owned(),
            operation: "NewUnmounter",
        })
    }
}

/// The registered plugins.
#[derive(Clone, Default)]
pub struct PluginManager {
    plugins: Vec<Arc<dyn VolumePlugin>>,
}

impl std::fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|p| p.name()))
            .finish()
    }
}

impl PluginManager {
    /// A manager over these plugins.
    pub fn new(plugins: Vec<Arc<dyn VolumePlugin>>) -> Self {
        Self { plugins }
    }

    /// Adds a plugin (an agent's own, next to the built-in ones).
    pub fn register(&mut self, plugin: Arc<dyn VolumePlugin>) {
        self.plugins.push(plugin);
    }

    /// The one plugin that serves `spec` (upstream `FindPluginBySpec`).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume};
    /// use rustlet_volume::{VolumeSpec, plugins::builtin_plugins};
    ///
    /// let spec = VolumeSpec::pod(Volume {
    ///     name: "logs".into(),
    ///     host_path: Some(HostPathVolumeSource { path: "/var/log".into(), ..Default::default() }),
    ///     ..Volume::default()
    /// });
    /// let plugin = builtin_plugins().find_by_spec(&spec).unwrap();
    /// assert_eq!(plugin.name(), "kubernetes.io/host-path");
    /// // No plugin serves a volume without a source.
    /// let bare = VolumeSpec::pod(Volume { name: "bare".into(), ..Volume::default() });
    /// assert!(builtin_plugins().find_by_spec(&bare).is_err());
    /// ```
    pub fn find_by_spec(&self, spec: &VolumeSpec) -> Result<Arc<dyn VolumePlugin>, PluginError> {
        let mut matches = self.plugins.iter().filter(|p| p.can_support(spec));
        let first = matches
            .next()
            .ok_or_else(|| PluginError::NoPlugin(spec.name().to_owned()))?;
        let rest: Vec<&str> = matches.map(|p| p.name()).collect();
        if !rest.is_empty() {
            let mut names = vec![first.name()];
            names.extend(rest);
            return Err(PluginError::MultiplePlugins(names.join(",")));
        }
        Ok(first.clone())
    }

    /// A plugin by name.
    pub fn find_by_name(&self, name: &str) -> Option<Arc<dyn VolumePlugin>> {
        self.plugins.iter().find(|p| p.name() == name).cloned()
    }
}

/// The unique name of a volume for a pod (section 2.1): shared (`<plugin>/<volume name>`) for
/// attachable or device-mountable plugins, per pod (`<plugin>/<pod uid>-<spec name>`) otherwise.
pub fn unique_volume_name(
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    pod: &UniquePodName,
) -> Result<UniqueVolumeName, PluginError> {
    if plugin.is_attachable() || plugin.is_device_mountable() {
        Ok(UniqueVolumeName::for_plugin(
            plugin.name(),
            &plugin.volume_name(spec)?,
        ))
    } else {
        Ok(UniqueVolumeName::for_pod(plugin.name(), pod, spec.name()))
    }
}

/// Upstream `EscapeQualifiedName`: `/` becomes `~`, for directory names.
pub fn escape_plugin_name(name: &str) -> String {
    name.replace('/', "~")
}

/// Upstream `UnescapeQualifiedName`.
pub fn unescape_plugin_name(name: &str) -> String {
    name.replace('~', "/")
}

#[cfg(test)]
mod pod_path_tests {
    use std::sync::Arc;

    use rustlet_mount::fake::FakeMounter;

    use super::*;

    fn host(root: &str) -> VolumeHost {
        VolumeHost {
            root_dir: PathBuf::from(root),
            mounter: Arc::new(FakeMounter::default()),
            node_allocatable_memory: None,
        }
    }

    /// The same text as `Path::join` of each component (compared as text: `Path` equality
    /// would not see a doubled separator).
    #[test]
    fn a_pods_paths_are_the_joined_components_of_the_kubelets_layout() {
        let uid = PodUid::new("0a1b-2c3d");
        let text = |p: &Path| p.to_str().unwrap().to_owned();
        for root in [
            "/var/lib/rustlet",
            "/var/lib/rustlet/",
            "relative/root",
            "/",
        ] {
            let host = host(root);
            let pod = Path::new(root).join("pods").join("0a1b-2c3d");
            assert_eq!(text(&host.pod_dir(&uid).unwrap()), text(&pod));
            for plugin in [
                "kubernetes.io/empty-dir",
                "a/b/c",
                "plain",
                "/lead",
                "trail/",
            ] {
                let escaped = escape_plugin_name(plugin);
                for name in ["disk", "vol.with.dots", "~tilde"] {
                    for (kind, made) in [
                        ("volumes", host.pod_volume_dir(&uid, plugin, name)),
                        ("plugins", host.pod_plugin_dir(&uid, plugin, name)),
                    ] {
                        let joined = pod.join(kind).join(&escaped).join(name);
                        assert_eq!(
                            text(&made.unwrap()),
                            text(&joined),
                            "{root} {plugin} {name}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_pods_paths_refuse_a_uid_or_volume_name_that_is_not_one_component() {
        let host = host("/root");
        let good = PodUid::new("u");
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            let uid = PodUid::new(bad);
            assert!(host.pod_dir(&uid).is_err(), "{bad:?}");
            assert!(host.pod_volume_dir(&uid, "p/q", "v").is_err(), "{bad:?}");
            assert!(host.pod_plugin_dir(&good, "p/q", bad).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod pod_dirs_tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use rustlet_mount::fake::FakeMounter;

    use super::*;
    use crate::plugins::empty_dir::EmptyDirPlugin;
    use crate::testing::{empty_dir, pod};

    /// Issue 29: a new pod's emptyDirs (one on disk, one Memory) set up in one hop make each
    /// directory of the layout once: the pod directory, `volumes`, `plugins`, their plugin
    /// directories and the two volumes' directories in each, nine `mkdir`s and no other
    /// (none meets `EEXIST` or `ENOENT`); the result is V82-V85's.
    #[test]
    fn a_new_pods_directories_are_each_made_once_in_one_hop() {
        let root = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let host = VolumeHost {
            root_dir: root.path().to_owned(),
            mounter: Arc::new(fake.clone()),
            node_allocatable_memory: Some(64 << 20),
        };
        let memory = VolumeSpec::pod(k8s_openapi::api::core::v1::Volume {
            name: "mem".into(),
            empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let p = pod("uid-1");
        let dirs = PodDirs::default();
        // `pods/` itself is the root's, made before: only the pod's layout is counted.
        std::fs::create_dir(root.path().join("pods")).unwrap();
        for spec in [empty_dir("disk"), memory] {
            let mounter = EmptyDirPlugin.new_mounter(&spec, &p, &host).unwrap();
            mounter.set_up_in(&dirs).unwrap();
        }
        assert_eq!(dirs.mkdirs(), 9, "each directory made once, none probed");
        let pod_dir = root.path().join("pods/uid-1");
        for name in ["disk", "mem"] {
            let dir = pod_dir.join("volumes/kubernetes.io~empty-dir").join(name);
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o777, "V84: {name}");
            assert!(
                pod_dir
                    .join("plugins/kubernetes.io~empty-dir")
                    .join(name)
                    .join("ready")
                    .is_file(),
                "V83: {name}'s marker"
            );
        }
        assert!(
            fake.is_tmpfs_mount_point(&pod_dir.join("volumes/kubernetes.io~empty-dir/mem"))
                .unwrap(),
            "V85"
        );
        // A later hop of the same pod (a volume added since): one `mkdir` finds the pod
        // directory, one makes the volume's, one its metadata directory.
        let later = PodDirs::default();
        let mounter = EmptyDirPlugin
            .new_mounter(&empty_dir("later"), &p, &host)
            .unwrap();
        mounter.set_up_in(&later).unwrap();
        assert_eq!(later.mkdirs(), 3);
        // Set up again (idempotent, V83): nothing is made.
        let again = PodDirs::default();
        let mounter = EmptyDirPlugin
            .new_mounter(&empty_dir("disk"), &p, &host)
            .unwrap();
        mounter.set_up_in(&again).unwrap();
        assert_eq!(fake.actions().len(), 1, "the tmpfs mounted once");
    }

    /// A directory outside the pod's, or a pod directory that is there, is made as `mkdir -p`
    /// would: its parents only when it says they are missing.
    #[test]
    fn outside_a_new_pod_directories_are_tried_once_then_made_with_their_parents() {
        let root = tempfile::tempdir().unwrap();
        let dirs = PodDirs::default();
        let pod_dir = root.path().join("pods/uid-1");
        std::fs::create_dir_all(pod_dir.join("volumes")).unwrap();
        assert_eq!(
            dirs.make(&pod_dir, &pod_dir.join("volumes/a")).unwrap(),
            Made::New
        );
        assert_eq!(dirs.mkdirs(), 2, "the pod directory found, the volume made");
        assert_eq!(
            dirs.make(&pod_dir, &pod_dir.join("volumes/a")).unwrap(),
            Made::Existed
        );
        let elsewhere = root.path().join("x/y");
        assert_eq!(dirs.make(&pod_dir, &elsewhere).unwrap(), Made::New);
        assert!(elsewhere.is_dir());
    }
}
