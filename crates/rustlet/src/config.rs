//! The command line and the configuration file, resolved into one [`AgentConfig`]. Flags win
//! over the file; every bad value is one clear error naming it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::Taint;
use rustlet_core::node_status::{EvictionThresholds, Threshold};
use rustlet_server::auth::{
    AnonymousAuthentication, AuthorizationMode, KubeletAuthentication, KubeletAuthorization,
    WebhookAuthentication, WebhookAuthorization, X509Authentication,
};
use rustlet_server::logs::rotation::{ContainerLogManagerConfig, LogRotatePolicy};
use serde::Deserialize;

/// rustlet: a Kubernetes node agent (status and volume managers of the kubelet, in Rust).
///
/// Local mode (`--local DIR`) needs no cluster: pods written as manifests into DIR run on this
/// node. Kube mode (`--kubeconfig FILE`, or the in-cluster service account) runs the pods the
/// API server binds to `--node-name`.
#[derive(Debug, Parser)]
#[command(name = "rustlet", version)]
pub struct Cli {
    /// This node's name (pods with `spec.nodeName` equal to it run here).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// The agent's state directory: `pods/<uid>/volumes/...` and `plugins/` (the kubelet's
    /// layout). Created if absent; one agent per directory.
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// Local mode: no cluster; the manifests in DIR (YAML, several documents a file, or JSON)
    /// are the API. A removed manifest deletes its pod gracefully.
    #[arg(long, value_name = "DIR", conflicts_with = "kubeconfig")]
    pub local: Option<PathBuf>,
    /// Kube mode: the cluster this kubeconfig points at.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the read-only HTTP endpoints (/healthz, /pods, /metrics).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// The read-only HTTP endpoints' port (the kubelet's flag): wins over --listen's port; 0
    /// turns the endpoints off.
    #[arg(long, value_name = "PORT")]
    pub read_only_port: Option<u16>,
    /// A YAML file with these settings (flags win) and the tunables.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The container runtime. `simulated`: real volumes and statuses, no processes. `cri`: real
    /// containers on a CRI runtime (containerd) at --container-runtime-endpoint.
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeKind>,
    /// With --runtime cri: the runtime's socket (default
    /// unix:///run/containerd/containerd.sock).
    #[arg(long, value_name = "unix:///PATH")]
    pub container_runtime_endpoint: Option<String>,
    /// Log format on stderr.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// The node's address: `status.addresses` InternalIP, the pods' hostIP (the kubelet's
    /// flag; config key `nodeIP`; default 127.0.0.1).
    #[arg(long, value_name = "IP")]
    pub node_ip: Option<String>,
    /// Labels to add when registering the Node (`key=value,...`, the kubelet's flag). Labels in
    /// the `kubernetes.io` and `k8s.io` namespaces the NodeRestriction admission plugin would
    /// refuse are refused at start.
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub node_labels: Option<String>,
    /// Taints to register the Node with (`key=value:Effect,...`, the kubelet's flag; config key
    /// `registerWithTaints`).
    #[arg(long, value_name = "KEY=VALUE:EFFECT,...")]
    pub register_with_taints: Option<String>,
    /// The kubelet port the Node reports in `daemonEndpoints.kubeletEndpoint.port` (the
    /// kubelet's flag; config key `port`; default 10250).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Static pods: one pod per manifest file in DIR, run on this node whatever the API says
    /// (as the kubelet's); in kube mode each gets a mirror pod in the API that carries its status.
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<PathBuf>,
    /// The kubelet server (HTTPS on --address:--port: `kubectl logs`, `exec`, `attach`,
    /// `port-forward`), as the kubelet's `--enable-server`: on by default in kube mode; in
    /// local mode on only with --client-ca-file (client certificates only).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_server: Option<bool>,
    /// The kubelet server's address (the kubelet's flag; config key `address`; default
    /// 0.0.0.0).
    #[arg(long, value_name = "IP")]
    pub address: Option<IpAddr>,
    /// The kubelet server's certificate (then its intermediates); without it and
    /// --tls-private-key-file, a self-signed pair under `<root>/pki` is generated and reused.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Client certificates signed by these CAs authenticate to the kubelet server as their CN,
    /// in the groups of their O values (config key `authentication.x509.clientCAFile`).
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// The healthz endpoint's port (plain HTTP, `/healthz` only; the kubelet's flag; config key
    /// `healthzPort`; default 10248; 0 turns it off).
    #[arg(long, value_name = "PORT")]
    pub healthz_port: Option<u16>,
    /// The healthz endpoint's address (the kubelet's flag; config key `healthzBindAddress`;
    /// default 127.0.0.1).
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<IpAddr>,
}

/// `--runtime`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// No processes: containers run in name only (like kwok).
    #[default]
    Simulated,
    /// Real containers through the CRI (containerd).
    Cri,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The configuration file (`--config`): the flags' settings and the tunables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    node_name: Option<String>,
    root_dir: Option<PathBuf>,
    local: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    listen: Option<String>,
    /// The read-only endpoints' port (the kubelet's `readOnlyPort`); 0 turns them off.
    read_only_port: Option<u16>,
    runtime: Option<RuntimeKind>,
    container_runtime_endpoint: Option<String>,
    log_format: Option<LogFormat>,
    pod_manifest_path: Option<PathBuf>,
    /// The node's address (hostIP, host-network pod IPs). Default 127.0.0.1.
    #[serde(rename = "nodeIP")]
    node_ip: Option<String>,
    /// Full status sync period in seconds (upstream 10).
    status_sync_period_seconds: Option<f64>,
    /// Client-side API rate limit (kubelet `kubeAPIQPS`, 50; none in local mode, where there
    /// is no API server to protect).
    #[serde(rename = "apiQPS")]
    api_qps: Option<f64>,
    /// Client-side API burst (kubelet `kubeAPIBurst`, 100).
    api_burst: Option<u32>,
    /// Kube mode: the event client's rate limit (kubelet `eventRecordQPS`, 50): events have
    /// a bucket of their own, so a flood of them never delays a status write.
    #[serde(rename = "eventRecordQPS")]
    event_record_qps: Option<f64>,
    /// The event client's burst (kubelet `eventBurst`, 100).
    event_burst: Option<u32>,
    /// Pods whose status syncs at once (16).
    status_sync_concurrency: Option<usize>,
    /// The least time between two signal-driven status batches, in seconds (0 allowed): a
    /// burst's changes are written once, at their latest. Local mode 1, kube mode 0
    /// (upstream's: a batch at every signal).
    status_kick_interval_seconds: Option<f64>,
    /// Deadline of each API call of the status manager, in seconds (10).
    api_request_timeout_seconds: Option<f64>,
    /// Kube mode: how often the node Lease is renewed, in seconds (upstream: a quarter of
    /// `nodeLeaseDurationSeconds`, 10).
    node_lease_renew_interval_seconds: Option<f64>,
    /// Kube mode: the Lease's duration in seconds (kubelet `nodeLeaseDurationSeconds`, 40).
    node_lease_duration_seconds: Option<i32>,
    /// Kube mode: how often the node status is computed (kubelet `nodeStatusUpdateFrequency`,
    /// a Go duration, `10s`).
    node_status_update_frequency: Option<String>,
    /// Kube mode: how long an unchanged node status goes unreported at most (kubelet
    /// `nodeStatusReportFrequency`, `5m`; the update frequency when only that is set).
    node_status_report_frequency: Option<String>,
    /// `status.capacity.pods` (kubelet `maxPods`, 110).
    max_pods: Option<u32>,
    /// The kubelet port reported in the Node's daemon endpoints (kubelet `port`, 10250).
    port: Option<u16>,
    /// Taints to register the Node with (kubelet `registerWithTaints`).
    register_with_taints: Option<Vec<FileTaint>>,
    /// Kube mode: the hard eviction thresholds the node's pressure conditions and allocatable
    /// come from (kubelet `evictionHard`: `memory.available`, `nodefs.available`,
    /// `nodefs.inodesFree`, `pid.available`, each a quantity or a percentage).
    eviction_hard: Option<BTreeMap<String, String>>,
    /// How long a simulated container takes to start, in milliseconds (0).
    simulated_start_delay_millis: Option<u64>,
    /// First simulated pod IP (10.88.0.2).
    #[serde(rename = "simulatedPodIPBase")]
    simulated_pod_ip_base: Option<String>,
    /// Whether each pod gets a cgroup under its QoS class's (kubelet `cgroupsPerQOS`; off by
    /// default, a deviation: upstream's is on), with `--runtime cri` on cgroup v1.
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    /// The cgroup the pods' `kubepods` cgroup goes under (kubelet `cgroupRoot`, `/`).
    cgroup_root: Option<String>,
    /// The agent's own cgroup, which it moves itself into at start (kubelet
    /// `kubeletCgroups`); unset: the cgroups it was started in.
    kubelet_cgroups: Option<String>,
    /// The container runtime's cgroup, for the summary's `runtime` system container (kubelet
    /// `--runtime-cgroups`); unset: none.
    runtime_cgroups: Option<String>,
    /// The node's other processes' cgroup, for the summary's `misc` system container (kubelet
    /// `systemCgroups`); unset: none.
    system_cgroups: Option<String>,
    /// The kubelet server on or off (kubelet `enableServer`).
    enable_server: Option<bool>,
    /// The kubelet server's address (kubelet `address`, 0.0.0.0).
    address: Option<String>,
    /// The kubelet server's certificate (kubelet `tlsCertFile`).
    tls_cert_file: Option<PathBuf>,
    /// Its key (kubelet `tlsPrivateKeyFile`).
    tls_private_key_file: Option<PathBuf>,
    /// The kubelet server's authentication (kubelet `authentication`).
    authentication: Option<FileAuthentication>,
    /// The kubelet server's authorization (kubelet `authorization`).
    authorization: Option<FileAuthorization>,
    /// The healthz endpoint's port (kubelet `healthzPort`, 10248; 0 turns it off).
    healthz_port: Option<u16>,
    /// The healthz endpoint's address (kubelet `healthzBindAddress`, 127.0.0.1).
    healthz_bind_address: Option<String>,
    /// How long an exec, attach or port-forward session may pass no byte before it is closed
    /// (kubelet `streamingConnectionIdleTimeout`, `4h`; `0` never closes one).
    streaming_connection_idle_timeout: Option<String>,
    /// Where the pods' log directories go (kubelet `podLogsDir`; `<root>/pod-logs`).
    pod_logs_dir: Option<PathBuf>,
    /// The device plugins' directory, with the registration socket `kubelet.sock`
    /// (`<root>/device-plugins`: upstream's `/var/lib/kubelet/device-plugins` under the
    /// default root).
    device_plugins_dir: Option<PathBuf>,
    /// Where the `/var/log/containers`-style symlinks go (`<root>/container-logs`).
    container_logs_dir: Option<PathBuf>,
    /// A container log this large is rotated (kubelet `containerLogMaxSize`, a quantity,
    /// `10Mi`; negative: no rotation).
    container_log_max_size: Option<String>,
    /// Log files kept per container, the live one included (kubelet `containerLogMaxFiles`, 5).
    container_log_max_files: Option<i64>,
    /// Containers whose logs are rotated at once (kubelet `containerLogMaxWorkers`, 1).
    container_log_max_workers: Option<i64>,
    /// How often the logs' sizes are checked (kubelet `containerLogMonitorInterval`, `10s`).
    container_log_monitor_interval: Option<String>,
    /// Sysctls (or patterns ending in `*`) pods may set besides the safe ones (kubelet
    /// `allowedUnsafeSysctls`); each must be known to be namespaced.
    allowed_unsafe_sysctls: Option<Vec<String>>,
}

