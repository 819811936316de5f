//! The command line and the configuration file, resolved into one [`AgentConfig`]. Flags win
//! over the file; every bad value is one clear error naming it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
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
    /// Static pods: one pod per manifest file in DIR, run on this node whatever the API says
    /// (as the kubelet's); in kube mode each gets a mirror pod in the API that carries its status.
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<PathBuf>,
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
    /// Deadline of each API call of the status manager, in seconds (10).
    api_request_timeout_seconds: Option<f64>,
    /// Kube mode: how often the node Lease is renewed, in seconds (kubelet 10).
    node_lease_renew_interval_seconds: Option<f64>,
    /// How long a simulated container takes to start, in milliseconds (0).
    simulated_start_delay_millis: Option<u64>,
    /// First simulated pod IP (10.88.0.2).
    #[serde(rename = "simulatedPodIPBase")]
    simulated_pod_ip_base: Option<String>,
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
    /// Deadline of each status API call.
    pub api_request_timeout: Duration,
    /// How often the node Lease is renewed.
    pub node_lease_renew_interval: Duration,
    /// Simulated container start delay.
    pub simulated_start_delay: Duration,
    /// First simulated pod IP.
    pub simulated_pod_ip_base: std::net::Ipv4Addr,
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
        let file = match &cli.config {
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
        let node_ip = file.node_ip.unwrap_or_else(|| "127.0.0.1".into());
        if node_ip.parse::<std::net::IpAddr>().is_err() {
            return Err(bad(format!(
                "config key nodeIP: {node_ip:?} is not an IP address"
            )));
        }
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
            api_request_timeout: seconds(
                "apiRequestTimeoutSeconds",
                file.api_request_timeout_seconds,
                Duration::from_secs(10),
            )?,
            node_lease_renew_interval: seconds(
                "nodeLeaseRenewIntervalSeconds",
                file.node_lease_renew_interval_seconds,
                Duration::from_secs(10),
            )?,
            simulated_start_delay: Duration::from_millis(
                file.simulated_start_delay_millis.unwrap_or(0),
            ),
            simulated_pod_ip_base,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<AgentConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("rustlet").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        AgentConfig::resolve(cli, false).map_err(|e| e.to_string())
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
