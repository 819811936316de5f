//! The store's API semantics: UIDs, resourceVersions, the status subresource, preconditions,
//! graceful pod deletion, and watches.

use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use rustlet_status::Clock;
use serde_json::{Value, json};

use super::*;

struct FixedClock(Mutex<Timestamp>);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

fn store() -> Store {
    Store::new(Arc::new(FixedClock(Mutex::new(
        "2026-12-02T10:00:00Z".parse().unwrap(),
    ))))
}

fn pod(name: &str) -> Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":"ns"},
        "spec":{"nodeName":"node-a","containers":[{"name":"c","image":"busybox"}]}})
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The types of a status's conditions, in order.
fn condition_types(status: &Value) -> Vec<&str> {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect()
}

fn pod_ref(name: &str) -> ObjectRef {
    ObjectRef::new(Kind::Pod, "ns", name)
}

#[test]
fn create_assigns_uid_timestamp_and_increasing_resource_versions() {
    let store = store();
    let a = store.create(pod("a")).unwrap();
    let b = store.create(pod("b")).unwrap();
    assert_eq!(a["metadata"]["creationTimestamp"], "2026-12-02T10:00:00Z");
    let uid = a["metadata"]["uid"].as_str().unwrap();
    assert_eq!(uid.len(), 36, "{uid}");
    assert_ne!(a["metadata"]["uid"], b["metadata"]["uid"]);
    assert!(rv(&b) > rv(&a));
    assert_eq!(store.resource_version(), rv(&b));
    assert_eq!(
        store.create(pod("a")).unwrap_err(),
        StoreError::AlreadyExists(pod_ref("a"))
    );
    // A given UID is kept; a missing namespace is `default`.
    let mut c = pod("c");
    c["metadata"] = json!({"name":"c","uid":"given"});
    let c = store.create(c).unwrap();
    assert_eq!(c["metadata"]["uid"], "given");
    assert_eq!(c["metadata"]["namespace"], "default");
}

#[test]
fn documents_that_are_not_supported_objects_are_invalid() {
    let store = store();
    for (doc, why) in [
        (
            json!({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}),
            "unsupported",
        ),
        (
            json!({"apiVersion":"v1","kind":"Pod","metadata":{}}),
            "without metadata.name",
        ),
        (json!("just a string"), "unsupported"),
    ] {
        let err = store.create(doc).unwrap_err();
        assert_eq!(err.code(), 422);
        assert!(err.to_string().contains(why), "{err}");
    }
}

