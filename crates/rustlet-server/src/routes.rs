//! The kubelet server's routes (upstream: `pkg/kubelet/server/server.go`): `/healthz`, `/pods`,
//! `/configz`, `/containerLogs`, `/exec`, `/attach`, `/portForward`, `/run`, `/stats/summary`,
//! `/metrics/resource`, `/metrics/cadvisor`, `/metrics/probes`, over a [`NodeApi`] the binary implements (the pod
//! manager, the status manager and the CRI live there). [`stats_router`] is the part the
//! read-only port serves too.
//!
//! The router has no authentication of its own: the binary wraps it in
//! [`crate::auth::AuthLayer`], as upstream's `InstallAuthFilter` wraps every route.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, Response, StatusCode, Uri, header};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use tokio::io::AsyncReadExt as _;

use crate::logs::{ContainerRunning, LogOptions, LogReader, parse_pod_log_query};
use crate::metrics::probes::{ProbeCount, probe_metrics};
use crate::metrics::resource::resource_metrics;
use crate::stats::summary::Summary;
use crate::streaming::{ProxyConfig, is_upgrade_request, proxy_upgrade};

/// Why the node could not answer a route's question.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiError {
    /// The pod, container or sandbox does not exist (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The runtime cannot do this (the simulated runtime has no streams or log files).
    #[error("{0}")]
    Unsupported(String),
    /// The runtime failed (HTTP 500 for streams, 400 for logs, as upstream).
    #[error("{0}")]
    Runtime(String),
}

/// A container instance's log: the file CRI `ContainerStatus.log_path` names and the check a
/// follow asks whether the instance still runs.
pub struct ContainerLogSource {
    /// The log file.
    pub path: PathBuf,
    /// Whether the instance is running (a follow ends when it is not).
    pub running: Box<dyn ContainerRunning>,
}

/// The streams a session asks for (upstream: `remotecommandserver.Options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// `input=1`.
    pub stdin: bool,
    /// `output=1`.
    pub stdout: bool,
    /// `error=1` (dropped with a TTY, as upstream).
    pub stderr: bool,
    /// `tty=1`.
    pub tty: bool,
}

/// What the routes ask the node. Upstream: the `HostInterface` of `server.go`.
#[async_trait::async_trait]
pub trait NodeApi: Send + Sync {
    /// The pods the node should run, with their latest status (upstream: `GetPods` for
    /// `/pods`; `GetPodByName` and the status manager's status for the others).
    async fn pods(&self) -> Vec<Pod>;

