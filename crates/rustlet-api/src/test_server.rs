//! The test API server (feature `test-util`): a small HTTP server over the local
//! [`Store`] that speaks the Kubernetes REST API for what Rustlet uses, so tests can point a
//! real `kube::Client` at `127.0.0.1:<port>`.
//!
//! Routes (core `v1`, `coordination.k8s.io/v1`, `events.k8s.io/v1`), namespaced or cluster
//! scoped as the kind is: get, list and watch (`fieldSelector`, `resourceVersion`), create,
//! replace, JSON merge PATCH of the object, merge/strategic PATCH of the `status` subresource, and DELETE
//! with `gracePeriodSeconds` and preconditions. Errors are `Status` objects with the API's
//! codes. [`Fault`]s inject error codes, latency and cut watches per route; every request is
//! logged for counting. It is test infrastructure: the product never needs it.

// The error of the handlers is the HTTP response they answer with; large, but this is test
// infrastructure and not a hot path.
#![allow(clippy::result_large_err)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::local::store::{
    DeleteOptions, Deleted, FieldSelector, Kind, ObjectRef, PatchKind, Preconditions, Selection,
    Store, StoreError, json_merge,
};

/// What a fault does to the requests it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this status code (a `Status` body) instead of serving.
    Status(u16),
    /// Wait this long, then serve.
    Delay(Duration),
    /// Serve a watch, but end its stream after this many events.
    CutWatchAfter(usize),
}

/// One injected fault: requests whose method matches (any, when `None`) and whose path
/// contains `path_contains` get `action`, for the next `times` matching requests (always, when
/// `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Only this method.
    pub method: Option<Method>,
    /// Only paths containing this.
    pub path_contains: String,
    /// What to do.
    pub action: FaultAction,
    /// How many more times (`None`: forever).
    pub times: Option<usize>,
}

/// One served request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    /// Its method.
    pub method: Method,
    /// Its path.
    pub path: String,
    /// Its query string.
    pub query: String,
    /// Its body, as text (empty for none).
    pub body: String,
}

#[derive(Default)]
struct Shared {
    faults: Vec<Fault>,
    log: Vec<LoggedRequest>,
    served: u64,
}

#[derive(Clone)]
struct AppState {
    store: Arc<Store>,
    shared: Arc<Mutex<Shared>>,
}

/// A running test API server.
pub struct TestApiServer {
    addr: SocketAddr,
    store: Arc<Store>,
    shared: Arc<Mutex<Shared>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for TestApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApiServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TestApiServer {
    /// Serve `store` on `127.0.0.1:0`.
    pub async fn start(store: Arc<Store>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let state = AppState {
            store: store.clone(),
            shared: shared.clone(),
        };
        let app = Router::new().fallback(serve).with_state(state);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let shutdown = async move { stopped.cancelled().await };
            // A failed server shows as refused connections in the test using it.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
        });
        Ok(Self {
            addr,
            store,
            shared,
            stop,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The store it serves.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// A kubeconfig (YAML) whose current context points at this server.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\nusers:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\ncurrent-context: test\n",
            self.url()
        )
    }

    /// The kube `Config` of [`TestApiServer::kubeconfig`].
    pub async fn config(&self) -> Result<kube::Config, kube::Error> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig())
            .map_err(|e| kube::Error::Service(e.into()))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| kube::Error::Service(e.into()))
    }

    /// A plain `kube::Client` built from [`TestApiServer::kubeconfig`].
    pub async fn client(&self) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(self.config().await?)
    }

    /// The same server as an in-process tower service (over the same store, faults and log),
    /// for `kube::Client::new`: no socket, so tests in paused time drive every request as a
    /// task and see it at an exact instant.
    pub fn router(&self) -> Router {
        Router::new().fallback(serve).with_state(AppState {
            store: self.store.clone(),
            shared: self.shared.clone(),
        })
    }

    /// Add a fault.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Remove every fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The requests served so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.lock().log.clone()
    }

    /// How many requests had this method and a path containing `path_contains`.
    pub fn count(&self, method: &Method, path_contains: &str) -> usize {
        self.lock()
            .log
            .iter()
            .filter(|r| r.method == *method && r.path.contains(path_contains))
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn status_body(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
        "message":message,"reason":reason,"code":code});
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &body,
    )
}