#[test]
fn status_subresource_changes_only_status_and_update_never_changes_status() {
    let store = store();
    let created = store.create(pod("a")).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let patched = store
        .patch_status(
            &pod_ref("a"),
            &json!({"metadata":{"uid":uid},"spec":{"nodeName":"elsewhere"},
                "status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}),
        )
        .unwrap();
    assert_eq!(patched["status"]["phase"], "Running");
    assert_eq!(patched["spec"]["nodeName"], "node-a");
    assert!(rv(&patched) > rv(&created));
    // A strategic merge: conditions merge by type.
    let patched = store
        .patch_status(
            &pod_ref("a"),
            &json!({"status":{"conditions":[{"type":"Initialized","status":"True"}]}}),
        )
        .unwrap();
    assert_eq!(
        condition_types(&patched["status"]),
        ["Ready", "Initialized"]
    );
    // An update with another status keeps the stored one.
    let mut replacement = patched.clone();
    replacement["status"] = json!({"phase":"Failed"});
    replacement["metadata"]["labels"] = json!({"app":"x"});
    let updated = store.update(replacement).unwrap();
    assert_eq!(updated["status"]["phase"], "Running");
    assert_eq!(updated["metadata"]["labels"]["app"], "x");
    // A patch that changes nothing does not bump the resourceVersion.
    let same = store
        .patch_status(&pod_ref("a"), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    assert_eq!(rv(&same), rv(&updated));
}

#[test]
fn uid_and_resource_version_preconditions_conflict_on_mismatch() {
    let store = store();
    let created = store.create(pod("a")).unwrap();
    let err = store
        .patch_status(
            &pod_ref("a"),
            &json!({"metadata":{"uid":"other"},"status":{"phase":"Running"}}),
        )
        .unwrap_err();
    // A patch's UID is validated (immutable field), after the resourceVersion: 422.
    assert_eq!(err.code(), 422);
    assert!(err.to_string().contains("metadata.uid"), "{err}");
    let stale = json!({"metadata":{"resourceVersion":"0"},"status":{"phase":"Running"}});
    assert_eq!(
        store
            .patch_status(&pod_ref("a"), &stale)
            .unwrap_err()
            .code(),
        409
    );
    let fresh = json!({"metadata":{"resourceVersion":created["metadata"]["resourceVersion"]},
        "status":{"phase":"Running"}});
    store.patch_status(&pod_ref("a"), &fresh).unwrap();
    // Nothing was written by the refused patches.
    assert_eq!(
        store.get(&pod_ref("a")).unwrap()["status"],
        json!({"phase":"Running","qosClass":"BestEffort"})
    );
    let wrong_uid = DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        },
    };
    assert_eq!(
        store.delete(&pod_ref("a"), &wrong_uid).unwrap_err().code(),
        409
    );
    assert!(store.get(&pod_ref("a")).is_ok());
    assert_eq!(
        store
            .patch_status(&pod_ref("missing"), &json!({"status":{}}))
            .unwrap_err()
            .code(),
        404
    );
}

#[test]
fn pods_are_deleted_gracefully_then_removed_with_grace_zero() {
    let store = store();
    let mut p = pod("a");
    p["spec"]["terminationGracePeriodSeconds"] = json!(45);
    let created = store.create(p).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let Deleted::Terminating(terminating) = store
        .delete(&pod_ref("a"), &DeleteOptions::default())
        .unwrap()
    else {
        panic!("a pod with a grace period is not removed at once");
    };
    assert_eq!(
        terminating["metadata"]["deletionTimestamp"],
        "2026-12-02T10:00:45Z"
    );
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 45);
    // Deleting again changes nothing.
    let again = store
        .delete(&pod_ref("a"), &DeleteOptions::default())
        .unwrap();
    assert_eq!(again, Deleted::Terminating(terminating.clone()));
    // The kubelet's final delete: grace 0 with the UID.
    let last = DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Preconditions {
            uid: Some(uid),
            resource_version: None,
        },
    };
    assert!(matches!(
        store.delete(&pod_ref("a"), &last).unwrap(),
        Deleted::Removed(_)
    ));
    assert_eq!(store.get(&pod_ref("a")).unwrap_err().code(), 404);
    // Other kinds go at once.
    store
        .create(
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"ns"}}),
        )
        .unwrap();
    let cm = ObjectRef::new(Kind::ConfigMap, "ns", "cm");
    assert!(matches!(
        store.delete(&cm, &DeleteOptions::default()).unwrap(),
        Deleted::Removed(_)
    ));
}

#[test]
fn list_filters_by_kind_namespace_and_field_selector() {
    let store = store();
    store.create(pod("a")).unwrap();
    let mut other = pod("b");
    other["spec"]["nodeName"] = json!("node-b");
    store.create(other).unwrap();
    store
        .create(json!({"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv"}}))
        .unwrap();
    let selection = Selection {
        kind: Kind::Pod,
        namespace: Some("ns".into()),
        fields: FieldSelector::parse("spec.nodeName=node-a").unwrap(),
    };
    let (items, rv) = store.list(&selection);
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "a");
    assert_eq!(rv, store.resource_version());
    let not_a = FieldSelector::parse("metadata.name!=a").unwrap();
    let (items, _) = store.list(&Selection {
        fields: not_a,
        ..Selection::all(Kind::Pod)
    });
    assert_eq!(items.len(), 1);
    // A cluster-scoped kind ignores the namespace.
    let (pvs, _) = store.list(&Selection {
        namespace: Some("ns".into()),
        ..Selection::all(Kind::PersistentVolume)
    });
    assert_eq!(pvs.len(), 1);
    assert!(FieldSelector::parse("nonsense").is_err());
}