    /// The pod `namespace/name` with its latest status.
    async fn pod_by_name(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods().await.into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    /// The pods the runtime runs, as upstream's `/runningpods/` shows them
    /// (`kubecontainer.Pod.ToAPIPod`: name, namespace, UID and the running containers' names
    /// and images).
    async fn running_pods(&self) -> Vec<Pod>;

    /// The node's configuration as `/configz` shows it under `kubeletconfig`.
    fn configz(&self) -> serde_json::Value;

    /// The log of the container instance `container_id` (`<runtime>://<id>` as the pod status
    /// names it) of `pod`.
    async fn container_log(
        &self,
        pod: &Pod,
        container_id: &str,
    ) -> Result<ContainerLogSource, NodeApiError>;

    /// The runtime's stream URL for `cmd` in the running `container` of `pod` (upstream:
    /// `GetExec`, CRI `Exec`).
    async fn exec_url(
        &self,
        pod: &Pod,
        container: &str,
        cmd: Vec<String>,
        streams: StreamOptions,
    ) -> Result<Uri, NodeApiError>;

    /// The runtime's stream URL to attach to `container` (upstream: `GetAttach`, CRI `Attach`).
    async fn attach_url(
        &self,
        pod: &Pod,
        container: &str,
        streams: StreamOptions,
    ) -> Result<Uri, NodeApiError>;

    /// The runtime's stream URL to forward `ports` of `pod`'s sandbox (upstream:
    /// `GetPortForward`, CRI `PortForward`).
    async fn port_forward_url(&self, pod: &Pod, ports: Vec<i32>) -> Result<Uri, NodeApiError>;

    /// Runs `cmd` in the running `container` of `pod` to its end; its stdout then its stderr
    /// (upstream: `RunInContainer`, CRI `ExecSync`). A command that exits non-zero is an error
    /// naming its exit code.
    async fn run_in_container(
        &self,
        pod: &Pod,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, NodeApiError> {
        let _ = (pod, container, cmd);
        Err(NodeApiError::Unsupported(
            "this node cannot run commands in containers".to_owned(),
        ))
    }

    /// The stats summary (upstream: `SummaryProvider.Get`; with `only_cpu_and_memory`,
    /// `GetCPUAndMemoryStats`: no filesystems, volumes or network). Default: unsupported.
    async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, NodeApiError> {
        let _ = only_cpu_and_memory;
        Err(NodeApiError::Unsupported(
            "this node has no stats provider".to_owned(),
        ))
    }

    /// `/metrics/cadvisor`'s body (upstream: the kubelet's cAdvisor registry), in the
    /// Prometheus text format ([`crate::metrics::cadvisor`]). Default: unsupported.
    async fn cadvisor_metrics(&self) -> Result<String, NodeApiError> {
        Err(NodeApiError::Unsupported(
            "this node has no stats provider".to_owned(),
        ))
    }

    /// The agent's own metrics in the OpenMetrics text format (upstream: `/metrics`, the
    /// kubelet's registry). Default: none (404).
    fn metrics_text(&self) -> Option<String> {
        None
    }

    /// The prober's `prober_probe_total` series. Default: none.
    fn probe_counts(&self) -> Vec<ProbeCount> {
        Vec::new()
    }
}

/// The router's state.
#[derive(Clone)]
struct Server {
    api: Arc<dyn NodeApi>,
    proxy: ProxyConfig,
}

/// The kubelet server's routes over `api`; sessions are proxied with `proxy`.
pub fn router(api: Arc<dyn NodeApi>, proxy: ProxyConfig) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/ping", get(healthz))
        .route("/healthz/syncloop", get(healthz))
        .route("/healthz/log", get(healthz))
        .route("/pods", get(pods))
        .route("/runningpods/", get(running_pods))
        .route("/configz", get(configz))
        .route("/metrics", get(metrics))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/exec/{ns}/{pod}/{uid}/{container}",
            get(exec_uid).post(exec_uid),
        )
        .route("/attach/{ns}/{pod}/{container}", get(attach).post(attach))
        .route(
            "/attach/{ns}/{pod}/{uid}/{container}",
            get(attach_uid).post(attach_uid),
        )
        .route("/run/{ns}/{pod}/{container}", post(run))
        .route("/run/{ns}/{pod}/{uid}/{container}", post(run_uid))
        .route(
            "/portForward/{ns}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route(
            "/portForward/{ns}/{pod}/{uid}",
            get(port_forward_uid).post(port_forward_uid),
        )
        .merge(stats_router(api.clone()))
        .with_state(Server { api, proxy })
}

/// `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor` and `/metrics/probes` over
/// `api`: the routes the
/// read-only port serves beside the secure port's.
pub fn stats_router<S>(api: Arc<dyn NodeApi>) -> Router<S> {
    Router::new()
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route("/metrics/cadvisor", get(metrics_cadvisor))
        .route("/metrics/probes", get(metrics_probes))
        .with_state(api)
}

async fn metrics(State(server): State<Server>) -> Response<Body> {
    match server.api.metrics_text() {
        Some(body) => {
            let mut response = Response::new(Body::from(body));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        None => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// A plain-text answer (upstream's `response.WriteError`/`http.Error`: the status, the text).
fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let body = body.into();
    if status.is_client_error() || status.is_server_error() {
        // Why (the request line is logged by the server).
        tracing::info!(status = status.as_u16(), reason = %body.trim_end(), "kubelet server answer");
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut response = Response::new(Body::from(bytes));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn healthz() -> Response<Body> {
    text(StatusCode::OK, "ok")
}

/// A `v1 PodList` written straight from the typed pods (issue 29: through a
/// `serde_json::Value` the list was a tree of ~40 MB at 1,000 pods).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PodList<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: serde_json::Map<String, serde_json::Value>,
    items: &'a [Pod],
}

impl<'a> PodList<'a> {
    fn of(items: &'a [Pod]) -> Self {
        Self {
            kind: "PodList",
            api_version: "v1",
            metadata: serde_json::Map::new(),
            items,
        }
    }
}

/// upstream: `getPods`, a `v1 PodList` of the pods the node should run.
async fn pods(State(server): State<Server>) -> Response<Body> {
    let items = server.api.pods().await;
    json(&PodList::of(&items))
}

/// upstream: `getRunningPods`, a `v1 PodList` of what the runtime runs.
async fn running_pods(State(server): State<Server>) -> Response<Body> {
    let items = server.api.running_pods().await;
    json(&PodList::of(&items))
}

/// upstream: `handleSummary`: `only_cpu_and_memory=true` asks for CPU and memory only; an
/// error is a 500 with its text.
async fn stats_summary(
    State(api): State<Arc<dyn NodeApi>>,
    RawQuery(query): RawQuery,
) -> Response<Body> {
    let only_cpu_and_memory = query_values(query.as_deref(), "only_cpu_and_memory")
        .first()
        .is_some_and(|v| v == "true");
    match api.summary(only_cpu_and_memory).await {
        Ok(summary) => json(&summary),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        ),
    }
}

fn prometheus_text(body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::TEXT_CONTENT_TYPE),
    );
    response
}