fn store_error(err: &StoreError) -> Response {
    status_body(err.code(), err.reason(), &err.to_string())
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .expect("a static response")
}

/// The parts of a REST path.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    kind: Option<Kind>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    resource: String,
}

fn kind_of(group_version: &str, resource: &str) -> Option<Kind> {
    Kind::ALL
        .into_iter()
        .find(|k| k.plural() == resource && k.api_version() == group_version)
}

fn parse_route(path: &str) -> Option<Route> {
    let (group_version, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        ("v1".to_owned(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let group = parts.next()?;
        let version = parts.next()?;
        (format!("{group}/{version}"), parts.next()?)
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segments) = match segments.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some((*ns).to_owned()), tail),
        all => (None, all),
    };
    let (resource, name, subresource) = match segments {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return None,
    };
    Some(Route {
        kind: kind_of(&group_version, resource),
        namespace,
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
        resource: resource.to_owned(),
    })
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn serve(State(state): State<AppState>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let (actions, request_number, logged) = {
        let mut shared = state.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.log.push(LoggedRequest {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: String::new(),
        });
        let logged = shared.log.len() - 1;
        let mut actions = Vec::new();
        for fault in &mut shared.faults {
            let matches = fault.method.as_ref().is_none_or(|m| *m == method)
                && path.contains(&fault.path_contains)
                && fault.times != Some(0);
            if matches {
                if let Some(times) = &mut fault.times {
                    *times -= 1;
                }
                actions.push(fault.action.clone());
            }
        }
        shared.served += 1;
        (actions, shared.served, logged)
    };
    let mut cut_after = None;
    for action in actions {
        match action {
            FaultAction::Delay(d) => tokio::time::sleep(d).await,
            FaultAction::Status(code) => {
                return status_body(code, "InjectedFault", &format!("injected {code}"));
            }
            FaultAction::CutWatchAfter(n) => cut_after = Some(n),
        }
    }
    let body = match axum::body::to_bytes(request.into_body(), 16 << 20).await {
        Ok(body) => body,
        Err(e) => return status_body(400, "BadRequest", &format!("read body: {e}")),
    };
    if !body.is_empty()
        && let Some(entry) = state
            .shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .log
            .get_mut(logged)
    {
        entry.body = String::from_utf8_lossy(&body).into_owned();
    }
    let Some(route) = parse_route(&path) else {
        return status_body(404, "NotFound", &format!("no route {path}"));
    };
    let context = Context {
        store: &state.store,
        method,
        query,
        content_type,
        body,
        cut_after,
        request_number,
    };
    context.handle(route)
}

struct Context<'a> {
    store: &'a Arc<Store>,
    method: Method,
    query: String,
    content_type: String,
    body: Bytes,
    cut_after: Option<usize>,
    request_number: u64,
}

type Answer = Result<(StatusCode, Value), Response>;

fn stored(result: Result<Value, StoreError>, code: StatusCode) -> Answer {
    result.map(|o| (code, o)).map_err(|e| store_error(&e))
}