#[tokio::test]
async fn a_watch_resumes_from_a_resource_version_and_sees_live_changes() {
    let store = store();
    store.create(pod("first")).unwrap();
    let a = store.create(pod("a")).unwrap();
    store.create(pod("b")).unwrap();
    let selection = Selection {
        kind: Kind::Pod,
        namespace: Some("ns".into()),
        fields: FieldSelector::parse("metadata.name=a").unwrap(),
    };
    let mut watch = store.watch(selection.clone(), rv(&a) - 1).unwrap();
    let event = watch.next().await.unwrap();
    assert_eq!(
        (event.type_, event.resource_version),
        (EventType::Added, rv(&a))
    );
    store
        .patch_status(&pod_ref("a"), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    let event = watch.next().await.unwrap();
    assert_eq!(event.type_, EventType::Modified);
    assert_eq!(event.object.to_value()["status"]["phase"], "Running");
    assert_eq!(event.object.field("status.phase"), "Running");
    store
        .delete(
            &pod_ref("a"),
            &DeleteOptions {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(watch.next().await.unwrap().type_, EventType::Deleted);
    // From "0" (any): the current objects as ADDED first, as the API server starts such a
    // watch, then live events (issue 10 item 19).
    let mut any = store.watch(Selection::all(Kind::Pod), 0).unwrap();
    store.create(pod("c")).unwrap();
    let current = store.list(&Selection::all(Kind::Pod)).0.len() - 1;
    let mut seen = Vec::new();
    for _ in 0..current {
        let event = any.next().await.unwrap();
        assert_eq!(event.type_, EventType::Added);
        seen.push(event.reference.name.clone());
    }
    assert!(seen.contains(&"b".to_owned()), "{seen:?}");
    assert_eq!(any.next().await.unwrap().reference, pod_ref("c"));
}

/// Issue 10 item 19: an empty store never lists at "0" (which a watch reads as "any"), so a
/// list-then-watch never loses an object created in between.
#[tokio::test]
async fn an_empty_store_lists_above_zero_and_list_then_watch_loses_nothing() {
    let store = store();
    let (items, rv) = store.list(&Selection::all(Kind::Pod));
    assert!(items.is_empty());
    assert_ne!(rv, 0);
    store.create(pod("between")).unwrap();
    let mut watch = store.watch(Selection::all(Kind::Pod), rv).unwrap();
    assert_eq!(watch.next().await.unwrap().reference, pod_ref("between"));
}

#[test]
fn a_watch_from_before_the_history_is_gone() {
    let store = store();
    for i in 0..(StoreConfig::default().history + 5) {
        store.create(pod(&format!("p{i}"))).unwrap();
    }
    let err = store.watch(Selection::all(Kind::Pod), 1).unwrap_err();
    assert_eq!(err.code(), 410);
    assert!(
        store
            .watch(Selection::all(Kind::Pod), store.resource_version() - 10)
            .is_ok()
    );
}

/// A status write whose status does not decode is a 422 naming the field under `status`,
/// and leaves the stored object as it was.
#[test]
fn a_status_that_does_not_decode_is_refused_with_its_path() {
    let store = store();
    store.create(pod("p")).unwrap();
    let before = store.get(&pod_ref("p")).unwrap();
    let err = store
        .patch_status(
            &pod_ref("p"),
            &json!({"status": {"containerStatuses": [{"name": "c", "restartCount": "many"}]}}),
        )
        .unwrap_err();
    assert_eq!(err.code(), 422);
    assert!(
        err.to_string()
            .contains("status.containerStatuses[0].restartCount"),
        "{err}"
    );
    assert_eq!(store.get(&pod_ref("p")).unwrap(), before);
}

/// A short history (the agent's own store) lets old versions go: after `history` more writes
/// nothing keeps the first version alive, while the default history still holds it.
#[test]
fn a_short_history_keeps_no_old_versions_alive() {
    let first_version_alive_after = |config: StoreConfig, writes: usize| {
        let store = Store::with_config(Arc::new(SystemClock), config);
        store.create(pod("p")).unwrap();
        let (items, _) = store.list_shared(&Selection::all(Kind::Pod));
        let first = Arc::downgrade(&items[0]);
        drop(items);
        for i in 0..writes {
            store
                .patch_status(
                    &pod_ref("p"),
                    &json!({"status": {"message": i.to_string()}}),
                )
                .unwrap();
        }
        first.upgrade().is_some()
    };
    let short = StoreConfig {
        history: 4,
        watch_buffer: 16,
    };
    assert!(first_version_alive_after(short, 3));
    assert!(!first_version_alive_after(short, 5));
    assert!(first_version_alive_after(StoreConfig::default(), 5));
    assert_eq!(StoreConfig::in_process().history, 64);
}

#[test]
fn json_merge_patch_replaces_removes_and_recurses() {
    let mut target = json!({"a":1,"b":{"c":2,"d":3},"e":[1,2]});
    json_merge(&mut target, &json!({"a":null,"b":{"c":5},"e":[3]}));
    assert_eq!(target, json!({"b":{"c":5,"d":3},"e":[3]}));
}

#[tokio::test]
async fn an_object_that_stops_or_starts_matching_a_field_selector_is_deleted_or_added() {
    let store = store();
    store.create(pod("p")).unwrap();
    let selection = Selection {
        kind: Kind::Pod,
        namespace: None,
        fields: FieldSelector::parse("status.podIP=10.0.0.1").unwrap(),
    };
    let mut watch = store.watch(selection, 0).unwrap();
    let ip = |ip: &str| json!({"status": {"podIP": ip}});
    store.patch_status(&pod_ref("p"), &ip("10.0.0.1")).unwrap();
    assert_eq!(watch.next().await.unwrap().type_, EventType::Added);
    store.patch_status(&pod_ref("p"), &ip("10.0.0.2")).unwrap();
    assert_eq!(watch.next().await.unwrap().type_, EventType::Deleted);
    store.patch_status(&pod_ref("p"), &ip("10.0.0.1")).unwrap();
    assert_eq!(watch.next().await.unwrap().type_, EventType::Added);
}

/// As the API server: only a kind's selectable fields can be selected; a boolean field
/// matches its text (`spec.hostNetwork=true`).
#[test]
fn only_selectable_fields_are_selected_and_booleans_match_their_text() {
    let owner = FieldSelector::parse("data.owner=a").unwrap();
    let err = owner.check(Kind::ConfigMap).unwrap_err();
    assert_eq!(err.code(), 400);
    assert!(
        err.to_string()
            .contains("field label not supported: data.owner")
    );
    assert!(
        FieldSelector::parse("spec.nodeName=a")
            .unwrap()
            .check(Kind::Pod)
            .is_ok()
    );
    assert!(
        FieldSelector::parse("spec.nodeName=a")
            .unwrap()
            .check(Kind::Secret)
            .is_err()
    );
    let store = store();
    let mut host = pod("host");
    host["spec"]["hostNetwork"] = json!(true);
    store.create(host).unwrap();
    store.create(pod("other")).unwrap();
    let (items, _) = store.list(&Selection {
        fields: FieldSelector::parse("spec.hostNetwork=true").unwrap(),
        ..Selection::all(Kind::Pod)
    });
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "host");
}

/// Issue 10 item 20: as the API server's pod strategy, a pod never scheduled or already
/// finished goes at once whatever the grace period, and a later delete may shorten the grace of
/// a terminating pod (never lengthen it).
#[test]
fn unscheduled_and_finished_pods_go_at_once_and_a_later_delete_shortens_the_grace() {
    let store = store();
    let mut unscheduled = pod("unscheduled");
    unscheduled["spec"]
        .as_object_mut()
        .unwrap()
        .remove("nodeName");
    store.create(unscheduled).unwrap();
    assert!(matches!(
        store.delete(&pod_ref("unscheduled"), &DeleteOptions::default()),
        Ok(Deleted::Removed(_))
    ));
    store.create(pod("done")).unwrap();
    store
        .patch_status(&pod_ref("done"), &json!({"status":{"phase":"Succeeded"}}))
        .unwrap();
    assert!(matches!(
        store.delete(&pod_ref("done"), &DeleteOptions::default()),
        Ok(Deleted::Removed(_))
    ));

    let mut slow = pod("slow");
    slow["spec"]["terminationGracePeriodSeconds"] = json!(60);
    store.create(slow).unwrap();
    let grace = |seconds| DeleteOptions {
        grace_period_seconds: Some(seconds),
        ..DeleteOptions::default()
    };
    store
        .delete(&pod_ref("slow"), &DeleteOptions::default())
        .unwrap();
    let Ok(Deleted::Terminating(longer)) = store.delete(&pod_ref("slow"), &grace(120)) else {
        panic!("still terminating");
    };
    assert_eq!(
        longer["metadata"]["deletionGracePeriodSeconds"], 60,
        "never lengthened"
    );
    assert_eq!(
        longer["metadata"]["deletionTimestamp"],
        "2026-12-02T10:01:00Z"
    );
    let Ok(Deleted::Terminating(shorter)) = store.delete(&pod_ref("slow"), &grace(10)) else {
        panic!("still terminating");
    };
    assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], 10);
    assert_eq!(
        shorter["metadata"]["deletionTimestamp"],
        "2026-12-02T10:00:10Z"
    );
    assert!(matches!(
        store.delete(&pod_ref("slow"), &grace(0)),
        Ok(Deleted::Removed(_))
    ));
}

