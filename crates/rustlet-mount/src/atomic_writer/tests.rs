//! `atomic_writer_test.go` cases (V96-V101) and hostile volumes: planted symlinks never lead a
//! write outside the target.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use proptest::prelude::*;

use super::*;

fn file(data: &str, mode: u32) -> FileProjection {
    FileProjection {
        data: data.as_bytes().to_vec(),
        mode,
        fs_user: None,
    }
}

fn payload(files: &[(&str, &str, u32)]) -> BTreeMap<String, FileProjection> {
    files
        .iter()
        .map(|(p, d, m)| ((*p).to_owned(), file(d, *m)))
        .collect()
}

/// What a reader sees through the user-visible names: path → (bytes, mode).
fn contents(target: &Path) -> BTreeMap<String, (String, u32)> {
    fn visit(base: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u32)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap();
            if dir == base && name.starts_with("..") {
                continue;
            }
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                visit(base, &path, out);
            } else {
                let relative = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                let data = std::fs::read_to_string(&path).unwrap();
                out.insert(relative, (data, meta.permissions().mode() & 0o7777));
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(target, target, &mut out);
    out
}

fn expect(files: &[(&str, &str, u32)]) -> BTreeMap<String, (String, u32)> {
    files
        .iter()
        .map(|(p, d, m)| ((*p).to_owned(), ((*d).to_owned(), *m)))
        .collect()
}

fn data_target(target: &Path) -> std::path::PathBuf {
    std::fs::read_link(target.join("..data")).unwrap()
}

#[test]
fn test_new_atomic_writer() {
    let dir = tempfile::tempdir().unwrap();
    assert!(AtomicWriter::new(dir.path()).is_ok());
    assert!(matches!(
        AtomicWriter::new(dir.path().join("missing")),
        Err(AtomicWriteError::OpenTarget { .. })
    ));
}

/// Upstream `TestValidatePath`, its cases by name, each refusal with upstream's exact error.
#[test]
fn test_validate_path() {
    let max_path = "a".repeat(MAX_PATH_LENGTH + 1);
    let max_file = "a".repeat(MAX_FILE_NAME_LENGTH + 1);
    let cases: [(&str, &str, Option<&str>); 9] = [
        ("valid 1", "i/am/well/behaved.txt", None),
        ("valid 2", "keepyourheaddownandfollowtherules.txt", None),
        (
            "max path length",
            &max_path,
            Some("invalid path: must be less than or equal to 4096 characters"),
        ),
        (
            "max file length",
            &max_file,
            Some("invalid path: filenames must be less than or equal to 255 characters"),
        ),
        (
            "absolute failure",
            "/dev/null",
            Some("invalid path: must be relative path: /dev/null"),
        ),
        (
            "reserved path",
            "..sneaky.txt",
            Some("invalid path: must not start with '..': ..sneaky.txt"),
        ),
        (
            "contains doubledot 1",
            "hello/there/../../../../../../etc/passwd",
            Some("invalid path: must not contain '..': hello/there/../../../../../../etc/passwd"),
        ),
        (
            "contains doubledot 2",
            "hello/../etc/somethingbad",
            Some("invalid path: must not contain '..': hello/../etc/somethingbad"),
        ),
        ("empty", "", Some("invalid path: must not be empty: \"\"")),
    ];
    for (name, path, want) in cases {
        let got = validate_path(path).err().map(|e| e.to_string());
        assert_eq!(got.as_deref(), want, "{name}");
    }
    // Upstream's order: an element `..` is named before a later element's length.
    assert_eq!(
        validate_path(&format!("a/../{max_file}"))
            .unwrap_err()
            .to_string(),
        format!("invalid path: must not contain '..': a/../{max_file}")
    );
}

