//! The volume manager's `EventRecorder` over kube-runtime's events recorder
//! (`events.k8s.io/v1`, with its series de-duplication).
//!
//! Recording never waits and never spawns: an event joins a bounded queue that one task drains
//! through the event client (its own rate limit, [`crate::client::ClientKind::Events`]). When
//! the queue is full the oldest waiting event is dropped and counted
//! (`rustlet_events_dropped_total`), as upstream's broadcaster drops what its 1,000-event
//! queue cannot hold (`watch.NewLongQueueBroadcaster(maxQueuedEvents, DropIfChannelFull)`;
//! upstream drops the newest, this queue the oldest: the latest state of a pod is what a user
//! wants to read). 500 pods whose mounts fail every few seconds thus cost at most the event
//! client's QPS, never a status write's or the Lease's turn, and a bounded amount of memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use rustlet_volume::events::{EventKind, EventRecorder};
use tokio::sync::Notify;
use tracing::warn;

/// Events waiting to be sent at most (upstream: the event broadcaster's `maxQueuedEvents`).
pub const EVENT_QUEUE_CAPACITY: usize = 1000;

/// How events are queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventQueueConfig {
    /// Events waiting at most; the oldest goes when a new one comes to a full queue.
    pub capacity: usize,
}

impl Default for EventQueueConfig {
    fn default() -> Self {
        Self {
            capacity: EVENT_QUEUE_CAPACITY,
        }
    }
}

#[derive(Default)]
struct Pending {
    events: VecDeque<(Event, ObjectReference)>,
    /// Every recorder is gone: the drain ends once the queue is empty.
    closed: bool,
}

/// The queue between the recorders and the one task that sends.
struct EventQueue {
    pending: Mutex<Pending>,
    wake: Notify,
    capacity: usize,
    dropped: Counter,
}

impl EventQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, event: Event, reference: ObjectReference) {
        {
            let mut pending = self.lock();
            while pending.events.len() >= self.capacity.max(1) {
                pending.events.pop_front();
                self.dropped.inc();
            }
            pending.events.push_back((event, reference));
        }
        self.wake.notify_one();
    }

    /// The next event to send; `None` once closed and empty.
    async fn next(&self) -> Option<(Event, ObjectReference)> {
        loop {
            {
                let mut pending = self.lock();
                if let Some(next) = pending.events.pop_front() {
                    return Some(next);
                }
                if pending.closed {
                    return None;
                }
            }
            // A push after the check above left a permit: no wakeup is lost.
            self.wake.notified().await;
        }
    }
}

/// Closes the queue when the last recorder goes.
struct Sender {
    queue: Arc<EventQueue>,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.wake.notify_one();
    }
}

/// Publishes events about pods through a bounded queue and one sending task (see the module
/// doc). Clones share the queue.
#[derive(Clone)]
pub struct KubeEventRecorder {
    sender: Arc<Sender>,
}

impl std::fmt::Debug for KubeEventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEventRecorder")
            .field("queued", &self.queued())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl KubeEventRecorder {
    /// Events reported as `controller` (upstream: `kubelet`) from `instance` (the node name),
    /// sent through `client` (the event client) with the default queue. Starts the sending
    /// task, which ends when every clone of the recorder is gone.
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        Self::with_queue(client, controller, instance, &EventQueueConfig::default())
    }

    /// [`Self::new`] with a queue of `config`'s size.
    pub fn with_queue(
        client: kube::Client,
        controller: &str,
        instance: &str,
        config: &EventQueueConfig,
    ) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(instance.to_owned()),
        };
        let queue = Arc::new(EventQueue {
            pending: Mutex::default(),
            wake: Notify::new(),
            capacity: config.capacity,
            dropped: Counter::default(),
        });
        let recorder = Recorder::new(client, reporter);
        let drained = queue.clone();
        tokio::spawn(async move {
            while let Some((event, reference)) = drained.next().await {
                if let Err(err) = recorder.publish(&event, &reference).await {
                    warn!("recording event {}: {err}", event.reason);
                }
            }
        });
        Self {
            sender: Arc::new(Sender { queue }),
        }
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.sender.queue.dropped.get()
    }

    /// Events waiting to be sent.
    pub fn queued(&self) -> usize {
        self.sender.queue.lock().events.len()
    }

    /// Registers `rustlet_events_dropped_total` (no upstream metric counts these drops).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "rustlet_events_dropped",
            "Events dropped because the queue of events waiting to be sent was full",
            self.sender.queue.dropped.clone(),
        );
    }
}

