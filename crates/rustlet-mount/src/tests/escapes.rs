//! Symlink-escape attempts on every safe-path operation, with both resolvers. Each must fail
//! and leave everything outside the root exactly as it was. No privilege needed.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::safe_path::{
    OpenKind, Resolver, Subpath, create_dir_all_beneath, open_beneath_with, plain_components,
    prepare_subpath,
};

struct Scene {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

/// `root/` holds hostile links; `outside/` holds what they point at.
fn scene() -> Scene {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("real/inner")).unwrap();
    std::fs::write(root.join("real/file"), "inside").unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host secret").unwrap();
    let link =
        |target: &Path, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    link(&outside, "abs-dir"); // absolute link to a dir outside
    link(&outside.join("secret"), "abs-file"); // absolute link to a file outside
    link(Path::new("../outside"), "rel-dir"); // relative link climbing out
    link(Path::new("../outside/secret"), "rel-file");
    link(Path::new("real"), "inner-link"); // a link that stays inside
    Scene {
        _dir: dir,
        root,
        outside,
    }
}

fn outside_untouched(s: &Scene) {
    let mut names: Vec<_> = std::fs::read_dir(&s.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["secret"], "nothing created outside the root");
    assert_eq!(
        std::fs::read_to_string(s.outside.join("secret")).unwrap(),
        "host secret"
    );
}

const HOSTILE: &[&str] = &[
    "abs-dir/secret",
    "abs-file",
    "rel-dir/secret",
    "rel-file",
    "abs-dir",
    "rel-dir",
    "inner-link/file",
    "abs-dir/new",
    "rel-dir/new-file",
];

#[test]
fn open_beneath_refuses_every_symlink_with_both_resolvers() {
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        for kind in [
            OpenKind::Directory,
            OpenKind::File,
            OpenKind::Path,
            OpenKind::CreateFile(0o644),
        ] {
            let s = scene();
            for path in HOSTILE {
                let result = open_beneath_with(&s.root, Path::new(path), kind, resolver);
                assert!(
                    result.is_err(),
                    "{resolver:?} {kind:?} {path}: opened through a symlink"
                );
            }
            outside_untouched(&s);
        }
    }
}

#[test]
fn open_beneath_refuses_absolute_and_parent_paths_before_any_syscall() {
    let s = scene();
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        for path in [
            "/etc/passwd",
            "../outside/secret",
            "real/../../outside/secret",
        ] {
            let err =
                open_beneath_with(&s.root, Path::new(path), OpenKind::File, resolver).unwrap_err();
            assert!(matches!(err, Error::InvalidPath { .. }), "{path}: {err}");
        }
    }
    outside_untouched(&s);
}

#[test]
fn open_beneath_opens_plain_paths_with_both_resolvers() {
    use std::io::{Read, Write};
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let s = scene();
        let mut f = std::fs::File::from(
            open_beneath_with(&s.root, Path::new("real/file"), OpenKind::File, resolver).unwrap(),
        );
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(text, "inside");
        open_beneath_with(
            &s.root,
            Path::new("real/inner"),
            OpenKind::Directory,
            resolver,
        )
        .unwrap();
        open_beneath_with(&s.root, Path::new(""), OpenKind::Directory, resolver).unwrap();
        let mut created = std::fs::File::from(
            open_beneath_with(
                &s.root,
                Path::new("real/new"),
                OpenKind::CreateFile(0o600),
                resolver,
            )
            .unwrap(),
        );
        created.write_all(b"made").unwrap();
        assert_eq!(
            std::fs::read_to_string(s.root.join("real/new")).unwrap(),
            "made"
        );
    }
}

#[test]
fn create_dir_all_beneath_refuses_symlinks_and_creates_plain_dirs() {
    for path in [
        "abs-dir/new",
        "rel-dir/new/deeper",
        "inner-link/new",
        "abs-file/x",
    ] {
        let s = scene();
        assert!(
            create_dir_all_beneath(&s.root, Path::new(path), 0o750).is_err(),
            "{path}"
        );
        outside_untouched(&s);
    }
    let s = scene();
    assert!(matches!(
        create_dir_all_beneath(&s.root, Path::new("../x"), 0o750),
        Err(Error::InvalidPath { .. })
    ));
    create_dir_all_beneath(&s.root, Path::new("real/a/b/c"), 0o750).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.root.join("real/a/b/c"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750, "mode set with fchmod, not the umask");
    outside_untouched(&s);
}

#[test]
fn prepare_subpath_refuses_a_path_resolving_outside_the_volume() {
    let s = scene();
    let target = s.root.join("../target");
    for path in ["abs-dir", "rel-dir", "rel-file"] {
        let err = prepare_subpath(
            &crate::mounter::LinuxMounter::new(),
            &Subpath {
                volume_path: s.root.clone(),
                path: path.into(),
                target: target.clone(),
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::NotWithinBase { .. }), "{path}: {err}");
    }
    assert!(!target.exists(), "nothing created for a refused subpath");
    outside_untouched(&s);
    assert!(plain_components(Path::new("a/./b")).is_ok());
}
