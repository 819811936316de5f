//! Mount options as `mount(8)` spells them, split into `mount(2)` flags and filesystem data,
//! and sensitive options that never reach a log or a `Debug`.

use std::fmt;

use sys_mount::MountFlags;

/// Options whose values must never be logged (credentials for CIFS, Ceph keys, ...).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SensitiveOptions(Vec<String>);

impl SensitiveOptions {
    /// Wraps options such as `password=...`.
    pub fn new(options: Vec<String>) -> Self {
        Self(options)
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn expose(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Debug for SensitiveOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SensitiveOptions(<{} masked>)", self.0.len())
    }
}

/// `mount(8)`-style options parsed into `mount(2)` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedOptions {
    /// Flags for `mount(2)`.
    pub flags: MountFlags,
    /// Whether `bind` or `rbind` was asked for.
    pub bind: bool,
    /// The remaining options, comma-joined, for the filesystem (`size=1m,mode=0750`).
    pub data: Vec<String>,
}

/// Splits `mount(8)` options into flags and data. Unknown options are filesystem data.
pub fn parse_options(options: &[String]) -> ParsedOptions {
    let mut parsed = ParsedOptions {
        flags: MountFlags::empty(),
        bind: false,
        data: Vec::new(),
    };
    for option in options {
        let flag = match option.as_str() {
            "" | "defaults" | "rw" | "suid" | "dev" | "exec" | "async" | "atime" => continue,
            "ro" => MountFlags::RDONLY,
            "nosuid" => MountFlags::NOSUID,
            "nodev" => MountFlags::NODEV,
            "noexec" => MountFlags::NOEXEC,
            "noatime" => MountFlags::NOATIME,
            "nodiratime" => MountFlags::NODIRATIME,
            "relatime" => MountFlags::RELATIME,
            "strictatime" => MountFlags::STRICTATIME,
            "sync" => MountFlags::SYNCHRONOUS,
            "dirsync" => MountFlags::DIRSYNC,
            "remount" => MountFlags::REMOUNT,
            "bind" => {
                parsed.bind = true;
                MountFlags::BIND
            }
            "rbind" => {
                parsed.bind = true;
                MountFlags::BIND | MountFlags::REC
            }
            other => {
                parsed.data.push(other.to_owned());
                continue;
            }
        };
        parsed.flags |= flag;
    }
    parsed
}

/// Flags that a remount of a bind mount must carry over from the mount it copies, else the
/// kernel clears them as root and refuses (EPERM) in a user namespace.
pub(crate) const LOCKED_FLAGS: [MountFlags; 5] = [
    MountFlags::NOSUID,
    MountFlags::NODEV,
    MountFlags::NOEXEC,
    MountFlags::NOATIME,
    MountFlags::RELATIME,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn options_split_into_flags_and_data() {
        let p = parse_options(&opts(&[
            "ro",
            "bind",
            "nosuid",
            "size=1m",
            "mode=0750",
            "defaults",
        ]));
        assert!(p.bind);
        assert_eq!(
            p.flags,
            MountFlags::RDONLY | MountFlags::BIND | MountFlags::NOSUID
        );
        assert_eq!(p.data, ["size=1m", "mode=0750"]);
        let r = parse_options(&opts(&["rbind"]));
        assert_eq!(r.flags, MountFlags::BIND | MountFlags::REC);
    }

    #[test]
    fn sensitive_options_never_show_in_debug() {
        let s = SensitiveOptions::new(opts(&["password=hunter2"]));
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("masked"));
    }
}
