//! Container mounts and subPath safety (upstream `kubelet_pods.go` `makeMounts` and
//! `pkg/volume/util/subpath`, V105-V108): what a runtime binds into a container. A `subPath`
//! (or a `subPathExpr` expanded with the container's env) is created if missing without
//! following a symlink, resolved once, pinned by an fd and bind-mounted from that fd onto
//! `pods/<uid>/volume-subpaths/<volume>/<container>/<index>` (the mount crate's
//! `prepare_subpath`), so a symlink swapped in by a container can never redirect it
//! (CVE-2017-1002101, CVE-2021-25741). The unmount of a volume cleans its subpath binds first.
//! Each mount's propagation (`translateMountPropagation`; `Bidirectional` only for a
//! privileged container) and recursive read-only mode (`resolveRecursiveReadOnly`) are
//! resolved here too.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, VolumeMount};
use rustlet_mount::safe_path::plain_components;
use rustlet_mount::{MountPointCheck, Subpath, create_dir_all_beneath};

use tracing::warn;

use crate::mounter::Mounter;

/// A mount the runtime makes in a container (upstream `kubecontainer.Mount`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMount {
    /// The volume's name in the pod.
    pub name: String,
    /// Where it appears in the container.
    pub container_path: String,
    /// What to bind: the volume's directory, or the prepared subpath target.
    pub host_path: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
    /// Mounted recursively read-only (upstream `RecursiveReadOnly`, [`resolve_recursive_read_only`]).
    pub recursive_read_only: bool,
    /// How mounts propagate between the host and the container.
    pub propagation: MountPropagation,
}

/// A mount's propagation (upstream `translateMountPropagation`: the CRI's three modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MountPropagation {
    /// No propagation either way (`None`, or unset).
    #[default]
    Private,
    /// Mounts made on the host below the volume appear in the container (`rslave`).
    HostToContainer,
    /// Both ways (`rshared`): mounts the container makes below the volume appear on the host
    /// (in the volume's directory) and in the pod's other containers.
    Bidirectional,
}

impl MountPropagation {
    /// The spec's `mountPropagation` (upstream `translateMountPropagation`).
    pub fn of(mode: Option<&str>) -> Result<Self, String> {
        match mode {
            None | Some("None") => Ok(Self::Private),
            Some("HostToContainer") => Ok(Self::HostToContainer),
            Some("Bidirectional") => Ok(Self::Bidirectional),
            Some(other) => Err(other.to_owned()),
        }
    }
}

/// Why a mount's recursive read-only mode cannot be honoured (upstream
/// `resolveRecursiveReadOnly`'s errors, word for word).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecursiveReadOnlyError {
    /// Recursive read-only on a writable mount.
    #[error("volume {0:?} requested recursive read-only mode, but it is not read-only")]
    NotReadOnly(String),
    /// Recursive read-only with propagation.
    #[error(
        "volume {volume:?} requested recursive read-only mode, but it is not compatible with propagation {propagation:?}"
    )]
    Propagation {
        /// The volume.
        volume: String,
        /// The mount's `mountPropagation`.
        propagation: String,
    },
    /// `Enabled` on a runtime (handler) without the feature.
    #[error(
        "volume {0:?} requested recursive read-only mode, but it is not supported by the runtime"
    )]
    Unsupported(String),
    /// Neither `Enabled`, `IfPossible` nor `Disabled`.
    #[error("unknown recursive read-only mode {0:?}")]
    UnknownMode(String),
}

/// Upstream `resolveRecursiveReadOnly`: whether `mount` is made recursively read-only, on a
/// runtime that does (`runtime_supports_rro`) or does not support it.
pub fn resolve_recursive_read_only(
    mount: &VolumeMount,
    runtime_supports_rro: bool,
) -> Result<bool, RecursiveReadOnlyError> {
    let mode = match mount.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    if !mount.read_only.unwrap_or(false) {
        return Err(RecursiveReadOnlyError::NotReadOnly(mount.name.clone()));
    }
    if let Some(propagation) = mount.mount_propagation.as_deref().filter(|p| *p != "None") {
        return Err(RecursiveReadOnlyError::Propagation {
            volume: mount.name.clone(),
            propagation: propagation.to_owned(),
        });
    }
    match mode {
        "IfPossible" => Ok(runtime_supports_rro),
        "Enabled" if runtime_supports_rro => Ok(true),
        "Enabled" => Err(RecursiveReadOnlyError::Unsupported(mount.name.clone())),
        other => Err(RecursiveReadOnlyError::UnknownMode(other.to_owned())),
    }
}