#[test]
fn uids_are_the_api_text_form_of_their_bytes() {
    // The first 16 bytes of SHA-256("default/p0"), as the API writes a UID: a UID made from a
    // seed must stay the same text from one version of the agent to the next (local mode
    // keeps them on disk).
    assert_eq!(
        uid_from(b"default/p0"),
        "5f421a62-42e1-74a1-9bef-2edce4d70e3e"
    );
    let random = random_uid();
    let groups: Vec<usize> = random.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{random}");
    assert!(
        random
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{random}"
    );
    assert_eq!(&random[14..15], "4", "version 4: {random}");
    assert!("89ab".contains(&random[19..20]), "the variant: {random}");
    assert_ne!(random_uid(), random);
}

/// The cut of a pod's text ([`PodCut`]) is where its values are: its text is
/// `Value::to_string`'s, byte for byte, and a pod not laid out for cutting is not cut.
#[test]
fn a_pods_text_is_its_trees_encoding_cut_where_its_status_begins() {
    let annotations = json!({"a\"quoted\"": "line\nbreak \u{1F600} \\ \"resourceVersion\":\"9\""});
    let cases = [
        json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"p","labels":{"resourceVersion":"label"},"annotations":annotations,
                "uid":"u-1","resourceVersion":"12"},
            "spec":{"containers":[{"name":"c"}]},"status":{"phase":"Running","podIP":"10.0.0.1"}}),
        json!({"kind":"Pod","metadata":{"resourceVersion":"9","uid":"u-2","name":"q"},"spec":{},
            "status":{"phase":"Pending"}}),
        json!({"kind":"Pod","metadata":{"resourceVersion":"7"},"spec":{}}),
        json!({"kind":"Pod","metadata":{"resourceVersion":"7","uid":"with\"quote"},"status":{}}),
        // Not cut: the status is not last, the resourceVersion is missing or not text, no
        // metadata object.
        json!({"kind":"Pod","metadata":{"resourceVersion":"7"},"status":{},"spec":{}}),
        json!({"kind":"Pod","metadata":{"uid":"u"},"status":{}}),
        json!({"kind":"Pod","metadata":{"resourceVersion":7},"status":{}}),
        json!({"kind":"Pod","metadata":"resourceVersion","status":{}}),
        json!(["not", "an", "object"]),
    ];
    let mut cut_count = 0;
    for object in &cases {
        let (json, cut) = encode_pod(object);
        assert_eq!(json, object.to_string());
        let Some(cut) = cut else { continue };
        cut_count += 1;
        assert_eq!(&json[cut.rv.clone()], object["metadata"]["resourceVersion"]);
        assert_eq!(
            cut.uid.clone().map(|at| &json[at]),
            object["metadata"]["uid"]
                .as_str()
                .filter(|uid| !uid.contains('"')),
        );
        match object.get("status") {
            Some(status) => {
                assert_eq!(&json[cut.status_at..], format!("{STATUS_MEMBER}{status}}}"))
            }
            None => assert_eq!(&json[cut.status_at..], "}"),
        }
        // A status written on the text under a resourceVersion one digit longer is what
        // encoding the patched tree stores.
        let stored = StoredObject::new(Kind::Pod, object);
        let status = json!({"phase": "Running", "podIP": "10.0.0.9"});
        let written = stored.with_status(&cut, 1000, (&status, &status.to_string()));
        let mut expected = object.clone();
        expected["metadata"]["resourceVersion"] = json!("1000");
        expected["status"] = status;
        assert_eq!(written, StoredObject::new(Kind::Pod, &expected));
        assert_eq!(written.field("status.podIP"), "10.0.0.9");
    }
    assert_eq!(cut_count, 4);
}