/// upstream: the `/metrics/resource` handler over `NewResourceMetricsCollector`.
async fn metrics_resource(State(api): State<Arc<dyn NodeApi>>) -> Response<Body> {
    let summary = api.summary(true).await;
    if let Err(error) = &summary {
        tracing::warn!(%error, "getting the summary for /metrics/resource");
    }
    prometheus_text(resource_metrics(summary.as_ref()))
}

/// upstream: the `/metrics/cadvisor` handler over the cAdvisor registry; an error is a 500
/// with its text.
async fn metrics_cadvisor(State(api): State<Arc<dyn NodeApi>>) -> Response<Body> {
    match api.cadvisor_metrics().await {
        Ok(body) => prometheus_text(body),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        ),
    }
}

/// upstream: the `/metrics/probes` handler over the prober's registry.
async fn metrics_probes(State(api): State<Arc<dyn NodeApi>>) -> Response<Body> {
    prometheus_text(probe_metrics(&api.probe_counts()))
}

/// upstream: `configz`'s handler, `{"kubeletconfig": {...}}`.
async fn configz(State(server): State<Server>) -> Response<Body> {
    json(&serde_json::json!({ "kubeletconfig": server.api.configz() }))
}

fn status_of<'a>(
    statuses: Option<&'a Vec<ContainerStatus>>,
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses?.iter().find(|s| s.name == name)
}

/// Which container instance's log to read (upstream: `validateContainerLogStatus`, with its
/// wording).
pub fn container_log_id(
    pod_name: &str,
    status: &PodStatus,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let found = status_of(status.container_statuses.as_ref(), container)
        .or_else(|| status_of(status.init_container_statuses.as_ref(), container))
        .or_else(|| status_of(status.ephemeral_container_statuses.as_ref(), container));
    let Some(cs) = found else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        ));
    };
    let last_terminated = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_id = last_terminated
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let state = cs.state.clone().unwrap_or_default();
    let terminated_msg = || format!("container {container:?} in pod {pod_name:?} is terminated");
    if previous {
        return last_id.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod_name:?} not found")
        });
    }
    if state.running.is_some() {
        return cs.container_id.clone().ok_or_else(terminated_msg);
    }
    if let Some(terminated) = &state.terminated {
        return match terminated.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => Ok(id),
            None => last_id.ok_or_else(terminated_msg),
        };
    }
    if last_terminated.is_some() {
        return last_id.ok_or_else(terminated_msg);
    }
    if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let why = match reason {
            "ErrImagePull" => "image can't be pulled".to_owned(),
            "ImagePullBackOff" => "trying and failing to pull image".to_owned(),
            other => other.to_owned(),
        };
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
        ));
    }
    Err(format!(
        "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
    ))
}