/// Upstream `TestValidatePayload`, its cases by name, each refusal with upstream's exact
/// error; then the refusals beyond upstream's (errata 4) and the collision.
#[test]
fn test_validate_payload() {
    /// The payload's paths, what validating them gives: the cleaned paths or the error.
    type Case<'a> = (&'a str, Vec<&'a str>, Result<Vec<&'a str>, &'a str>);
    let max_path = "a".repeat(MAX_PATH_LENGTH + 1);
    let cases: [Case<'_>; 7] = [
        ("valid payload", vec!["foo", "bar"], Ok(vec!["bar", "foo"])),
        (
            "payload with path length > 4096 is invalid",
            vec![&max_path],
            Err("invalid path: must be less than or equal to 4096 characters"),
        ),
        (
            "payload with absolute path is invalid",
            vec!["/dev/null"],
            Err("invalid path: must be relative path: /dev/null"),
        ),
        (
            "payload with reserved path is invalid",
            vec!["..sneaky.txt"],
            Err("invalid path: must not start with '..': ..sneaky.txt"),
        ),
        (
            "payload with doubledot path is invalid",
            vec!["foo/../etc/password"],
            Err("invalid path: must not contain '..': foo/../etc/password"),
        ),
        (
            "payload with empty path is invalid",
            vec![""],
            Err("invalid path: must not be empty: \"\""),
        ),
        (
            "payload with unclean path should be cleaned",
            vec!["foo////bar"],
            Ok(vec!["foo/bar"]),
        ),
    ];
    for (name, paths, want) in cases {
        let files: Vec<(&str, &str, u32)> = paths.iter().map(|p| (*p, "x", 0o644)).collect();
        let got = validate_payload(&payload(&files))
            .map(|cleaned| cleaned.into_keys().collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        let want = want
            .map(|paths| paths.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>())
            .map_err(str::to_owned);
        assert_eq!(got, want, "{name}");
    }
    for (bad, error) in [
        (
            "./..data",
            "invalid path: must not start with '..': ./..data",
        ),
        (
            ".",
            "invalid path: must name a file, not the volume's directory: .",
        ),
        ("..data", "invalid path: must not start with '..': ..data"),
        ("../x", "invalid path: must not contain '..': ../x"),
    ] {
        assert_eq!(
            validate_payload(&payload(&[(bad, "x", 0o644)]))
                .unwrap_err()
                .to_string(),
            error
        );
    }
    assert!(matches!(
        validate_payload(&payload(&[("a", "x", 0o644), ("a/b", "y", 0o644)])),
        Err(AtomicWriteError::Collision(c)) if c == "a"
    ));
}

#[test]
fn test_paths_to_remove() {
    let old = |paths: &[&str]| {
        paths
            .iter()
            .map(|p| (*p).to_owned())
            .collect::<BTreeSet<_>>()
    };
    let new = payload(&[("foo.txt", "", 0o644)]);
    assert_eq!(
        paths_to_remove(&old(&["foo.txt", "bar.txt"]), &new),
        old(&["bar.txt"])
    );
    assert_eq!(
        paths_to_remove(&old(&["foo.txt", "zip", "zip/bar.txt"]), &new),
        old(&["zip", "zip/bar.txt"])
    );
    let deep = payload(&[("zap/1/2/magic.txt", "", 0o644)]);
    assert_eq!(
        paths_to_remove(
            &old(&[
                "zap",
                "zap/1",
                "zap/1/2",
                "zap/1/2/3",
                "zap/1/2/3/x",
                "zap/1/2/c"
            ]),
            &deep
        ),
        old(&["zap/1/2/3", "zap/1/2/3/x", "zap/1/2/c"])
    );
}

#[test]
fn test_write_once_contents_modes_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    let files = [
        ("foo", "foo", 0o644),
        ("bar", "\u{1}\u{2}binary", 0o400),
        (".dotfile", "dot", 0o777),
        ("foo2/bar/zab.txt", "deep", 0o600),
        ("1/2/3/4/5/6/7/8/9/10/.dotfile.lib", "kitchen sink", 0o777),
    ];
    assert!(writer.write(&payload(&files)).unwrap());
    assert_eq!(contents(dir.path()), expect(&files));
    let data = data_target(dir.path());
    assert!(data.to_str().unwrap().starts_with(".."), "{data:?}");
    for top in ["foo", "bar", ".dotfile", "foo2", "1"] {
        assert_eq!(
            std::fs::read_link(dir.path().join(top)).unwrap(),
            Path::new("..data").join(top)
        );
    }
    let meta = std::fs::metadata(dir.path().join(&data)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    // Unclean paths are written cleaned.
    let dir = tempfile::tempdir().unwrap();
    AtomicWriter::new(dir.path())
        .unwrap()
        .write(&payload(&[("foo//bar.txt", "x", 0o644)]))
        .unwrap();
    assert_eq!(contents(dir.path()), expect(&[("foo/bar.txt", "x", 0o644)]));
}

#[test]
fn test_update_add_delete_and_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    writer
        .write(&payload(&[
            ("foo", "foo", 0o644),
            ("zip/bar", "zip", 0o644),
        ]))
        .unwrap();
    let first = data_target(dir.path());
    // Identical: nothing written, the same version stays.
    assert!(
        !writer
            .write(&payload(&[
                ("foo", "foo", 0o644),
                ("zip/bar", "zip", 0o644)
            ]))
            .unwrap()
    );
    assert_eq!(data_target(dir.path()), first);
    // Update of data and mode, one file gone, one added.
    let next = [("foo", "foo2", 0o400), ("new/deep/file", "n", 0o600)];
    assert!(writer.write(&payload(&next)).unwrap());
    assert_eq!(contents(dir.path()), expect(&next));
    assert!(!dir.path().join("zip").exists(), "its symlink went");
    assert!(
        dir.path().join(&first).exists(),
        "the version just replaced stays until the next call"
    );
    let second = data_target(dir.path());
    assert!(!writer.write(&payload(&next)).unwrap(), "nothing changed");
    assert!(
        !dir.path().join(&first).exists(),
        "a call that changes nothing removes the replaced version"
    );
    assert_eq!(data_target(dir.path()), second);
    // Delete all: an empty version, no user-visible names left.
    assert!(writer.write(&BTreeMap::new()).unwrap());
    assert!(contents(dir.path()).is_empty());
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        3,
        "..data, this version and the one before: {names:?}"
    );
    assert!(!writer.write(&BTreeMap::new()).unwrap());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "..data and this version"
    );
}