/// `authentication` with the kubelet's names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileAuthentication {
    #[serde(default)]
    x509: FileX509,
    #[serde(default)]
    webhook: FileAuthnWebhook,
    #[serde(default)]
    anonymous: FileAnonymous,
}

/// `authentication.x509`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileX509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<PathBuf>,
}

/// `authentication.webhook`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthnWebhook {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<String>,
}

/// `authentication.anonymous`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAnonymous {
    enabled: Option<bool>,
}

/// `authorization` with the kubelet's names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileAuthorization {
    mode: Option<String>,
    #[serde(default)]
    webhook: FileAuthzWebhook,
}

/// `authorization.webhook`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthzWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<String>,
}

/// A taint of `registerWithTaints`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileTaint {
    key: String,
    #[serde(default)]
    value: Option<String>,
    effect: String,
}

/// Where pods come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The manifests of a directory, in an in-process store.
    Local(PathBuf),
    /// A cluster, from a kubeconfig file.
    Kubeconfig(PathBuf),
    /// A cluster, from the pod's service account.
    InCluster,
}

/// Where the read-only HTTP endpoints (`/healthz`, `/pods`, `/metrics`) are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnlyEndpoints {
    /// Nothing listens (`--read-only-port 0`, as the kubelet's).
    Off,
    /// Served on this address.
    Listen(SocketAddr),
}

/// Where the healthz endpoint (`/healthz` in plain HTTP, the kubelet's `healthzPort`) listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthzEndpoint {
    /// Nothing listens (`healthzPort: 0`).
    Off,
    /// Served on this address.
    Listen(SocketAddr),
}

/// The kubelet server (:10250).
#[derive(Clone, Debug, PartialEq)]
pub enum KubeletServer {
    /// Not served (`enableServer: false`; local mode without a client CA).
    Off,
    /// Served with these settings.
    Serve(ServerSettings),
}

/// How the kubelet server serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSettings {
    /// `address`:`port`.
    pub listen: SocketAddr,
    /// `tlsCertFile`.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `authentication`.
    pub authentication: KubeletAuthentication,
    /// `authorization`.
    pub authorization: KubeletAuthorization,
    /// `streamingConnectionIdleTimeout`: an exec, attach or port-forward session that passes
    /// no byte for this long is closed; `None` (the key's `0`) never closes one.
    pub streaming_connection_idle_timeout: Option<Duration>,
}

/// Container log rotation (the kubelet's container log manager; `--runtime cri` only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogRotation {
    /// `containerLogMaxSize` negative: logs grow unbounded (upstream's stub manager).
    Off,
    /// Rotated with these settings.
    Rotate(ContainerLogManagerConfig),
}

/// Where the container logs go.
#[derive(Clone, Debug, PartialEq)]
pub struct LogSettings {
    /// `podLogsDir`: the pods' log directories.
    pub pod_logs_dir: PathBuf,
    /// `containerLogsDir`: the `/var/log/containers`-style symlinks.
    pub container_logs_dir: PathBuf,
    /// Rotation.
    pub rotation: LogRotation,
}

/// Everything the agent runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// This node's name.
    pub node_name: String,
    /// The state directory.
    pub root_dir: PathBuf,
    /// Where pods come from.
    pub mode: Mode,
    /// The read-only HTTP endpoints.
    pub read_only: ReadOnlyEndpoints,
    /// The healthz endpoint.
    pub healthz: HealthzEndpoint,
    /// The static pod directory.
    pub pod_manifest_path: Option<PathBuf>,
    /// The runtime.
    pub runtime: RuntimeKind,
    /// The CRI runtime's endpoint (`--runtime cri`).
    pub container_runtime_endpoint: String,
    /// The log format.
    pub log_format: LogFormat,
    /// The node's address.
    pub node_ip: String,
    /// Full status sync period.
    pub status_sync_period: Duration,
    /// API rate limit.
    pub api_qps: f64,
    /// API burst.
    pub api_burst: u32,
    /// The event client's rate limit.
    pub event_qps: f64,
    /// The event client's burst.
    pub event_burst: u32,
    /// Status syncs at once.
    pub status_sync_concurrency: usize,
    /// The least time between two signal-driven status batches.
    pub status_kick_interval: Duration,
    /// Deadline of each status API call.
    pub api_request_timeout: Duration,
    /// How often the node Lease is renewed.
    pub node_lease_renew_interval: Duration,
    /// The node Lease's duration in seconds.
    pub node_lease_duration_seconds: i32,
    /// How often the node status is computed.
    pub node_status_update_frequency: Duration,
    /// How long an unchanged node status goes unreported at most.
    pub node_status_report_frequency: Duration,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--register-with-taints` / `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `maxPods`.
    pub max_pods: u32,
    /// `evictionHard`.
    pub eviction_hard: EvictionThresholds,
    /// `port`: the kubelet port the Node reports.
    pub port: u16,
    /// The kubelet server.
    pub server: KubeletServer,
    /// The container logs' directories and rotation.
    pub logs: LogSettings,
    /// The device plugins' directory (`devicePluginsDir`): the registration socket
    /// `kubelet.sock` and the plugins' sockets.
    pub device_plugins_dir: PathBuf,
    /// Simulated container start delay.
    pub simulated_start_delay: Duration,
    /// First simulated pod IP.
    pub simulated_pod_ip_base: std::net::Ipv4Addr,
    /// With `cgroupsPerQOS`: the cgroup root the pods' cgroups go under (absolute, `/` by
    /// default); `None`: no pod cgroups.
    pub pod_cgroup_root: Option<String>,
    /// `allowedUnsafeSysctls`, each valid and known to be namespaced.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The system containers' cgroups (kubelet `kubeletCgroups`, `runtimeCgroups`,
    /// `systemCgroups`), each absolute.
    pub system_cgroups: SystemCgroupNames,
}

/// The cgroups of the summary's system containers as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemCgroupNames {
    /// `kubeletCgroups`.
    pub kubelet: Option<String>,
    /// `runtimeCgroups`.
    pub runtime: Option<String>,
    /// `systemCgroups`.
    pub system: Option<String>,
}

/// An absolute cgroup name without `.` or `..` parts.
fn cgroup_name(key: &str, name: &str) -> Result<String, String> {
    if !name.starts_with('/') || name.split('/').any(|part| part == "." || part == "..") {
        return Err(format!(
            "config key {key}: {name:?} is not an absolute cgroup name"
        ));
    }
    Ok(name.to_owned())
}