impl Context<'_> {
    fn body_json(&self) -> Result<Value, Response> {
        serde_json::from_slice(&self.body)
            .map_err(|e| status_body(400, "BadRequest", &format!("body is not JSON: {e}")))
    }

    fn handle(self, route: Route) -> Response {
        if route.resource == "serviceaccounts" && route.subresource.as_deref() == Some("token") {
            return match self.token(&route) {
                Ok((code, body)) | Err((code, body)) => json_response(code, &body),
            };
        }
        let Some(kind) = route.kind else {
            return status_body(404, "NotFound", &format!("no resource {}", route.resource));
        };
        if kind.is_namespaced() == route.namespace.is_none() && route.name.is_some() {
            return status_body(404, "NotFound", "namespace scope does not match the kind");
        }
        let namespace = route.namespace.clone().unwrap_or_default();
        let name = route.name.as_deref();
        let answer = match (&self.method, name, route.subresource.as_deref()) {
            (&Method::GET, None, None) => return self.list_or_watch(kind, route.namespace),
            (&Method::POST, None, None) => self.create(kind, &namespace),
            (&Method::GET, Some(name), None | Some("status")) => stored(
                self.store.get(&ObjectRef::new(kind, &namespace, name)),
                StatusCode::OK,
            ),
            (&Method::PUT, Some(name), None) => self.replace(kind, &namespace, name),
            (&Method::PATCH, Some(name), None) => self.patch(kind, &namespace, name),
            (&Method::PATCH, Some(name), Some("status")) => {
                self.patch_status(&ObjectRef::new(kind, &namespace, name))
            }
            (&Method::PUT, Some(name), Some("status")) => {
                self.object_for(kind, &namespace).and_then(|object| {
                    if object.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
                        return Err(status_body(
                            400,
                            "BadRequest",
                            "metadata.name does not match the path",
                        ));
                    }
                    stored(self.store.update_status(object), StatusCode::OK)
                })
            }
            (&Method::DELETE, Some(name), None) => self.delete(kind, &namespace, name),
            _ => Err(status_body(
                405,
                "MethodNotAllowed",
                &format!("{} is not supported here", self.method),
            )),
        };
        match answer {
            Ok((code, object)) => json_response(code, &object),
            Err(response) => response,
        }
    }

    /// The body as an object of `kind` in `namespace` (path wins over body).
    fn object_for(&self, kind: Kind, namespace: &str) -> Result<Value, Response> {
        let mut object = self.body_json()?;
        if !object.is_object() {
            return Err(status_body(400, "BadRequest", "body is not an object"));
        }
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.name());
        if kind.is_namespaced() {
            if !object["metadata"].is_object() {
                object["metadata"] = json!({});
            }
            object["metadata"]["namespace"] = json!(namespace);
        }
        Ok(object)
    }

    /// As the API server: the UID (and the other server-set metadata) a create carries is
    /// ignored; the server assigns its own.
    fn create(&self, kind: Kind, namespace: &str) -> Answer {
        let mut object = self.object_for(kind, namespace)?;
        if let Some(meta) = object["metadata"].as_object_mut() {
            for field in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
            ] {
                meta.remove(field);
            }
        }
        stored(self.store.create(object), StatusCode::CREATED)
    }

    fn replace(&self, kind: Kind, namespace: &str, name: &str) -> Answer {
        let object = self.object_for(kind, namespace)?;
        if object.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
            return Err(status_body(
                400,
                "BadRequest",
                "metadata.name does not match the path",
            ));
        }
        stored(self.store.update(object), StatusCode::OK)
    }

    /// PATCH of the status subresource by its `Content-Type`, as the API server: strategic
    /// merge, JSON merge and JSON patch; anything else (server-side apply included) 415.
    fn patch_status(&self, reference: &ObjectRef) -> Answer {
        let media = self.content_type.split(';').next().unwrap_or("").trim();
        let kind = match media {
            "application/strategic-merge-patch+json" => PatchKind::StrategicMerge,
            "application/merge-patch+json" => PatchKind::Merge,
            "application/json-patch+json" => PatchKind::Json,
            other => {
                return Err(status_body(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                    ),
                ));
            }
        };
        let patch = self.body_json()?;
        stored(
            self.store.patch_status_as(reference, &patch, kind),
            StatusCode::OK,
        )
    }

    /// JSON merge patches of the object (what Rustlet sends outside `status`: kube-runtime's
    /// event series updates). A strategic merge patch of a whole object needs every type's
    /// merge keys; rather than apply it with the wrong (JSON merge) semantics, the server
    /// refuses it with 415, as the API server refuses a patch type it cannot apply.
    fn patch(&self, kind: Kind, namespace: &str, name: &str) -> Answer {
        if !self
            .content_type
            .starts_with("application/merge-patch+json")
        {
            return Err(status_body(
                415,
                "UnsupportedMediaType",
                &format!(
                    "patch type {:?} is not supported by the test API server for a whole \
                     object (use application/merge-patch+json; strategic merge is served for \
                     pods/status)",
                    self.content_type
                ),
            ));
        }
        let patch = self.body_json()?;
        let reference = ObjectRef::new(kind, namespace, name);
        let pinned = Preconditions::from_body(&patch).resource_version.is_some();
        loop {
            let mut object = self.store.get(&reference).map_err(|e| store_error(&e))?;
            json_merge(&mut object, &patch);
            match self.store.update(object) {
                // Someone wrote in between: the API server retries unless the patch pins a
                // resourceVersion.
                Err(StoreError::Conflict { .. }) if !pinned => continue,
                other => return stored(other, StatusCode::OK),
            }
        }
    }

    fn delete(&self, kind: Kind, namespace: &str, name: &str) -> Answer {
        let body: Value = if self.body.is_empty() {
            json!({})
        } else {
            self.body_json()?
        };
        let precondition = |f: &str| {
            body.pointer(&format!("/preconditions/{f}"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let grace = body
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| query_param(&self.query, "gracePeriodSeconds")?.parse().ok());
        let options = DeleteOptions {
            grace_period_seconds: grace,
            preconditions: Preconditions {
                uid: precondition("uid"),
                resource_version: precondition("resourceVersion"),
            },
        };
        match self
            .store
            .delete(&ObjectRef::new(kind, namespace, name), &options)
        {
            Ok(Deleted::Removed(object) | Deleted::Terminating(object)) => {
                Ok((StatusCode::OK, object))
            }
            Err(e) => Err(store_error(&e)),
        }
    }

    fn selection(&self, kind: Kind, namespace: Option<String>) -> Result<Selection, Response> {
        let fields = query_param(&self.query, "fieldSelector").unwrap_or_default();
        let fields = FieldSelector::parse_for(kind, &fields).map_err(|e| store_error(&e))?;
        Ok(Selection {
            kind,
            namespace,
            fields,
        })
    }

    fn list_or_watch(self, kind: Kind, namespace: Option<String>) -> Response {
        let selection = match self.selection(kind, namespace) {
            Ok(selection) => selection,
            Err(response) => return response,
        };
        let watching = matches!(
            query_param(&self.query, "watch").as_deref(),
            Some("true" | "1")
        );
        if !watching {
            let (items, resource_version) = self.store.list(&selection);
            let list = json!({"apiVersion": kind.api_version(), "kind": format!("{}List", kind.name()),
                "metadata": {"resourceVersion": resource_version.to_string()}, "items": items});
            return json_response(StatusCode::OK, &list);
        }
        let from = query_param(&self.query, "resourceVersion")
            .and_then(|rv| rv.parse::<u64>().ok())
            .unwrap_or(0);
        let watch = match self.store.watch(selection, from) {
            Ok(watch) => watch,
            Err(e) => return store_error(&e),
        };
        let limit = self.cut_after.unwrap_or(usize::MAX);
        let stream = futures::stream::unfold(
            (watch, 0usize),
            move |(mut watch, sent)| async move {
                if sent >= limit {
                    return None;
                }
                let mut bytes = match watch.next().await {
                    // The stored text as it is: no tree is built per watcher and event.
                    Ok(event) => format!(
                        r#"{{"type":"{}","object":{}}}"#,
                        event.type_.as_str(),
                        event.object.json()
                    )
                    .into_bytes(),
                    Err(e) => serde_json::to_vec(&json!({"type": "ERROR", "object": {"kind":"Status","apiVersion":"v1",
                    "status":"Failure","reason":e.reason(),"code":e.code(),"message":e.to_string()}}))
                    .unwrap_or_default(),
                };
                bytes.push(b'\n');
                Some((
                    Ok::<_, std::io::Error>(Bytes::from(bytes)),
                    (watch, sent + 1),
                ))
            },
        );
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(stream))
            .expect("a streaming response")
    }

    /// `POST .../serviceaccounts/{name}/token`: a made-up token that expires after the asked
    /// `expirationSeconds` (default 3600).
    fn token(&self, route: &Route) -> Result<(StatusCode, Value), (StatusCode, Value)> {
        let request = self.body_json().map_err(|_| {
            (
                StatusCode::BAD_REQUEST,
                json!({"kind":"Status","apiVersion":"v1","status":"Failure","code":400,"reason":"BadRequest","message":"body is not JSON"}),
            )
        })?;
        let seconds = request
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        let expires = k8s_openapi::jiff::Timestamp::now()
            + k8s_openapi::jiff::SignedDuration::from_secs(seconds);
        let expires =
            k8s_openapi::jiff::Timestamp::from_second(expires.as_second()).unwrap_or(expires);
        let mut answer = request;
        answer["status"] = json!({
            "token": format!("test-token-{}-{}", route.name.as_deref().unwrap_or(""), self.request_number),
            "expirationTimestamp": expires.to_string(),
        });
        Ok((StatusCode::CREATED, answer))
    }
}

#[cfg(test)]
mod tests;
