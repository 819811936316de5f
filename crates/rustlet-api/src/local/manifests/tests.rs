//! The manifest directory: parsing, pod UIDs (fresh, remembered in the state file), changes,
//! new incarnations, withdrawals and bad files.

use std::sync::Arc;

use serde_json::json;

use super::super::store::{DeleteOptions, Kind, ObjectRef, Store};
use super::{DirectorySync, ManifestError, parse_documents};

fn setup() -> (tempfile::TempDir, Arc<Store>, DirectorySync) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::default());
    let sync = DirectorySync::new(dir.path(), "node-a", store.clone());
    (dir, store, sync)
}

/// [`setup`] with a UID and a status state file (`state/uids.json`, `state/statuses.json`).
fn setup_with_state() -> (
    tempfile::TempDir,
    Arc<Store>,
    DirectorySync,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let (dir, store, sync) = setup();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (uids, statuses) = (state.join("uids.json"), state.join("statuses.json"));
    let sync = sync
        .with_uid_state(&uids)
        .unwrap()
        .with_status_state(&statuses)
        .unwrap();
    (dir, store, sync, uids, statuses)
}

const WEB: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: ns
spec:
  containers:
  - name: c
    image: nginx
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
  namespace: ns
data:
  k: v
";

fn web() -> ObjectRef {
    ObjectRef::new(Kind::Pod, "ns", "web")
}

#[test]
fn documents_are_applied_with_node_name_and_a_uid_remembered_across_restarts() {
    let (dir, store, sync) = setup();
    let state = dir.path().join("state").join("uids.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    let mut sync = sync.with_uid_state(&state).unwrap();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    let report = sync.sync();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.applied.len(), 2);
    let pod = store.get(&web()).unwrap();
    assert_eq!(pod["spec"]["nodeName"], "node-a");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(uid.len(), 36);
    assert_eq!(&uid[14..15], "4", "a random (v4) UUID: {uid}");
    assert_eq!(
        store
            .get(&ObjectRef::new(Kind::ConfigMap, "ns", "web-config"))
            .unwrap()["data"]["k"],
        "v"
    );
    // A restart (a fresh store) with the state file gives the pod the same UID...
    let store2 = Arc::new(Store::default());
    DirectorySync::new(dir.path(), "node-a", store2.clone())
        .with_uid_state(&state)
        .unwrap()
        .sync();
    assert_eq!(store2.get(&web()).unwrap()["metadata"]["uid"], uid.as_str());
    // ... and without it, the API server's way: a new object, a new UID.
    let store3 = Arc::new(Store::default());
    DirectorySync::new(dir.path(), "node-a", store3.clone()).sync();
    assert_ne!(store3.get(&web()).unwrap()["metadata"]["uid"], uid.as_str());
    // Nothing changed: nothing applied.
    assert_eq!(sync.sync().applied, vec![]);
    assert!(!state.with_extension("tmp").exists(), "written by rename");
}

/// Issue 24 item 5: a zero-length or half-written state file (a crash that lost the write)
/// no longer stops the agent: it is moved aside with a timestamp, read as empty, and the next
/// scan writes a whole one.
#[test]
fn a_zero_length_or_half_written_state_file_is_moved_aside_and_rebuilt() {
    let (dir, store, sync, uids, statuses) = setup_with_state();
    let mut sync = sync;
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    let uid = store.get(&web()).unwrap()["metadata"]["uid"].clone();
    let whole = std::fs::read(&uids).unwrap();
    for (name, bytes) in [
        ("zero-length", &whole[..0]),
        ("half-written", &whole[..whole.len() / 2]),
    ] {
        std::fs::write(&uids, bytes).unwrap();
        std::fs::write(&statuses, bytes).unwrap();
        let store2 = Arc::new(Store::default());
        let mut restarted = DirectorySync::new(dir.path(), "node-a", store2.clone())
            .with_uid_state(&uids)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .with_status_state(&statuses)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let state_dir = uids.parent().unwrap();
        let mut aside: Vec<String> = std::fs::read_dir(state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".corrupt-"))
            .collect();
        aside.sort();
        assert_eq!(aside.len(), 2, "{name}: both files moved aside: {aside:?}");
        assert!(aside[0].starts_with("statuses.json.corrupt-"), "{aside:?}");
        assert!(aside[1].starts_with("uids.json.corrupt-"), "{aside:?}");
        assert_eq!(
            std::fs::read(state_dir.join(&aside[1])).unwrap(),
            bytes,
            "kept as found"
        );
        for file in aside {
            std::fs::remove_file(state_dir.join(file)).unwrap();
        }
        let report = restarted.sync();
        assert!(report.errors.is_empty(), "{name}: {:?}", report.errors);
        // Rebuilt: a new UID for the pod (the old one was in the lost file), written whole.
        let new_uid = store2.get(&web()).unwrap()["metadata"]["uid"].clone();
        assert_ne!(new_uid, uid, "{name}");
        let written: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(&std::fs::read(&uids).unwrap()).unwrap();
        assert_eq!(
            written.values().collect::<Vec<_>>(),
            [&new_uid.as_str().unwrap().to_owned()]
        );
    }
}