impl EventRecorder for KubeEventRecorder {
    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        let reference = pod.object_ref(&());
        let event = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: reason.to_owned(),
            note: Some(message.to_owned()),
            action: reason.to_owned(),
            secondary: None,
        };
        self.sender.queue.push(event, reference);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Method, Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::client::Body;

    #[tokio::test]
    async fn failed_mount_is_an_events_v1_warning_about_the_pod() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let recorder =
            KubeEventRecorder::new(kube::Client::new(service, "default"), "kubelet", "node-a");
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        recorder.event(
            &pod,
            EventKind::Warning,
            "FailedMount",
            "MountVolume.SetUp failed for volume \"v\" : boom",
        );
        futures::pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::POST);
        assert_eq!(
            req.uri().path(),
            "/apis/events.k8s.io/v1/namespaces/ns/events"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["type"], "Warning");
        assert_eq!(body["reason"], "FailedMount");
        assert_eq!(
            body["note"],
            "MountVolume.SetUp failed for volume \"v\" : boom"
        );
        assert_eq!(body["regarding"]["uid"], "u1");
        assert_eq!(body["reportingController"], "kubelet");
        assert_eq!(body["reportingInstance"], "node-a");
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&body).unwrap(),
        )));
    }

    /// Issue 24 item 13: recording never waits. While the sending task waits for the API
    /// server, a full queue drops its oldest event for each new one, counts it in
    /// `rustlet_events_dropped_total`, and the newest events are the ones sent.
    #[tokio::test]
    async fn item13_a_full_event_queue_drops_the_oldest_and_counts_it() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let recorder = KubeEventRecorder::with_queue(
            kube::Client::new(service, "default"),
            "kubelet",
            "node-a",
            &EventQueueConfig { capacity: 2 },
        );
        let mut registry = Registry::default();
        recorder.register_metrics(&mut registry);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let record = |i: usize| {
            recorder.event(&pod, EventKind::Warning, &format!("Reason{i}"), "m");
        };
        futures::pin_mut!(handle);
        let reason = |body: &serde_json::Value| body["reason"].as_str().unwrap().to_owned();
        let body = |req: Request<Body>| async move {
            serde_json::from_slice::<serde_json::Value>(
                &req.into_body().collect_bytes().await.unwrap(),
            )
            .unwrap()
        };
        // The first is taken at once and waits for its answer; four more come meanwhile.
        record(0);
        let (first, answer) = handle.next_request().await.unwrap();
        for i in 1..=4 {
            record(i);
        }
        assert_eq!((recorder.queued(), recorder.dropped()), (2, 2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("rustlet_events_dropped_total 2"), "{text}");
        let first = body(first).await;
        assert_eq!(reason(&first), "Reason0");
        answer.send_response(Response::new(Body::from(
            serde_json::to_vec(&first).unwrap(),
        )));
        let mut sent = Vec::new();
        for _ in 0..2 {
            let (req, answer) = handle.next_request().await.unwrap();
            let event = body(req).await;
            sent.push(reason(&event));
            answer.send_response(Response::new(Body::from(
                serde_json::to_vec(&event).unwrap(),
            )));
        }
        assert_eq!(sent, ["Reason3", "Reason4"], "the oldest were dropped");
    }
}
