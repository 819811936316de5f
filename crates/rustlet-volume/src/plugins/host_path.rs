//! hostPath (upstream `pkg/volume/hostpath`, V90-V91): no mount; SetUp checks the path's type
//! (creating it for the `...OrCreate` types) and the runtime binds the host path itself.

use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use rustlet_core::PodUid;

use crate::plugin::{
    PluginError, VolumeError, VolumeHost, VolumeMounter, VolumePlugin, VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// Upstream plugin name.
pub const PLUGIN_NAME: &str = "kubernetes.io/host-path";

/// The hostPath plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostPathPlugin;

/// `hostPath.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    /// Create a directory (0755) when missing.
    DirectoryOrCreate,
    /// Must be a directory.
    Directory,
    /// Create an empty file (0644) when missing; the parent must exist.
    FileOrCreate,
    /// Must be a regular file.
    File,
    /// Must be a Unix socket.
    Socket,
    /// Must be a character device.
    CharDevice,
    /// Must be a block device.
    BlockDevice,
}

impl HostPathType {
    /// Parses `hostPath.type`.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        Ok(match value.unwrap_or("") {
            "" => Self::Unset,
            "DirectoryOrCreate" => Self::DirectoryOrCreate,
            "Directory" => Self::Directory,
            "FileOrCreate" => Self::FileOrCreate,
            "File" => Self::File,
            "Socket" => Self::Socket,
            "CharDevice" => Self::CharDevice,
            "BlockDevice" => Self::BlockDevice,
            other => return Err(format!("{other} is an invalid volume type")),
        })
    }
}

impl VolumePlugin for HostPathPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        match spec {
            VolumeSpec::Pod(v) => v.host_path.is_some(),
            VolumeSpec::Persistent { pv, .. } => {
                pv.spec.as_ref().is_some_and(|s| s.host_path.is_some())
            }
        }
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        _pod: &Pod,
        _host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let (path, type_) = match spec {
            VolumeSpec::Pod(v) => v
                .host_path
                .as_ref()
                .map(|h| (h.path.clone(), h.type_.clone())),
            VolumeSpec::Persistent { pv, .. } => pv
                .spec
                .as_ref()
                .and_then(|s| s.host_path.as_ref())
                .map(|h| (h.path.clone(), h.type_.clone())),
        }
        .ok_or_else(|| PluginError::invalid_spec(PLUGIN_NAME, "no hostPath source"))?;
        Ok(Box::new(HostPath {
            path: PathBuf::from(path),
            type_,
        }))
    }

    /// V90: a dummy spec whose path is the volume name; reconstruction only needs the name.
    fn construct_volume_spec(
        &self,
        inner_name: &str,
        _mount_path: &Path,
        _host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        Ok(VolumeSpec::pod(k8s_openapi::api::core::v1::Volume {
            name: inner_name.to_owned(),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: inner_name.to_owned(),
                type_: None,
            }),
            ..Default::default()
        }))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        _pod_uid: &PodUid,
        _host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(HostPath {
            path: PathBuf::from(inner_name),
            type_: None,
        }))
    }
}

struct HostPath {
    path: PathBuf,
    type_: Option<String>,
}

fn kind_name(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        "unknown"
    }
}

