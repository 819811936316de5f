//! `/proc/self/mountinfo`: parsing (with the kernel's octal escapes), and the mount table
//! queries built on it.
//!
//! Line format (proc(5)): `id parent major:minor root mount_point mount_options [optional...] -
//! fstype source super_options`. Paths are escaped by the kernel: space, tab, newline and
//! backslash appear as `\040`, `\011`, `\012`, `\134`.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The mount table of the calling process's mount namespace.
pub const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique mount ID.
    pub id: u32,
    /// ID of the parent mount.
    pub parent_id: u32,
    /// Major device number of the filesystem.
    pub major: u32,
    /// Minor device number of the filesystem.
    pub minor: u32,
    /// The directory of the filesystem that forms this mount's root (not `/` for bind mounts
    /// of a subdirectory).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,relatime`).
    pub mount_options: Vec<String>,
    /// Optional fields (`shared:1`, `master:2`, ...).
    pub optional_fields: Vec<String>,
    /// Filesystem type.
    pub fstype: String,
    /// Mount source (device, or a name such as `tmpfs`).
    pub source: String,
    /// Per-superblock options.
    pub super_options: Vec<String>,
}

/// Decodes the kernel's `\ooo` octal escapes; anything else is kept as it is.
pub fn unescape(field: &str) -> OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

/// Escapes a path as the kernel does in mountinfo (space, tab, newline, backslash).
pub fn escape(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.push_str(&format!("\\{b:03o}")),
            _ if b.is_ascii() => out.push(char::from(b)),
            // Not ASCII: keep the byte, escaped, so the line stays valid UTF-8.
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out
}

fn options(field: &str) -> Vec<String> {
    field
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses one mountinfo line (1-based `line` for errors).
pub fn parse_line(text: &str, line: usize) -> Result<MountInfo> {
    let bad = |reason: String| Error::ParseMountInfo { line, reason };
    let fields: Vec<&str> = text.split(' ').collect();
    if fields.len() < 10 {
        return Err(bad(format!(
            "expected at least 10 fields, found {}",
            fields.len()
        )));
    }
    let separator = fields[6..]
        .iter()
        .position(|f| *f == "-")
        .map(|p| p + 6)
        .ok_or_else(|| bad("no \"-\" separator after the optional fields".into()))?;
    if fields.len() < separator + 3 {
        return Err(bad(
            "expected fstype, source and super options after \"-\"".into()
        ));
    }
    let number = |s: &str, what: &str| -> Result<u32> {
        s.parse()
            .map_err(|_| bad(format!("{what} {s:?} is not a number")))
    };
    let (major, minor) = fields[2]
        .split_once(':')
        .ok_or_else(|| bad(format!("device {:?} is not major:minor", fields[2])))?;
    Ok(MountInfo {
        id: number(fields[0], "mount id")?,
        parent_id: number(fields[1], "parent id")?,
        major: number(major, "major")?,
        minor: number(minor, "minor")?,
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        mount_options: options(fields[5]),
        optional_fields: fields[6..separator]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        fstype: fields[separator + 1].to_owned(),
        source: unescape(fields[separator + 2])
            .to_string_lossy()
            .into_owned(),
        super_options: fields[separator + 3..]
            .first()
            .map_or_else(Vec::new, |s| options(s)),
    })
}

/// Parses a whole mountinfo text; blank lines are skipped.
///
/// ```
/// let text = "36 35 98:0 / /mnt/my\\040volume rw,noatime master:1 - tmpfs tmpfs rw,size=1024k\n";
/// let table = rustlet_mount::mountinfo::parse(text).unwrap();
/// assert_eq!(table[0].mount_point, std::path::Path::new("/mnt/my volume"));
/// assert_eq!(table[0].fstype, "tmpfs");
/// assert_eq!(table[0].optional_fields, ["master:1"]);
/// ```
pub fn parse(text: &str) -> Result<Vec<MountInfo>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_line(l, i + 1))
        .collect()
}

/// Reads and parses a mountinfo file.
pub fn read(path: &Path) -> Result<Vec<MountInfo>> {
    let text = std::fs::read_to_string(path).map_err(|error| Error::ReadMountInfo {
        path: path.to_owned(),
        error,
    })?;
    parse(&text)
}