/// A configuration error: one line naming the flag or key (exit code 2).
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn bad(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

fn seconds(key: &str, value: Option<f64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e7 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(bad(format!(
            "config key {key}: {s} is not a positive number of seconds"
        ))),
    }
}

/// A Go duration (`10s`, `5m`, `1m30s`, `500ms`, `1.5h`), as the kubelet's configuration file
/// writes one.
pub fn go_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let refuse = || {
        bad(format!(
            "config key {key}: {text:?} is not a duration (such as 10s, 5m, 1m30s)"
        ))
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(refuse());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(refuse)?;
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number.parse().map_err(|_| refuse())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(refuse()),
        };
        total += value * scale;
        rest = tail;
    }
    if !total.is_finite() || total >= 1e9 {
        return Err(refuse());
    }
    Ok(Duration::from_secs_f64(total))
}

/// `--node-labels`: `key=value,...`.
fn parse_node_labels(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut labels = BTreeMap::new();
    for item in text.split(',').filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| bad(format!("--node-labels: {item:?} is not key=value")))?;
        labels.insert(key.trim().to_owned(), value.trim().to_owned());
    }
    Ok(labels)
}

/// Upstream's check of `--node-labels` (`ValidateKubeletFlags`): no label the NodeRestriction
/// admission plugin would refuse (the Node could not be registered), and valid keys and values.
fn check_node_labels(labels: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    if let Some(message) =
        rustlet_core::node::forbidden_node_labels(labels.keys().map(String::as_str))
    {
        return Err(bad(message));
    }
    let mut errors = rustlet_api::local::validation::FieldErrors::default();
    rustlet_api::local::validation::validate_metadata(
        &serde_json::json!({ "labels": labels }),
        &mut errors,
    );
    if !errors.0.is_empty() {
        return Err(bad(format!(
            "--node-labels: invalid node labels: {}",
            errors.0.join("; ")
        )));
    }
    Ok(())
}

const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

fn taint(source: &str, key: &str, value: Option<&str>, effect: &str) -> Result<Taint, ConfigError> {
    if key.is_empty() {
        return Err(bad(format!("{source}: a taint needs a key")));
    }
    if !TAINT_EFFECTS.contains(&effect) {
        return Err(bad(format!(
            "{source}: taint {key:?}: effect {effect:?} is not one of {}",
            TAINT_EFFECTS.join(", ")
        )));
    }
    Ok(Taint {
        key: key.to_owned(),
        value: value.filter(|v| !v.is_empty()).map(str::to_owned),
        effect: effect.to_owned(),
        time_added: None,
    })
}

/// `--register-with-taints`: `key=value:Effect,...` (or `key:Effect`).
fn parse_taints(text: &str) -> Result<Vec<Taint>, ConfigError> {
    text.split(',')
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (key_value, effect) = item.rsplit_once(':').ok_or_else(|| {
                bad(format!(
                    "--register-with-taints: {item:?} is not key=value:Effect"
                ))
            })?;
            let (key, value) = match key_value.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (key_value, None),
            };
            taint("--register-with-taints", key, value, effect)
        })
        .collect()
}

