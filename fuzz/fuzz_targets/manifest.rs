//! Fuzz target `manifest`: a manifest file's text through the agent's intake, as the manifest
//! directory (`DirectorySync`) and the static pod source read it.
//!
//! The first byte picks the file name (`pod.json`: JSON documents; anything else `pod.yaml`:
//! YAML), the rest is the file's text. Every document goes through `parse_documents`, then
//! `admit` (as a create, and its result again as an update, which must succeed and store the
//! same object: admission is deterministic and its own output is valid), and a Pod also through
//! the static pod intake. Nothing may panic, hang or exhaust memory.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rustlet_api::local::admission::{Operation, admit};
use rustlet_api::local::manifests::parse_documents;
use rustlet_api::local::store::{Kind, Store};
use rustlet_api::static_pods::fuzz_static_pod;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let path = if selector & 1 == 1 {
        Path::new("/etc/rustlet/manifests/pod.json")
    } else {
        Path::new("/etc/rustlet/manifests/pod.yaml")
    };
    let Ok(documents) = parse_documents(path, text) else {
        return;
    };
    for document in documents {
        let reference = Store::reference_of(&document).expect("parse_documents checked it");
        if reference.kind == Kind::Pod {
            let _ = fuzz_static_pod(path, document.clone(), "node-a");
        }
        let Ok(admitted) = admit(&reference, document, Operation::Create) else {
            continue;
        };
        let again = admit(&reference, admitted.clone(), Operation::Update)
            .unwrap_or_else(|e| panic!("admitted {admitted} is refused as an update: {e}"));
        assert_eq!(again, admitted, "admission is not idempotent");
    }
});
