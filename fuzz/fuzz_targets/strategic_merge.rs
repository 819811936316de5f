//! Fuzz target `strategic_merge`: the strategic merge patch of a pod's status (what the local
//! store and the fake API servers apply, and what the status manager sends).
//!
//! The input is two JSON values, one after the other: a status and a patch. Applying any patch
//! to any status must not panic. When both decode as a `PodStatus` whose merge lists have one
//! item per key (as the API server's validation keeps them), the patch built from the first to
//! the second, applied to the first, gives the second (`apply(diff(a, b), a) == b`).

#![no_main]

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodStatus;
use libfuzzer_sys::fuzz_target;
use rustlet_core::patch::{MERGE_KEYS, apply_status_patch, status_patch};
use serde_json::Value;

/// Go's `json.Marshal` of a status, as the patch code compares it: empty lists left out, at
/// every depth (`omitempty`).
fn normalised(status: &PodStatus) -> Value {
    let mut value = serde_json::to_value(status).expect("a PodStatus encodes");
    drop_empty_lists(&mut value);
    value
}

fn drop_empty_lists(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
            map.values_mut().for_each(drop_empty_lists);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_empty_lists),
        _ => {}
    }
}

/// Every merge list of `status` has one item per key, each with its key.
fn merge_keys_unique(status: &Value) -> bool {
    MERGE_KEYS.iter().all(|(field, key)| {
        let Some(items) = status.get(*field).and_then(Value::as_array) else {
            return true;
        };
        let mut seen = BTreeSet::new();
        items
            .iter()
            .all(|item| item.get(*key).is_some_and(|k| seen.insert(k.to_string())))
    })
}

fuzz_target!(|data: &[u8]| {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let (Some(Ok(first)), Some(Ok(second))) = (values.next(), values.next()) else {
        return;
    };
    let mut target = first.clone();
    apply_status_patch(&mut target, &second);

    let (Ok(old), Ok(new)) = (
        serde_json::from_value::<PodStatus>(first),
        serde_json::from_value::<PodStatus>(second),
    ) else {
        return;
    };
    let (old_value, new_value) = (normalised(&old), normalised(&new));
    if !merge_keys_unique(&old_value) || !merge_keys_unique(&new_value) {
        return;
    }
    let Some(patch) = status_patch("uid", None, &old, &new) else {
        assert_eq!(old_value, new_value, "no patch, yet the statuses differ");
        return;
    };
    let mut applied = old_value;
    apply_status_patch(&mut applied, &patch["status"]);
    assert_eq!(
        applied, new_value,
        "apply(diff(a, b), a) != b; patch {patch}"
    );
});