/// Reads and checks `--config`.
pub fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("--config {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    serde_saphyr::from_str(&text).map_err(|e| {
        bad(format!(
            "--config {}: {}",
            path.display(),
            one_line(&e.to_string())
        ))
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl AgentConfig {
    /// Flags over the file over the defaults; `in_cluster` says whether the service-account
    /// environment is present.
    pub fn resolve(cli: Cli, in_cluster: bool) -> Result<Self, ConfigError> {
        let mut file = match &cli.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let node_name = cli
            .node_name
            .or(file.node_name)
            .ok_or_else(|| bad("--node-name is required"))?;
        if node_name.is_empty()
            || node_name.len() > 253
            || !node_name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
        {
            return Err(bad(format!(
                "--node-name {node_name:?}: must be a lowercase RFC 1123 subdomain"
            )));
        }
        let cli_server = CliServer {
            enable: cli.enable_server,
            address: cli.address,
            tls_cert_file: cli.tls_cert_file.clone(),
            tls_private_key_file: cli.tls_private_key_file.clone(),
            client_ca_file: cli.client_ca_file.clone(),
        };
        let mut file_server = FileServer {
            enable: file.enable_server,
            address: file.address.clone(),
            tls_cert_file: file.tls_cert_file.clone(),
            tls_private_key_file: file.tls_private_key_file.clone(),
            authentication: file.authentication.take(),
            authorization: file.authorization.take(),
            streaming_connection_idle_timeout: file.streaming_connection_idle_timeout.take(),
        };
        let root_dir = cli
            .root_dir
            .or(file.root_dir)
            .ok_or_else(|| bad("--root-dir is required"))?;
        let local = cli.local.or(file.local);
        let kubeconfig = cli.kubeconfig.or(file.kubeconfig);
        let mode = match (local, kubeconfig) {
            (Some(_), Some(_)) => {
                return Err(bad("--local and --kubeconfig exclude each other"));
            }
            (Some(dir), None) => {
                if !dir.is_dir() {
                    return Err(bad(format!("--local {}: not a directory", dir.display())));
                }
                Mode::Local(dir)
            }
            (None, Some(file)) => {
                if !file.is_file() {
                    return Err(bad(format!(
                        "--kubeconfig {}: no such file",
                        file.display()
                    )));
                }
                Mode::Kubeconfig(file)
            }
            (None, None) if in_cluster => Mode::InCluster,
            (None, None) => {
                return Err(bad(
                    "no cluster and no local mode: give --local DIR or --kubeconfig FILE \
                     (or run in a pod with a service account)",
                ));
            }
        };
        let pod_manifest_path = cli.pod_manifest_path.or(file.pod_manifest_path);
        if let Some(dir) = &pod_manifest_path
            && !dir.is_dir()
        {
            return Err(bad(format!(
                "--pod-manifest-path {}: not a directory",
                dir.display()
            )));
        }
        let file_listen: Option<SocketAddr> = file
            .listen
            .map(|addr| {
                addr.parse()
                    .map_err(|_| bad(format!("config key listen: {addr:?} is not ADDR:PORT")))
            })
            .transpose()?;
        // The port: a flag's over the file's; on each side the explicit port over the address's.
        let port = cli
            .read_only_port
            .or(cli.listen.map(|a| a.port()))
            .or(file.read_only_port)
            .or(file_listen.map(|a| a.port()))
            .unwrap_or(10255);
        let read_only = match port {
            0 => ReadOnlyEndpoints::Off,
            port => {
                let ip = cli
                    .listen
                    .or(file_listen)
                    .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip());
                ReadOnlyEndpoints::Listen(SocketAddr::new(ip, port))
            }
        };
        let healthz = match cli.healthz_port.or(file.healthz_port).unwrap_or(10248) {
            0 => HealthzEndpoint::Off,
            port => {
                let ip = match (cli.healthz_bind_address, &file.healthz_bind_address) {
                    (Some(ip), _) => ip,
                    (None, Some(text)) => text.parse().map_err(|_| {
                        bad(format!(
                            "config key healthzBindAddress: {text:?} is not an IP address"
                        ))
                    })?,
                    (None, None) => Ipv4Addr::LOCALHOST.into(),
                };
                HealthzEndpoint::Listen(SocketAddr::new(ip, port))
            }
        };
        let node_ip_flag = cli.node_ip.is_some();
        let node_ip = cli
            .node_ip
            .or(file.node_ip)
            .unwrap_or_else(|| "127.0.0.1".into());
        if node_ip.parse::<std::net::IpAddr>().is_err() {
            let name = if node_ip_flag {
                "--node-ip"
            } else {
                "config key nodeIP"
            };
            return Err(bad(format!("{name}: {node_ip:?} is not an IP address")));
        }
        let node_labels = match &cli.node_labels {
            Some(text) => parse_node_labels(text)?,
            None => BTreeMap::new(),
        };
        check_node_labels(&node_labels)?;
        let register_with_taints = match (&cli.register_with_taints, file.register_with_taints) {
            (Some(text), _) => parse_taints(text)?,
            (None, Some(list)) => list
                .iter()
                .map(|t| {
                    taint(
                        "config key registerWithTaints",
                        &t.key,
                        t.value.as_deref(),
                        &t.effect,
                    )
                })
                .collect::<Result<_, _>>()?,
            (None, None) => Vec::new(),
        };
        let max_pods = file.max_pods.unwrap_or(110);
        if max_pods == 0 {
            return Err(bad("config key maxPods: must be at least 1"));
        }
        let port = cli.port.or(file.port).unwrap_or(10250);
        if port == 0 {
            return Err(bad("--port: must be 1-65535"));
        }
        let server = kubelet_server(&cli_server, &mode, port, &mut file_server)?;
        let logs = log_settings(
            &root_dir,
            FileLogs {
                pod_logs_dir: file.pod_logs_dir.take(),
                container_logs_dir: file.container_logs_dir.take(),
                max_size: file.container_log_max_size.take(),
                max_files: file.container_log_max_files,
                max_workers: file.container_log_max_workers,
                monitor_interval: file.container_log_monitor_interval.take(),
            },
        )?;
        let device_plugins_dir = device_plugins_dir(&root_dir, file.device_plugins_dir.take())?;
        let node_lease_duration_seconds = file.node_lease_duration_seconds.unwrap_or(40);
        if node_lease_duration_seconds <= 0 {
            return Err(bad(
                "config key nodeLeaseDurationSeconds: must be a positive number of seconds",
            ));
        }
        let positive = |key: &str, text: &Option<String>| {
            text.as_deref()
                .map(|t| match go_duration(key, t)? {
                    d if d.is_zero() => Err(bad(format!("config key {key}: must be positive"))),
                    d => Ok(d),
                })
                .transpose()
        };
        let update_frequency = positive(
            "nodeStatusUpdateFrequency",
            &file.node_status_update_frequency,
        )?;
        let report_frequency = positive(
            "nodeStatusReportFrequency",
            &file.node_status_report_frequency,
        )?;
        // upstream's defaulting: with only the update frequency set, the report frequency is
        // the same.
        let node_status_report_frequency = match (report_frequency, update_frequency) {
            (Some(report), _) => report,
            (None, Some(update)) => update,
            (None, None) => Duration::from_secs(5 * 60),
        };
        let node_status_update_frequency = update_frequency.unwrap_or(Duration::from_secs(10));
        let api_qps = match (file.api_qps, &mode) {
            (Some(qps), _) => qps,
            (None, Mode::Local(_)) => f64::INFINITY,
            (None, _) => 50.0,
        };
        let explicit = file.api_qps.is_some();
        if api_qps.is_nan() || api_qps <= 0.0 || (explicit && api_qps.is_infinite()) {
            return Err(bad(format!(
                "config key apiQPS: {api_qps} must be positive"
            )));
        }
        let api_burst = file.api_burst.unwrap_or(100);
        if api_burst == 0 {
            return Err(bad("config key apiBurst: must be at least 1"));
        }
        let event_qps = file.event_record_qps.unwrap_or(50.0);
        if !event_qps.is_finite() || event_qps <= 0.0 {
            return Err(bad(format!(
                "config key eventRecordQPS: {event_qps} must be positive"
            )));
        }
        let event_burst = file.event_burst.unwrap_or(100);
        if event_burst == 0 {
            return Err(bad("config key eventBurst: must be at least 1"));
        }
        // Local mode writes statuses to the agent's own store, where a pod start's status
        // writes would take a third of the CPU the pods need (issue 29): a burst's are written
        // once a second. Kube mode batches at every signal, as upstream does.
        let status_kick_interval = match (file.status_kick_interval_seconds, &mode) {
            (Some(s), _) if s.is_finite() && (0.0..1e7).contains(&s) => Duration::from_secs_f64(s),
            (Some(s), _) => {
                return Err(bad(format!(
                    "config key statusKickIntervalSeconds: {s} is not a number of seconds, 0 or more"
                )));
            }
            (None, Mode::Local(_)) => Duration::from_secs(1),
            (None, _) => Duration::ZERO,
        };
        let status_sync_concurrency = file.status_sync_concurrency.unwrap_or(16);
        if status_sync_concurrency == 0 {
            return Err(bad("config key statusSyncConcurrency: must be at least 1"));
        }
        let simulated_pod_ip_base = match file.simulated_pod_ip_base {
            None => std::net::Ipv4Addr::new(10, 88, 0, 2),
            Some(ip) => ip.parse().map_err(|_| {
                bad(format!(
                    "config key simulatedPodIPBase: {ip:?} is not an IPv4 address"
                ))
            })?,
        };
        let pod_cgroup_root = match (file.cgroups_per_qos.unwrap_or(false), file.cgroup_root) {
            (false, _) => None,
            (true, root) => {
                let root = root.unwrap_or_else(|| "/".to_owned());
                if !root.starts_with('/') || root.split('/').any(|part| part == "." || part == "..")
                {
                    return Err(bad(format!(
                        "config key cgroupRoot: {root:?} is not an absolute cgroup name"
                    )));
                }
                Some(root)
            }
        };
        // upstream's NewAllowlist refuses the kubelet's start on a bad pattern.
        let allowed_unsafe_sysctls = file.allowed_unsafe_sysctls.take().unwrap_or_default();
        rustlet_pods::sysctl::Allowlist::new(&allowed_unsafe_sysctls)
            .map_err(|e| bad(format!("config key allowedUnsafeSysctls: {e}")))?;
        let named = |key: &str, name: Option<String>| -> Result<Option<String>, ConfigError> {
            name.map(|n| cgroup_name(key, &n)).transpose().map_err(bad)
        };
        let system_cgroups = SystemCgroupNames {
            kubelet: named("kubeletCgroups", file.kubelet_cgroups)?,
            runtime: named("runtimeCgroups", file.runtime_cgroups)?,
            system: named("systemCgroups", file.system_cgroups)?,
        };
        if system_cgroups.system.as_deref() == Some("/") {
            // upstream: "system container cannot be root".
            return Err(bad(
                "config key systemCgroups: the system container cannot be root (\"/\")".to_owned(),
            ));
        }
        let container_runtime_endpoint = cli
            .container_runtime_endpoint
            .or(file.container_runtime_endpoint)
            .unwrap_or_else(|| rustlet_cri::client::DEFAULT_ENDPOINT.to_owned());
        rustlet_cri::client::socket_path(&container_runtime_endpoint)
            .map_err(|e| bad(format!("--container-runtime-endpoint: {e}")))?;
        Ok(Self {
            node_name,
            root_dir,
            mode,
            read_only,
            healthz,
            pod_manifest_path,
            runtime: cli.runtime.or(file.runtime).unwrap_or_default(),
            container_runtime_endpoint,
            log_format: cli.log_format.or(file.log_format).unwrap_or_default(),
            node_ip,
            status_sync_period: seconds(
                "statusSyncPeriodSeconds",
                file.status_sync_period_seconds,
                Duration::from_secs(10),
            )?,
            api_qps,
            api_burst,
            event_qps,
            event_burst,
            status_sync_concurrency,
            status_kick_interval,
            api_request_timeout: seconds(
                "apiRequestTimeoutSeconds",
                file.api_request_timeout_seconds,
                Duration::from_secs(10),
            )?,
            // upstream: a quarter of the lease duration (NodeLeaseRenewIntervalFraction).
            node_lease_renew_interval: seconds(
                "nodeLeaseRenewIntervalSeconds",
                file.node_lease_renew_interval_seconds,
                Duration::from_secs(node_lease_duration_seconds.unsigned_abs().into()) / 4,
            )?,
            node_lease_duration_seconds,
            node_status_update_frequency,
            node_status_report_frequency,
            node_labels,
            register_with_taints,
            max_pods,
            port,
            server,
            logs,
            device_plugins_dir,
            eviction_hard: match &file.eviction_hard {
                Some(map) => eviction_hard(map).map_err(bad)?,
                None => EvictionThresholds::default(),
            },
            simulated_start_delay: Duration::from_millis(
                file.simulated_start_delay_millis.unwrap_or(0),
            ),
            simulated_pod_ip_base,
            pod_cgroup_root,
            allowed_unsafe_sysctls,
            system_cgroups,
        })
    }
}

/// The container log keys of the file.
struct FileLogs {
    pod_logs_dir: Option<PathBuf>,
    container_logs_dir: Option<PathBuf>,
    max_size: Option<String>,
    max_files: Option<i64>,
    max_workers: Option<i64>,
    monitor_interval: Option<String>,
}

/// A log directory key: absolute and normalized (upstream's `podLogsDir` validation).
fn log_dir(key: &str, dir: Option<&PathBuf>, default: PathBuf) -> Result<PathBuf, ConfigError> {
    let Some(dir) = dir else {
        return Ok(default);
    };
    if !dir.is_absolute() {
        return Err(bad(format!(
            "config key {key}: pod logs path {:?} must be absolute path",
            dir.display()
        )));
    }
    // Checked on the text: `Path::components` would hide `a/./b` and a trailing `/`.
    let text = dir.as_os_str().as_encoded_bytes();
    let clean = text == b"/"
        || text[1..]
            .split(|b| *b == b'/')
            .all(|seg| !matches!(seg, b"" | b"." | b".."));
    if !clean {
        return Err(bad(format!(
            "config key {key}: pod logs path {:?} must be normalized",
            dir.display()
        )));
    }
    Ok(dir.clone())
}

/// `devicePluginsDir`: absolute; `<root>/device-plugins` by default. Deviation: upstream has
/// no such key: its directory is always `/var/lib/kubelet/device-plugins`, which is this
/// default under the default root; an agent with another root (a test's, or one beside a
/// kubelet) keeps its plugins apart.
fn device_plugins_dir(root_dir: &Path, dir: Option<PathBuf>) -> Result<PathBuf, ConfigError> {
    match dir {
        None => Ok(root_dir.join("device-plugins")),
        Some(dir) if dir.is_absolute() => Ok(dir),
        Some(dir) => Err(bad(format!(
            "config key devicePluginsDir: {:?} must be an absolute path",
            dir.display()
        ))),
    }
}