/// upstream: `getContainerLogs` then `GetKubeletContainerLogs`.
async fn container_logs(
    State(server): State<Server>,
    Path((ns, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response<Body> {
    let opts = match parse_pod_log_query(query.as_deref().unwrap_or_default()) {
        Ok(opts) => opts,
        Err(e) => {
            return text(
                StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST),
                e.http_body(),
            );
        }
    };
    let Some(pod) = server.api.pod_by_name(&ns, &pod_name).await else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    let in_spec = pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    });
    if !in_spec {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let status = pod.status.clone().unwrap_or_default();
    let id = match container_log_id(&pod_name, &status, &container, opts.previous) {
        Ok(id) => id,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let source = match server.api.container_log(&pod, &id).await {
        Ok(source) => source,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // A missing file is the request's error (400), not a body cut short.
    if let Err(e) = tokio::fs::metadata(&source.path).await {
        return text(
            StatusCode::BAD_REQUEST,
            format!("reading log file {:?}: {e}", source.path),
        );
    }
    let reader = LogReader::new(
        source.path,
        LogOptions::new(&opts, k8s_openapi::jiff::Timestamp::now()),
    );
    stream_body(move |mut out| async move {
        match reader.read_logs(source.running.as_ref(), &mut out).await {
            Ok(stats) => tracing::debug!(bytes = stats.bytes_written, "served a container log"),
            Err(error) => tracing::debug!(%error, "serving a container log"),
        }
    })
}

/// Ends the writer task when the body is dropped (the client went away).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A chunked body fed by `write`: each write reaches the client as soon as it is made
/// (upstream: `flushwriter.Wrap`), and the body's end never travels with its last data.
///
/// The end waits one turn of the runtime after `write` is done, so the server flushes the last
/// chunk before it writes the terminating one (as Go's server does: the handler's last flush,
/// then the end when the handler returns). Sent together, they reach a Go client in one TLS
/// record, and its chunked reader returns the last bytes *with* `io.EOF`: the API server's
/// WebSocket copy of `pods/log` (`wsstream`'s `messageCopy`) drops the bytes of such a read,
/// and `kubectl logs` over WebSockets showed nothing for a short log.
fn stream_body<F, Fut>(write: F) -> Response<Body>
where
    F: FnOnce(tokio::io::DuplexStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    const PIPE_BYTES: usize = 64 * 1024;
    let (out, read) = tokio::io::duplex(PIPE_BYTES);
    let task = AbortOnDrop(tokio::spawn(write(out)));
    let stream = futures::stream::unfold((read, task), |(mut read, task)| async move {
        let mut buf = vec![0u8; PIPE_BYTES];
        match read.read(&mut buf).await {
            Ok(0) => {
                // Pending once: the server flushes what it has before the end is written.
                tokio::task::yield_now().await;
                None
            }
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), (read, task)))
            }
            Err(e) => Some((Err(e), (read, task))),
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// The query's values of `key`, in order (Go's `url.Values[key]`).
fn query_values(query: Option<&str>, key: &str) -> Vec<String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// upstream: `remotecommandserver.NewOptions` (`req.FormValue(p) == "1"` of the kubelet's
/// parameter names `api.ExecStdinParam` `input`, `output`, `error`, `tty`: the API server's
/// `streamParams` turns the client's `stdin=true&stdout=true` into these).
fn stream_options(query: Option<&str>) -> Result<StreamOptions, String> {
    let flag = |key| query_values(query, key).first().is_some_and(|v| v == "1");
    let tty = flag("tty");
    let opts = StreamOptions {
        stdin: flag("input"),
        stdout: flag("output"),
        stderr: flag("error") && !tty,
        tty,
    };
    if !opts.stdin && !opts.stdout && !opts.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".to_owned());
    }
    Ok(opts)
}

/// Whether the request upgrades to a WebSocket (upstream: `wsstream.IsWebSocketRequest`).
fn is_websocket_request(headers: &HeaderMap) -> bool {
    is_upgrade_request(headers)
        && headers
            .get_all(header::UPGRADE)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// upstream: `portforward.NewV4Options`. A SPDY client names its ports per stream, so the
/// query's are not read; a WebSocket client must name them there (`port=80&port=8080` or
/// `port=80,8080`), each in 1..=65535, with upstream's wording (and Go's `strconv` text).
fn port_forward_ports(headers: &HeaderMap, query: Option<&str>) -> Result<Vec<i32>, String> {
    if !is_websocket_request(headers) {
        return Ok(Vec::new());
    }
    let values = query_values(query, "port");
    if values.is_empty() {
        return Err("query parameter \"port\" is required".to_owned());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".to_owned());
        }
        for p in value.split(',') {
            // Go's `ParseUint(p, 10, 16)`: digits only, then the range.
            let why = if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                Some("invalid syntax")
            } else {
                p.parse::<u16>().err().map(|_| "value out of range")
            };
            if let Some(why) = why {
                return Err(format!(
                    "unable to parse {value:?} as a port: strconv.ParseUint: parsing {p:?}: {why}"
                ));
            }
            let port: u16 = p.parse().unwrap_or_default();
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// upstream: `streaming.WriteError` (NotFound 404, else 500, the error's text).
fn stream_error(e: &NodeApiError) -> Response<Body> {
    let status = match e {
        NodeApiError::NotFound(_) => StatusCode::NOT_FOUND,
        NodeApiError::Unsupported(_) | NodeApiError::Runtime(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    text(status, e.to_string())
}

/// What a session route asks for.
enum Session {
    Exec { container: String },
    Attach { container: String },
    PortForward,
}

/// upstream: `getExec`/`getAttach`/`getPortForward`, then `proxyStream`.
async fn session(
    server: Server,
    ns: String,
    pod_name: String,
    uid: Option<String>,
    kind: Session,
    req: Request,
) -> Response<Body> {
    let query = req.uri().query().map(str::to_owned);
    let options = match kind {
        Session::PortForward => port_forward_ports(req.headers(), query.as_deref())
            .map(|ports| (StreamOptions::default(), ports)),
        _ => stream_options(query.as_deref()).map(|streams| (streams, Vec::new())),
    };
    let (streams, ports) = match options {
        Ok(options) => options,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let Some(pod) = server.api.pod_by_name(&ns, &pod_name).await else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    // upstream: `getPortForward` answers a UID that is not the pod's with `pod not found`;
    // exec and attach do not compare it (`findContainer` → `Pods.FindPod` looks the pod up by
    // its full name whenever it has one, and it always has).
    if let Session::PortForward = kind
        && let Some(uid) = uid.as_deref().filter(|u| !u.is_empty())
        && pod.metadata.uid.as_deref() != Some(uid)
    {
        return text(StatusCode::NOT_FOUND, "pod not found");
    }
    let url = match kind {
        Session::Exec { container } => {
            let cmd = query_values(query.as_deref(), "command");
            server.api.exec_url(&pod, &container, cmd, streams).await
        }
        Session::Attach { container } => server.api.attach_url(&pod, &container, streams).await,
        Session::PortForward => server.api.port_forward_url(&pod, ports).await,
    };
    let url = match url {
        Ok(url) => url,
        Err(e) => return stream_error(&e),
    };
    match proxy_upgrade(req, &url, server.proxy).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn exec(
    State(server): State<Server>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response<Body> {
    session(server, ns, pod, None, Session::Exec { container }, req).await
}

async fn exec_uid(
    State(server): State<Server>,
    Path((ns, pod, uid, container)): Path<(String, String, String, String)>,
    req: Request,
) -> Response<Body> {
    session(server, ns, pod, Some(uid), Session::Exec { container }, req).await
}

async fn attach(
    State(server): State<Server>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response<Body> {
    session(server, ns, pod, None, Session::Attach { container }, req).await
}

async fn attach_uid(
    State(server): State<Server>,
    Path((ns, pod, uid, container)): Path<(String, String, String, String)>,
    req: Request,
) -> Response<Body> {
    session(
        server,
        ns,
        pod,
        Some(uid),
        Session::Attach { container },
        req,
    )
    .await
}

async fn port_forward(
    State(server): State<Server>,
    Path((ns, pod)): Path<(String, String)>,
    req: Request,
) -> Response<Body> {
    session(server, ns, pod, None, Session::PortForward, req).await
}

async fn port_forward_uid(
    State(server): State<Server>,
    Path((ns, pod, uid)): Path<(String, String, String)>,
    req: Request,
) -> Response<Body> {
    session(server, ns, pod, Some(uid), Session::PortForward, req).await
}

/// upstream: `getRun`. The command is the `cmd` parameter split at spaces (upstream: "for
/// legacy reasons, run uses different query param than exec"); the answer is its output
/// (labelled JSON as upstream's `writeJSONResponse` does, though it is the command's bytes),
/// any failure a 500 with the error's text.
async fn run_command(
    server: Server,
    ns: String,
    pod_name: String,
    container: String,
    query: Option<String>,
) -> Response<Body> {
    let Some(pod) = server.api.pod_by_name(&ns, &pod_name).await else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let cmd_text = query_values(query.as_deref(), "cmd")
        .into_iter()
        .next()
        .unwrap_or_default();
    let cmd = cmd_text.split(' ').map(str::to_owned).collect();
    match server.api.run_in_container(&pod, &container, cmd).await {
        Ok(output) if output.is_empty() => Response::new(Body::empty()),
        Ok(output) => {
            let mut response = Response::new(Body::from(output));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn run(
    State(server): State<Server>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response<Body> {
    run_command(server, ns, pod, container, query).await
}

/// The `{uid}` form. Upstream's `RunInContainer` finds the pod by its full name and does not
/// compare the UID (`Pods.FindPod` looks a pod up by its name when it has one): neither
/// does this.
async fn run_uid(
    State(server): State<Server>,
    Path((ns, pod, _uid, container)): Path<(String, String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response<Body> {
    run_command(server, ns, pod, container, query).await
}

#[cfg(test)]
mod tests;
