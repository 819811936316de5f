//! The prober (upstream `pkg/kubelet/prober`; spec `pod-lifecycle.md` B1-B10): one task per
//! (pod, container, probe kind) for regular containers and sidecars (init containers with
//! `restartPolicy: Always`), results by container instance ID, and a
//! wake of the pod's worker whenever a result changes.
//!
//! ```text
//!   new container ID: result := initial (readiness Failure, liveness Success, startup none)
//!  waiting ──────────────────────────► probing ──run reaches its threshold──► result set
//!     ▲  no instance / not started        │  liveness Failure or startup result
//!     │                                   ▼
//!     └──────── new container ID ◄──── ON HOLD (until the container is replaced)
//! ```
//!
//! A changed readiness or startup result goes to the status manager at once
//! (`set_container_readiness`, `set_container_startup`: R15-R18) and wakes the pod's worker,
//! which acts on a liveness or startup failure.
//!
//! Probes run only on a runtime with processes ([`Runtime::runs_probes`]); exec goes through
//! [`Runtime::exec_sync`], HTTP GET and TCP connect go from the agent to the pod IP (or the
//! probe's host), and gRPC through the [`GrpcProber`] seam (a gRPC client is not this crate's:
//! `rustlet-cri` implements it), each under the probe's timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use rustlet_core::PodUid;
use rustlet_volume::events::{EventKind, EventRecorder};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::runtime::{InstanceState, Runtime};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Restarts the container on failure.
    Liveness,
    /// Gates the container's `ready`.
    Readiness,
    /// Gates `started`, and the other two until it succeeds.
    Startup,
}

impl ProbeKind {
    fn title(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }

    /// The container's probe of this kind.
    pub fn of(self, container: &Container) -> Option<&Probe> {
        match self {
            Self::Liveness => container.liveness_probe.as_ref(),
            Self::Readiness => container.readiness_probe.as_ref(),
            Self::Startup => container.startup_probe.as_ref(),
        }
    }

    /// All three.
    pub const ALL: [ProbeKind; 3] = [Self::Liveness, Self::Readiness, Self::Startup];
}

/// A probe's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// Passed (a warning counts as passed).
    Success,
    /// Failed.
    Failure,
}

/// Results by container instance ID and kind (upstream's results managers, B5).
#[derive(Debug, Default)]
pub struct ProbeResults {
    map: Mutex<HashMap<(String, ProbeKind), ProbeResult>>,
}

impl ProbeResults {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, ProbeKind), ProbeResult>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result for a container instance.
    pub fn get(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.lock().get(&(id.to_owned(), kind)).copied()
    }

    /// Sets a result; whether it changed.
    fn set(&self, id: &str, kind: ProbeKind, result: ProbeResult) -> bool {
        self.lock().insert((id.to_owned(), kind), result) != Some(result)
    }

    fn remove(&self, id: &str, kind: ProbeKind) {
        self.lock().remove(&(id.to_owned(), kind));
    }

    /// Forgets every result of these instances (the pod is gone).
    pub fn forget(&self, ids: &[String]) {
        self.lock().retain(|(id, _), _| !ids.contains(id));
    }
}

/// One series of upstream's `prober_probe_total`: a container's probe of one kind, by
/// result.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeSeries {
    /// `Liveness`, `Readiness` or `Startup` (upstream's `probe_type`).
    pub probe_type: &'static str,
    /// `successful` or `failed` (upstream's `result`; `unknown` is never counted: an errored
    /// probe is thrown away before the count, as upstream's `doProbe`).
    pub result: &'static str,
    /// The container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub pod_uid: String,
}

/// The probes run, by series (upstream: `ProberResults`, served on `/metrics/probes`). A
/// probe task's series go when the task ends, as upstream's worker deletes its labels.
#[derive(Debug, Default)]
pub struct ProbeCounts {
    map: Mutex<BTreeMap<ProbeSeries, u64>>,
}

impl ProbeCounts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<ProbeSeries, u64>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn inc(&self, series: ProbeSeries) {
        *self.lock().entry(series).or_insert(0) += 1;
    }

    fn forget(&self, probe_type: &str, container: &str, pod_uid: &str) {
        self.lock().retain(|s, _| {
            !(s.probe_type == probe_type && s.container == container && s.pod_uid == pod_uid)
        });
    }

    /// Every series with its count.
    pub fn snapshot(&self) -> Vec<(ProbeSeries, u64)> {
        self.lock().iter().map(|(s, n)| (s.clone(), *n)).collect()
    }
}

/// A probe's settings with the API's defaults (B1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10).
    pub period: Duration,
    /// `timeoutSeconds` (1).
    pub timeout: Duration,
    /// `successThreshold` (1).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

fn positive(v: Option<i32>, default: u32) -> u32 {
    v.and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

impl Timing {
    /// `probe`'s timing.
    pub fn of(probe: &Probe) -> Self {
        Self {
            initial_delay: Duration::from_secs(u64::from(
                probe
                    .initial_delay_seconds
                    .and_then(|v| u32::try_from(v).ok())
                    .unwrap_or(0),
            )),
            period: Duration::from_secs(u64::from(positive(probe.period_seconds, 10))),
            timeout: Duration::from_secs(u64::from(positive(probe.timeout_seconds, 1))),
            success_threshold: positive(probe.success_threshold, 1),
            failure_threshold: positive(probe.failure_threshold, 3),
        }
    }
}

/// One probe run: the result and the output (the failure's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Passed or failed.
    pub result: ProbeResult,
    /// What it printed, or why it failed.
    pub output: String,
    /// Passed with a warning (upstream's `probe.Warning`, a success to the results manager
    /// and a `ProbeWarning` event): an HTTP probe's redirect to another host, not followed.
    pub warning: bool,
}