/// V91 (with errata 1): the checks of one hostPath type.
pub fn check_host_path(path: &Path, type_: HostPathType) -> Result<(), String> {
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "invalid HostPath `{}`: must not contain '..'",
            path.display()
        ));
    }
    let display = path.display();
    if type_ == HostPathType::DirectoryOrCreate {
        // Issue 29: the common case (missing, its parent there) in one `mkdir`, no `statx`
        // first; an existing path is checked below, a missing parent made by `MkdirAll`.
        use std::os::unix::fs::DirBuilderExt;
        if std::fs::DirBuilder::new().mode(0o755).create(path).is_ok() {
            return Ok(());
        }
    }
    let meta = std::fs::metadata(path);
    let mismatch = |wanted: &str, meta: &std::fs::Metadata| -> String {
        match kind_name(meta) {
            "unknown" => format!(
                "hostPath type check failed, {display} is not a {wanted}, unable to determine its type: only recognise file, directory, socket, block device and character device"
            ),
            kind => {
                format!("hostPath type check failed: {display} is not a {wanted}, it's a {kind}")
            }
        }
    };
    let wanted = match type_ {
        HostPathType::Unset => return Ok(()),
        HostPathType::DirectoryOrCreate => {
            if meta.is_err() {
                use std::os::unix::fs::DirBuilderExt;
                return std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(|e| format!("creating hostPath {display}: {e}"));
            }
            "directory"
        }
        HostPathType::FileOrCreate => {
            if meta.is_err() {
                use std::os::unix::fs::OpenOptionsExt;
                return std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(path)
                    .map(drop)
                    .map_err(|e| format!("creating hostPath {display}: {e}"));
            }
            "file"
        }
        HostPathType::Directory => "directory",
        HostPathType::File => "file",
        HostPathType::Socket => "socket file",
        HostPathType::CharDevice => "character device",
        HostPathType::BlockDevice => "block device",
    };
    let meta = meta.map_err(|_| format!("hostPath {display} doesn't exist"))?;
    let t = meta.file_type();
    let ok = match wanted {
        "directory" => t.is_dir(),
        "file" => t.is_file(),
        "socket file" => t.is_socket(),
        "character device" => t.is_char_device(),
        _ => t.is_block_device(),
    };
    if ok {
        Ok(())
    } else {
        Err(mismatch(wanted, &meta))
    }
}

impl VolumeMounter for HostPath {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        let type_ = HostPathType::parse(self.type_.as_deref()).map_err(VolumeError::Final)?;
        check_host_path(&self.path, type_).map_err(VolumeError::Final)
    }
}

impl VolumeUnmounter for HostPath {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// V90: nothing to undo.
    fn tear_down(&self) -> Result<(), VolumeError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v91_host_path_types() {
        let dir = tempfile_dir();
        let file = dir.join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(check_host_path(&dir, HostPathType::Directory).is_ok());
        assert!(check_host_path(&file, HostPathType::File).is_ok());
        assert_eq!(
            check_host_path(&file, HostPathType::Directory).unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
        assert_eq!(
            check_host_path(&dir.join("missing"), HostPathType::File).unwrap_err(),
            format!("hostPath {} doesn't exist", dir.join("missing").display())
        );
        let created = dir.join("made/deeper");
        check_host_path(&created, HostPathType::DirectoryOrCreate).unwrap();
        assert!(created.is_dir());
        let new_file = dir.join("new-file");
        check_host_path(&new_file, HostPathType::FileOrCreate).unwrap();
        assert!(new_file.is_file());
        assert!(
            check_host_path(&dir.join("no-parent/file"), HostPathType::FileOrCreate).is_err(),
            "parent not created"
        );
        assert!(check_host_path(Path::new("/dev/null"), HostPathType::CharDevice).is_ok());
        assert!(
            check_host_path(Path::new("/dev/null"), HostPathType::BlockDevice)
                .unwrap_err()
                .contains("is not a block device")
        );
        assert!(
            check_host_path(&file, HostPathType::Socket)
                .unwrap_err()
                .contains("is not a socket file")
        );
        assert!(
            check_host_path(&dir.join("a/../b"), HostPathType::Unset)
                .unwrap_err()
                .starts_with("invalid HostPath")
        );
        assert!(check_host_path(&dir.join("whatever"), HostPathType::Unset).is_ok());
        assert_eq!(
            HostPathType::parse(Some("Bogus")).unwrap_err(),
            "Bogus is an invalid volume type"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn v91_sockets_are_recognised() {
        let dir = tempfile_dir();
        let socket = dir.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert!(check_host_path(&socket, HostPathType::Socket).is_ok());
        assert!(
            check_host_path(&socket, HostPathType::File)
                .unwrap_err()
                .contains("it's a Socket")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::canonicalize(&dir).unwrap()
    }
}
