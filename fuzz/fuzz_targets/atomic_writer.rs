//! Fuzz target `atomic_writer`: the path and payload validation of the atomic writer (what a
//! ConfigMap key, a `items[].path` or a downward API path must pass before it names a file in a
//! volume).
//!
//! The input is the payload's paths, one a line. Nothing may panic, and an accepted payload
//! names only files inside the volume: every cleaned path is relative, has no empty, `.` or
//! `..` element, does not start with `..` (the writer's own `..data` and `..<timestamp>`), and
//! no path is the parent directory of another.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use rustlet_mount::atomic_writer::{FileProjection, validate_path, validate_payload};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut payload = BTreeMap::new();
    for path in text.split('\n') {
        let _ = validate_path(path);
        payload.insert(
            path.to_owned(),
            FileProjection {
                data: path.as_bytes().to_vec(),
                mode: 0o644,
                fs_user: None,
            },
        );
    }
    let Ok(cleaned) = validate_payload(&payload) else {
        return;
    };
    for path in cleaned.keys() {
        assert!(!path.starts_with('/'), "{path:?} is absolute");
        assert!(!path.starts_with(".."), "{path:?} starts with '..'");
        for element in path.split('/') {
            assert!(
                !matches!(element, "" | "." | ".."),
                "{path:?} has the element {element:?}"
            );
        }
        assert!(
            validate_path(path).is_ok(),
            "the cleaned {path:?} fails validation"
        );
        let mut parent = path.as_str();
        while let Some((dir, _)) = parent.rsplit_once('/') {
            assert!(
                !cleaned.contains_key(dir),
                "{dir:?} is both a file and a directory"
            );
            parent = dir;
        }
    }
});