#[test]
fn a_deleted_user_visible_symlink_is_restored_without_a_new_version() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    let files = payload(&[("foo", "foo", 0o644)]);
    writer.write(&files).unwrap();
    let version = data_target(dir.path());
    std::fs::remove_file(dir.path().join("foo")).unwrap();
    assert!(!writer.write(&files).unwrap());
    assert_eq!(data_target(dir.path()), version);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("foo")).unwrap(),
        "foo"
    );
}

#[test]
fn planted_symlinks_never_lead_a_write_outside() {
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("passwd");
    std::fs::write(&victim, "root").unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A container planted a symlink at a user-visible name, and a `..data` pointing outside.
    std::os::unix::fs::symlink(&victim, dir.path().join("foo")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("..data_tmp")).unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    writer
        .write(&payload(&[
            ("foo", "mine", 0o644),
            ("passwd", "mine", 0o644),
        ]))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing added outside"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("foo")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_link(dir.path().join("foo")).unwrap(),
        Path::new("..data/foo")
    );
    // A symlink planted inside the current version (a directory of the payload swapped for a
    // link outside) is not followed when the next write compares or removes.
    let version = dir.path().join(data_target(dir.path()));
    std::fs::remove_file(version.join("passwd")).unwrap();
    std::os::unix::fs::symlink(&victim, version.join("passwd")).unwrap();
    writer.write(&payload(&[("foo", "mine", 0o644)])).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root");
    assert!(victim.exists());
}

#[test]
fn the_target_itself_must_not_be_a_symlink() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("volume");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    assert!(AtomicWriter::new(&link).is_err());
}

#[test]
fn files_get_the_exact_mode_and_owner() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    let uid = nix::unistd::getuid().as_raw();
    let mut files = payload(&[("a", "x", 0o640)]);
    files.get_mut("a").unwrap().fs_user = Some(uid);
    writer.write(&files).unwrap();
    let meta = std::fs::metadata(dir.path().join("a")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    assert_eq!(meta.uid(), uid);
}

proptest! {
    /// Whatever the key, an accepted path stays below the target and never names the
    /// writer's own `..` entries.
    #[test]
    fn accepted_paths_stay_inside(path in "[a-z./]{0,12}") {
        if let Ok(cleaned) = validate_payload(&payload(&[(path.as_str(), "x", 0o644)])) {
            let cleaned = cleaned.keys().next().unwrap().clone();
            prop_assert!(!cleaned.is_empty());
            prop_assert!(!cleaned.starts_with('/'));
            prop_assert!(!cleaned.split('/').any(|e| e == ".." || e == "." || e.is_empty()));
            prop_assert!(!cleaned.starts_with(".."));
        }
    }

    /// `paths_to_remove` never lists a new path or a parent of one.
    #[test]
    fn removal_keeps_what_the_new_payload_needs(
        old in proptest::collection::btree_set("[ab](/[ab]){0,3}", 0..8),
        new in proptest::collection::btree_set("[ab](/[ab]){0,3}", 0..4),
    ) {
        let new: BTreeMap<String, FileProjection> =
            new.into_iter().map(|p| (p, file("", 0o644))).collect();
        let removed = paths_to_remove(&old, &new);
        for path in new.keys() {
            prop_assert!(!removed.contains(path));
            let mut parent = path.as_str();
            while let Some((dir, _)) = parent.rsplit_once('/') {
                prop_assert!(!removed.contains(dir));
                parent = dir;
            }
        }
        prop_assert!(removed.is_subset(&old));
    }
}

#[test]
fn a_reader_never_sees_a_torn_or_missing_file_while_versions_change() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    let version = |n: usize| {
        let body = format!("{n:08}").repeat(512);
        payload(&[("a", &body, 0o644), ("b/c", &body, 0o644)])
    };
    writer.write(&version(0)).unwrap();
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reads = std::sync::Arc::new(AtomicUsize::new(0));
    let reader = {
        let (target, stop, reads) = (dir.path().to_owned(), stop.clone(), reads.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let a = std::fs::read_to_string(target.join("a")).expect("never missing");
                assert_eq!(a.len(), 8 * 512, "never torn");
                assert!(a == a[..8].repeat(512), "one version");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    for n in 1..200 {
        // One read finishes between writes: a reader is never overtaken by two versions in a
        // single lookup (the writer keeps exactly one version behind).
        let seen = reads.load(Ordering::Relaxed);
        while reads.load(Ordering::Relaxed) == seen && !reader.is_finished() {
            std::thread::yield_now();
        }
        assert!(writer.write(&version(n)).unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader saw every version whole");
}

#[test]
fn a_mode_only_change_is_not_rewritten_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let writer = AtomicWriter::new(dir.path()).unwrap();
    writer.write(&payload(&[("foo", "same", 0o644)])).unwrap();
    let version = data_target(dir.path());
    assert!(
        !writer.write(&payload(&[("foo", "same", 0o600)])).unwrap(),
        "V99 step 4: only bytes count"
    );
    assert_eq!(data_target(dir.path()), version);
    assert_eq!(contents(dir.path()), expect(&[("foo", "same", 0o644)]));
}