/// Whether the container runs privileged (`securityContext.privileged`).
fn privileged(container: &Container) -> bool {
    container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

/// Why a container's mounts cannot be made (the container then waits with
/// `CreateContainerConfigError`, as upstream's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContainerMountError {
    /// The volume is not mounted (or not in the pod).
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    VolumeNotMounted {
        /// The volume.
        volume: String,
        /// The container.
        container: String,
    },
    /// The subpath is not plain, escapes the volume, or could not be bound. As upstream, the
    /// message names no host path (the detail is logged).
    #[error(
        "failed to prepare subPath for volumeMount {mount:?} of container {container:?}{}",
        reason_suffix(reason)
    )]
    SubPath {
        /// The volumeMount's name.
        mount: String,
        /// The container.
        container: String,
        /// Why, when it names no host path.
        reason: Option<String>,
    },
    /// The pod's UID cannot name its directory.
    #[error(transparent)]
    UnsafePath(#[from] rustlet_core::UnsafePathComponent),
    /// The preparation was cancelled before it finished (the runtime is shutting down).
    #[error("preparing the mounts of container {container:?} was interrupted")]
    Interrupted {
        /// The container.
        container: String,
    },
    /// The mount's `mountPropagation` is none of the API's modes.
    #[error("invalid MountPropagation mode: {0:?}")]
    InvalidPropagation(String),
    /// `Bidirectional` propagation from a container that is not privileged (the API server's
    /// validation refuses it; a pod from a file is refused here, so that no such container
    /// ever propagates a mount to the host).
    #[error(
        "volume {mount:?} of container {container:?}: Bidirectional mount propagation is available only to privileged containers"
    )]
    BidirectionalUnprivileged {
        /// The volumeMount's name.
        mount: String,
        /// The container.
        container: String,
    },
    /// The recursive read-only mode cannot be honoured.
    #[error("failed to resolve recursive read-only mode: {0}")]
    RecursiveReadOnly(#[from] RecursiveReadOnlyError),
    /// The missing subpath directory could not be created.
    #[error(
        "failed to create subPath directory for volumeMount {mount:?} of container {container:?}"
    )]
    CreateDir {
        /// The volumeMount's name.
        mount: String,
        /// The container.
        container: String,
    },
}

fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_ref()
        .map_or_else(String::new, |r| format!(": {r}"))
}