/// A pod's status writes go through its text (the spec is copied, not parsed): each version
/// they store is exactly what encoding the patched pod afresh stores (text, selectable
/// fields, cut), with the same preconditions, merge, no-op and admission as the whole-tree
/// write.
#[test]
fn a_pod_status_write_on_its_text_stores_what_a_fresh_encoding_would() {
    let store = store();
    // The first write below takes the resourceVersion from 9 to 10, one digit longer.
    for filler in 0..7 {
        store.create(pod(&format!("filler-{filler}"))).unwrap();
    }
    let mut manifest = pod("a");
    manifest["metadata"]["labels"] = json!({"resourceVersion": "label"});
    manifest["metadata"]["annotations"] = json!({"note": "a \"quoted\" \u{e9}\n"});
    let created = store.create(manifest).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(rv(&created), 9);
    let condition = |type_: &str, status: &str| json!({"type": type_, "status": status});
    let patches = [
        json!({"metadata":{"uid":uid},"status":{"phase":"Pending","hostIP":"127.0.0.1",
            "conditions":[condition("Initialized","True"), condition("Ready","False")]}}),
        json!({"metadata":{"uid":uid},"status":{"phase":"Running","podIP":"10.0.0.2",
            "podIPs":[{"ip":"10.0.0.2"}],"conditions":[condition("Ready","True")]}}),
        json!({"status":{"$setElementOrder/conditions":[{"type":"Ready"},{"type":"Initialized"}],
            "conditions":[condition("PodScheduled","True")]}}),
        json!({"status":{"conditions":[{"type":"Initialized","$patch":"delete"}],
            "message":"m\u{e9} \"x\"","hostIP":null}}),
    ];
    let mut previous = store.get(&pod_ref("a")).unwrap();
    for patch in &patches {
        let written = store.patch_status_shared(&pod_ref("a"), patch).unwrap();
        assert!(written.cut.is_some());
        let tree = written.to_value();
        assert_eq!(*written, StoredObject::new(Kind::Pod, &tree));
        assert_eq!(written.field("status.phase"), tree["status"]["phase"]);
        assert_eq!(rv(&tree), rv(&previous) + 1);
        // Only the status and the resourceVersion changed.
        let (mut before, mut after) = (previous.clone(), tree.clone());
        for object in [&mut before, &mut after] {
            object.as_object_mut().unwrap().remove("status");
            object["metadata"]["resourceVersion"] = json!(null);
        }
        assert_eq!(before, after);
        assert_eq!(store.get(&pod_ref("a")).unwrap(), tree);
        previous = tree;
    }
    let status = &previous["status"];
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["podIP"], "10.0.0.2");
    assert_eq!(status["qosClass"], "BestEffort");
    assert!(status.get("hostIP").is_none());
    assert_eq!(condition_types(status), ["Ready", "PodScheduled"]);
    // A patch that changes nothing writes nothing; refused preconditions write nothing.
    let same = store
        .patch_status_shared(&pod_ref("a"), &json!({"status":{"phase":"Running"}}))
        .unwrap();
    assert_eq!(same.resource_version(), rv(&previous));
    let stale = json!({"metadata":{"resourceVersion":"1"},"status":{"phase":"Failed"}});
    let err = store
        .patch_status_shared(&pod_ref("a"), &stale)
        .unwrap_err();
    assert_eq!(err.code(), 409);
    assert!(err.to_string().contains("in record ("), "{err}");
    let other = json!({"metadata":{"uid":"other"},"status":{"phase":"Failed"}});
    assert_eq!(
        store
            .patch_status_shared(&pod_ref("a"), &other)
            .unwrap_err()
            .code(),
        422
    );
    assert_eq!(store.get(&pod_ref("a")).unwrap(), previous);
}

/// The admission of a status written on the text reads the spec when it needs it: a
/// container that terminated may be reported running again under `restartPolicy: Always`,
/// not under `Never`.
#[test]
fn a_status_write_on_the_text_is_validated_against_the_spec() {
    let store = store();
    let state = |state: Value| {
        json!({"status":{"containerStatuses":[{"name":"c","image":"busybox","imageID":"",
            "ready":false,"restartCount":0,"state":state}]}})
    };
    for (name, policy, code) in [("always", "Always", None), ("never", "Never", Some(422))] {
        let mut manifest = pod(name);
        manifest["spec"]["restartPolicy"] = json!(policy);
        store.create(manifest).unwrap();
        store
            .patch_status_shared(&pod_ref(name), &state(json!({"terminated":{"exitCode":1}})))
            .unwrap();
        let running = store.patch_status_shared(
            &pod_ref(name),
            &state(json!({"running":{"startedAt":"2026-12-02T10:00:00Z"}})),
        );
        assert_eq!(running.err().map(|e| e.code()), code, "{policy}");
    }
}