/// The container log keys with the kubelet's names, defaults and checks (upstream:
/// `ValidateKubeletConfiguration`, `NewContainerLogManager`). Deviation: the directories
/// default under the root directory, not `/var/log/pods` and `/var/log/containers`: an agent
/// beside a kubelet or another agent on the same node must not share them (each removes the
/// log directories of pods it does not know), and a test agent writes nothing outside its root.
fn log_settings(root_dir: &Path, file: FileLogs) -> Result<LogSettings, ConfigError> {
    let pod_logs_dir = log_dir(
        "podLogsDir",
        file.pod_logs_dir.as_ref(),
        root_dir.join(rustlet_cri::runtime::DEFAULT_POD_LOGS_DIR),
    )?;
    let container_logs_dir = log_dir(
        "containerLogsDir",
        file.container_logs_dir.as_ref(),
        root_dir.join(rustlet_cri::runtime::DEFAULT_CONTAINER_LOGS_DIR),
    )?;
    let size_text = file.max_size.as_deref().unwrap_or("10Mi");
    let max_size = rustlet_core::quantity::quantity_ceil(
        &k8s_openapi::apimachinery::pkg::api::resource::Quantity(size_text.to_owned()),
    )
    .and_then(|n| i64::try_from(n).ok())
    .ok_or_else(|| {
        bad(format!(
            "config key containerLogMaxSize: {size_text:?} is not a quantity (such as 10Mi)"
        ))
    })?;
    let max_files = file.max_files.unwrap_or(5);
    let max_workers = file.max_workers.unwrap_or(1);
    if max_workers < 1 {
        return Err(bad(
            "config key containerLogMaxWorkers: must be greater than or equal to 1",
        ));
    }
    let monitor_interval = match &file.monitor_interval {
        Some(text) => go_duration("containerLogMonitorInterval", text)?,
        None => Duration::from_secs(10),
    };
    if monitor_interval < Duration::from_secs(3) {
        return Err(bad(
            "config key containerLogMonitorInterval: must be a positive time duration greater than or equal to 3s",
        ));
    }
    let rotation = match u64::try_from(max_size) {
        Err(_) => LogRotation::Off,
        Ok(max_size) => {
            let policy = usize::try_from(max_files)
                .map_err(|_| ())
                .and_then(|n| LogRotatePolicy::new(max_size, n).map_err(|_| ()))
                .map_err(|()| {
                    bad(format!(
                        "config key containerLogMaxFiles: invalid MaxFiles {max_files}, must be > 1"
                    ))
                })?;
            LogRotation::Rotate(ContainerLogManagerConfig {
                policy,
                monitor_interval,
                max_workers: usize::try_from(max_workers).unwrap_or(1),
            })
        }
    };
    Ok(LogSettings {
        pod_logs_dir,
        container_logs_dir,
        rotation,
    })
}

/// The kubelet server's flags.
struct CliServer {
    enable: Option<bool>,
    address: Option<IpAddr>,
    tls_cert_file: Option<PathBuf>,
    tls_private_key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
}

/// The kubelet server's config keys.
struct FileServer {
    enable: Option<bool>,
    address: Option<String>,
    tls_cert_file: Option<PathBuf>,
    tls_private_key_file: Option<PathBuf>,
    authentication: Option<FileAuthentication>,
    authorization: Option<FileAuthorization>,
    streaming_connection_idle_timeout: Option<String>,
}