/// Formats a mount as a mountinfo line (the inverse of [`parse_line`]).
pub fn format_line(m: &MountInfo) -> String {
    let mut fields = vec![
        m.id.to_string(),
        m.parent_id.to_string(),
        format!("{}:{}", m.major, m.minor),
        escape(&m.root),
        escape(&m.mount_point),
        m.mount_options.join(","),
    ];
    fields.extend(m.optional_fields.iter().cloned());
    fields.push("-".into());
    fields.push(m.fstype.clone());
    fields.push(escape(Path::new(&m.source)));
    fields.push(m.super_options.join(","));
    fields.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
36 22 0:31 / /tmp/with\\040space rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k,mode=750
37 22 8:1 /var/data /mnt/bind\\012newline rw master:3 propagate_from:2 - ext4 /dev/sda1 rw
";

    #[test]
    fn parses_escapes_optional_fields_and_super_options() {
        let mounts = parse(SAMPLE).unwrap();
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].optional_fields, ["shared:1"]);
        assert_eq!(mounts[1].mount_point, Path::new("/tmp/with space"));
        assert_eq!(mounts[1].super_options, ["rw", "size=1024k", "mode=750"]);
        assert_eq!(mounts[1].fstype, "tmpfs");
        assert_eq!(mounts[2].mount_point, Path::new("/mnt/bind\nnewline"));
        assert_eq!(mounts[2].root, Path::new("/var/data"));
        assert_eq!(mounts[2].optional_fields, ["master:3", "propagate_from:2"]);
        assert_eq!((mounts[2].major, mounts[2].minor), (8, 1));
    }

    #[test]
    fn bad_lines_are_errors_with_line_numbers() {
        let err = parse("22 1 8:1 / / rw\n").unwrap_err();
        assert!(err.to_string().starts_with("mountinfo line 1:"), "{err}");
        let err = parse("x 1 8:1 / / rw shared:1 - ext4 /dev/sda1 rw").unwrap_err();
        assert!(err.to_string().contains("mount id"), "{err}");
        assert!(parse("22 1 8:1 / / rw a b c d e").is_err(), "no separator");
    }

    #[test]
    fn unescape_keeps_malformed_escapes() {
        assert_eq!(unescape("a\\04"), OsString::from("a\\04"));
        assert_eq!(unescape("a\\999b"), OsString::from("a\\999b"));
        assert_eq!(unescape("\\134"), OsString::from("\\"));
    }

    fn path_bytes() -> impl Strategy<Value = PathBuf> {
        prop::collection::vec(any::<u8>().prop_filter("no NUL", |b| *b != 0), 0..40).prop_map(
            |mut v| {
                v.insert(0, b'/');
                PathBuf::from(OsString::from_vec(v))
            },
        )
    }

    proptest! {
        #[test]
        fn escaping_round_trips(path in path_bytes()) {
            let escaped = escape(&path);
            prop_assert!(!escaped.contains([' ', '\t', '\n']));
            prop_assert_eq!(PathBuf::from(unescape(&escaped)), path);
        }

        #[test]
        fn parser_never_panics(text in ".{0,300}") {
            let _ = parse(&text);
        }

        #[test]
        fn parser_never_panics_on_near_valid_lines(
            fields in prop::collection::vec("[-a-z0-9:/\\\\,]{0,6}", 0..14),
        ) {
            let _ = parse(&fields.join(" "));
        }

        #[test]
        fn format_then_parse_is_identity(
            id in any::<u32>(), parent in any::<u32>(), major in any::<u32>(), minor in any::<u32>(),
            root in path_bytes(), mount_point in path_bytes(),
            opts in prop::collection::vec("[a-z]{1,6}", 1..4),
            optional in prop::collection::vec("[a-z]{1,6}:[0-9]{1,3}", 0..3),
            fstype in "[a-z]{1,8}", source in "[a-z/]{1,12}",
            super_opts in prop::collection::vec("[a-z=0-9]{1,6}", 1..4),
        ) {
            let m = MountInfo {
                id, parent_id: parent, major, minor, root, mount_point,
                mount_options: opts, optional_fields: optional,
                fstype, source, super_options: super_opts,
            };
            prop_assert_eq!(parse_line(&format_line(&m), 1).unwrap(), m);
        }
    }
}
