//! The `Mounter` trait: the volume manager's seam to the kernel (upstream `mount.Interface`).
//!
//! `rustlet-mount` stays free of this crate and of Kubernetes; this crate owns the trait and
//! implements it for `rustlet_mount::LinuxMounter` (real mounts) and, behind `test-util`, for
//! `rustlet_mount::fake::FakeMounter` (an in-memory table).

use std::path::{Path, PathBuf};

use rustlet_mount::{
    BindAccess, LinuxMounter, MountInfo, MountPointCheck, MountRequest, Result, Subpath,
    TmpfsOptions, UnmountMode,
};

/// What the volume manager needs from a mount backend.
pub trait Mounter: Send + Sync {
    /// `mount(8)`-style mount.
    fn mount(&self, request: &MountRequest) -> Result<()>;
    /// Bind mount, optionally read-only.
    fn bind(&self, source: &Path, target: &Path, access: BindAccess) -> Result<()>;
    /// tmpfs with size and mode.
    fn tmpfs(&self, target: &Path, options: TmpfsOptions) -> Result<()>;
    /// Unmount.
    fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<()>;
    /// Fast check; misses same-filesystem bind mounts.
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool>;
    /// Exact check from the mount table.
    fn is_mount_point(&self, path: &Path) -> Result<bool>;
    /// Whether a tmpfs is mounted exactly at `path` (cheap: no mount table read).
    fn is_tmpfs_mount_point(&self, path: &Path) -> Result<bool>;
    /// The mount table.
    fn list(&self) -> Result<Vec<MountInfo>>;
    /// Other mount points of the same filesystem directory.
    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>>;
    /// Unmount if mounted, then remove the empty directory.
    fn cleanup_mount_point(&self, path: &Path, check: MountPointCheck) -> Result<()>;
    /// Upstream `PrepareSafeSubpath`: binds a pinned subpath of a volume onto its target.
    fn prepare_subpath(&self, subpath: &Subpath) -> Result<()>;
}

macro_rules! forward_mounter {
    ($type:ty) => {
        impl Mounter for $type {
            fn mount(&self, request: &MountRequest) -> Result<()> {
                <$type>::mount(self, request)
            }
            fn bind(&self, source: &Path, target: &Path, access: BindAccess) -> Result<()> {
                <$type>::bind(self, source, target, access)
            }
            fn tmpfs(&self, target: &Path, options: TmpfsOptions) -> Result<()> {
                <$type>::tmpfs(self, target, options)
            }
            fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<()> {
                <$type>::unmount(self, target, mode)
            }
            fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool> {
                <$type>::is_likely_not_mount_point(self, path)
            }
            fn is_mount_point(&self, path: &Path) -> Result<bool> {
                <$type>::is_mount_point(self, path)
            }
            fn is_tmpfs_mount_point(&self, path: &Path) -> Result<bool> {
                <$type>::is_tmpfs_mount_point(self, path)
            }
            fn list(&self) -> Result<Vec<MountInfo>> {
                <$type>::list(self)
            }
            fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>> {
                <$type>::mount_refs(self, path)
            }
            fn cleanup_mount_point(&self, path: &Path, check: MountPointCheck) -> Result<()> {
                <$type>::cleanup_mount_point(self, path, check)
            }
            fn prepare_subpath(&self, subpath: &Subpath) -> Result<()> {
                <$type>::prepare_subpath(self, subpath)
            }
        }
    };
}

forward_mounter!(LinuxMounter);
#[cfg(any(test, feature = "test-util"))]
forward_mounter!(rustlet_mount::fake::FakeMounter);

#[cfg(test)]
mod tests {
    use super::*;
    use rustlet_mount::fake::{FakeAction, FakeMounter};

    #[test]
    fn fake_mounter_serves_through_the_trait() {
        let dir =
            std::env::temp_dir().join(format!("rustlet-volume-mounter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = FakeMounter::new();
        let mounter: &dyn Mounter = &fake;
        mounter.tmpfs(&dir, TmpfsOptions::default()).unwrap();
        assert!(mounter.is_mount_point(&dir).unwrap());
        mounter.unmount(&dir, UnmountMode::Normal).unwrap();
        assert!(matches!(fake.actions()[0], FakeAction::Mount { .. }));
        std::fs::remove_dir(&dir).unwrap();
        let _linux: Box<dyn Mounter> = Box::new(LinuxMounter::new());
    }
}
