//! The read-only HTTP endpoints (the kubelet's read-only port): `/healthz`, `/pods`,
//! `/metrics`, and `/stats/summary`, `/metrics/resource`, `/metrics/probes` as the kubelet
//! server answers them.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use prometheus_client::registry::Registry;
use rustlet_api::PodCache;
use rustlet_core::PodUid;
use rustlet_status::StatusManager;

/// Whether the agent is healthy, and if not, why.
#[derive(Debug)]
pub struct Health(Mutex<Option<String>>);

impl Health {
    /// Unhealthy with this reason until [`Self::set_ok`].
    pub fn starting(reason: &str) -> Self {
        Self(Mutex::new(Some(reason.to_owned())))
    }

    /// Healthy.
    pub fn set_ok(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Unhealthy (a manager stopped); the first reason stays.
    pub fn set_failed(&self, reason: String) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            *state = Some(reason);
        }
    }

    /// `None` when healthy.
    pub fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The agent's registry and the process gauges refreshed at each scrape: `/metrics` of the
/// read-only port and of the kubelet server.
#[derive(Clone)]
pub struct AgentMetrics {
    /// Every metric of the agent.
    pub registry: Arc<Registry>,
    /// Refreshed at each scrape.
    pub process: crate::process::ProcessMetrics,
}

impl AgentMetrics {
    /// The OpenMetrics text of every metric, the process gauges refreshed first.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        self.process.update();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// What the handlers read.
pub struct Endpoints {
    /// Health.
    pub health: Arc<Health>,
    /// This node's pods.
    pub pods: Arc<PodCache>,
    /// Their statuses.
    pub status: Arc<StatusManager>,
    /// Every metric of the agent.
    pub metrics: AgentMetrics,
    /// `/stats/summary`, `/metrics/resource`, `/metrics/probes`.
    pub stats: Arc<dyn rustlet_server::routes::NodeApi>,
}

/// The router.
pub fn router(endpoints: Arc<Endpoints>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .merge(rustlet_server::routes::stats_router(
            endpoints.stats.clone(),
        ))
        .with_state(endpoints)
}

async fn healthz(State(e): State<Arc<Endpoints>>) -> Response {
    health_answer(&e.health)
}

fn health_answer(health: &Health) -> Response {
    match health.reason() {
        None => (StatusCode::OK, "ok").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// The healthz endpoint's router (the kubelet's `healthzPort`): `/healthz` only.
///
/// Deviation: upstream's answers `ok` for as long as the process serves (`healthz.InstallHandler`
/// with no checks); this one answers as the read-only port's `/healthz` does, 503 with the
/// reason once a manager stopped, so a supervisor probing it sees a broken agent.
pub fn healthz_router(health: Arc<Health>) -> Router {
    Router::new().route(
        "/healthz",
        get(move || {
            let health = health.clone();
            async move { health_answer(&health) }
        }),
    )
}

/// A pod as the API serves it, with the status the status manager holds (when it holds one)
/// in place of its own: serialised without copying the pod.
struct WithStatus<'a> {
    pod: &'a Pod,
    status: Option<&'a PodStatus>,
}

impl serde::Serialize for WithStatus<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let status = self.status.or(self.pod.status.as_ref());
        let mut out = serializer.serialize_struct("Pod", 5)?;
        out.serialize_field("apiVersion", "v1")?;
        out.serialize_field("kind", "Pod")?;
        out.serialize_field("metadata", &self.pod.metadata)?;
        if let Some(spec) = &self.pod.spec {
            out.serialize_field("spec", spec)?;
        }
        if let Some(status) = status {
            out.serialize_field("status", status)?;
        }
        out.end()
    }
}

/// A v1 `PodList` of this node's pods with the statuses the status manager holds, written
/// pod by pod (a whole list as `serde_json::Value`s cost ~40 MB at 1,000 pods on every
/// request) and sent as the client reads it, [`PodListChunks::PODS`] pods to a chunk (issue
/// 29: the whole body, 4 MB at 1,000 pods, was the largest single item of the agent's peak
/// heap while a client polled it).
async fn pods(State(e): State<Arc<Endpoints>>) -> Response {
    let mut pods = e.pods.pods();
    pods.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let chunks = PodListChunks::new(pods, move |uid, write| e.status.with_pod_status(uid, write));
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(futures::stream::iter(chunks)),
    )
        .into_response()
}

