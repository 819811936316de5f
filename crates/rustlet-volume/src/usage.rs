//! A mounted volume's use for `/stats/summary` (upstream: `pkg/volume/metrics_du.go`,
//! `metrics_statfs.go`, `metrics_nil.go`, and which plugin takes which): the directory's own
//! bytes and inodes for the volumes that live in the pod's directory (`emptyDir` and the
//! content volumes built on it), the filesystem's figures for the others, nothing for
//! `hostPath`.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use k8s_openapi::api::core::v1::Volume;

/// How a volume's use is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageMethod {
    /// upstream `MetricsDu`: used bytes and inodes by walking the directory; capacity, free
    /// bytes and inodes of its filesystem.
    Du,
    /// upstream `MetricsStatFS`: all figures of the filesystem mounted there.
    StatFs,
    /// upstream `MetricsNil`: not measured (`hostPath`).
    None,
}

impl UsageMethod {
    /// The method the plugin of `volume` uses.
    pub fn of(volume: &Volume) -> Self {
        if volume.host_path.is_some() {
            Self::None
        } else if volume.empty_dir.is_some()
            || volume.config_map.is_some()
            || volume.secret.is_some()
            || volume.downward_api.is_some()
            || volume.projected.is_some()
        {
            Self::Du
        } else {
            Self::StatFs
        }
    }
}

/// A volume's figures (upstream: `volume.Metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    /// The bytes the volume takes.
    pub used_bytes: u64,
    /// The filesystem's size.
    pub capacity_bytes: u64,
    /// Free bytes for an unprivileged user.
    pub available_bytes: u64,
    /// The inodes the volume takes.
    pub inodes_used: u64,
    /// The filesystem's inodes.
    pub inodes: u64,
    /// Its free inodes.
    pub inodes_free: u64,
}

/// The bytes (allocated blocks, as `du`) and inodes under `path`, without following symlinks
/// or crossing into other filesystems (upstream: `fs.DiskUsage`, `du -x`).
pub fn disk_usage(path: &Path) -> io::Result<(u64, u64)> {
    let root = std::fs::symlink_metadata(path)?;
    let device = root.dev();
    let (mut bytes, mut inodes) = (root.blocks() * 512, 1);
    let mut dirs = vec![path.to_path_buf()];
    let mut seen = std::collections::HashSet::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.dev() != device {
                continue;
            }
            // A hard-linked file counts once (content volumes link their files in).
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert(meta.ino()) {
                continue;
            }
            bytes += meta.blocks() * 512;
            inodes += 1;
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

/// The volume at `path` measured by `method`; `None` for [`UsageMethod::None`].
pub fn measure(path: &Path, method: UsageMethod) -> io::Result<Option<VolumeUsage>> {
    let fs = match method {
        UsageMethod::None => return Ok(None),
        UsageMethod::Du | UsageMethod::StatFs => {
            nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?
        }
    };
    let block = fs.fragment_size();
    let mut usage = VolumeUsage {
        capacity_bytes: fs.blocks().saturating_mul(block),
        available_bytes: fs.blocks_available().saturating_mul(block),
        inodes: fs.files(),
        inodes_free: fs.files_free(),
        ..VolumeUsage::default()
    };
    match method {
        UsageMethod::Du => {
            let (bytes, inodes) = disk_usage(path)?;
            usage.used_bytes = bytes;
            usage.inodes_used = inodes;
        }
        _ => {
            usage.used_bytes = fs
                .blocks()
                .saturating_sub(fs.blocks_free())
                .saturating_mul(block);
            usage.inodes_used = fs.files().saturating_sub(fs.files_free());
        }
    }
    Ok(Some(usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream `TestMetricsDuGetCapacity`: the directory's own bytes and inodes grow with
    /// what is written; the filesystem's capacity and inodes come with them.
    #[test]
    fn metrics_du_counts_the_directorys_bytes_and_inodes() {
        let dir = tempfile::tempdir().unwrap();
        let before = measure(dir.path(), UsageMethod::Du).unwrap().unwrap();
        assert_eq!(before.inodes_used, 1);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![7u8; 64 * 1024]).unwrap();
        let after = measure(dir.path(), UsageMethod::Du).unwrap().unwrap();
        assert_eq!(after.inodes_used, 3);
        assert!(
            after.used_bytes >= before.used_bytes + 64 * 1024,
            "{before:?} {after:?}"
        );
        assert!(after.capacity_bytes > 0 && after.inodes > 0);
    }

    /// Which plugin measures how: `hostPath` not at all, the pod-directory volumes by `du`,
    /// the others by `statfs`.
    #[test]
    fn the_usage_method_follows_the_plugin() {
        use k8s_openapi::api::core::v1::{
            ConfigMapVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource,
            PersistentVolumeClaimVolumeSource,
        };
        let base = Volume {
            name: "v".into(),
            ..Volume::default()
        };
        let host_path = Volume {
            host_path: Some(HostPathVolumeSource::default()),
            ..base.clone()
        };
        let empty_dir = Volume {
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..base.clone()
        };
        let config_map = Volume {
            config_map: Some(ConfigMapVolumeSource::default()),
            ..base.clone()
        };
        let claim = Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource::default()),
            ..base
        };
        assert_eq!(UsageMethod::of(&host_path), UsageMethod::None);
        assert_eq!(UsageMethod::of(&empty_dir), UsageMethod::Du);
        assert_eq!(UsageMethod::of(&config_map), UsageMethod::Du);
        assert_eq!(UsageMethod::of(&claim), UsageMethod::StatFs);
        assert!(
            measure(Path::new("/"), UsageMethod::None)
                .unwrap()
                .is_none()
        );
    }
}