/// The kubelet server's settings, flags over the file over upstream's v1beta1 defaults. Kube
/// mode serves unless `enableServer: false`. Local mode has no API server to review tokens
/// or access: it serves only with a client CA, to client certificates alone, every
/// authenticated request allowed (deviation: upstream's kubelet always needs an authorizer;
/// `AlwaysAllow` is local mode's default here).
fn kubelet_server(
    cli: &CliServer,
    mode: &Mode,
    port: u16,
    file: &mut FileServer,
) -> Result<KubeletServer, ConfigError> {
    let authn = file.authentication.take().unwrap_or_default();
    let authz = file.authorization.take().unwrap_or_default();
    let client_ca_file = cli
        .client_ca_file
        .clone()
        .or(authn.x509.client_ca_file.clone());
    let local = matches!(mode, Mode::Local(_));
    match (cli.enable.or(file.enable), local, &client_ca_file) {
        (Some(false), _, _) | (None, true, None) => return Ok(KubeletServer::Off),
        (Some(true), true, None) => {
            return Err(bad(
                "--enable-server in local mode needs --client-ca-file: local mode takes client \
                 certificates only",
            ));
        }
        _ => {}
    }
    let address = match (cli.address, &file.address) {
        (Some(ip), _) => ip,
        (None, Some(text)) => text
            .parse()
            .map_err(|_| bad(format!("config key address: {text:?} is not an IP address")))?,
        (None, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let tls_cert_file = cli.tls_cert_file.clone().or(file.tls_cert_file.clone());
    let tls_private_key_file = cli
        .tls_private_key_file
        .clone()
        .or(file.tls_private_key_file.clone());
    if tls_cert_file.is_some() != tls_private_key_file.is_some() {
        return Err(bad(
            "--tls-cert-file and --tls-private-key-file go together",
        ));
    }
    let ttl = |key: &str, text: &Option<String>, default: Duration| match text {
        Some(text) => go_duration(key, text),
        None => Ok(default),
    };
    let webhook_defaults = WebhookAuthentication::default();
    let authentication = KubeletAuthentication {
        x509: X509Authentication { client_ca_file },
        webhook: WebhookAuthentication {
            // Local mode has nothing to send a TokenReview to.
            enabled: authn.webhook.enabled.unwrap_or(!local),
            cache_ttl: ttl(
                "authentication.webhook.cacheTTL",
                &authn.webhook.cache_ttl,
                webhook_defaults.cache_ttl,
            )?,
        },
        anonymous: AnonymousAuthentication {
            enabled: authn.anonymous.enabled.unwrap_or(false),
        },
    };
    let authz_defaults = WebhookAuthorization::default();
    let authorization = KubeletAuthorization {
        mode: match authz.mode.as_deref() {
            None if local => AuthorizationMode::AlwaysAllow,
            None | Some("Webhook") => AuthorizationMode::Webhook,
            Some("AlwaysAllow") => AuthorizationMode::AlwaysAllow,
            Some(other) => {
                return Err(bad(format!(
                    "config key authorization.mode: {other:?}: must be Webhook or AlwaysAllow"
                )));
            }
        },
        webhook: WebhookAuthorization {
            cache_authorized_ttl: ttl(
                "authorization.webhook.cacheAuthorizedTTL",
                &authz.webhook.cache_authorized_ttl,
                authz_defaults.cache_authorized_ttl,
            )?,
            cache_unauthorized_ttl: ttl(
                "authorization.webhook.cacheUnauthorizedTTL",
                &authz.webhook.cache_unauthorized_ttl,
                authz_defaults.cache_unauthorized_ttl,
            )?,
        },
    };
    let idle = ttl(
        "streamingConnectionIdleTimeout",
        &file.streaming_connection_idle_timeout,
        rustlet_server::streaming::DEFAULT_IDLE_TIMEOUT,
    )?;
    Ok(KubeletServer::Serve(ServerSettings {
        listen: SocketAddr::new(address, port),
        tls_cert_file,
        tls_private_key_file,
        authentication,
        authorization,
        // upstream: "0 indicates no timeout".
        streaming_connection_idle_timeout: (!idle.is_zero()).then_some(idle),
    }))
}

/// `evictionHard` as upstream's kubelet reads it (`ParseThresholdConfig`): each signal a
/// quantity (`100Mi`) or a percentage of the capacity (`10%`). A map that is given replaces
/// the defaults: a signal it leaves out has no threshold (upstream's v1beta1 defaulting only
/// fills an absent map, as the eviction documentation warns). `imagefs.*` are accepted and
/// not used (the image filesystem is the runtime's).
fn eviction_hard(map: &BTreeMap<String, String>) -> Result<EvictionThresholds, String> {
    let mut thresholds = EvictionThresholds {
        memory_available: None,
        nodefs_available: None,
        nodefs_inodes_free: None,
        pid_available: None,
    };
    for (signal, value) in map {
        let bad = |why: &str| format!("config key evictionHard: {signal}: {value:?} {why}");
        let threshold = match value.strip_suffix('%') {
            Some(percent) => {
                let p: f64 = percent
                    .trim()
                    .parse()
                    .map_err(|_| bad("is no percentage"))?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(bad("must be between 0% and 100%"));
                }
                Threshold::Percentage(p / 100.0)
            }
            None => {
                let q = rustlet_core::quantity::quantity_ceil(
                    &k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.clone()),
                )
                .filter(|q| *q >= 0)
                .ok_or_else(|| bad("is no quantity"))?;
                Threshold::Quantity(u64::try_from(q).map_err(|_| bad("is too large"))?)
            }
        };
        match signal.as_str() {
            "memory.available" => thresholds.memory_available = Some(threshold),
            "nodefs.available" => thresholds.nodefs_available = Some(threshold),
            "nodefs.inodesFree" => thresholds.nodefs_inodes_free = Some(threshold),
            "pid.available" => thresholds.pid_available = Some(threshold),
            "imagefs.available" | "imagefs.inodesFree" => {}
            _ => return Err(bad("names no eviction signal")),
        }
    }
    Ok(thresholds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration of a local-mode node `n` with root `/r` and `text` as its config
    /// file.
    fn resolve_file(text: &str) -> Result<AgentConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, text).unwrap();
        parse(&[
            "--node-name",
            "n",
            "--root-dir",
            "/r",
            "--local",
            dir.path().to_str().unwrap(),
            "--config",
            file.to_str().unwrap(),
        ])
    }

    /// The configuration of a kube-mode node `n` with root `/r`, `text` as its config file and
    /// the flags `extra`.
    fn resolve_kube_file(extra: &[&str], text: &str) -> Result<AgentConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, "").unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(&file, text).unwrap();
        let mut args = vec![
            "--node-name",
            "n",
            "--root-dir",
            "/r",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--config",
            file.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        parse(&args)
    }

    fn parse(args: &[&str]) -> Result<AgentConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("rustlet").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        AgentConfig::resolve(cli, false).map_err(|e| e.to_string())
    }

    /// The kubelet's `cgroupsPerQOS` and `cgroupRoot` (issue 27): off by default here, the root
    /// `/` when on; a relative root or one with `..` is refused.
    #[test]
    fn cgroups_per_qos_takes_the_kubelets_cgroup_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = |yaml: &str| {
            let file = dir.path().join("c.yaml");
            std::fs::write(&file, yaml).unwrap();
            parse(&[
                "--node-name",
                "n",
                "--root-dir",
                "/r",
                "--local",
                dir.path().to_str().unwrap(),
                "--config",
                file.to_str().unwrap(),
            ])
            .map(|c| c.pod_cgroup_root)
        };
        assert_eq!(root("{}").unwrap(), None);
        assert_eq!(root("cgroupsPerQOS: true\n").unwrap(), Some("/".to_owned()));
        assert_eq!(
            root("cgroupsPerQOS: true\ncgroupRoot: /rustlet\n").unwrap(),
            Some("/rustlet".to_owned())
        );
        assert_eq!(root("cgroupRoot: /rustlet\n").unwrap(), None);
        for bad in ["rustlet", "/a/../b"] {
            let err = root(&format!("cgroupsPerQOS: true\ncgroupRoot: {bad}\n")).unwrap_err();
            assert!(err.contains("cgroupRoot"), "{err}");
        }
    }

    /// Issue 27 (Summary API): the kubelet's `kubeletCgroups`, `runtimeCgroups` and
    /// `systemCgroups`, each an absolute cgroup name, unset by default; `systemCgroups: /` is
    /// refused as upstream refuses it ("system container cannot be root").
    #[test]
    fn system_cgroups_are_the_kubelets_keys() {
        let dir = tempfile::tempdir().unwrap();
        let names = |yaml: &str| {
            let file = dir.path().join("c.yaml");
            std::fs::write(&file, yaml).unwrap();
            parse(&[
                "--node-name",
                "n",
                "--root-dir",
                "/r",
                "--local",
                dir.path().to_str().unwrap(),
                "--config",
                file.to_str().unwrap(),
            ])
            .map(|c| c.system_cgroups)
        };
        assert_eq!(names("{}").unwrap(), SystemCgroupNames::default());
        assert_eq!(
            names("kubeletCgroups: /k\nruntimeCgroups: /rt\nsystemCgroups: /system\n").unwrap(),
            SystemCgroupNames {
                kubelet: Some("/k".into()),
                runtime: Some("/rt".into()),
                system: Some("/system".into()),
            }
        );
        for (key, bad) in [
            ("kubeletCgroups", "kubelet"),
            ("runtimeCgroups", "/a/../b"),
            ("systemCgroups", "/"),
        ] {
            let err = names(&format!("{key}: {bad}\n")).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }

    /// Issue 26 item 4: `streamingConnectionIdleTimeout` as the kubelet's: 4h by default, a Go
    /// duration, `0` for none.
    #[test]
    fn streaming_connection_idle_timeout_is_the_kubelets() {
        let idle = |yaml: &str| {
            let server = resolve_kube_file(&[], yaml).map(|c| c.server)?;
            let KubeletServer::Serve(set) = server else {
                panic!("kube mode serves by default");
            };
            Ok::<_, String>(set.streaming_connection_idle_timeout)
        };
        assert_eq!(idle("{}").unwrap(), Some(Duration::from_secs(4 * 3600)));
        assert_eq!(
            idle("streamingConnectionIdleTimeout: 5m\n").unwrap(),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            idle("streamingConnectionIdleTimeout: \"0\"\n").unwrap(),
            None
        );
        let err = idle("streamingConnectionIdleTimeout: soon\n").unwrap_err();
        assert!(err.contains("streamingConnectionIdleTimeout"), "{err}");
    }

    /// Issue 26 item 3: the kubelet server with the kubelet's names and defaults: on in kube
    /// mode on 0.0.0.0:`port` with webhook authentication and authorization (2m, 5m, 30s);
    /// `--enable-server=false` turns it off; the file's `authentication`/`authorization`
    /// blocks and `address`; local mode serves only with a client CA, client certificates
    /// only.
    #[test]
    fn the_kubelet_server_takes_the_kubelets_settings() {
        let dir = tempfile::tempdir().unwrap();
        let kube = |extra: &[&str], yaml: &str| resolve_kube_file(extra, yaml).map(|c| c.server);
        let KubeletServer::Serve(default) = kube(&[], "{}").unwrap() else {
            panic!("kube mode serves by default");
        };
        assert_eq!(default.listen, "0.0.0.0:10250".parse().unwrap());
        assert_eq!(default.authentication, KubeletAuthentication::default());
        assert!(default.authentication.webhook.enabled);
        assert_eq!(default.authorization, KubeletAuthorization::default());
        assert_eq!(default.authorization.mode, AuthorizationMode::Webhook);
        assert_eq!(
            kube(&["--enable-server=false"], "{}").unwrap(),
            KubeletServer::Off
        );
        assert_eq!(
            kube(&[], "enableServer: false\n").unwrap(),
            KubeletServer::Off
        );
        let KubeletServer::Serve(set) = kube(
            &["--port", "10260", "--client-ca-file", "/ca.crt"],
            "address: 10.0.0.1\ntlsCertFile: /s.crt\ntlsPrivateKeyFile: /s.key\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    cacheTTL: 10s\n\
             authorization:\n  mode: AlwaysAllow\n  webhook:\n    cacheUnauthorizedTTL: 1m\n",
        )
        .unwrap() else {
            panic!("configured");
        };
        assert_eq!(set.listen, "10.0.0.1:10260".parse().unwrap());
        assert_eq!(set.tls_cert_file, Some(PathBuf::from("/s.crt")));
        assert_eq!(
            set.authentication.x509.client_ca_file,
            Some(PathBuf::from("/ca.crt"))
        );
        assert!(set.authentication.anonymous.enabled);
        assert_eq!(
            set.authentication.webhook.cache_ttl,
            Duration::from_secs(10)
        );
        assert_eq!(set.authorization.mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(
            set.authorization.webhook.cache_unauthorized_ttl,
            Duration::from_secs(60)
        );
        let err = kube(&["--tls-cert-file", "/s.crt"], "{}").unwrap_err();
        assert!(err.contains("--tls-private-key-file"), "{err}");
        let err = kube(&[], "authorization:\n  mode: RBAC\n").unwrap_err();
        assert!(err.contains("authorization.mode"), "{err}");

        let local = |extra: &[&str]| {
            let mut args = vec![
                "--node-name",
                "n",
                "--root-dir",
                "/r",
                "--local",
                dir.path().to_str().unwrap(),
            ];
            args.extend_from_slice(extra);
            parse(&args).map(|c| c.server)
        };
        assert_eq!(local(&[]).unwrap(), KubeletServer::Off);
        let err = local(&["--enable-server"]).unwrap_err();
        assert!(err.contains("--client-ca-file"), "{err}");
        let KubeletServer::Serve(certs) = local(&["--client-ca-file", "/ca.crt"]).unwrap() else {
            panic!("local mode with a client CA serves");
        };
        assert_eq!(
            certs.authentication,
            KubeletAuthentication::client_certificates_only(PathBuf::from("/ca.crt"))
        );
        assert_eq!(certs.authorization.mode, AuthorizationMode::AlwaysAllow);
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_sets_tunables() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(
            &file,
            format!(
                "nodeName: from-file\nrootDir: /x\nlocal: {}\nstatusSyncPeriodSeconds: 2.5\napiQPS: 5\neventRecordQPS: 7\neventBurst: 9\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let config = parse(&[
            "--config",
            file.to_str().unwrap(),
            "--node-name",
            "from-flag",
        ])
        .unwrap();
        assert_eq!(config.node_name, "from-flag");
        assert_eq!(config.root_dir, PathBuf::from("/x"));
        assert_eq!(config.status_sync_period, Duration::from_millis(2500));
        assert_eq!(config.api_qps, 5.0);
        assert_eq!((config.event_qps, config.event_burst), (7.0, 9));
        assert_eq!(config.mode, Mode::Local(dir.path().to_owned()));
    }

    /// Issue 29: `statusKickIntervalSeconds`: 1 s in local mode, 0 in kube mode (a batch at
    /// every signal, as upstream), 0 allowed, a negative or non-number refused.
    #[test]
    fn status_kick_interval_is_a_second_in_local_mode_and_none_in_kube_mode() {
        let local = |yaml: &str| resolve_file(yaml).map(|c| c.status_kick_interval);
        assert_eq!(local("{}").unwrap(), Duration::from_secs(1));
        assert_eq!(
            local("statusKickIntervalSeconds: 0.25\n").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            local("statusKickIntervalSeconds: 0\n").unwrap(),
            Duration::ZERO
        );
        for bad in ["-1", ".nan", ".inf"] {
            let err = local(&format!("statusKickIntervalSeconds: {bad}\n")).unwrap_err();
            assert!(err.contains("statusKickIntervalSeconds"), "{err}");
        }
        let kube = resolve_kube_file(&[], "{}").unwrap();
        assert_eq!(kube.status_kick_interval, Duration::ZERO);
    }

    /// Item 17: `--read-only-port` / `readOnlyPort` (the kubelet's) set the endpoints' port
    /// over `--listen`'s / `listen`'s, flags over the file; 0 turns them off.
    #[test]
    fn read_only_port_sets_the_endpoints_port_and_0_turns_them_off() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        let local = dir.path().to_str().unwrap();
        let resolve = |text: &str, flags: &[&str]| {
            std::fs::write(&file, text).unwrap();
            let mut args = vec!["--node-name", "n", "--root-dir", "/r", "--local", local];
            args.extend(["--config", file.to_str().unwrap()]);
            args.extend(flags);
            parse(&args).unwrap().read_only
        };
        let at = |addr: &str| ReadOnlyEndpoints::Listen(addr.parse().unwrap());
        assert_eq!(resolve("", &[]), at("127.0.0.1:10255"));
        assert_eq!(resolve("readOnlyPort: 0\n", &[]), ReadOnlyEndpoints::Off);
        assert_eq!(
            resolve("listen: 0.0.0.0:1\nreadOnlyPort: 7\n", &[]),
            at("0.0.0.0:7")
        );
        assert_eq!(
            resolve("", &["--listen", "0.0.0.0:1", "--read-only-port", "0"]),
            ReadOnlyEndpoints::Off
        );
        assert_eq!(
            resolve("readOnlyPort: 0\n", &["--listen", "127.0.0.1:9"]),
            at("127.0.0.1:9"),
            "a flag's port wins over the file's"
        );
        assert_eq!(
            resolve("listen: 0.0.0.0:1\n", &["--read-only-port", "8"]),
            at("0.0.0.0:8")
        );
    }

    /// Issue 26 item 6: the healthz endpoint on 127.0.0.1:10248 by default (the kubelet's
    /// `healthzPort`/`healthzBindAddress`), 0 turns it off, flags over the file, a bad address
    /// refused naming the key.
    #[test]
    fn healthz_port_defaults_to_10248_on_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        let local = dir.path().to_str().unwrap();
        let resolve = |text: &str, flags: &[&str]| {
            std::fs::write(&file, text).unwrap();
            let mut args = vec!["--node-name", "n", "--root-dir", "/r", "--local", local];
            args.extend(["--config", file.to_str().unwrap()]);
            args.extend(flags);
            parse(&args).map(|c| c.healthz)
        };
        let at = |addr: &str| HealthzEndpoint::Listen(addr.parse().unwrap());
        assert_eq!(resolve("", &[]).unwrap(), at("127.0.0.1:10248"));
        assert_eq!(
            resolve("healthzPort: 0\n", &[]).unwrap(),
            HealthzEndpoint::Off
        );
        assert_eq!(
            resolve("healthzBindAddress: 0.0.0.0\nhealthzPort: 7\n", &[]).unwrap(),
            at("0.0.0.0:7")
        );
        assert_eq!(
            resolve(
                "healthzPort: 7\n",
                &["--healthz-port", "9", "--healthz-bind-address", "::1"]
            )
            .unwrap(),
            at("[::1]:9"),
            "flags win over the file"
        );
        assert_eq!(
            resolve("healthzPort: 7\n", &["--healthz-port", "0"]).unwrap(),
            HealthzEndpoint::Off
        );
        let err = resolve("healthzBindAddress: nowhere\n", &[]).unwrap_err();
        assert!(err.to_string().contains("healthzBindAddress"), "{err}");
    }

    /// Issue 25 item 2: the node keys take the kubelet's names and defaults
    /// (`nodeStatusUpdateFrequency` 10s, `nodeStatusReportFrequency` 5m or the update frequency
    /// when only that is set, `nodeLeaseDurationSeconds` 40 renewed every quarter of it,
    /// `maxPods` 110, `port` 10250, `registerWithTaints`), flags over the file.
    /// `evictionHard` (upstream `ParseThresholdConfig`): quantities and percentages; a map
    /// replaces the defaults; an unknown signal or a bad value is refused naming the key.
    #[test]
    fn eviction_hard_replaces_the_defaults_and_refuses_bad_signals() {
        let resolve = resolve_file;
        assert_eq!(
            resolve("").unwrap().eviction_hard,
            EvictionThresholds::default()
        );
        let set = resolve(
            "evictionHard:\n  memory.available: 200Mi\n  nodefs.available: \"1%\"\n  imagefs.available: 15%\n",
        )
        .unwrap()
        .eviction_hard;
        assert_eq!(
            set,
            EvictionThresholds {
                memory_available: Some(Threshold::Quantity(200 << 20)),
                nodefs_available: Some(Threshold::Percentage(0.01)),
                nodefs_inodes_free: None,
                pid_available: None,
            }
        );
        for (text, want) in [
            (
                "evictionHard:\n  disk.available: 1Gi\n",
                "names no eviction signal",
            ),
            (
                "evictionHard:\n  memory.available: lots\n",
                "is no quantity",
            ),
            (
                "evictionHard:\n  nodefs.available: \"120%\"\n",
                "between 0% and 100%",
            ),
        ] {
            let err = resolve(text).unwrap_err().to_string();
            assert!(
                err.contains("evictionHard") && err.contains(want),
                "{text}: {err}"
            );
        }
    }

    /// `allowedUnsafeSysctls` (upstream `NewAllowlist` at the kubelet's start): names and
    /// patterns ending in `*` known to be namespaced are kept; an invalid pattern or a sysctl
    /// not known to be namespaced stops the agent, naming the key.
    #[test]
    fn allowed_unsafe_sysctls_refuses_what_new_allowlist_refuses() {
        let resolve = resolve_file;
        assert!(resolve("").unwrap().allowed_unsafe_sysctls.is_empty());
        assert_eq!(
            resolve("allowedUnsafeSysctls: [\"kernel.msg*\", \"net.core.somaxconn\"]\n")
                .unwrap()
                .allowed_unsafe_sysctls,
            ["kernel.msg*", "net.core.somaxconn"]
        );
        assert_eq!(
            resolve("allowedUnsafeSysctls: [\"vm.swappiness\"]\n").unwrap_err(),
            "config key allowedUnsafeSysctls: the sysctls \"vm.swappiness\" are not known to be \
             namespaced"
        );
        let err = resolve("allowedUnsafeSysctls: [\"net.*.foo\"]\n").unwrap_err();
        assert!(
            err.starts_with("config key allowedUnsafeSysctls: sysctl \"net.*.foo\" must have at most 253 characters and match regex"),
            "{err}"
        );
    }

    #[test]
    fn the_node_keys_take_the_kubelets_names_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        let local = dir.path().to_str().unwrap();
        let resolve = |text: &str, flags: &[&str]| {
            std::fs::write(&file, text).unwrap();
            let mut args = vec!["--node-name", "n", "--root-dir", "/r", "--local", local];
            args.extend(["--config", file.to_str().unwrap()]);
            args.extend(flags);
            parse(&args)
        };
        let defaults = resolve("", &[]).unwrap();
        assert_eq!(
            (
                defaults.node_status_update_frequency,
                defaults.node_status_report_frequency,
                defaults.node_lease_duration_seconds,
                defaults.node_lease_renew_interval,
                defaults.max_pods,
                defaults.port,
                defaults.node_ip.as_str(),
            ),
            (
                Duration::from_secs(10),
                Duration::from_secs(300),
                40,
                Duration::from_secs(10),
                110,
                10250,
                "127.0.0.1"
            )
        );
        assert!(defaults.register_with_taints.is_empty() && defaults.node_labels.is_empty());
        let set = resolve(
            "nodeStatusUpdateFrequency: 1m30s\nnodeLeaseDurationSeconds: 20\nmaxPods: 30\n\
             port: 10251\nnodeIP: 10.0.0.1\nregisterWithTaints:\n\
             - {key: dedicated, value: x, effect: NoSchedule}\n",
            &["--node-ip", "10.0.0.2"],
        )
        .unwrap();
        assert_eq!(set.node_status_update_frequency, Duration::from_secs(90));
        assert_eq!(
            set.node_status_report_frequency,
            Duration::from_secs(90),
            "only the update frequency set: the report frequency follows it"
        );
        assert_eq!(set.node_lease_renew_interval, Duration::from_secs(5));
        assert_eq!((set.max_pods, set.port), (30, 10251));
        assert_eq!(set.node_ip, "10.0.0.2", "the flag wins");
        assert_eq!(set.register_with_taints[0].key, "dedicated");
        assert_eq!(set.register_with_taints[0].value.as_deref(), Some("x"));
        let both = resolve(
            "nodeStatusUpdateFrequency: 500ms\nnodeStatusReportFrequency: 1h\n",
            &[
                "--register-with-taints",
                "a=b:NoExecute,c:PreferNoSchedule",
                "--port",
                "9",
            ],
        )
        .unwrap();
        assert_eq!(
            both.node_status_update_frequency,
            Duration::from_millis(500)
        );
        assert_eq!(both.node_status_report_frequency, Duration::from_secs(3600));
        assert_eq!(both.port, 9);
        let taints: Vec<(String, Option<String>, String)> = both
            .register_with_taints
            .into_iter()
            .map(|t| (t.key, t.value, t.effect))
            .collect();
        assert_eq!(
            taints,
            [
                ("a".into(), Some("b".into()), "NoExecute".into()),
                ("c".into(), None, "PreferNoSchedule".into())
            ]
        );
        for (text, flags, expected) in [
            (
                "nodeStatusUpdateFrequency: 10\n",
                &[][..],
                "nodeStatusUpdateFrequency",
            ),
            (
                "nodeStatusReportFrequency: 0s\n",
                &[][..],
                "nodeStatusReportFrequency",
            ),
            ("maxPods: 0\n", &[][..], "maxPods"),
            (
                "nodeLeaseDurationSeconds: 0\n",
                &[][..],
                "nodeLeaseDurationSeconds",
            ),
            (
                "",
                &["--register-with-taints", "a=b:Sometimes"][..],
                "effect",
            ),
            ("", &["--node-ip", "x"][..], "--node-ip"),
        ] {
            let err = resolve(text, flags).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }

    /// Issue 25 item 2 (upstream `ValidateKubeletFlags`): a `--node-labels` label that the
    /// NodeRestriction admission plugin would refuse stops the agent at start with upstream's
    /// message; allowed labels go to the Node.
    #[test]
    fn node_labels_that_node_restriction_refuses_are_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().to_str().unwrap();
        let with = |labels: &str| {
            parse(&[
                "--node-name",
                "n",
                "--root-dir",
                "/r",
                "--local",
                local,
                "--node-labels",
                labels,
            ])
        };
        let ok = with("node.kubernetes.io/pool=a,example.com/team=blue").unwrap();
        assert_eq!(ok.node_labels["node.kubernetes.io/pool"], "a");
        assert_eq!(ok.node_labels["example.com/team"], "blue");
        let err = with("node-role.kubernetes.io/worker=,example.com/team=blue").unwrap_err();
        assert!(
            err.starts_with(
                "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: \
                 [node-role.kubernetes.io/worker]"
            ),
            "{err}"
        );
        let err = with("node-restriction.kubernetes.io/pool=a").unwrap_err();
        assert!(err.contains("node-restriction.kubernetes.io/pool"), "{err}");
        let err = with("bad key=a").unwrap_err();
        assert!(err.contains("invalid node labels"), "{err}");
        let err = with("novalue").unwrap_err();
        assert!(err.contains("key=value"), "{err}");
    }

    #[test]
    fn go_durations_parse_as_go_does() {
        for (text, expected) in [
            ("10s", Duration::from_secs(10)),
            ("5m", Duration::from_secs(300)),
            ("5m0s", Duration::from_secs(300)),
            ("1h1m1s", Duration::from_secs(3661)),
            ("1.5s", Duration::from_millis(1500)),
            ("250ms", Duration::from_millis(250)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(go_duration("k", text).unwrap(), expected, "{text}");
        }
        for text in ["", "10", "s", "1x", "1s2"] {
            assert!(go_duration("k", text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        let local = dir.path().display();
        for (text, key) in [
            (format!("local: {local}\napiQPS: -1\n"), "apiQPS"),
            (
                format!("local: {local}\neventRecordQPS: 0\n"),
                "eventRecordQPS",
            ),
            (format!("local: {local}\neventBurst: 0\n"), "eventBurst"),
            (format!("local: {local}\nnodeIP: nope\n"), "nodeIP"),
            (
                format!("local: {local}\nstatusSyncPeriodSeconds: 0\n"),
                "statusSyncPeriodSeconds",
            ),
            (format!("local: {local}\nnoSuchKey: 1\n"), "noSuchKey"),
        ] {
            std::fs::write(&file, text).unwrap();
            let err = parse(&[
                "--config",
                file.to_str().unwrap(),
                "--node-name",
                "n",
                "--root-dir",
                "/r",
            ])
            .unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }

    /// Issue 27: the device plugins' directory is `<root>/device-plugins` unless
    /// `devicePluginsDir` says otherwise, and must be absolute.
    #[test]
    fn the_device_plugins_dir_defaults_under_the_root() {
        let resolve = resolve_file;
        assert_eq!(
            resolve("").unwrap().device_plugins_dir,
            PathBuf::from("/r/device-plugins")
        );
        assert_eq!(
            resolve("devicePluginsDir: /var/lib/kubelet/device-plugins\n")
                .unwrap()
                .device_plugins_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
        let err = resolve("devicePluginsDir: plugins\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("devicePluginsDir"), "{err}");
    }

    /// Issue 26 item 3: the container log keys take the kubelet's names and defaults (the
    /// directories under the root unless configured) and refuse what upstream's validation
    /// refuses; a negative size turns rotation off.
    #[test]
    fn the_container_log_keys_take_the_kubelets_names_and_defaults() {
        let resolve = resolve_file;
        let defaults = resolve("").unwrap().logs;
        assert_eq!(
            defaults,
            LogSettings {
                pod_logs_dir: "/r/pod-logs".into(),
                container_logs_dir: "/r/container-logs".into(),
                rotation: LogRotation::Rotate(ContainerLogManagerConfig {
                    policy: LogRotatePolicy::new(10 * 1024 * 1024, 5).unwrap(),
                    monitor_interval: Duration::from_secs(10),
                    max_workers: 1,
                }),
            }
        );
        let set = resolve(
            "podLogsDir: /var/log/pods\ncontainerLogsDir: /var/log/containers\n\
             containerLogMaxSize: 1Ki\ncontainerLogMaxFiles: 2\ncontainerLogMaxWorkers: 3\n\
             containerLogMonitorInterval: 1m\n",
        )
        .unwrap()
        .logs;
        assert_eq!(
            set,
            LogSettings {
                pod_logs_dir: "/var/log/pods".into(),
                container_logs_dir: "/var/log/containers".into(),
                rotation: LogRotation::Rotate(ContainerLogManagerConfig {
                    policy: LogRotatePolicy::new(1024, 2).unwrap(),
                    monitor_interval: Duration::from_secs(60),
                    max_workers: 3,
                }),
            }
        );
        assert_eq!(
            resolve("containerLogMaxSize: \"-1\"\n")
                .unwrap()
                .logs
                .rotation,
            LogRotation::Off
        );
        for (text, want) in [
            ("podLogsDir: logs\n", "must be absolute path"),
            ("podLogsDir: /var/log/../pods\n", "must be normalized"),
            ("containerLogsDir: /a/./b\n", "must be normalized"),
            ("containerLogsDir: /a//b\n", "must be normalized"),
            ("podLogsDir: /a/b/\n", "must be normalized"),
            ("containerLogMaxSize: ten\n", "containerLogMaxSize"),
            (
                "containerLogMaxFiles: 1\n",
                "invalid MaxFiles 1, must be > 1",
            ),
            ("containerLogMaxWorkers: 0\n", "containerLogMaxWorkers"),
            (
                "containerLogMonitorInterval: 2s\n",
                "greater than or equal to 3s",
            ),
        ] {
            let err = resolve(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn without_a_cluster_or_local_mode_it_says_what_to_give() {
        let err = parse(&["--node-name", "n", "--root-dir", "/r"]).unwrap_err();
        assert!(err.contains("--local DIR or --kubeconfig FILE"), "{err}");
        let err = parse(&["--root-dir", "/r", "--local", "/"]).unwrap_err();
        assert!(err.contains("--node-name"), "{err}");
        let err = parse(&[
            "--node-name",
            "Bad_Name",
            "--root-dir",
            "/r",
            "--local",
            "/",
        ])
        .unwrap_err();
        assert!(err.contains("RFC 1123"), "{err}");
    }
}
