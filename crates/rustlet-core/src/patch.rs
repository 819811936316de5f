//! The strategic merge patch of a pod's status subresource: building it (upstream
//! `PatchPodStatus` over `CreateTwoWayMergePatch`) and applying it (what the API server does,
//! for the fakes and the local store).
//!
//! Only what a pod status needs is implemented: objects merge key by key (a removed key becomes
//! `null`), the lists with a patch merge key in the Pod schema merge by that key
//! (`conditions` by `type`, `hostIPs` and `podIPs` by `ip`, `resourceClaimStatuses` by `name`)
//! with upstream's `$setElementOrder/<list>` and `$patch: delete` directives, and every other list
//! (the container statuses) is replaced whole. The node status uses the same two functions with
//! its own merge keys ([`diff_with_keys`], [`apply_with_keys`]; `crate::node_status`), and a list
//! whose items include `{"$patch": "replace"}` replaces the stored one (upstream's fix-up of
//! `status.addresses` in `PatchNodeStatus`).
//!
//! Deviation: k8s-openapi omits unset structs where Go writes `{}` (`"state":{}`), so a patch that
//! replaces a container status list is shorter than upstream's; the server stores the same object.

use k8s_openapi::api::core::v1::PodStatus;
use serde_json::{Map, Value, json};

/// Lists of `PodStatus` that merge by key, and their keys (from the Pod schema's
/// `x-kubernetes-patch-merge-key`).
pub const MERGE_KEYS: [(&str, &str); 4] = [
    ("conditions", "type"),
    ("hostIPs", "ip"),
    ("podIPs", "ip"),
    ("resourceClaimStatuses", "name"),
];

const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
/// The strategic merge patch directive key (`$patch: delete`, `$patch: replace`).
pub const PATCH_DIRECTIVE: &str = "$patch";

/// A table of list fields and their merge keys (the schema's `x-kubernetes-patch-merge-key`),
/// for the top level of the object a patch is made of.
pub type MergeKeys = [(&'static str, &'static str)];

fn merge_key(keys: &MergeKeys, field: &str) -> Option<&'static str> {
    keys.iter().find(|(f, _)| *f == field).map(|(_, k)| *k)
}

/// A status as Go's `json.Marshal` writes it: a list field tagged `omitempty` (every list of a
/// pod status) is left out when empty, so `conditions: []` and no conditions are the same.
fn to_object(status: &PodStatus) -> Map<String, Value> {
    match serde_json::to_value(status) {
        Ok(Value::Object(mut map)) => {
            drop_empty_lists(&mut map);
            map
        }
        _ => Map::new(),
    }
}

