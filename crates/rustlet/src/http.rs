//! The read-only HTTP endpoints (the kubelet's read-only port): `/healthz`, `/pods`,
//! `/metrics`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
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

/// What the handlers read.
pub struct Endpoints {
    /// Health.
    pub health: Arc<Health>,
    /// This node's pods.
    pub pods: Arc<PodCache>,
    /// Their statuses.
    pub status: Arc<StatusManager>,
    /// Every metric of the agent.
    pub registry: Arc<Registry>,
    /// Refreshed at each scrape.
    pub process: crate::process::ProcessMetrics,
}

/// The router.
pub fn router(endpoints: Arc<Endpoints>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .with_state(endpoints)
}

async fn healthz(State(e): State<Arc<Endpoints>>) -> Response {
    match e.health.reason() {
        None => (StatusCode::OK, "ok").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// A v1 `PodList` of this node's pods with the statuses the status manager holds.
async fn pods(State(e): State<Arc<Endpoints>>) -> Response {
    let mut items: Vec<Pod> = e
        .pods
        .pods()
        .iter()
        .map(|pod| {
            let mut pod = (**pod).clone();
            if let Some(status) = e.status.get_pod_status(&PodUid::of(&pod)) {
                pod.status = Some(status);
            }
            pod
        })
        .collect();
    items.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let items: Vec<serde_json::Value> = items
        .iter()
        .map(|pod| {
            let mut value = serde_json::to_value(pod).unwrap_or_default();
            value["apiVersion"] = "v1".into();
            value["kind"] = "Pod".into();
            value
        })
        .collect();
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {},
        "items": items,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn metrics(State(e): State<Arc<Endpoints>>) -> Response {
    e.process.update();
    let mut text = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &e.registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