impl Outcome {
    /// A failure, with why.
    pub fn failure(output: impl Into<String>) -> Self {
        Self {
            result: ProbeResult::Failure,
            output: output.into(),
            warning: false,
        }
    }

    /// A success, with what the check said.
    pub fn success(output: impl Into<String>) -> Self {
        Self {
            result: ProbeResult::Success,
            output: output.into(),
            warning: false,
        }
    }

    /// A success with a warning, saying what.
    pub fn warning(output: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::success(output)
        }
    }
}

/// The gRPC health check of a `grpc` probe (upstream `pkg/probe/grpc`'s `Prober`): one
/// `grpc.health.v1.Health/Check` of `service` at `host:port`, in plaintext, the whole of it
/// (connecting included) under `timeout`. Never an error: whatever goes wrong (no connection,
/// no health service, an RPC error, a status other than `SERVING`, the deadline) is a
/// [`ProbeResult::Failure`] whose output says why in upstream's words, as upstream's prober,
/// which mimics `grpc_health_probe`.
#[async_trait::async_trait]
pub trait GrpcProber: Send + Sync {
    /// Checks `service` (`""`: the server as a whole) at `host:port`.
    async fn probe(&self, host: &str, port: u16, service: &str, timeout: Duration) -> Outcome;
}

/// The port a probe names: a number, or a named port of the container.
fn port(container: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port number {n}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("couldn't find port {name:?} in the container")),
    }
}

/// Runs `probe` once against a running container instance (B8): exec through the runtime,
/// HTTP GET or TCP from here, gRPC through `grpc` (the pod IP, upstream's `runProbe`; without
/// a `grpc` prober a gRPC probe cannot run). `Err`: the probe itself could not run (retried,
/// B8).
pub async fn run_probe(
    runtime: &dyn Runtime,
    grpc: Option<&dyn GrpcProber>,
    probe: &Probe,
    container: &Container,
    instance_id: &str,
    pod_ip: &str,
) -> Result<Outcome, String> {
    let timeout = Timing::of(probe).timeout;
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match runtime.exec_sync(instance_id, &cmd, timeout).await {
            // A timeout is a failure, not an error (B8).
            Ok(out) if out.timed_out => Ok(Outcome::failure(format!(
                "command {cmd:?} timed out after {}s",
                timeout.as_secs()
            ))),
            Ok(out) if out.exit_code == 0 => Ok(Outcome::success(out.output)),
            Ok(out) => Ok(Outcome::failure(if out.output.is_empty() {
                format!("command {cmd:?} exited with {}", out.exit_code)
            } else {
                out.output
            })),
            Err(e) => Err(e.to_string()),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp.host.as_deref().unwrap_or(pod_ip);
        let port = port(container, &tcp.port)?;
        return Ok(
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await
            {
                Ok(Ok(_)) => Outcome::success(""),
                Ok(Err(e)) => Outcome::failure(format!("dial tcp {host}:{port}: {e}")),
                Err(_) => Outcome::failure(format!("dial tcp {host}:{port}: i/o timeout")),
            },
        );
    }
    if let Some(http) = &probe.http_get {
        let target = HttpTarget::of(http, container, pod_ip)?;
        let (host, port, path, scheme) = (&target.host, target.port, &target.path, target.scheme());
        let get = http_get_following_local_redirects(&target);
        return match tokio::time::timeout(timeout, get).await {
            Err(_) => Ok(Outcome::failure(format!(
                "Get \"{scheme}://{host}:{port}{path}\": context deadline exceeded"
            ))),
            Ok(Err(e)) => Ok(Outcome::failure(e)),
            // upstream: DoHTTPProbe returns a body read error as the probe's error.
            Ok(Ok((_, Err(e)))) => Err(format!("reading the response body: {e}")),
            Ok(Ok((code, Ok(body)))) if (200..300).contains(&code) => Ok(Outcome::success(
                String::from_utf8_lossy(&body).into_owned(),
            )),
            // upstream: a redirect to another host is not followed, and its answer passes
            // with a warning.
            Ok(Ok((code, Ok(body)))) if (300..400).contains(&code) => {
                Ok(Outcome::warning(format!(
                    "Probe terminated redirects, Response body: {}",
                    String::from_utf8_lossy(&body)
                )))
            }
            Ok(Ok((code, _))) => Ok(Outcome::failure(format!(
                "HTTP probe failed with statuscode: {code}"
            ))),
        };
    }
    if let Some(action) = &probe.grpc {
        // upstream: the pod IP, the action's port and service ("" when unset); `mode: TLS` is
        // behind the alpha gate GRPCContainerProbeTLS, off by default and not implemented
        // here, so the mode is ignored and the probe is plaintext, as upstream's by default.
        let port = u16::try_from(action.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port number {}", action.port))?;
        let Some(grpc) = grpc else {
            return Err("gRPC probes are not supported by this agent".into());
        };
        let service = action.service.as_deref().unwrap_or_default();
        return Ok(grpc.probe(pod_ip, port, service, timeout).await);
    }
    Err("the probe has no handler".into())
}

/// Where an `httpGet` action (of a probe or a lifecycle hook) goes: the action's host or the
/// pod's IP, its port (a number or a named port of the container), scheme, path and headers
/// (upstream: `NewRequestForHTTPGetAction`).
#[derive(Clone, Debug)]
pub(crate) struct HttpTarget {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) https: bool,
    pub(crate) path: String,
    pub(crate) headers: Vec<k8s_openapi::api::core::v1::HTTPHeader>,
}