/// The chunks of a `PodList` body, each serialized when asked for; `status` lends a pod's
/// current status to the writer it is given (`None`: the pod's own), so no status is copied.
struct PodListChunks<F> {
    pods: std::vec::IntoIter<Arc<Pod>>,
    status: F,
    /// Where the list is: before its head, among its items, or past its end.
    at: ListAt,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ListAt {
    Start,
    Items,
    Done,
}

/// Lends a pod's current status to a writer (see [`PodListChunks`]).
type LendStatus<'a> = dyn FnMut(Option<&PodStatus>) + 'a;

impl<F: Fn(&PodUid, &mut LendStatus<'_>)> PodListChunks<F> {
    /// Pods per chunk: a chunk is ~100 KB.
    const PODS: usize = 32;

    fn new(pods: Vec<Arc<Pod>>, status: F) -> Self {
        Self {
            pods: pods.into_iter(),
            status,
            at: ListAt::Start,
        }
    }
}

impl<F: Fn(&PodUid, &mut LendStatus<'_>)> Iterator for PodListChunks<F> {
    /// A serialization error ends the body early: the client sees a broken response.
    type Item = Result<Vec<u8>, serde_json::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut chunk = Vec::with_capacity(4096 * Self::PODS);
        match self.at {
            ListAt::Done => return None,
            ListAt::Start => chunk.extend_from_slice(
                br#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":["#,
            ),
            ListAt::Items => {}
        }
        for pod in self.pods.by_ref().take(Self::PODS) {
            if self.at == ListAt::Items {
                chunk.push(b',');
            }
            self.at = ListAt::Items;
            let mut written = Ok(());
            (self.status)(&PodUid::of(&pod), &mut |status| {
                let pod = WithStatus { pod: &pod, status };
                written = serde_json::to_writer(&mut chunk, &pod);
            });
            if let Err(err) = written {
                self.at = ListAt::Done;
                return Some(Err(err));
            }
        }
        if self.pods.len() == 0 {
            chunk.extend_from_slice(b"]}");
            self.at = ListAt::Done;
        }
        Some(Ok(chunk))
    }
}

async fn metrics(State(e): State<Arc<Endpoints>>) -> Response {
    let text = match e.metrics.render() {
        Ok(text) => text,
        Err(err) => return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Pod, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::PodListChunks;

    fn pod(i: usize) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(format!("p{i:03}")),
                uid: Some(format!("uid-{i}")),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// Issue 29: `/pods` is sent a chunk at a time; the chunks make one `PodList` with every
    /// pod in order, each with the status the manager holds (its own when it holds none).
    #[test]
    fn the_pod_list_comes_in_chunks_that_make_one_list() {
        let pods: Vec<_> = (0..100).map(pod).collect();
        let running = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        let chunks: Vec<Vec<u8>> = PodListChunks::new(pods, |uid, write| {
            write((uid.as_str() != "uid-7").then_some(&running));
        })
        .map(Result::unwrap)
        .collect();
        assert_eq!(chunks.len(), 100_usize.div_ceil(32), "32 pods to a chunk");
        let list: serde_json::Value = serde_json::from_slice(&chunks.concat()).unwrap();
        assert_eq!(
            (&list["kind"], &list["apiVersion"]),
            (&"PodList".into(), &"v1".into())
        );
        let items = list["items"].as_array().unwrap();
        let names: Vec<_> = items
            .iter()
            .map(|p| p["metadata"]["name"].clone())
            .collect();
        let expected: Vec<serde_json::Value> =
            (0..100).map(|i| format!("p{i:03}").into()).collect();
        assert_eq!(names, expected);
        let phase = |i: usize| items[i]["status"]["phase"].as_str().unwrap();
        assert_eq!(
            (phase(6), phase(7), phase(99)),
            ("Running", "Pending", "Running")
        );
        assert_eq!(items[0]["kind"], "Pod");
    }

    #[test]
    fn no_pods_make_an_empty_list_in_one_chunk() {
        let chunks: Vec<_> = PodListChunks::new(Vec::new(), |_, write| write(None)).collect();
        assert_eq!(chunks.len(), 1);
        let list: serde_json::Value = serde_json::from_slice(chunks[0].as_ref().unwrap()).unwrap();
        assert_eq!(list["items"], serde_json::json!([]));
        // Exactly a chunk's worth: the last chunk closes the list, and none follows.
        let pods: Vec<_> = (0..32).map(pod).collect();
        let chunks: Vec<_> = PodListChunks::new(pods, |_, write| write(None)).collect();
        assert_eq!(chunks.len(), 1);
        let list: serde_json::Value = serde_json::from_slice(chunks[0].as_ref().unwrap()).unwrap();
        assert_eq!(list["items"].as_array().unwrap().len(), 32);
    }
}