/// `$(VAR)` from the container's literal env values; `$$(VAR)` stays `$(VAR)` (upstream
/// `expansion.Expand`). An unknown variable stays as written.
pub fn expand_subpath_expr(expr: &str, container: &Container) -> String {
    let lookup = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `<pod dir>/volume-subpaths/<volume>/<container>/<index>`.
pub fn subpath_target(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir
        .join("volume-subpaths")
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// The mounts of one container (upstream `makeMounts`): `volumes` maps a pod volume's name to
/// its mounted directory and whether it must be mounted read-only; `runtime_supports_rro`:
/// whether the runtime supports recursive read-only mounts.
pub fn make_mounts(
    container: &Container,
    volumes: &dyn Fn(&str) -> Option<(PathBuf, bool)>,
    pod_dir: &Path,
    mounter: &dyn Mounter,
    runtime_supports_rro: bool,
) -> Result<Vec<ContainerMount>, ContainerMountError> {
    let mut out = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let (volume_path, must_mount_ro) =
            volumes(&mount.name).ok_or_else(|| ContainerMountError::VolumeNotMounted {
                volume: mount.name.clone(),
                container: container.name.clone(),
            })?;
        // Resolved before a subPath is bound, so that a refused mount leaves nothing behind.
        let propagation = MountPropagation::of(mount.mount_propagation.as_deref())
            .map_err(ContainerMountError::InvalidPropagation)?;
        if propagation == MountPropagation::Bidirectional && !privileged(container) {
            return Err(ContainerMountError::BidirectionalUnprivileged {
                mount: mount.name.clone(),
                container: container.name.clone(),
            });
        }
        let recursive_read_only = resolve_recursive_read_only(mount, runtime_supports_rro)?;
        let sub_path = match (&mount.sub_path, &mount.sub_path_expr) {
            (Some(p), _) if !p.is_empty() => Some(p.clone()),
            (_, Some(e)) if !e.is_empty() => Some(expand_subpath_expr(e, container)),
            _ => None,
        };
        let subpath_error = |reason: Option<String>| ContainerMountError::SubPath {
            mount: mount.name.clone(),
            container: container.name.clone(),
            reason,
        };
        let host_path = match sub_path {
            None => volume_path,
            Some(sub_path) => {
                let rel = Path::new(&sub_path);
                plain_components(rel).map_err(|_| {
                    subpath_error(Some(format!(
                        "the subPath {sub_path:?} must be relative and must not contain '..'"
                    )))
                })?;
                // V106: a missing subpath is created beneath the volume, never through a
                // symlink, with the volume root's mode.
                if std::fs::symlink_metadata(volume_path.join(rel)).is_err() {
                    let mode = std::fs::metadata(&volume_path)
                        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                        .unwrap_or(0o755);
                    create_dir_all_beneath(&volume_path, rel, mode).map_err(|_| {
                        ContainerMountError::CreateDir {
                            mount: mount.name.clone(),
                            container: container.name.clone(),
                        }
                    })?;
                }
                let target = subpath_target(pod_dir, &mount.name, &container.name, index);
                let subpath = Subpath {
                    volume_path: volume_path.clone(),
                    path: rel.to_owned(),
                    target: target.clone(),
                };
                mounter.prepare_subpath(&subpath).map_err(|e| {
                    warn!(volume = %mount.name, container = %container.name, error = %e, "failed to prepare subPath");
                    subpath_error(None)
                })?;
                target
            }
        };
        out.push(ContainerMount {
            name: mount.name.clone(),
            container_path: mount.mount_path.clone(),
            host_path,
            read_only: mount.read_only.unwrap_or(false) || must_mount_ro,
            recursive_read_only,
            propagation,
        });
    }
    Ok(out)
}

/// V108 (upstream `CleanSubPaths`): every subpath bind of `volume` in the pod is unmounted and
/// removed, then the emptied directories; never following a symlink, never recursive into a
/// mount. Called before the volume's TearDown.
pub fn clean_subpaths(pod_dir: &Path, volume: &str, mounter: &dyn Mounter) -> Result<(), String> {
    let dir = pod_dir.join("volume-subpaths").join(volume);
    let Ok(containers) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    for container in containers.flatten() {
        let path = container.path();
        if !container.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for entry in std::fs::read_dir(&path)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let target = entry.path();
            if mounter.is_mount_point(&target).unwrap_or(false) {
                mounter
                    .unmount(&target, rustlet_mount::UnmountMode::Normal)
                    .map_err(|e| format!("unmount subpath {}: {e}", target.display()))?;
            }
            let removed = match entry.file_type() {
                Ok(t) if t.is_dir() => mounter
                    .cleanup_mount_point(&target, MountPointCheck::Exact)
                    .map_err(|e| e.to_string()),
                _ => std::fs::remove_file(&target).map_err(|e| e.to_string()),
            };
            removed.map_err(|e| format!("remove subpath {}: {e}", target.display()))?;
        }
        std::fs::remove_dir(&path).map_err(|e| format!("remove {}: {e}", path.display()))?;
    }
    std::fs::remove_dir(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    let parent = pod_dir.join("volume-subpaths");
    let _ = std::fs::remove_dir(parent); // only when empty
    Ok(())
}

#[cfg(test)]
mod tests;