impl HttpTarget {
    pub(crate) fn of(
        http: &k8s_openapi::api::core::v1::HTTPGetAction,
        container: &Container,
        pod_ip: &str,
    ) -> Result<Self, String> {
        let path = http.path.as_deref().unwrap_or("/");
        Ok(Self {
            host: http.host.as_deref().unwrap_or(pod_ip).to_owned(),
            port: port(container, &http.port)?,
            https: http
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https")),
            path: if path.starts_with('/') {
                path.to_owned()
            } else {
                format!("/{path}")
            },
            headers: http.http_headers.clone().unwrap_or_default(),
        })
    }

    pub(crate) fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// Where a redirect's `Location` leads from here: an absolute `http(s)` URL, or a path
    /// (absolute, or relative to this one's directory) on this host. `None`: neither.
    fn redirected(&self, location: &str) -> Option<Self> {
        if location.starts_with("http://") || location.starts_with("https://") {
            let uri: hyper::Uri = location.parse().ok()?;
            let https = uri.scheme_str() == Some("https");
            let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
            return Some(Self {
                host: host.to_owned(),
                port: uri.port_u16().unwrap_or(if https { 443 } else { 80 }),
                https,
                path: uri
                    .path_and_query()
                    .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
                headers: self.headers.clone(),
            });
        }
        if location.contains("://") {
            return None;
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = self.path.split('?').next().unwrap_or("/");
            let dir = &dir[..=dir.rfind('/').unwrap_or(0)];
            format!("{dir}{location}")
        };
        Some(Self {
            path,
            ..self.clone()
        })
    }
}

/// How many redirects a probe follows (Go's `http.Client`: "stopped after 10 redirects").
const MAX_REDIRECTS: usize = 10;

/// The body of a GET's answer, as much of it as was read.
type Body = Result<Vec<u8>, hyper::Error>;

/// A probe's GET of `target`, following redirects to the same host name (any port or path),
/// at most [`MAX_REDIRECTS`] (upstream: the HTTP prober's client with
/// `redirectChecker(followNonLocalRedirects=false)`: a redirect to another host ends with the
/// redirect's own answer). No timeout of its own.
async fn http_get_following_local_redirects(target: &HttpTarget) -> Result<(u16, Body), String> {
    let mut target = target.clone();
    let host = target.host.clone();
    for _ in 0..=MAX_REDIRECTS {
        let (code, location, body) = http_get(&target, "kube-probe/1.37", MAX_BODY).await?;
        let next = location
            .filter(|_| (300..400).contains(&code))
            .and_then(|location| target.redirected(&location))
            .filter(|next| next.host == host);
        match next {
            Some(next) => target = next,
            None => return Ok((code, body)),
        }
    }
    Err(format!(
        "Get \"{}://{}:{}{}\": stopped after {MAX_REDIRECTS} redirects",
        target.scheme(),
        target.host,
        target.port,
        target.path
    ))
}

/// One GET of `target` (no timeout of its own): the status code, the `Location` header and
/// the first `limit` bytes of the body. `Err`: no response.
pub(crate) async fn http_get(
    target: &HttpTarget,
    user_agent: &str,
    limit: usize,
) -> Result<(u16, Option<String>, Body), String> {
    let HttpTarget {
        host,
        port,
        https,
        path,
        headers,
    } = target;
    let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let (mut sender, _connection) = if *https {
        http1(tls_connect(host, stream).await?).await?
    } else {
        http1(stream).await?
    };
    let mut request = hyper::Request::get(path.as_str())
        .header("Host", format!("{host}:{port}"))
        .header("User-Agent", user_agent)
        .header("Accept", "*/*");
    for h in headers {
        request = request.header(h.name.as_str(), h.value.as_str());
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let location = response
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_owned);
    // The connection (`_connection`) is dropped with whatever the body still holds.
    Ok((
        code,
        location,
        read_at_most(response.into_body(), limit).await,
    ))
}

/// Told of every change of a result: the container instance's ID, the kind, the new result
/// (upstream's results-manager updates, B5/B6).
pub(crate) type OnChange = Arc<dyn Fn(&str, ProbeKind, ProbeResult) + Send + Sync>;

/// How much of an HTTP probe's body is read (upstream: `maxRespBodyLength`, 10 KiB).
const MAX_BODY: usize = 10 * 1024;

/// The first `limit` bytes of `body`; the rest is never read (upstream: `ReadAtMost`, whose
/// `ErrLimitReached` the HTTP prober takes as a truncated body, not an error).
async fn read_at_most(
    mut body: hyper::body::Incoming,
    limit: usize,
) -> Result<Vec<u8>, hyper::Error> {
    let mut read = Vec::new();
    while read.len() < limit {
        let Some(frame) = body.frame().await.transpose()? else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            let take = data.len().min(limit - read.len());
            read.extend_from_slice(&data[..take]);
        }
    }
    Ok(read)
}

/// Aborts the connection's driver task when dropped, closing the socket even when the
/// response body was not read to its end.
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An HTTP/1.1 client connection over `io`: its driver runs as a task, aborted when the
/// returned [`Connection`] is dropped.
async fn http1<S>(
    io: S,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        Connection,
    ),
    String,
>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            debug!(error = %e, "HTTP probe connection ended");
        }
    });
    Ok((sender, Connection(driver)))
}

/// Upstream's HTTPS probes skip certificate verification (`InsecureSkipVerify`): the
/// handshake's signatures are still checked against the presented key, the chain and the name
/// are not.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client session over `stream` for an HTTPS probe.
async fn tls_connect(
    host: &str,
    stream: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("server name {host:?}: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS handshake with {host}: {e}"))
}

