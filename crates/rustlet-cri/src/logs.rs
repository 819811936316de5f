//! The kubelet's container log layout on the node: each pod's directory
//! `<podLogsDir>/<namespace>_<name>_<uid>` (containerd writes
//! `<container>/<restartCount>.log` beneath it), and the `/var/log/containers`-style symlinks
//! `<containerLogsDir>/<pod>_<namespace>_<container>-<containerID>.log` that log collectors
//! read (upstream: `BuildPodLogsDirectory`, `BuildContainerLogsDirectory`, `legacyLogSymlink`,
//! `logSymlink` in `kuberuntime`).
//!
//! Invariants: every name that becomes a path component is checked here, whatever the API
//! server validated (a manifest is hostile input): nothing is written outside the configured
//! directories; a pod's log directory is removed without crossing a mount point, and with it
//! the symlinks that point into it.

use std::io;
use std::path::{Path, PathBuf};

use rustlet_core::{PodUid, UnsafePathComponent, path_component};

/// upstream: `logPathDelimiter`.
const DELIMITER: char = '_';
/// upstream: `legacyLogSuffix`.
const SYMLINK_SUFFIX: &str = ".log";
/// upstream: `ext4MaxFileNameLen`.
const MAX_FILE_NAME_LEN: usize = 255;

