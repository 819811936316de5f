//! Container mounts and subPath safety (upstream `kubelet_pods.go` `makeMounts` and
//! `pkg/volume/util/subpath`, V105-V108): what a runtime binds into a container. A `subPath`
//! (or a `subPathExpr` expanded with the container's env) is created if missing without
//! following a symlink, resolved once, pinned by an fd and bind-mounted from that fd onto
//! `pods/<uid>/volume-subpaths/<volume>/<container>/<index>` (the mount crate's
//! `prepare_subpath`), so a symlink swapped in by a container can never redirect it
//! (CVE-2017-1002101, CVE-2021-25741). The unmount of a volume cleans its subpath binds first.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;
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
/// its mounted directory and whether it must be mounted read-only.
pub fn make_mounts(
    container: &Container,
    volumes: &dyn Fn(&str) -> Option<(PathBuf, bool)>,
    pod_dir: &Path,
    mounter: &dyn Mounter,
) -> Result<Vec<ContainerMount>, ContainerMountError> {
    let mut out = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let (volume_path, must_mount_ro) =
            volumes(&mount.name).ok_or_else(|| ContainerMountError::VolumeNotMounted {
                volume: mount.name.clone(),
                container: container.name.clone(),
            })?;
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
