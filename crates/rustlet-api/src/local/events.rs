//! The volume manager's `EventRecorder` over the local store: events.k8s.io/v1 Event objects
//! next to the pods they are about, shaped as kube-runtime's recorder shapes them (a repeated
//! event is one object whose `series.count` grows), so local mode shows what a cluster shows.
//! As the API server (`--event-ttl`, 1 h), an event is removed [`EVENT_TTL`] after it was
//! last written: a long-running agent's store does not grow with every event it ever made.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use rustlet_status::Clock;
use rustlet_volume::events::{EventKind, EventRecorder};
use serde_json::{Value, json};
use tracing::warn;

use super::store::{DeleteOptions, Kind, ObjectRef, Store, StoreError, uid_from};

/// What makes two events one series (kube-runtime's key: regarding object, reason, note, type).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    regarding: String,
    reason: String,
    note: String,
    warning: bool,
}

/// How long an event stays after it was last written (the API server's default `--event-ttl`).
pub const EVENT_TTL: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(3600);

/// The stored series, and when each expires, oldest first (an entry whose series was written
/// again since is skipped: the series' own deadline is the one that counts).
#[derive(Default)]
struct Series {
    by_key: HashMap<SeriesKey, (ObjectRef, k8s_openapi::jiff::Timestamp)>,
    expiry: VecDeque<(k8s_openapi::jiff::Timestamp, SeriesKey)>,
}

/// Records events into the local store.
pub struct LocalEventRecorder {
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    controller: String,
    instance: String,
    series: Mutex<Series>,
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
                self.written(key, reference);
            }
            Err(err) => warn!("recording event {reason} about {namespace}/{name}: {err}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The series `key` (event `reference`) was just written: it expires [`EVENT_TTL`] from now.
    fn written(&self, key: &SeriesKey, reference: ObjectRef) {
        let deadline = self.clock.now() + EVENT_TTL;
        let mut series = self.lock();
        series.by_key.insert(key.clone(), (reference, deadline));
        series.expiry.push_back((deadline, key.clone()));
    }

    /// Removes the events whose deadline has passed (amortised: each write is looked at once).
    fn expire(&self) {
        let now = self.clock.now();
        let mut gone = Vec::new();
        {
            let mut series = self.lock();
            while series.expiry.front().is_some_and(|(at, _)| *at <= now) {
                let (at, key) = series.expiry.pop_front().expect("checked above");
                if series.by_key.get(&key).is_some_and(|(_, due)| *due == at)
                    && let Some((reference, _)) = series.by_key.remove(&key)
                {
                    gone.push(reference);
                }
            }
        }
        for reference in gone {
            match self.store.delete(&reference, &DeleteOptions::default()) {
                Ok(_) | Err(StoreError::NotFound(_)) => {}
                Err(err) => warn!("expiring event {reference}: {err}"),
            }
        }
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
        self.expire();
        let known = self.lock().by_key.get(&key).map(|(r, _)| r.clone());
        if let Some(reference) = known
            && self.repeat(&reference)
        {
            self.written(&key, reference);
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

    /// A clock the test moves.
    #[derive(Clone)]
    struct StepClock(Arc<Mutex<k8s_openapi::jiff::Timestamp>>);

    impl Clock for StepClock {
        fn now(&self) -> k8s_openapi::jiff::Timestamp {
            *self.0.lock().unwrap()
        }
    }

    impl StepClock {
        fn advance(&self, by: k8s_openapi::jiff::SignedDuration) {
            let mut now = self.0.lock().unwrap();
            *now = now.checked_add(by).unwrap();
        }
    }

    /// As the API server's `--event-ttl`: an event goes one hour after its last write (a
    /// repeat keeps its series), so the store does not grow with every event ever made.
    #[test]
    fn an_event_expires_an_hour_after_its_last_write() {
        use k8s_openapi::jiff::SignedDuration;

        let store = Arc::new(Store::default());
        let clock = StepClock(Arc::new(Mutex::new(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        )));
        let recorder =
            LocalEventRecorder::new(store.clone(), Arc::new(clock.clone()), "kubelet", "node-a");
        let reasons = || {
            let mut r: Vec<String> = store
                .list(&Selection::all(Kind::Event))
                .0
                .iter()
                .map(|e| e["reason"].as_str().unwrap().to_owned())
                .collect();
            r.sort();
            r
        };
        recorder.event(&pod("u1"), EventKind::Normal, "Created", "a");
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "b");
        clock.advance(SignedDuration::from_mins(40));
        // Written again: its hour starts again.
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "b");
        clock.advance(SignedDuration::from_mins(20));
        recorder.event(&pod("u2"), EventKind::Normal, "Started", "c");
        assert_eq!(
            reasons(),
            ["FailedMount", "Started"],
            "Created is an hour old"
        );
        clock.advance(SignedDuration::from_mins(40));
        recorder.event(&pod("u2"), EventKind::Normal, "Started", "d");
        assert_eq!(reasons(), ["Started", "Started"]);
        assert_eq!(recorder.lock().by_key.len(), 2);
        // An expired series that happens again is a new event, counted from 1.
        recorder.event(&pod("u1"), EventKind::Warning, "FailedMount", "b");
        let events = store.list(&Selection::all(Kind::Event)).0;
        let again = events
            .iter()
            .find(|e| e["reason"] == "FailedMount")
            .unwrap();
        assert!(again.get("series").is_none());
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