fn drop_empty_lists(map: &mut Map<String, Value>) {
    map.retain(|_, value| !matches!(value, Value::Array(items) if items.is_empty()));
    for value in map.values_mut() {
        match value {
            Value::Object(inner) => drop_empty_lists(inner),
            Value::Array(items) => {
                for item in items {
                    if let Value::Object(inner) = item {
                        drop_empty_lists(inner);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The body to send as `PATCH pods/<name>/status` (`application/strategic-merge-patch+json`):
/// `{"metadata":{"uid":..,("resourceVersion":..)},"status":{..}}`, or `None` when the status part
/// is empty: upstream's "unchanged" (a patch of only the UID is never sent).
pub fn status_patch(
    uid: &str,
    resource_version: Option<&str>,
    old: &PodStatus,
    new: &PodStatus,
) -> Option<Value> {
    let diff = diff_with_keys(&to_object(old), to_object(new), &MERGE_KEYS);
    if diff.is_empty() {
        return None;
    }
    let mut metadata = Map::new();
    metadata.insert("uid".into(), Value::String(uid.to_owned()));
    if let Some(rv) = resource_version {
        metadata.insert("resourceVersion".into(), Value::String(rv.to_owned()));
    }
    Some(json!({ "metadata": metadata, "status": diff }))
}

/// The two-way strategic merge patch from `old` to `new` (upstream `CreateTwoWayMergePatch`):
/// the lists named in `keys` (at this top level) merge by their key, every other list is
/// replaced, objects merge key by key and a removed key becomes `null`. `new` is taken apart
/// into the patch: what changed moves into it instead of being copied.
pub fn diff_with_keys(
    old: &Map<String, Value>,
    new: Map<String, Value>,
    keys: &MergeKeys,
) -> Map<String, Value> {
    diff_objects(old, new, Some(keys))
}

fn diff_objects(
    old: &Map<String, Value>,
    new: Map<String, Value>,
    keys: Option<&MergeKeys>,
) -> Map<String, Value> {
    let mut patch = Map::new();
    for key in old.keys() {
        if !new.contains_key(key) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    for (key, new_value) in new {
        let Some(old_value) = old.get(&key) else {
            patch.insert(key, new_value);
            continue;
        };
        if *old_value == new_value {
            continue;
        }
        match (old_value, new_value) {
            (Value::Object(o), Value::Object(n)) => {
                let sub = diff_objects(o, n, None);
                if !sub.is_empty() {
                    patch.insert(key, Value::Object(sub));
                }
            }
            (Value::Array(o), Value::Array(n)) => match keys.and_then(|k| merge_key(k, &key)) {
                Some(merge_key) => diff_merge_list(&mut patch, &key, merge_key, o, n),
                None => {
                    patch.insert(key, Value::Array(n));
                }
            },
            (_, new_value) => {
                patch.insert(key, new_value);
            }
        }
    }
    patch
}

fn key_of<'a>(item: &'a Value, merge_key: &str) -> Option<&'a Value> {
    item.get(merge_key)
}

fn diff_merge_list(
    patch: &mut Map<String, Value>,
    field: &str,
    merge_key: &str,
    old: &[Value],
    new: Vec<Value>,
) {
    let order: Vec<Value> = new
        .iter()
        .filter_map(|n| key_of(n, merge_key))
        .map(|k| json!({ merge_key: k }))
        .collect();
    let old_order: Vec<&Value> = old.iter().filter_map(|o| key_of(o, merge_key)).collect();
    let new_keys: Vec<&Value> = new.iter().filter_map(|n| key_of(n, merge_key)).collect();
    let common_old: Vec<&&Value> = old_order.iter().filter(|k| new_keys.contains(k)).collect();
    let common_new: Vec<&&Value> = new_keys.iter().filter(|k| old_order.contains(k)).collect();
    let reordered = common_old != common_new;
    let deleted: Vec<Value> = old
        .iter()
        .filter_map(|o| {
            let key = key_of(o, merge_key);
            if new.iter().any(|n| key_of(n, merge_key) == key) {
                return None;
            }
            let mut delete = Map::new();
            if let Some(k) = key {
                delete.insert(merge_key.to_owned(), k.clone());
            }
            delete.insert(PATCH_DIRECTIVE.into(), Value::String("delete".into()));
            Some(Value::Object(delete))
        })
        .collect();
    let mut items = Vec::new();
    for n in new {
        let key = key_of(&n, merge_key).cloned();
        match old.iter().find(|o| key_of(o, merge_key) == key.as_ref()) {
            None => items.push(n),
            Some(o) if *o == n => {}
            Some(o) => match (o, n) {
                (Value::Object(om), Value::Object(nm)) => {
                    let mut sub = diff_objects(om, nm, None);
                    if let Some(k) = key {
                        sub.insert(merge_key.to_owned(), k);
                    }
                    items.push(Value::Object(sub));
                }
                (_, n) => items.push(n),
            },
        }
    }
    items.extend(deleted);
    if items.is_empty() && !reordered {
        return;
    }
    patch.insert(format!("{SET_ELEMENT_ORDER}{field}"), Value::Array(order));
    if !items.is_empty() {
        patch.insert(field.to_owned(), Value::Array(items));
    }
}

/// Applies a status patch (the `status` part of what [`status_patch`] builds) to a status in
/// JSON form, as the API server's strategic merge does for the fields of a pod status.
pub fn apply_status_patch(status: &mut Value, patch: &Value) {
    apply_with_keys(status, patch, &MERGE_KEYS);
}

/// Applies a strategic merge patch to `target` as the API server does, the lists named in
/// `keys` (at this top level) merging by their key.
pub fn apply_with_keys(target: &mut Value, patch: &Value, keys: &MergeKeys) {
    apply_object(target, patch, Some(keys));
}

fn apply_object(target: &mut Value, patch: &Value, keys: Option<&MergeKeys>) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(object) = target else {
        return;
    };
    for (key, value) in patch {
        if key.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        if value.is_null() {
            object.remove(key);
            continue;
        }
        match (keys.and_then(|k| merge_key(k, key)), value) {
            (Some(_), Value::Array(items))
                if items
                    .iter()
                    .any(|i| i.get(PATCH_DIRECTIVE).and_then(Value::as_str) == Some("replace")) =>
            {
                let kept = items
                    .iter()
                    .filter(|i| i.get(PATCH_DIRECTIVE).is_none())
                    .cloned()
                    .collect();
                object.insert(key.clone(), Value::Array(kept));
            }
            (Some(merge_key), Value::Array(items)) => {
                let list = object
                    .entry(key.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if !list.is_array() {
                    *list = Value::Array(Vec::new());
                }
                let Value::Array(list) = list else { continue };
                for item in items {
                    let key_value = key_of(item, merge_key).cloned();
                    let position = list
                        .iter()
                        .position(|l| key_of(l, merge_key) == key_value.as_ref());
                    let delete =
                        item.get(PATCH_DIRECTIVE).and_then(Value::as_str) == Some("delete");
                    match (position, delete) {
                        (Some(i), true) => {
                            list.remove(i);
                        }
                        (None, true) => {}
                        (Some(i), false) => apply_object(&mut list[i], item, None),
                        (None, false) => list.push(item.clone()),
                    }
                }
            }
            (_, Value::Object(_)) => {
                let slot = object.entry(key.clone()).or_insert(Value::Null);
                apply_object(slot, value, None);
            }
            _ => {
                object.insert(key.clone(), value.clone());
            }
        }
    }
    // `$setElementOrder`: listed keys first, in that order; the rest keep their relative order.
    for (key, order) in patch
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(SET_ELEMENT_ORDER)?, v)))
    {
        let (Some(merge_key), Some(Value::Array(list)), Value::Array(order)) = (
            keys.and_then(|k| merge_key(k, key)),
            object.get_mut(key),
            order,
        ) else {
            continue;
        };
        let rank = |item: &Value| {
            order
                .iter()
                .position(|o| key_of(o, merge_key) == key_of(item, merge_key))
                .unwrap_or(usize::MAX)
        };
        list.sort_by_key(rank);
    }
    // A merge list emptied by deletions is omitted, as Go's `omitempty` does when the server
    // stores the result.
    if let Some(keys) = keys {
        for &(field, _) in keys {
            if object
                .get(field)
                .is_some_and(|c| c.as_array().is_some_and(Vec::is_empty))
            {
                object.remove(field);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::ContainerStatus;

    fn base() -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![cond("Ready", "True"), cond("PodScheduled", "True")]),
            container_statuses: Some(vec![
                ContainerStatus {
                    ready: true,
                    ..status_named("container1")
                },
                ContainerStatus {
                    ready: true,
                    ..status_named("container2")
                },
            ]),
            message: Some("Message".into()),
            ..Default::default()
        }
    }

    fn check(new: PodStatus, expected: Option<Value>) {
        let patch = status_patch("myuid", None, &base(), &new);
        assert_eq!(patch, expected);
        if let Some(patch) = patch {
            let mut applied = serde_json::to_value(base()).unwrap();
            apply_status_patch(&mut applied, &patch["status"]);
            assert_eq!(
                applied,
                serde_json::to_value(&new).unwrap(),
                "apply(diff(a, b), a) == b"
            );
        }
    }

    #[test]
    fn test_patch_pod_status_no_change() {
        check(base(), None);
    }

    /// Issue 10 item 8: an empty list is absent, as Go's `omitempty` writes it.
    #[test]
    fn an_emptied_list_is_sent_as_null_not_as_deletions() {
        let new = PodStatus {
            conditions: Some(vec![]),
            ..base()
        };
        let patch = status_patch("myuid", None, &base(), &new);
        assert_eq!(
            patch,
            Some(json!({"metadata":{"uid":"myuid"},"status":{"conditions":null}}))
        );
    }

    #[test]
    fn a_list_absent_in_the_api_and_empty_locally_is_no_change() {
        let old = PodStatus {
            conditions: None,
            container_statuses: None,
            ..base()
        };
        let new = PodStatus {
            conditions: Some(vec![]),
            container_statuses: Some(vec![]),
            ..old.clone()
        };
        assert_eq!(status_patch("myuid", None, &old, &new), None);
        let nested = PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                volume_mounts: Some(vec![]),
                ..status_named("c")
            }]),
            ..old.clone()
        };
        let plain = PodStatus {
            container_statuses: Some(vec![status_named("c")]),
            ..old
        };
        assert_eq!(status_patch("myuid", None, &plain, &nested), None);
    }

    #[test]
    fn test_patch_pod_status_message_change() {
        let new = PodStatus {
            message: Some("random message".into()),
            ..base()
        };
        check(
            new,
            Some(json!({"metadata":{"uid":"myuid"},"status":{"message":"random message"}})),
        );
    }

    #[test]
    fn test_patch_pod_status_pod_condition_change() {
        let mut new = base();
        new.conditions.as_mut().unwrap()[0].status = "False".into();
        check(
            new,
            Some(json!({"metadata":{"uid":"myuid"},"status":{
                "$setElementOrder/conditions":[{"type":"Ready"},{"type":"PodScheduled"}],
                "conditions":[{"status":"False","type":"Ready"}]}})),
        );
    }

    #[test]
    fn test_patch_pod_status_additional_init_container_condition() {
        let new = PodStatus {
            init_container_statuses: Some(vec![ContainerStatus {
                ready: true,
                ..status_named("init-container")
            }]),
            ..base()
        };
        // Upstream also writes "lastState":{} and "state":{} (Go value structs); same object stored.
        check(
            new,
            Some(
                json!({"metadata":{"uid":"myuid"},"status":{"initContainerStatuses":[
                {"image":"","imageID":"","name":"init-container","ready":true,"restartCount":0}]}}),
            ),
        );
    }

    #[test]
    fn errata6_reorder_only_yields_set_element_order() {
        let mut new = base();
        new.conditions.as_mut().unwrap().reverse();
        check(
            new,
            Some(json!({"metadata":{"uid":"myuid"},"status":{
                "$setElementOrder/conditions":[{"type":"PodScheduled"},{"type":"Ready"}]}})),
        );
    }

    #[test]
    fn removed_condition_and_field_become_delete_directives_and_nulls() {
        let new = PodStatus {
            conditions: Some(vec![cond("PodScheduled", "True")]),
            message: None,
            ..base()
        };
        check(
            new,
            Some(json!({"metadata":{"uid":"myuid"},"status":{
                "$setElementOrder/conditions":[{"type":"PodScheduled"}],
                "conditions":[{"type":"Ready","$patch":"delete"}],
                "message":null}})),
        );
    }

    #[test]
    fn resource_version_goes_into_the_metadata() {
        let new = PodStatus {
            message: Some("m".into()),
            ..base()
        };
        let patch = status_patch("u", Some("42"), &base(), &new).unwrap();
        assert_eq!(patch["metadata"], json!({"uid":"u","resourceVersion":"42"}));
        assert_eq!(status_patch("u", Some("42"), &base(), &base()), None);
    }

    #[test]
    fn applying_keeps_conditions_added_concurrently_by_others() {
        let mut new = base();
        new.conditions.as_mut().unwrap()[0].status = "False".into();
        let patch = status_patch("u", None, &base(), &new).unwrap();
        let mut server = base();
        server
            .conditions
            .as_mut()
            .unwrap()
            .push(cond("example.com/gate", "True"));
        let mut server = serde_json::to_value(server).unwrap();
        apply_status_patch(&mut server, &patch["status"]);
        let types: Vec<&str> = server["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Ready", "PodScheduled", "example.com/gate"]);
        assert_eq!(server["conditions"][0]["status"], "False");
    }

    /// A list with a merge key whose items are not objects (a hostile or broken API copy) is
    /// sent as its new items.
    #[test]
    fn a_merge_keyed_list_of_non_objects_is_sent_as_its_new_items() {
        let old = serde_json::from_value(json!({"podIPs": ["a"]}));
        let new = serde_json::from_value(json!({"podIPs": ["b"]}));
        let (Ok(Value::Object(old)), Ok(Value::Object(new))) = (old, new) else {
            unreachable!()
        };
        assert_eq!(
            Value::Object(diff_with_keys(&old, new, &MERGE_KEYS)),
            json!({"$setElementOrder/podIPs": [], "podIPs": ["b"]})
        );
    }
}