/// A state file that cannot be read at all (here: a directory) is still an error naming it.
#[test]
fn an_unreadable_uid_state_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("uids.json");
    std::fs::create_dir(&state).unwrap();
    let err = DirectorySync::new(dir.path(), "node-a", Arc::new(Store::default()))
        .with_uid_state(&state)
        .unwrap_err();
    assert!(err.to_string().contains("uids.json"), "{err}");
}

#[test]
fn terminal_statuses_come_back_after_a_restart_and_others_do_not() {
    let (dir, store, mut sync, uids, statuses) = setup_with_state();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    store
        .patch_status(&web(), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    sync.sync();
    let restart = || {
        let store = Arc::new(Store::default());
        DirectorySync::new(dir.path(), "node-a", store.clone())
            .with_uid_state(&uids)
            .unwrap()
            .with_status_state(&statuses)
            .unwrap()
            .sync();
        store.get(&web()).unwrap()
    };
    assert_eq!(
        restart()["status"]["phase"],
        "Pending",
        "a running pod's status is made again by the agent"
    );
    let finished = json!({"phase": "Succeeded", "containerStatuses": [{"name": "c", "image": "busybox",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-12-02T10:00:00Z"}}}]});
    store
        .patch_status(&web(), &json!({ "status": finished }))
        .unwrap();
    assert!(sync.sync().errors.is_empty());
    let pod = restart();
    assert_eq!(pod["status"]["phase"], "Succeeded");
    assert_eq!(
        pod["status"]["containerStatuses"],
        store.get(&web()).unwrap()["status"]["containerStatuses"]
    );
    assert_eq!(
        pod["metadata"]["uid"],
        store.get(&web()).unwrap()["metadata"]["uid"]
    );
    // The pod goes (its manifest removed; a finished pod is deleted at once): its status is
    // forgotten.
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    sync.sync();
    assert!(store.get(&web()).is_err());
    let kept: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&statuses).unwrap()).unwrap();
    assert!(kept.is_empty(), "{kept:?}");
}

/// Issue 29: the 500 ms status period hops to the blocking pool only when the store changed
/// since the last save (a settled node's hops were most of its wake-ups): after a save
/// nothing is due, a status write makes it due, and saving makes it quiet again.
#[test]
fn the_status_period_is_due_only_after_the_store_changed() {
    let (dir, store, mut sync, _uids, _statuses) = setup_with_state();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    assert!(!sync.statuses_due(), "saved by the scan");
    store
        .patch_status(&web(), &json!({"status": {"phase": "Running"}}))
        .unwrap();
    assert!(sync.statuses_due(), "a status was written");
    assert!(sync.save_statuses_now().errors.is_empty());
    assert!(!sync.statuses_due(), "saved");
}

/// `run()` without a `sync()` before it: the status state file's periodic save must not run
/// before the first scan (the store is still empty then, and saving would erase the kept
/// statuses): the finished pod comes back finished.
#[tokio::test(start_paused = true)]
async fn run_after_a_restart_keeps_the_finished_statuses() {
    let (dir, store, mut sync, uids, statuses) = setup_with_state();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    store
        .patch_status(&web(), &json!({"status": {"phase": "Failed"}}))
        .unwrap();
    assert!(sync.sync().errors.is_empty());
    for _ in 0..20 {
        let store = Arc::new(Store::default());
        let restarted = DirectorySync::new(dir.path(), "node-a", store.clone())
            .with_uid_state(&uids)
            .unwrap()
            .with_status_state(&statuses)
            .unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(restarted.run(cancel.clone()));
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(store.get(&web()).unwrap()["status"]["phase"], "Failed");
        cancel.cancel();
        task.await.unwrap();
    }
}

/// A status state file of the wrong shape (valid JSON, not a map) is moved aside as well.
#[test]
fn a_status_state_of_the_wrong_shape_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("statuses.json");
    std::fs::write(&state, "[1, 2]").unwrap();
    DirectorySync::new(dir.path(), "node-a", Arc::new(Store::default()))
        .with_status_state(&state)
        .unwrap();
    assert!(!state.exists());
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("statuses.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
}

fn finish(store: &Store) {
    // What the status manager does once the old incarnation is reclaimed.
    let force = DeleteOptions {
        grace_period_seconds: Some(0),
        ..DeleteOptions::default()
    };
    store.delete(&web(), &force).unwrap();
}

#[test]
fn a_changed_spec_is_a_new_incarnation_created_once_the_old_one_is_gone() {
    let (dir, store, mut sync) = setup();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    let old_uid = store.get(&web()).unwrap()["metadata"]["uid"].clone();
    store
        .patch_status(&web(), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    // A label change keeps the UID and the status.
    std::fs::write(
        dir.path().join("web.yaml"),
        WEB.replace(
            "  namespace: ns\nspec:",
            "  namespace: ns\n  labels: {app: web}\nspec:",
        ),
    )
    .unwrap();
    assert_eq!(sync.sync().applied, vec![web()]);
    let pod = store.get(&web()).unwrap();
    assert_eq!(
        (
            pod["metadata"]["uid"].clone(),
            pod["status"]["phase"].clone()
        ),
        (old_uid.clone(), json!("Running"))
    );
    // An image change is a new pod: the old one terminates first, the new one waits.
    std::fs::write(dir.path().join("web.yaml"), WEB.replace("nginx", "nginx:2")).unwrap();
    assert_eq!(sync.sync().waiting, vec![web()]);
    let pod = store.get(&web()).unwrap();
    assert_eq!(pod["metadata"]["uid"], old_uid);
    assert!(!pod["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(sync.sync().waiting, vec![web()], "still waiting");
    finish(&store);
    assert_eq!(sync.sync().applied, vec![web()]);
    let pod = store.get(&web()).unwrap();
    assert_ne!(pod["metadata"]["uid"], old_uid);
    // A new pod starts Pending with its QoS class, as the API server creates it; the old
    // status is not carried.
    assert_eq!(
        pod["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
}

/// Issue 10 item 17: removing a manifest and restoring it while its pod still terminates
/// never brings back the terminating UID.
#[test]
fn a_manifest_removed_and_restored_within_the_grace_period_is_a_new_pod() {
    let (dir, store, mut sync) = setup();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    let old_uid = store.get(&web()).unwrap()["metadata"]["uid"].clone();
    store
        .patch_status(&web(), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    assert_eq!(sync.sync().terminating, vec![web()]);
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    assert_eq!(sync.sync().waiting, vec![web()]);
    assert_eq!(store.get(&web()).unwrap()["metadata"]["uid"], old_uid);
    finish(&store);
    sync.sync();
    let pod = store.get(&web()).unwrap();
    assert_ne!(pod["metadata"]["uid"], old_uid, "a fresh UID");
    assert_eq!(
        pod["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
    assert!(pod["metadata"]["deletionTimestamp"].is_null());
}

#[test]
fn a_pod_whose_document_disappears_is_terminating_not_dropped() {
    let (dir, store, mut sync) = setup();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    let report = sync.sync();
    assert_eq!(report.terminating, vec![web()]);
    assert_eq!(
        report.removed,
        vec![ObjectRef::new(Kind::ConfigMap, "ns", "web-config")]
    );
    let pod = store.get(&web()).unwrap();
    assert!(pod["metadata"]["deletionTimestamp"].is_string());
}

#[test]
fn a_bad_file_is_reported_with_its_position_and_disturbs_nothing() {
    let (dir, store, mut sync) = setup();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    sync.sync();
    let before = store.get(&web()).unwrap();
    // The file breaks; another file is fine.
    std::fs::write(
        dir.path().join("web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("other.json"),
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns"}}"#,
    )
    .unwrap();
    let report = sync.sync();
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let message = report.errors[0].to_string();
    assert!(
        message.starts_with(&format!("parse {}:", dir.path().join("web.yaml").display())),
        "{message}"
    );
    assert!(
        matches!(report.errors[0], ManifestError::Parse { line: Some(_), .. }),
        "{message}"
    );
    assert_eq!(
        report.applied,
        vec![ObjectRef::new(Kind::Secret, "ns", "s")]
    );
    assert_eq!(store.get(&web()).unwrap(), before);
    assert!(report.terminating.is_empty());
}

#[test]
fn unsupported_documents_name_the_file_and_document() {
    let path = std::path::Path::new("/m/x.yaml");
    let err = parse_documents(path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n").unwrap_err();
    assert!(
        matches!(err, ManifestError::Invalid { document: 2, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("/m/x.yaml document 2: unsupported apiVersion/kind"),
        "{err}"
    );
    let err = parse_documents(std::path::Path::new("/m/x.json"), "{\"a\": ").unwrap_err();
    assert!(
        matches!(err, ManifestError::Parse { line: Some(1), .. }),
        "{err}"
    );
    // Empty documents are skipped; JSON may hold several values.
    assert_eq!(
        parse_documents(path, "---\n---\n").unwrap(),
        Vec::<serde_json::Value>::new()
    );
    let two = "{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"name\":\"a\"}}\n{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"name\":\"b\"}}";
    assert_eq!(
        parse_documents(std::path::Path::new("/m/two.json"), two)
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn run_applies_a_new_file_within_a_second() {
    let (dir, store, sync) = setup();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(sync.run(cancel.clone()));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(store.get(&web()).is_ok());
    cancel.cancel();
    task.await.unwrap();
}

/// The directory's inotify watch: a written manifest is applied in milliseconds, long before
/// the safety-net scan (10 s), and so is its removal; nothing is read in between.
#[tokio::test(start_paused = true)]
async fn run_applies_a_change_when_the_watch_announces_it() {
    use crate::dir_watch::{SETTLE_AT_MOST, WATCHED_PERIOD};

    let (dir, store, sync) = setup();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(sync.run(cancel.clone()));
    // Past the first scan.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // The file's ConfigMap (a pod is deleted gracefully, a ConfigMap at once).
    let config = ObjectRef::new(Kind::ConfigMap, "ns", "web-config");
    let applied = |present: bool| {
        let store = store.clone();
        let config = config.clone();
        async move {
            let start = tokio::time::Instant::now();
            while store.get(&config).is_ok() != present {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            start.elapsed()
        }
    };
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    let took = applied(true).await;
    assert!(took <= SETTLE_AT_MOST, "{took:?}: not the watch");
    assert!(took < WATCHED_PERIOD);
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    let took = applied(false).await;
    assert!(took <= SETTLE_AT_MOST, "{took:?}: not the watch");
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn an_object_moved_to_another_file_in_one_scan_is_not_withdrawn() {
    use super::super::store::{EventType, Selection};

    let (dir, store, mut sync) = setup();
    let config = "apiVersion: v1
kind: ConfigMap
metadata:
  name: shared
  namespace: ns
data:
  k: v
";
    // `b.yaml` sorts after `a.yaml`, and `z.yaml` after both: the move is seen in both orders.
    for (from, to) in [
        ("a.yaml", "b.yaml"),
        ("b.yaml", "a.yaml"),
        ("a.yaml", "z.yaml"),
    ] {
        std::fs::write(dir.path().join(from), config).unwrap();
        std::fs::remove_file(dir.path().join(to)).ok();
        assert!(sync.sync().errors.is_empty());
        let mut watch = store
            .watch(Selection::all(Kind::ConfigMap), store.resource_version())
            .unwrap();
        // `from` keeps another object; `to` gains this one.
        std::fs::write(dir.path().join(from), config.replace("shared", "other")).unwrap();
        std::fs::write(dir.path().join(to), config.replace("k: v", "k: w")).unwrap();
        let report = sync.sync();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert!(
            report.removed.is_empty(),
            "{from} -> {to}: {:?}",
            report.removed
        );
        let mut seen = Vec::new();
        while let Ok(Ok(event)) =
            tokio::time::timeout(std::time::Duration::from_millis(1), watch.next()).await
        {
            if event.reference.name == "shared" {
                seen.push((event.type_, event.object.to_value()["data"]["k"].clone()));
            }
        }
        assert_eq!(seen, [(EventType::Modified, json!("w"))], "{from} -> {to}");
        for file in [from, to] {
            std::fs::remove_file(dir.path().join(file)).unwrap();
        }
        sync.sync();
    }
    // Removed from every file, it is withdrawn.
    assert!(
        store
            .get(&ObjectRef::new(Kind::ConfigMap, "ns", "shared"))
            .is_err()
    );
}

#[test]
fn an_oversized_file_is_reported_unread_and_its_objects_stay() {
    let (dir, store, mut sync) = setup();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    assert!(sync.sync().errors.is_empty());
    let file = std::fs::File::options()
        .append(true)
        .open(dir.path().join("web.yaml"))
        .unwrap();
    file.set_len(super::MAX_MANIFEST_BYTES + 1).unwrap();
    let report = sync.sync();
    assert!(
        matches!(&report.errors[..], [ManifestError::TooLarge { size, .. }] if *size == super::MAX_MANIFEST_BYTES + 1),
        "{:?}",
        report.errors
    );
    assert!(report.errors[0].to_string().contains("web.yaml"));
    assert!(report.terminating.is_empty() && report.removed.is_empty());
    assert!(store.get(&web()).unwrap()["metadata"]["deletionTimestamp"].is_null());
}

/// A file's stamp is trusted only once it has settled for a second (a change within the
/// filesystem clock's tick could keep the same stamp), and any rewrite changes it.
#[test]
fn a_file_stamp_is_trusted_only_once_settled() {
    use std::time::{Duration, SystemTime};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("web.yaml");
    std::fs::write(&path, WEB).unwrap();
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(super::stamp(&metadata, SystemTime::now()), None, "racy");
    let later = SystemTime::now() + Duration::from_secs(2);
    let settled = super::stamp(&metadata, later).expect("settled");
    std::fs::write(&path, WEB.replace("nginx", "httpd")).unwrap();
    let rewritten = std::fs::metadata(&path).unwrap();
    assert_ne!(
        super::stamp(&rewritten, SystemTime::now() + Duration::from_secs(2)),
        Some(settled)
    );
}

#[test]
fn a_broken_file_is_reported_once_and_again_only_when_it_changes() {
    let (dir, store, mut sync) = setup();
    let path = dir.path().join("web.yaml");
    std::fs::write(&path, "kind: Pod\nmetadata: [unclosed\n").unwrap();
    assert_eq!(sync.sync().errors.len(), 1);
    for _ in 0..3 {
        assert!(sync.sync().errors.is_empty(), "said once");
    }
    std::fs::write(&path, "kind: Pod\nmetadata: {unclosed\n").unwrap();
    assert_eq!(sync.sync().errors.len(), 1, "a new content is said again");
    std::fs::write(&path, WEB).unwrap();
    let report = sync.sync();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(store.get(&web()).is_ok());
}

#[test]
fn other_kinds_are_ignored_by_kind_and_name_and_the_rest_is_applied() {
    let (dir, store, mut sync) = setup();
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: web-svc, namespace: ns}\nspec: {ports: [{port: 80}]}\n";
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web-deploy}\n";
    std::fs::write(
        dir.path().join("app.yaml"),
        format!("{service}---\n{WEB}---\n{deployment}"),
    )
    .unwrap();
    let report = sync.sync();
    assert!(store.get(&web()).is_ok(), "the pod is applied");
    let messages: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(
        messages[0].ends_with(
            "app.yaml document 1: v1/Service \"web-svc\" ignored: local mode does not serve this kind"
        ),
        "{messages:?}"
    );
    assert!(
        messages[1].contains("document 4: apps/v1/Deployment \"web-deploy\" ignored"),
        "{messages:?}"
    );
    assert!(sync.sync().errors.is_empty(), "said once");
}

#[test]
fn the_same_object_in_two_files_keeps_the_first_and_the_second_takes_over_when_it_goes() {
    let (dir, store, mut sync) = setup();
    let pod = |image: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: ns}}\nspec: {{containers: [{{name: c, image: {image}}}]}}\n"
        )
    };
    // b.yaml first; a.yaml (which sorts first) comes later: the pod stays b's.
    std::fs::write(dir.path().join("b.yaml"), pod("from-b")).unwrap();
    sync.sync();
    std::fs::write(dir.path().join("a.yaml"), pod("from-a")).unwrap();
    let before = store.get(&web()).unwrap();
    let report = sync.sync();
    let messages: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].contains("a.yaml document 1: Pod ns/web already exists")
            && messages[0].ends_with("b.yaml provides it"),
        "{messages:?}"
    );
    assert!(report.applied.is_empty() && report.terminating.is_empty());
    for _ in 0..3 {
        let report = sync.sync();
        assert!(report.errors.is_empty() && report.applied.is_empty());
    }
    assert_eq!(store.get(&web()).unwrap(), before, "untouched");
    // The losing file goes: nothing happens to the pod; it comes back: a conflict again.
    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let report = sync.sync();
    assert!(report.terminating.is_empty() && report.removed.is_empty() && report.errors.is_empty());
    assert_eq!(store.get(&web()).unwrap(), before);
    std::fs::write(dir.path().join("a.yaml"), pod("from-a")).unwrap();
    assert_eq!(
        sync.sync().errors.len(),
        1,
        "the conflict said again for the new file"
    );

    // b.yaml goes: its pod is deleted gracefully, then a.yaml's is created.
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    assert_eq!(sync.sync().waiting, vec![web()], "a.yaml's pod waits");
    assert!(!store.get(&web()).unwrap()["metadata"]["deletionTimestamp"].is_null());
    finish(&store);
    sync.sync();
    let now = store.get(&web()).unwrap();
    assert_eq!(now["spec"]["containers"][0]["image"], "from-a");
    assert_ne!(now["metadata"]["uid"], before["metadata"]["uid"]);

    // Two new files in one scan: the first in name order wins.
    std::fs::write(
        dir.path().join("c1.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: ns}\ndata: {k: one}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("c2.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm, namespace: ns}\ndata: {k: two}\n",
    )
    .unwrap();
    assert_eq!(sync.sync().errors.len(), 1);
    let cm = store
        .get(&ObjectRef::new(Kind::ConfigMap, "ns", "cm"))
        .unwrap();
    assert_eq!(cm["data"]["k"], "one");
}

/// A changed file is applied as soon as its objects' owners are settled (issue 29); one whose
/// object a later file provided waits for that file. Within one scan, an object that a later
/// file still has stays with it, and one that moves to another file, earlier or later, moves
/// without being withdrawn (its UID is kept): as if every file had been read first.
#[test]
fn objects_moving_between_files_in_one_scan_settle_as_if_every_file_were_read_first() {
    let (dir, store, mut sync) = setup();
    let cms = |names: &[(&str, &str)]| {
        names
            .iter()
            .map(|(name, value)| {
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: ns}}\ndata: {{k: {value}}}\n"
                )
            })
            .collect::<Vec<_>>()
            .join("---\n")
    };
    let cm = |name: &str| {
        store
            .get(&ObjectRef::new(Kind::ConfigMap, "ns", name))
            .unwrap()
    };
    let write = |file: &str, text: String| std::fs::write(dir.path().join(file), text).unwrap();
    write("b.yaml", cms(&[("kept", "b1"), ("moved-up", "b1")]));
    write("c.yaml", cms(&[("moved-down", "c1")]));
    assert!(sync.sync().errors.is_empty());
    let uid = |name: &str| cm(name)["metadata"]["uid"].clone();
    let (moved_up, moved_down) = (uid("moved-up"), uid("moved-down"));

    // One scan: a.yaml (new, sorts first) has `kept`, which b.yaml still has, and `moved-up`,
    // which b.yaml gave up; `moved-down` goes from c.yaml to d.yaml (new, sorts last).
    write("a.yaml", cms(&[("kept", "a"), ("moved-up", "a")]));
    write("b.yaml", cms(&[("kept", "b2")]));
    write("c.yaml", cms(&[("other", "c2")]));
    write("d.yaml", cms(&[("moved-down", "d")]));
    let report = sync.sync();
    let messages: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].contains("a.yaml document 1: ConfigMap ns/kept already exists")
            && messages[0].ends_with("b.yaml provides it"),
        "{messages:?}"
    );
    assert_eq!(cm("kept")["data"]["k"], "b2", "b.yaml still has it");
    assert_eq!(cm("moved-up")["data"]["k"], "a");
    assert_eq!(
        uid("moved-up"),
        moved_up,
        "moved, not withdrawn and made again"
    );
    assert_eq!(cm("moved-down")["data"]["k"], "d");
    assert_eq!(
        uid("moved-down"),
        moved_down,
        "moved, not withdrawn and made again"
    );
    assert_eq!(cm("other")["data"]["k"], "c2");
    assert!(
        report.removed.is_empty() && report.terminating.is_empty(),
        "{report:?}"
    );

    // b.yaml goes: `kept` is withdrawn and a.yaml takes it over in the next scan.
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    sync.sync();
    sync.sync();
    assert_eq!(cm("kept")["data"]["k"], "a");
}

#[test]
fn yaml_octal_modes_are_octal_as_the_api_server_reads_them() {
    let (dir, store, mut sync) = setup();
    std::fs::write(
        dir.path().join("web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: ns}\nspec:\n  containers: [{name: c, image: nginx}]\n  volumes:\n  - name: s\n    secret:\n      secretName: s\n      defaultMode: 0400\n      items: [{key: k, path: k, mode: 0660}]\n  - name: d\n    configMap: {name: c, defaultMode: 0o755}\n  - name: e\n    configMap: {name: c, defaultMode: 420}\n",
    )
    .unwrap();
    let report = sync.sync();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let pod = store.get(&web()).unwrap();
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["defaultMode"], 0o400);
    assert_eq!(volumes[0]["secret"]["items"][0]["mode"], 0o660);
    assert_eq!(volumes[1]["configMap"]["defaultMode"], 0o755);
    assert_eq!(
        volumes[2]["configMap"]["defaultMode"], 420,
        "decimal stays decimal"
    );
}

/// Issue 15: the directory listing's entry types spare a `stat` per file, yet a symlinked
/// manifest is still read (and a symlink to a directory is not); a scan of a quiet directory
/// changes nothing, and a file gone since is still seen.
#[test]
fn a_symlinked_manifest_is_read_and_a_quiet_scan_changes_nothing() {
    use super::SyncReport;
    let (dir, store, mut sync) = setup();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("web.yaml");
    std::fs::write(&target, WEB).unwrap();
    std::os::unix::fs::symlink(&target, dir.path().join("web.yaml")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("dir.yaml")).unwrap();
    let report = sync.sync();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.applied.len(), 2);
    let version = store.resource_version();
    assert_eq!(sync.sync(), SyncReport::default());
    assert_eq!(store.resource_version(), version, "nothing written");
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    let report = sync.sync();
    assert_eq!(report.terminating, vec![web()]);
}

/// A clock whose reading passes a [`rustlet_volume::testing::ThreadGate`]: the store reads it
/// when it creates an object, so a scan that applies a manifest parks in it.
struct GatedClock(Arc<rustlet_volume::testing::ThreadGate>);

impl rustlet_status::Clock for GatedClock {
    fn now(&self) -> k8s_openapi::jiff::Timestamp {
        self.0.pass();
        rustlet_status::SystemClock.now()
    }
}

/// Issue 24 item 14: the manifest scan (reads of up to 10 MiB, hashing, YAML, the store and
/// the state files) runs on the blocking pool. Parked in the middle of a scan, it holds one
/// pool thread: on this `current_thread` runtime other tasks go on, and the scan finishes
/// once let go.
#[tokio::test(start_paused = true)]
async fn item14_the_manifest_scan_runs_on_the_blocking_pool() {
    use rustlet_volume::testing::{GateOutcome, ThreadGate};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    let gate = Arc::new(ThreadGate::new());
    let store = Arc::new(Store::new(Arc::new(GatedClock(gate.clone()))));
    let sync = DirectorySync::new(dir.path(), "node-a", store.clone());
    gate.arm();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(sync.run(cancel.clone()));
    assert_eq!(
        gate.parked().await,
        GateOutcome::Parked,
        "the manifest scan ran on the async runtime's thread"
    );
    // Parked in the scan (the store's lock may be held: this test leaves the store alone).
    let other = tokio::spawn(async { "another task ran" });
    assert_eq!(other.await.unwrap(), "another task ran");
    assert!(!task.is_finished());
    gate.release();
    while store.get(&web()).is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    cancel.cancel();
    task.await.unwrap();
}

/// Issue 29: a scan keeps its files in byte order and finds them by bytes; for the entries of
/// one directory that is the order and the equality of paths (phase 2 gives a new object to
/// the first file in name order).
#[test]
fn a_scans_files_are_in_path_order_and_found_as_paths_are() {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::{FileKey, SortedPaths};

    let dir = Path::new("/etc/kubernetes/manifests");
    let names = [
        "b.yaml", "a.yaml", "a.yml", "a", "ä.json", "A.yaml", "a.yaml", "a-b.json", "a.b.yaml",
    ];
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    let sorted = SortedPaths::from(paths.clone());
    let by_path: BTreeSet<PathBuf> = paths.into_iter().collect();
    assert!(
        sorted
            .iter()
            .map(|k| k.as_path())
            .eq(by_path.iter().map(PathBuf::as_path)),
        "one copy of each, in path order"
    );
    for path in &by_path {
        assert!(sorted.contains(path), "{}", path.display());
    }
    assert!(!sorted.contains(&dir.join("c.yaml")));
    assert!(!sorted.contains(Path::new("/etc/kubernetes/a.yaml")));
    assert!(sorted.contains_all(by_path.iter().map(PathBuf::as_path)));
    let mut more = by_path.clone();
    more.insert(dir.join("gone.yaml"));
    assert!(!sorted.contains_all(more.iter().map(PathBuf::as_path)));
    // The applied files' keys: the same order, found by a borrowed path's bytes.
    let keys: std::collections::BTreeMap<FileKey, usize> = by_path
        .iter()
        .enumerate()
        .map(|(i, p)| (FileKey::from(p.as_path()), i))
        .collect();
    assert!(keys.keys().map(|k| k.as_path()).eq(by_path.iter()));
    for (i, path) in by_path.iter().enumerate() {
        assert_eq!(keys.get(path.as_os_str()), Some(&i), "{}", path.display());
    }
    assert_eq!(keys.get(dir.join("c.yaml").as_os_str()), None);
}
