//! The volume manager's `EventRecorder` over the local store: events.k8s.io/v1 Event objects
//! next to the pods they are about, shaped as kube-runtime's recorder shapes them (a repeated
//! event is one object whose `series.count` grows), so local mode shows what a cluster shows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use rustlet_status::Clock;
use rustlet_volume::events::{EventKind, EventRecorder};
use serde_json::{Value, json};
use tracing::warn;

use super::store::{Kind, ObjectRef, Store, uid_from};

/// What makes two events one series (kube-runtime's key: regarding object, reason, note, type).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    regarding: String,
    reason: String,
    note: String,
    warning: bool,
}

/// Records events into the local store.
pub struct LocalEventRecorder {
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    controller: String,
    instance: String,
    series: Mutex<HashMap<SeriesKey, ObjectRef>>,
}

impl std::fmt::Debug for LocalEventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEventRecorder")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl LocalEventRecorder {
    /// Events reported as `controller` (upstream: `kubelet`) from `instance` (the node name).
    pub fn new(store: Arc<Store>, clock: Arc<dyn Clock>, controller: &str, instance: &str) -> Self {
        Self {
            store,
            clock,
            controller: controller.to_owned(),
            instance: instance.to_owned(),
            series: Mutex::default(),
        }
    }

    fn now(&self) -> String {
        self.clock
            .now()
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string()
    }

    /// Bump the series of an event already stored; `false` when it is gone.
    fn repeat(&self, reference: &ObjectRef) -> bool {
        let Ok(mut event) = self.store.get(reference) else {
            return false;
        };
        let count = event
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            + 1;
        event["series"] = json!({"count": count, "lastObservedTime": self.now()});
        match self.store.update(event) {
            Ok(_) => true,
            Err(err) => {
                warn!("recording event {reference}: {err}");
                true
            }
        }
    }

    fn create(&self, pod: &Pod, key: &SeriesKey, kind: EventKind, reason: &str, note: &str) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let now = self.now();
        let seed = format!("{}\0{reason}\0{note}\0{now}", key.regarding);
        let event_name = format!("{name}.{}", &uid_from(seed.as_bytes())[..8]);
        let event = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "eventTime": now,
            "type": match kind { EventKind::Normal => "Normal", EventKind::Warning => "Warning" },
            "reason": reason,
            "action": reason,
            "note": note,
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": pod.metadata.uid,
            },
        });
        match self.store.create(event) {
            Ok(_) => {
                let reference = ObjectRef::new(Kind::Event, &namespace, &event_name);
                self.lock().insert(key.clone(), reference);
            }
            Err(err) => warn!("recording event {reason} about {namespace}/{name}: {err}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SeriesKey, ObjectRef>> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventRecorder for LocalEventRecorder {
    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        let key = SeriesKey {
            regarding: pod.metadata.uid.clone().unwrap_or_default(),
            reason: reason.to_owned(),
            note: message.to_owned(),
            warning: matches!(kind, EventKind::Warning),
        };
        let known = self.lock().get(&key).cloned();
        if let Some(reference) = known
            && self.repeat(&reference)
        {
            return;
        }
        self.create(pod, &key, kind, reason, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::store::Selection;
    use rustlet_status::SystemClock;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "uid": uid}}))
            .unwrap()
    }

    #[test]
    fn a_repeated_event_is_one_object_whose_series_grows() {
        let store = Arc::new(Store::default());
        let recorder =
            LocalEventRecorder::new(store.clone(), Arc::new(SystemClock), "kubelet", "node-a");
        let events = || store.list(&Selection::all(Kind::Event)).0;
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "boom");
        let stored = events();
        assert_eq!(stored.len(), 1);
        let event = &stored[0];
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["reason"], "FailedMount");
        assert_eq!(event["note"], "boom");
        assert_eq!(event["regarding"]["uid"], "u1");
        assert_eq!(event["reportingController"], "kubelet");
        assert_eq!(event["reportingInstance"], "node-a");
        assert_eq!(event["metadata"]["namespace"], "ns");
        assert!(event.get("series").is_none());
        // It decodes as the API type.
        let typed: k8s_openapi::api::events::v1::Event =
            serde_json::from_value(event.clone()).unwrap();
        assert!(typed.event_time.is_some());

        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "boom");
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "boom");
        let stored = events();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0]["series"]["count"], 3);

        // Another message, or another pod, is another event.
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "other");
        recorder.event(&pod("u2"), EventKind::Warning, "FailedMount", "boom");
        assert_eq!(events().len(), 3);
    }

    #[test]
    fn an_event_deleted_from_the_store_starts_a_new_series() {
        let store = Arc::new(Store::default());
        let recorder =
            LocalEventRecorder::new(store.clone(), Arc::new(SystemClock), "kubelet", "node-a");
        recorder.event(&pod("u1"), EventKind::Normal, "Mounted", "ok");
        let first = store.list(&Selection::all(Kind::Event)).0.remove(0);
        let name = first["metadata"]["name"].as_str().unwrap();
        store
            .delete(
                &ObjectRef::new(Kind::Event, "ns", name),
                &crate::local::store::DeleteOptions::default(),
            )
            .unwrap();
        recorder.event(&pod("u1"), EventKind::Normal, "Mounted", "ok");
        let stored = store.list(&Selection::all(Kind::Event)).0;
        assert_eq!(stored.len(), 1);
        assert!(stored[0].get("series").is_none());
    }
}
