//! The volume manager's `EventRecorder` over kube-runtime's events recorder
//! (`events.k8s.io/v1`, with its series de-duplication).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use rustlet_volume::events::{EventKind, EventRecorder};
use tracing::warn;

/// Publishes events about pods; each event is sent on its own task (recording never blocks a
/// volume operation).
#[derive(Clone)]
pub struct KubeEventRecorder {
    recorder: Arc<Recorder>,
}

impl KubeEventRecorder {
    /// Events reported as `controller` (upstream: `kubelet`) from `instance` (the node name).
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: Some(instance.to_owned()),
        };
        Self {
            recorder: Arc::new(Recorder::new(client, reporter)),
        }
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
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &reference).await {
                warn!("recording event {}: {err}", event.reason);
            }
        });
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
}