/// Why a log path was refused or a log directory not removed.
#[derive(Debug, thiserror::Error)]
pub enum LogLayoutError {
    /// A name that is not one safe path component.
    #[error(transparent)]
    Unsafe(#[from] UnsafePathComponent),
    /// A namespace or pod name that is not a DNS name (the API server's rule; `_`, the
    /// delimiter, and upper case are refused).
    #[error("{what} {value:?} is not a lowercase DNS name: refused in a log path")]
    NotDnsName {
        /// `namespace` or `pod name`.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// Listing a log directory.
    #[error("failed to list the log directory {path:?}")]
    List {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Removing a file or a symlink.
    #[error("failed to remove {path:?}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Removing a pod's log directory (a mount point beneath it stops the removal).
    #[error("failed to remove the pod log directory {path:?}")]
    RemoveDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustlet_mount::Error,
    },
}

/// `value` if it is a lowercase DNS name (a namespace is a label, a pod name a subdomain:
/// lowercase letters, digits, `-` and `.`), and one path component.
fn dns_name<'a>(what: &'static str, value: &'a str) -> Result<&'a str, LogLayoutError> {
    let value = path_component(what, value)?;
    let ok = value.len() <= 253
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok {
        Ok(value)
    } else {
        Err(LogLayoutError::NotDnsName {
            what,
            value: value.to_owned(),
        })
    }
}

/// `<pod_logs_dir>/<namespace>_<name>_<uid>` (upstream: `BuildPodLogsDirectory`).
pub fn pod_logs_directory(
    pod_logs_dir: &Path,
    namespace: &str,
    name: &str,
    uid: &PodUid,
) -> Result<PathBuf, LogLayoutError> {
    let namespace = dns_name("namespace", namespace)?;
    let name = dns_name("pod name", name)?;
    let uid = uid.as_path_component()?;
    Ok(pod_logs_dir.join(format!("{namespace}{DELIMITER}{name}{DELIMITER}{uid}")))
}

/// `<pod directory>/<container>` (upstream: `BuildContainerLogsDirectory`).
pub fn container_logs_directory(
    pod_directory: &Path,
    container: &str,
) -> Result<PathBuf, LogLayoutError> {
    Ok(pod_directory.join(path_component("container name", container)?))
}

/// The restart count a container's next instance takes when the runtime knows none of its
/// instances (after a reboot cleared it, or the garbage collector removed them all): one past
/// the highest `<n>.log` or `<n>.log.<anything>` file in its log directory, 0 when there is
/// none or no directory, so a new instance never appends to (or is removed with) an old one's
/// log (upstream: `calcRestartCountByLogDir`). Names that are not such files are ignored.
pub fn restart_count_from_log_dir(container_dir: &Path) -> io::Result<u32> {
    let entries = match std::fs::read_dir(container_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut next = 0u32;
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let digits = name.len() - name.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let rest = &name[digits..];
        if digits == 0 || !(rest == ".log" || rest.starts_with(".log.")) {
            continue;
        }
        // A number too large for a restart count is not a file this agent wrote.
        let Ok(count) = name[..digits].parse::<u32>() else {
            continue;
        };
        next = next.max(count.saturating_add(1));
    }
    Ok(next)
}

/// `<containers_dir>/<pod>_<namespace>_<container>-<containerID>.log`, the name cut to 255
/// bytes (upstream: `legacyLogSymlink`, `logSymlink`). `container_id` is the runtime's ID,
/// without its scheme.
pub fn container_log_symlink(
    containers_dir: &Path,
    namespace: &str,
    pod: &str,
    container: &str,
    container_id: &str,
) -> Result<PathBuf, LogLayoutError> {
    let namespace = dns_name("namespace", namespace)?;
    let pod = dns_name("pod name", pod)?;
    let container = path_component("container name", container)?;
    let container_id = path_component("container ID", container_id)?;
    let mut name = format!("{pod}{DELIMITER}{namespace}{DELIMITER}{container}-{container_id}");
    let max = MAX_FILE_NAME_LEN - SYMLINK_SUFFIX.len();
    if name.len() > max {
        let mut cut = max;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name.push_str(SYMLINK_SUFFIX);
    Ok(containers_dir.join(name))
}

/// The pod log directories of `uid` under `pod_logs_dir` (`*_<uid>`; upstream's container GC
/// parses the UID the same way, `parsePodUIDFromLogsDirectory`), and `<uid>` itself: the
/// layout of agents before this one, whose directories a newer agent removes too.
pub fn pod_log_directories(
    pod_logs_dir: &Path,
    uid: &PodUid,
) -> Result<Vec<PathBuf>, LogLayoutError> {
    let uid = uid.as_path_component()?;
    let suffix = format!("{DELIMITER}{uid}");
    let entries = match std::fs::read_dir(pod_logs_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LogLayoutError::List {
                path: pod_logs_dir.to_owned(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| LogLayoutError::List {
            path: pod_logs_dir.to_owned(),
            source,
        })?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.ends_with(&suffix) || n == uid)
        {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Removes the symlinks of `containers_dir` that point at `target` or beneath it. Other
/// entries (files, symlinks elsewhere) are left alone.
pub fn remove_symlinks_into(containers_dir: &Path, target: &Path) -> Result<(), LogLayoutError> {
    let entries = match std::fs::read_dir(containers_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(LogLayoutError::List {
                path: containers_dir.to_owned(),
                source,
            });
        }
    };
    for entry in entries {
        let entry = entry.map_err(|source| LogLayoutError::List {
            path: containers_dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let Ok(points_at) = std::fs::read_link(&path) else {
            continue;
        };
        if points_at.starts_with(target) {
            remove_file(&path)?;
        }
    }
    Ok(())
}

/// Removes a file or symlink; a missing one is success.
pub fn remove_file(path: &Path) -> Result<(), LogLayoutError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LogLayoutError::Remove {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Removes the pod's log directories (never across a mount point) and the symlinks into them
/// (upstream: the container GC's `evictPodLogsDirectories` and its removal of dead symlinks).
pub fn remove_pod_logs(
    pod_logs_dir: &Path,
    containers_dir: &Path,
    uid: &PodUid,
) -> Result<(), LogLayoutError> {
    for dir in pod_log_directories(pod_logs_dir, uid)? {
        remove_symlinks_into(containers_dir, &dir)?;
        rustlet_mount::remove::remove_all_one_filesystem(&dir).map_err(|source| {
            LogLayoutError::RemoveDir {
                path: dir.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Removes a removed container's log files (`<log_path>*`: the live and the rotated ones) and
/// its symlink (upstream: `removeContainerLog`, the log manager's `Clean`).
pub fn remove_container_logs(
    log_path: &Path,
    symlink: Option<&Path>,
) -> Result<(), LogLayoutError> {
    if let Some(link) = symlink {
        remove_file(link)?;
    }
    let (Some(dir), Some(name)) = (log_path.parent(), log_path.file_name()) else {
        return Ok(());
    };
    if log_path.as_os_str().is_empty() {
        return Ok(());
    }
    let prefix = name.as_encoded_bytes();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(LogLayoutError::List {
                path: dir.to_owned(),
                source,
            });
        }
    };
    for entry in entries {
        let entry = entry.map_err(|source| LogLayoutError::List {
            path: dir.to_owned(),
            source,
        })?;
        if entry.file_name().as_encoded_bytes().starts_with(prefix) {
            remove_file(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream: `TestBuildContainerLogsDirectory`-style: the pod's directory and a container's.
    #[test]
    fn pod_logs_directory_is_namespace_name_uid() {
        let dir = pod_logs_directory(
            Path::new("/var/log/pods"),
            "kube-system",
            "coredns-1.a",
            &PodUid::new("0f1e"),
        )
        .unwrap();
        assert_eq!(dir, Path::new("/var/log/pods/kube-system_coredns-1.a_0f1e"));
        assert_eq!(
            container_logs_directory(&dir, "main").unwrap(),
            Path::new("/var/log/pods/kube-system_coredns-1.a_0f1e/main")
        );
    }

    /// Hostile names never leave the directory, nor make the delimiter ambiguous.
    #[test]
    fn hostile_names_are_refused_in_log_paths() {
        let root = Path::new("/r");
        let uid = PodUid::new("u");
        for (ns, name) in [
            ("..", "p"),
            ("default", ".."),
            ("a/b", "p"),
            ("default", "p/../../etc"),
            ("de_fault", "p"),
            ("default", "P"),
            ("", "p"),
            ("default", "p\0"),
        ] {
            assert!(
                pod_logs_directory(root, ns, name, &uid).is_err(),
                "{ns:?} {name:?}"
            );
            assert!(
                container_log_symlink(root, ns, name, "c", "id").is_err(),
                "{ns:?} {name:?}"
            );
        }
        assert!(pod_logs_directory(root, "default", "p", &PodUid::new("..")).is_err());
        assert!(container_logs_directory(root, "../x").is_err());
        assert!(container_log_symlink(root, "default", "p", "..", "id").is_err());
        assert!(container_log_symlink(root, "default", "p", "c", "a/b").is_err());
    }

    /// upstream: `TestLogSymlink`: `<pod>_<ns>_<container>-<id>.log`, cut to 255 bytes.
    #[test]
    fn test_calc_restart_count_by_log_dir() {
        for (files, want) in [
            (&[][..], 0),
            (&["0.log"][..], 1),
            (&["0.log", "1.log", "2.log"][..], 3),
            (&["2.log", "1.log.rotated", "0.log.gz"][..], 3),
            (&["a.log.rotated", "b.log.rotated", "12log.rotated"][..], 0),
            (&["145.log.log.rotated"][..], 146),
            (
                &["92233720368547758089223372036854775808.log.rotated"][..],
                0,
            ),
            (
                &[
                    "9223372036854775808.log.rotated",
                    "23.log",
                    "23a.log",
                    "1aaa.log.rotated",
                    "2.log",
                    "3.log.rotated",
                ][..],
                24,
            ),
            (&["rotated.23.log"][..], 0),
            (&["mylog42.log"][..], 0),
            (&["-42.log"][..], 0),
            (&["6.log", "6.log.rotated", "6.log.rotated.rotated"][..], 7),
        ] {
            let dir = tempfile::tempdir().unwrap();
            for f in files {
                std::fs::write(dir.path().join(f), "a log line").unwrap();
            }
            // A directory of such a name is not a log.
            std::fs::create_dir(dir.path().join("40.log")).unwrap();
            assert_eq!(
                restart_count_from_log_dir(dir.path()).unwrap(),
                want,
                "{files:?}"
            );
        }
        let missing = tempfile::tempdir().unwrap().path().join("gone");
        assert_eq!(restart_count_from_log_dir(&missing).unwrap(), 0);
    }

    #[test]
    fn test_log_symlink() {
        let link = container_log_symlink(Path::new("/var/log/containers"), "ns", "pod", "c", "abc")
            .unwrap();
        assert_eq!(link, Path::new("/var/log/containers/pod_ns_c-abc.log"));
        let long = "a".repeat(253);
        let link =
            container_log_symlink(Path::new("/d"), "ns", &long, "c", &"f".repeat(64)).unwrap();
        let name = link.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), 255);
        assert_eq!(name, format!("{}.log", &long[..251]));
    }

    /// A pod's log directories are found by UID and removed with the symlinks into them;
    /// another pod's stay.
    #[test]
    fn remove_pod_logs_takes_the_pods_directory_and_its_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let pods = tmp.path().join("pods");
        let links = tmp.path().join("containers");
        std::fs::create_dir_all(&links).unwrap();
        let mine = pod_logs_directory(&pods, "ns", "p", &PodUid::new("u1")).unwrap();
        let other = pod_logs_directory(&pods, "ns", "q", &PodUid::new("xu1")).unwrap();
        // An older agent's layout, `<uid>` alone.
        let legacy = pods.join("u1");
        for dir in [&mine, &other, &legacy] {
            std::fs::create_dir_all(dir.join("c")).unwrap();
            std::fs::write(dir.join("c/0.log"), "x").unwrap();
        }
        let my_link = links.join("p_ns_c-1.log");
        let other_link = links.join("q_ns_c-2.log");
        std::os::unix::fs::symlink(mine.join("c/0.log"), &my_link).unwrap();
        std::os::unix::fs::symlink(other.join("c/0.log"), &other_link).unwrap();
        remove_pod_logs(&pods, &links, &PodUid::new("u1")).unwrap();
        assert!(!mine.exists());
        assert!(!legacy.exists());
        assert!(std::fs::symlink_metadata(&my_link).is_err());
        assert!(other.join("c/0.log").exists());
        assert!(std::fs::symlink_metadata(&other_link).is_ok());
    }

    /// upstream: `removeContainerLog`: the live and rotated files of the instance and its
    /// symlink go; the other instances' files stay.
    #[test]
    fn remove_container_logs_takes_its_files_and_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "1.log",
            "1.log.20260101-000000.gz",
            "1.log.20260101-000001",
            "2.log",
        ] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        let link = tmp.path().join("link.log");
        std::os::unix::fs::symlink(dir.join("1.log"), &link).unwrap();
        remove_container_logs(&dir.join("1.log"), Some(&link)).unwrap();
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["2.log"]);
        assert!(std::fs::symlink_metadata(&link).is_err());
    }
}