/// What a probe task is given.
pub(crate) struct ProbeTask {
    pub kind: ProbeKind,
    pub pod: Arc<Pod>,
    pub uid: PodUid,
    pub container: Container,
    pub runtime: Arc<dyn Runtime>,
    /// The gRPC health check (`None`: gRPC probes error).
    pub grpc: Option<Arc<dyn GrpcProber>>,
    pub results: Arc<ProbeResults>,
    /// `prober_probe_total`.
    pub counts: Arc<ProbeCounts>,
    pub events: Arc<dyn EventRecorder>,
    /// Called when a result changes.
    pub on_change: OnChange,
    pub cancel: CancellationToken,
    /// Probes at once and starts the period again (B3's manual trigger, B10).
    pub trigger: Arc<tokio::sync::Notify>,
    /// B11: an instance that started before this (the agent's start less 10 s) was adopted:
    /// no initial readiness Failure is seeded for it.
    pub adopted_before: Timestamp,
}

/// Seconds since `started_at` on the wall clock (whole seconds, as upstream compares them).
fn seconds_since(started_at: Timestamp) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    u64::try_from(now - started_at.as_second()).unwrap_or(0)
}

impl ProbeTask {
    /// The probe loop (B3, B4) until cancelled or the container will not run again.
    pub async fn run(self) {
        let Some(probe) = self.kind.of(&self.container).cloned() else {
            return;
        };
        let timing = Timing::of(&probe);
        let mut tick = tokio::time::interval(timing.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut current: Option<String> = None;
        let mut on_hold = false;
        let (mut last, mut run) = (None::<ProbeResult>, 0_u32);
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => break,
                _ = tick.tick() => {}
                () = self.trigger.notified() => tick.reset(),
            }
            let status = self.runtime.pod_status(&self.uid).await;
            let Some(instance) = status.instances(&self.container.name).0.cloned() else {
                continue;
            };
            // B4.4: a new instance starts from the initial result.
            if current.as_deref() != Some(instance.id.as_str()) {
                if let Some(old) = current.take() {
                    self.results.remove(&old, self.kind);
                }
                current = Some(instance.id.clone());
                on_hold = false;
                (last, run) = (None, 0);
                let adopted = matches!(instance.state, InstanceState::Running { started_at } if started_at < self.adopted_before);
                let initial = match self.kind {
                    ProbeKind::Readiness if adopted => None,
                    ProbeKind::Readiness => Some(ProbeResult::Failure),
                    ProbeKind::Liveness => Some(ProbeResult::Success),
                    ProbeKind::Startup => None,
                };
                if let Some(initial) = initial {
                    self.set(&instance.id, initial);
                }
            }
            if on_hold {
                continue;
            }
            let started_at = match &instance.state {
                InstanceState::Running { started_at } => *started_at,
                InstanceState::Exited { .. } | InstanceState::Created | InstanceState::Unknown => {
                    // B4.6: not running is a failure (readiness shows it at once).
                    if self.kind == ProbeKind::Readiness {
                        self.set(&instance.id, ProbeResult::Failure);
                    }
                    continue;
                }
            };
            // B4.8.
            if seconds_since(started_at) < timing.initial_delay.as_secs() {
                continue;
            }
            // B4.9: until the startup probe passed, only it runs; afterwards it does not.
            let started = self.container.startup_probe.is_none()
                || self.results.get(&instance.id, ProbeKind::Startup) == Some(ProbeResult::Success);
            if (self.kind == ProbeKind::Startup) == started {
                continue;
            }
            let pod_ip = status
                .sandbox
                .as_ref()
                .and_then(|s| s.ip.clone())
                .unwrap_or_default();
            // B8: up to three attempts while the probe errors; an error changes nothing.
            let mut outcome = Err(String::new());
            for _ in 0..3 {
                outcome = run_probe(
                    self.runtime.as_ref(),
                    self.grpc.as_deref(),
                    &probe,
                    &self.container,
                    &instance.id,
                    &pod_ip,
                )
                .await;
                if outcome.is_ok() {
                    break;
                }
            }
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => {
                    debug!(container = %self.container.name, kind = ?self.kind, error = %e, "probe errored");
                    self.event(&format!(
                        "{} probe errored and resulted in unknown state: {e}",
                        self.kind.title()
                    ));
                    continue;
                }
            };
            self.count(outcome.result);
            if outcome.warning {
                self.events.event(
                    &self.pod,
                    EventKind::Warning,
                    "ProbeWarning",
                    &format!(
                        "{} probe warning: {}",
                        self.kind.title(),
                        outcome.output.trim_end()
                    ),
                );
            }
            if outcome.result == ProbeResult::Failure {
                self.event(&format!(
                    "{} probe failed: {}",
                    self.kind.title(),
                    outcome.output.trim_end()
                ));
            }
            // B4.11.
            run = if last == Some(outcome.result) {
                run + 1
            } else {
                1
            };
            last = Some(outcome.result);
            let threshold = match outcome.result {
                ProbeResult::Failure => timing.failure_threshold,
                ProbeResult::Success => timing.success_threshold,
            };
            if run < threshold {
                continue;
            }
            self.set(&instance.id, outcome.result);
            // B4.13: a liveness failure or a startup result holds until a new instance.
            if (self.kind == ProbeKind::Liveness && outcome.result == ProbeResult::Failure)
                || self.kind == ProbeKind::Startup
            {
                on_hold = true;
                run = 0;
            }
        }
        if let Some(id) = current {
            self.results.remove(&id, self.kind);
        }
        self.counts
            .forget(self.kind.title(), &self.container.name, self.uid.as_str());
    }

    /// upstream: `doProbe`'s `ProberResults.With(...).Inc()` after each probe that did not
    /// error.
    fn count(&self, result: ProbeResult) {
        self.counts.inc(ProbeSeries {
            probe_type: self.kind.title(),
            result: match result {
                ProbeResult::Success => "successful",
                ProbeResult::Failure => "failed",
            },
            container: self.container.name.clone(),
            pod: self.pod.metadata.name.clone().unwrap_or_default(),
            namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
            pod_uid: self.uid.as_str().to_owned(),
        });
    }

    fn set(&self, id: &str, result: ProbeResult) {
        if self.results.set(id, self.kind, result) {
            debug!(container = %self.container.name, kind = ?self.kind, ?result, "probe result changed");
            (self.on_change)(id, self.kind, result);
        }
    }

    fn event(&self, message: &str) {
        self.events
            .event(&self.pod, EventKind::Warning, "Unhealthy", message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerKind, ExecOutput, RuntimeError, RuntimePodStatus, Sandbox};
    use crate::simulated::{SimulatedConfig, SimulatedRuntime};
    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ExecAction, PodSpec};
    use rustlet_volume::subpath::ContainerMount;
    use rustlet_volume::testing::FakeRecorder;
    use std::collections::VecDeque;
    use tokio::time::Instant;

    /// The simulated runtime with exec results scripted in order (then exit 0), counting execs.
    struct Scripted {
        inner: SimulatedRuntime,
        exits: Mutex<VecDeque<i32>>,
        execs: Mutex<u32>,
    }

    #[async_trait]
    impl Runtime for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError> {
            self.inner.run_pod_sandbox(pod).await
        }
        async fn start_container(
            &self,
            pod: &Pod,
            container: &Container,
            kind: ContainerKind,
            mounts: &[ContainerMount],
        ) -> Result<(), RuntimeError> {
            self.inner
                .start_container(pod, container, kind, mounts)
                .await
        }
        async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus {
            self.inner.pod_status(uid).await
        }
        async fn kill_pod(&self, pod: &Pod, grace: Duration) -> Result<(), RuntimeError> {
            self.inner.kill_pod(pod, grace).await
        }
        async fn remove_pod(&self, uid: &PodUid) {
            self.inner.remove_pod(uid).await;
        }
        fn next_change(&self, uid: &PodUid) -> Option<Instant> {
            self.inner.next_change(uid)
        }
        fn runs_probes(&self) -> bool {
            true
        }
        async fn exec_sync(
            &self,
            _id: &str,
            _cmd: &[String],
            _timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            *self.execs.lock().unwrap() += 1;
            let exit_code = self.exits.lock().unwrap().pop_front().unwrap_or(0);
            Ok(ExecOutput {
                exit_code,
                output: format!("exit {exit_code}"),
                stderr: String::new(),
                timed_out: false,
            })
        }
    }

    /// A running pod whose container has `probe` as `kind`, and the probe task over it.
    async fn probed(kind: ProbeKind, probe: Probe, exits: &[i32]) -> Probed {
        probed_with(kind, probe, exits, None).await
    }

    /// [`probed`] with a gRPC prober.
    async fn probed_with(
        kind: ProbeKind,
        probe: Probe,
        exits: &[i32],
        grpc: Option<Arc<dyn GrpcProber>>,
    ) -> Probed {
        let mut container = Container {
            name: "c".into(),
            ..Default::default()
        };
        match kind {
            ProbeKind::Liveness => container.liveness_probe = Some(probe),
            ProbeKind::Readiness => container.readiness_probe = Some(probe),
            ProbeKind::Startup => container.startup_probe = Some(probe),
        }
        let pod = Arc::new(Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("uid-p".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container.clone()],
                ..Default::default()
            }),
            ..Default::default()
        });
        let runtime = Arc::new(Scripted {
            inner: SimulatedRuntime::new(SimulatedConfig::default()),
            exits: Mutex::new(exits.iter().copied().collect()),
            execs: Mutex::new(0),
        });
        runtime.run_pod_sandbox(&pod).await.unwrap();
        runtime
            .start_container(&pod, &container, ContainerKind::Regular, &[])
            .await
            .unwrap();
        let uid = PodUid::of(&pod);
        let id = runtime.pod_status(&uid).await.containers[0].id.clone();
        let (results, events) = (
            Arc::new(ProbeResults::default()),
            Arc::new(FakeRecorder::default()),
        );
        let counts = Arc::new(ProbeCounts::default());
        let cancel = CancellationToken::new();
        let changes = Arc::new(Mutex::new(Vec::new()));
        let task = ProbeTask {
            kind,
            pod,
            uid,
            container,
            runtime: runtime.clone(),
            grpc,
            results: results.clone(),
            counts: counts.clone(),
            events: events.clone(),
            on_change: {
                let changes = changes.clone();
                Arc::new(move |id: &str, kind: ProbeKind, result: ProbeResult| {
                    changes.lock().unwrap().push((id.to_owned(), kind, result));
                })
            },
            cancel: cancel.clone(),
            adopted_before: Timestamp::UNIX_EPOCH,
            trigger: Arc::new(tokio::sync::Notify::new()),
        };
        let done = tokio::spawn(task.run());
        Probed {
            runtime,
            results,
            counts,
            done,
            events,
            id,
            cancel,
            changes,
        }
    }

    type Changes = Arc<Mutex<Vec<(String, ProbeKind, ProbeResult)>>>;

    struct Probed {
        runtime: Arc<Scripted>,
        results: Arc<ProbeResults>,
        counts: Arc<ProbeCounts>,
        done: tokio::task::JoinHandle<()>,
        events: Arc<FakeRecorder>,
        id: String,
        cancel: CancellationToken,
        changes: Changes,
    }

    fn exec_probe(period: i32, success: i32, failure: i32) -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(period),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn b4_readiness_needs_its_success_threshold_and_failure_threshold_in_a_row() {
        let start = Instant::now();
        let period = Duration::from_secs(10);
        // S S | F F S | F F F
        let Probed {
            runtime,
            results,
            events,
            id,
            cancel,
            changes,
            ..
        } = probed(
            ProbeKind::Readiness,
            exec_probe(10, 2, 3),
            &[0, 0, 1, 1, 0, 1, 1, 1],
        )
        .await;
        let at = |n: u32| start + period * n + Duration::from_millis(1);
        let result = || results.get(&id, ProbeKind::Readiness);
        tokio::time::sleep_until(at(0)).await;
        assert_eq!(
            result(),
            Some(ProbeResult::Failure),
            "initial Failure, one success"
        );
        tokio::time::sleep_until(at(1)).await;
        assert_eq!(
            result(),
            Some(ProbeResult::Success),
            "two successes in a row"
        );
        for n in 2..=4 {
            tokio::time::sleep_until(at(n)).await;
            assert_eq!(
                result(),
                Some(ProbeResult::Success),
                "tick {n}: below the failure threshold"
            );
        }
        for n in 5..=6 {
            tokio::time::sleep_until(at(n)).await;
            assert_eq!(result(), Some(ProbeResult::Success), "tick {n}");
        }
        tokio::time::sleep_until(at(7)).await;
        assert_eq!(
            result(),
            Some(ProbeResult::Failure),
            "three failures in a row"
        );
        // One exec per period, no more (no spin); each failed run is an Unhealthy event.
        assert_eq!(*runtime.execs.lock().unwrap(), 8);
        // Each change of the result was told once, nothing else.
        let told: Vec<ProbeResult> = changes.lock().unwrap().iter().map(|c| c.2).collect();
        assert_eq!(
            told,
            [
                ProbeResult::Failure,
                ProbeResult::Success,
                ProbeResult::Failure
            ]
        );
        let unhealthy = events
            .events()
            .iter()
            .filter(|e| e.1 == "Unhealthy")
            .count();
        assert_eq!(unhealthy, 5);
        assert!(
            events.events()[0]
                .2
                .starts_with("Readiness probe failed: exit 1")
        );
        // Cancelled: it stops probing and forgets its result.
        cancel.cancel();
        tokio::time::sleep_until(at(9)).await;
        assert_eq!(*runtime.execs.lock().unwrap(), 8);
        assert_eq!(result(), None);
    }

    /// upstream's `prober_probe_total`: each probe run counts once under its type and result
    /// with the container's and pod's labels; the series go when the probe task ends.
    #[tokio::test(start_paused = true)]
    async fn prober_probe_total_counts_each_probe_by_result() {
        let start = Instant::now();
        let Probed {
            counts,
            cancel,
            done,
            ..
        } = probed(ProbeKind::Readiness, exec_probe(10, 1, 1), &[0, 1, 0]).await;
        tokio::time::sleep_until(start + Duration::from_secs(20) + Duration::from_millis(1)).await;
        let series = |result: &'static str| ProbeSeries {
            probe_type: "Readiness",
            result,
            container: "c".into(),
            pod: "p".into(),
            namespace: "default".into(),
            pod_uid: "uid-p".into(),
        };
        assert_eq!(
            counts.snapshot(),
            vec![(series("failed"), 1), (series("successful"), 2)]
        );
        cancel.cancel();
        done.await.unwrap();
        assert_eq!(counts.snapshot(), Vec::new());
    }

    #[tokio::test(start_paused = true)]
    async fn b4_a_liveness_failure_holds_until_the_container_is_replaced() {
        let start = Instant::now();
        let period = Duration::from_secs(1);
        let Probed {
            runtime,
            results,
            id,
            ..
        } = probed(ProbeKind::Liveness, exec_probe(1, 1, 2), &[1, 1, 1, 1]).await;
        let at = |n: u32| start + period * n + Duration::from_millis(1);
        tokio::time::sleep_until(at(0)).await;
        assert_eq!(
            results.get(&id, ProbeKind::Liveness),
            Some(ProbeResult::Success),
            "initial Success, one failure is below the threshold"
        );
        tokio::time::sleep_until(at(1)).await;
        assert_eq!(
            results.get(&id, ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
        // On hold: no more execs for this instance.
        tokio::time::sleep_until(at(5)).await;
        assert_eq!(*runtime.execs.lock().unwrap(), 2);
    }

    /// Serves one canned HTTP answer per connection on loopback (TLS with the test
    /// certificate when `tls`); returns the port.
    async fn http_server(status: u16, tls: bool) -> u16 {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tls.then(|| {
            let cert = CertificateDer::from_pem_slice(include_bytes!("../testdata/probe-cert.pem"))
                .unwrap();
            let key =
                PrivateKeyDer::from_pem_slice(include_bytes!("../testdata/probe-key.pem")).unwrap();
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
                    );
                    async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
                        mut s: S,
                        answer: String,
                    ) {
                        let mut seen = Vec::new();
                        let mut buf = [0_u8; 1024];
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        let _ = s.write_all(answer.as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    match acceptor {
                        Some(a) => {
                            if let Ok(tls) = a.accept(stream).await {
                                serve(tls, answer).await;
                            }
                        }
                        None => serve(stream, answer).await,
                    }
                });
            }
        });
        port
    }

    fn http_probe(port: u16, scheme: &str) -> Probe {
        Probe {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                port: IntOrString::Int(i32::from(port)),
                path: Some("/healthz".into()),
                scheme: Some(scheme.into()),
                ..Default::default()
            }),
            // The TLS client to the plain server waits for an answer that never comes.
            timeout_seconds: Some(1),
            ..Default::default()
        }
    }

    /// A loopback HTTP server answering by path: `/local` redirects to `/fail` (503), `/ok`
    /// answers 200, `/to-ok` redirects to `/ok` by an absolute URL of the same host on another
    /// port spelling, `/away` redirects to another host (with agnhost's body), `/loop` to
    /// itself.
    async fn redirecting_server() -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0_u8; 1024];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let request = String::from_utf8_lossy(&seen).into_owned();
                    let path = request.split(' ').nth(1).unwrap_or("/").to_owned();
                    let (status, location, body) = match path.as_str() {
                        "/local" => ("302 Found", Some("/fail".to_owned()), String::new()),
                        "/to-ok" => (
                            "302 Found",
                            Some(format!("http://127.0.0.1:{port}/ok")),
                            String::new(),
                        ),
                        "/ok" => ("200 OK", None, "fine".to_owned()),
                        "/away" => (
                            "302 Found",
                            Some("http://0.0.0.0/".to_owned()),
                            "<a href=\"http://0.0.0.0/\">Found</a>.".to_owned(),
                        ),
                        "/loop" => ("302 Found", Some("/loop".to_owned()), String::new()),
                        _ => ("503 Service Unavailable", None, String::new()),
                    };
                    let location = location
                        .map(|l| format!("Location: {l}\r\n"))
                        .unwrap_or_default();
                    let answer = format!(
                        "HTTP/1.1 {status}\r\n{location}Content-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        port
    }

    /// upstream `TestHTTPProbeChecker`'s redirect cases (`DoHTTPProbe` with
    /// `followNonLocalRedirects=false`): a redirect to the same host is followed (to a failure
    /// or a success), one to another host passes with a warning and the redirect's body, and
    /// the eleventh redirect is a failure.
    #[tokio::test]
    async fn http_probe_follows_local_redirects_and_warns_on_non_local_ones() {
        let port = redirecting_server().await;
        let runtime = SimulatedRuntime::new(SimulatedConfig::default());
        let c = Container::default();
        let probe = |path: &str| {
            let mut p = http_probe(port, "HTTP");
            p.http_get.as_mut().unwrap().path = Some(path.into());
            p.timeout_seconds = Some(10);
            let (runtime, c) = (&runtime, &c);
            async move {
                run_probe(runtime, None, &p, c, "sim://x", "127.0.0.1")
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            probe("/local").await,
            Outcome::failure("HTTP probe failed with statuscode: 503")
        );
        assert_eq!(probe("/to-ok").await, Outcome::success("fine"));
        assert_eq!(
            probe("/away").await,
            Outcome::warning(
                "Probe terminated redirects, Response body: <a href=\"http://0.0.0.0/\">Found</a>."
            )
        );
        let looping = probe("/loop").await;
        assert_eq!(looping.result, ProbeResult::Failure);
        assert!(
            looping.output.ends_with("stopped after 10 redirects"),
            "{}",
            looping.output
        );
    }

    #[tokio::test]
    async fn b8_http_https_and_tcp_probes_against_loopback_servers() {
        let runtime = SimulatedRuntime::new(SimulatedConfig::default());
        let c = Container::default();
        let probe = |p: Probe| {
            let (runtime, c) = (&runtime, &c);
            async move {
                run_probe(runtime, None, &p, c, "sim://x", "127.0.0.1")
                    .await
                    .unwrap()
            }
        };
        let ok = http_server(200, false).await;
        assert_eq!(
            probe(http_probe(ok, "HTTP")).await,
            Outcome::success("hello")
        );
        let failing = http_server(503, false).await;
        assert_eq!(
            probe(http_probe(failing, "HTTP")).await,
            Outcome::failure("HTTP probe failed with statuscode: 503")
        );
        // HTTPS with a self-signed certificate: not verified, as upstream's.
        let tls = http_server(204, true).await;
        assert_eq!(
            probe(http_probe(tls, "HTTPS")).await.result,
            ProbeResult::Success
        );
        // Plain HTTP to the TLS server fails, TLS to the plain one too.
        assert_eq!(
            probe(http_probe(tls, "HTTP")).await.result,
            ProbeResult::Failure
        );
        assert_eq!(
            probe(http_probe(ok, "HTTPS")).await.result,
            ProbeResult::Failure
        );

        let tcp = |port: u16| Probe {
            tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
                port: IntOrString::Int(i32::from(port)),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(probe(tcp(ok)).await.result, ProbeResult::Success);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let refused = probe(tcp(closed)).await;
        assert_eq!(refused.result, ProbeResult::Failure);
        assert!(
            refused.output.starts_with("dial tcp 127.0.0.1:"),
            "{}",
            refused.output
        );
    }

    /// Item 15 (upstream: `DoHTTPProbe`, `ReadAtMost`): a body that never ends is read up to
    /// 10 KiB, the probe succeeds on its status code, and the connection is dropped. The
    /// server's send buffer is small, so what it manages to write is what the probe took plus
    /// the sockets' buffers: far below a megabyte, where reading the whole body never ends.
    #[tokio::test]
    async fn http_probe_reads_at_most_10_kib_of_an_endless_body() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4096).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (written_tx, written_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0_u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            // No length: the body runs until the connection closes, which it never does.
            s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let chunk = [b'x'; 1024];
            let mut written = 0_usize;
            while let Ok(n) = s.write(&chunk).await {
                if n == 0 {
                    break;
                }
                written += n;
            }
            let _ = written_tx.send(written);
        });
        let mut probe = http_probe(port, "HTTP");
        // Long enough that reading the whole body is a timeout, not a success.
        probe.timeout_seconds = Some(30);
        let runtime = SimulatedRuntime::new(SimulatedConfig::default());
        let outcome = run_probe(
            &runtime,
            None,
            &probe,
            &Container::default(),
            "sim://x",
            "127.0.0.1",
        )
        .await
        .unwrap();
        assert_eq!(outcome.result, ProbeResult::Success, "{}", outcome.output);
        assert_eq!(outcome.output, "x".repeat(10 * 1024));
        let written = written_rx.await.unwrap();
        assert!(written < 1024 * 1024, "the server wrote {written} bytes");
    }

    #[test]
    fn b1_probe_defaults_are_the_apis() {
        let t = Timing::of(&Probe::default());
        assert_eq!(
            t,
            Timing {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
        let t = Timing::of(&Probe {
            period_seconds: Some(0),
            failure_threshold: Some(-1),
            initial_delay_seconds: Some(5),
            ..Default::default()
        });
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.failure_threshold, 3);
        assert_eq!(t.initial_delay, Duration::from_secs(5));
    }

    #[test]
    fn named_ports_come_from_the_container() {
        let c = Container {
            ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(port(&c, &IntOrString::String("http".into())), Ok(8080));
        assert!(port(&c, &IntOrString::String("nope".into())).is_err());
        assert_eq!(port(&c, &IntOrString::Int(80)), Ok(80));
        assert!(port(&c, &IntOrString::Int(0)).is_err());
        assert!(port(&c, &IntOrString::Int(70000)).is_err());
    }

    /// A gRPC prober that records each check and answers from a script (then `SERVING`).
    #[derive(Default)]
    struct ScriptedGrpc {
        answers: Mutex<VecDeque<Outcome>>,
        checks: Mutex<Vec<(String, u16, String, Duration)>>,
    }

    #[async_trait]
    impl GrpcProber for ScriptedGrpc {
        async fn probe(&self, host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
            self.checks
                .lock()
                .unwrap()
                .push((host.to_owned(), port, service.to_owned(), timeout));
            self.answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Outcome::success("service healthy"))
        }
    }

    fn grpc_probe(port: i32, service: Option<&str>) -> Probe {
        Probe {
            grpc: Some(k8s_openapi::api::core::v1::GRPCAction {
                port,
                service: service.map(str::to_owned),
                ..Default::default()
            }),
            timeout_seconds: Some(5),
            ..Default::default()
        }
    }

    /// upstream `runProbe`'s gRPC case: the pod IP, the action's port, its service or "", the
    /// probe's timeout; the check's outcome is the probe's. Without a gRPC prober, or with a
    /// port out of range, the probe errors (it could not run) instead of failing.
    #[tokio::test(start_paused = true)]
    async fn run_probe_grpc_checks_the_pod_ip_port_and_service_under_the_timeout() {
        let runtime = SimulatedRuntime::new(SimulatedConfig::default());
        let grpc = ScriptedGrpc::default();
        grpc.answers.lock().unwrap().extend([
            Outcome::success("service healthy"),
            Outcome::failure("service unhealthy (responded with \"NOT_SERVING\")"),
        ]);
        let c = Container::default();
        let run = async |probe: Probe, grpc: Option<&ScriptedGrpc>| {
            let grpc = grpc.map(|g| g as &dyn GrpcProber);
            run_probe(&runtime, grpc, &probe, &c, "sim://x", "10.88.0.7").await
        };
        let grpc = &grpc;
        assert_eq!(
            run(grpc_probe(5000, None), Some(grpc)).await,
            Ok(Outcome::success("service healthy"))
        );
        assert_eq!(
            run(grpc_probe(2333, Some("liveness")), Some(grpc)).await,
            Ok(Outcome::failure(
                "service unhealthy (responded with \"NOT_SERVING\")"
            ))
        );
        assert_eq!(
            *grpc.checks.lock().unwrap(),
            [
                (
                    "10.88.0.7".into(),
                    5000,
                    String::new(),
                    Duration::from_secs(5)
                ),
                (
                    "10.88.0.7".into(),
                    2333,
                    "liveness".into(),
                    Duration::from_secs(5)
                ),
            ]
        );
        assert_eq!(
            run(grpc_probe(5000, None), None).await,
            Err("gRPC probes are not supported by this agent".into())
        );
        for bad in [0, -1, 65536] {
            assert_eq!(
                run(grpc_probe(bad, None), Some(grpc)).await,
                Err(format!("invalid port number {bad}"))
            );
        }
        assert_eq!(
            grpc.checks.lock().unwrap().len(),
            2,
            "no check of a bad port"
        );
    }

    /// upstream "should be restarted with a GRPC liveness probe": a gRPC liveness check that
    /// fails sets the liveness result to Failure (the worker then restarts the container) and
    /// is an `Unhealthy` event with the check's message.
    #[tokio::test(start_paused = true)]
    async fn a_failing_grpc_liveness_probe_sets_liveness_failure_with_an_unhealthy_event() {
        let start = Instant::now();
        let grpc = Arc::new(ScriptedGrpc::default());
        grpc.answers.lock().unwrap().extend([
            Outcome::success("service healthy"),
            Outcome::failure("service unhealthy (responded with \"NOT_SERVING\")"),
        ]);
        let mut probe = grpc_probe(5000, None);
        probe.period_seconds = Some(1);
        probe.failure_threshold = Some(1);
        let Probed {
            results,
            events,
            id,
            changes,
            ..
        } = probed_with(ProbeKind::Liveness, probe, &[], Some(grpc.clone())).await;
        let at = |n: u32| start + Duration::from_secs(u64::from(n)) + Duration::from_millis(1);
        tokio::time::sleep_until(at(0)).await;
        assert_eq!(
            results.get(&id, ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        tokio::time::sleep_until(at(1)).await;
        assert_eq!(
            results.get(&id, ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(
            changes.lock().unwrap().last().map(|c| c.2),
            Some(ProbeResult::Failure)
        );
        let unhealthy: Vec<String> = events
            .events()
            .iter()
            .filter(|e| e.1 == "Unhealthy")
            .map(|e| e.2.clone())
            .collect();
        assert_eq!(
            unhealthy,
            ["Liveness probe failed: service unhealthy (responded with \"NOT_SERVING\")"]
        );
        // The check went to the sandbox's IP.
        let checks = grpc.checks.lock().unwrap().clone();
        assert_eq!(checks.len(), 2, "on hold after the failure: {checks:?}");
        assert!(checks.iter().all(|c| !c.0.is_empty() && c.1 == 5000));
    }
}
