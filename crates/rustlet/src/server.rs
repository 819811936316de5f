//! The kubelet server (:10250) wired to the agent: the pods and their statuses, the runtime's
//! log files and stream URLs behind `rustlet_server::routes::NodeApi`; TLS and the kubelet's
//! authentication and authorization in front.

use std::sync::Arc;

use anyhow::{Context, Result};
use axum::http::Uri;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_api::PodCache;
use rustlet_core::PodUid;
use rustlet_pods::Runtime;
use rustlet_pods::runtime::{InstanceState, RuntimeError, Streams};
use rustlet_server::auth::{AuthLayer, AuthSettings, AuthorizationMode, KubeletAuth, Reviewers};
use rustlet_server::logs::ContainerRunning;
use rustlet_server::logs::reader::StatusError;
use rustlet_server::metrics::probes::ProbeCount;
use rustlet_server::routes::{ContainerLogSource, NodeApi, NodeApiError, StreamOptions, router};
use rustlet_server::stats::summary::Summary;
use rustlet_server::streaming::ProxyConfig;
use rustlet_server::tls::{
    CLIENT_CA_RELOAD_INTERVAL, ServeOptions, ServingCertificate, TlsSettings, serve, server_config,
};
use rustlet_status::StatusManager;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{AgentConfig, HealthzEndpoint, LogRotation, ReadOnlyEndpoints, ServerSettings};

/// What the routes read: the pod cache, the status manager, the runtime.
pub struct NodeServer {
    /// This node's pods.
    pub pods: Arc<PodCache>,
    /// Their statuses.
    pub status: Arc<StatusManager>,
    /// The runtime.
    pub runtime: Arc<dyn Runtime>,
    /// `/configz`'s `kubeletconfig`.
    pub configz: serde_json::Value,
    /// `/stats/summary` and `/metrics/resource`.
    pub stats: Arc<crate::stats::StatsProvider>,
    /// `/metrics/probes`.
    pub probe_counts: Arc<rustlet_pods::prober::ProbeCounts>,
    /// `/metrics`: the agent's registry, as the read-only port serves it.
    pub metrics: crate::http::AgentMetrics,
}

fn node_error(e: RuntimeError) -> NodeApiError {
    match e {
        RuntimeError::NotFound { .. } => NodeApiError::NotFound(e.to_string()),
        RuntimeError::Unsupported { .. } => NodeApiError::Unsupported(e.to_string()),
        other => NodeApiError::Runtime(other.to_string()),
    }
}

fn parse_url(url: &str) -> Result<Uri, NodeApiError> {
    url.parse()
        .map_err(|e| NodeApiError::Runtime(format!("the runtime's stream URL {url:?}: {e}")))
}

/// The running instance of `container` as the pod's status names it. Upstream's
/// `findContainer` asks the runtime's pod list; the status the status manager holds is the
/// runtime's, one relist later at most. None is upstream's plain `container not found (...)`
/// error, which `streaming.WriteError` answers with a 500 (only the runtime's gRPC NotFound
/// is a 404).
fn running_container_id(pod: &Pod, container: &str) -> Result<String, NodeApiError> {
    let status = pod.status.as_ref();
    let lists: [Option<&Vec<ContainerStatus>>; 3] = [
        status.and_then(|s| s.container_statuses.as_ref()),
        status.and_then(|s| s.init_container_statuses.as_ref()),
        status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
    ];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .find(|s| s.name == container && s.state.as_ref().is_some_and(|st| st.running.is_some()))
        .and_then(|s| s.container_id.clone())
        .ok_or_else(|| NodeApiError::Runtime(format!("container not found ({container:?})")))
}

fn streams(s: StreamOptions) -> Streams {
    Streams {
        stdin: s.stdin,
        stdout: s.stdout,
        stderr: s.stderr,
        tty: s.tty,
    }
}

/// "Is this instance still running?" through CRI `ContainerStatus`.
struct InstanceRunning {
    runtime: Arc<dyn Runtime>,
    id: String,
}

#[async_trait::async_trait]
impl ContainerRunning for InstanceRunning {
    async fn is_running(&self) -> Result<bool, StatusError> {
        match self.runtime.container_log(&self.id).await {
            Ok(info) => Ok(info.running),
            // A removed instance runs no more.
            Err(RuntimeError::NotFound { .. }) => Ok(false),
            Err(e) => Err(Box::new(e)),
        }
    }
}

#[async_trait::async_trait]
impl NodeApi for NodeServer {
    async fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .pods
            .pods()
            .into_iter()
            .map(|pod| {
                let mut pod = Pod::clone(&pod);
                if let Some(status) = self.status.get_pod_status(&PodUid::of(&pod)) {
                    pod.status = Some(status);
                }
                pod
            })
            .collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }

    /// Deviation: upstream lists every pod the runtime has (`GetPods(true)`); here the pods
    /// the node knows that have a sandbox or a running container (orphans are stopped by the
    /// housekeeping and not shown).
    async fn running_pods(&self) -> Vec<Pod> {
        let mut out = Vec::new();
        for pod in self.pods.pods() {
            let status = self.runtime.pod_status(&PodUid::of(&pod)).await;
            let containers: Vec<Container> = status
                .containers
                .iter()
                .filter(|c| matches!(c.state, InstanceState::Running { .. }))
                .map(|c| Container {
                    name: c.name.clone(),
                    image: Some(c.image.clone()),
                    ..Container::default()
                })
                .collect();
            if status.sandbox.is_none() && containers.is_empty() {
                continue;
            }
            out.push(Pod {
                metadata: ObjectMeta {
                    name: pod.metadata.name.clone(),
                    namespace: pod.metadata.namespace.clone(),
                    uid: pod.metadata.uid.clone(),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers,
                    ..PodSpec::default()
                }),
                status: None,
            });
        }
        out
    }

    fn configz(&self) -> serde_json::Value {
        self.configz.clone()
    }

    async fn container_log(
        &self,
        _pod: &Pod,
        container_id: &str,
    ) -> Result<ContainerLogSource, NodeApiError> {
        let info = self
            .runtime
            .container_log(container_id)
            .await
            .map_err(node_error)?;
        Ok(ContainerLogSource {
            path: info.path,
            running: Box::new(InstanceRunning {
                runtime: self.runtime.clone(),
                id: container_id.to_owned(),
            }),
        })
    }

    async fn exec_url(
        &self,
        pod: &Pod,
        container: &str,
        cmd: Vec<String>,
        options: StreamOptions,
    ) -> Result<Uri, NodeApiError> {
        let id = running_container_id(pod, container)?;
        let url = self
            .runtime
            .exec_stream(&id, &cmd, streams(options))
            .await
            .map_err(node_error)?;
        parse_url(&url)
    }

    async fn attach_url(
        &self,
        pod: &Pod,
        container: &str,
        options: StreamOptions,
    ) -> Result<Uri, NodeApiError> {
        let id = running_container_id(pod, container)?;
        let url = self
            .runtime
            .attach_stream(&id, streams(options))
            .await
            .map_err(node_error)?;
        parse_url(&url)
    }

    /// upstream: `RunInContainer` (no timeout), the runtime manager's `RunInContainer` (CRI
    /// `ExecSync`, stdout then stderr) and the CRI client's `ExecSync` (a non-zero exit is
    /// an error with upstream's wording). Deviation: the runtime hands stdout and stderr back
    /// as one, so the error shows both where upstream's shows stderr alone.
    async fn run_in_container(
        &self,
        pod: &Pod,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, NodeApiError> {
        let id = running_container_id(pod, container)?;
        let out = self
            .runtime
            .exec_sync(&id, &cmd, std::time::Duration::ZERO)
            .await
            .map_err(node_error)?;
        if out.exit_code != 0 {
            return Err(NodeApiError::Runtime(format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                out.exit_code,
                out.output
            )));
        }
        Ok(out.output.into_bytes())
    }

    async fn port_forward_url(&self, pod: &Pod, ports: Vec<i32>) -> Result<Uri, NodeApiError> {
        let url = self
            .runtime
            .port_forward_stream(&PodUid::of(pod), &ports)
            .await
            .map_err(node_error)?;
        parse_url(&url)
    }

    async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, NodeApiError> {
        self.stats
            .summary(only_cpu_and_memory)
            .await
            .map_err(NodeApiError::Runtime)
    }

    async fn cadvisor_metrics(&self) -> Result<String, NodeApiError> {
        self.stats.cadvisor().await.map_err(NodeApiError::Runtime)
    }

    fn metrics_text(&self) -> Option<String> {
        self.metrics.render().ok()
    }

    fn probe_counts(&self) -> Vec<ProbeCount> {
        self.probe_counts
            .snapshot()
            .into_iter()
            .map(|(s, count)| ProbeCount {
                probe_type: s.probe_type.to_owned(),
                result: s.result.to_owned(),
                container: s.container,
                pod: s.pod,
                namespace: s.namespace,
                pod_uid: s.pod_uid,
                count,
            })
            .collect()
    }
}

/// `/configz`'s `kubeletconfig`: the settings a user asks the node about, with the kubelet's
/// names.
pub fn configz(config: &AgentConfig, server: &ServerSettings) -> serde_json::Value {
    let read_only_port = match config.read_only {
        ReadOnlyEndpoints::Off => 0,
        ReadOnlyEndpoints::Listen(addr) => addr.port(),
    };
    let authn = &server.authentication;
    let authz = &server.authorization;
    let (healthz_port, healthz_address) = match config.healthz {
        HealthzEndpoint::Off => (0, String::new()),
        HealthzEndpoint::Listen(addr) => (addr.port(), addr.ip().to_string()),
    };
    let rotation = match config.logs.rotation {
        LogRotation::Off => None,
        LogRotation::Rotate(r) => Some(r),
    };
    serde_json::json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "staticPodPath": config.pod_manifest_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        "address": server.listen.ip().to_string(),
        "port": server.listen.port(),
        "readOnlyPort": read_only_port,
        "tlsCertFile": server.tls_cert_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        "tlsPrivateKeyFile": server.tls_private_key_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        "authentication": {
            "x509": {"clientCAFile": authn.x509.client_ca_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default()},
            "webhook": {"enabled": authn.webhook.enabled, "cacheTTL": go_duration(authn.webhook.cache_ttl)},
            "anonymous": {"enabled": authn.anonymous.enabled},
        },
        "authorization": {
            "mode": match authz.mode {
                AuthorizationMode::AlwaysAllow => "AlwaysAllow",
                AuthorizationMode::Webhook => "Webhook",
            },
            "webhook": {
                "cacheAuthorizedTTL": go_duration(authz.webhook.cache_authorized_ttl),
                "cacheUnauthorizedTTL": go_duration(authz.webhook.cache_unauthorized_ttl),
            },
        },
        "maxPods": config.max_pods,
        "nodeStatusUpdateFrequency": go_duration(config.node_status_update_frequency),
        "nodeStatusReportFrequency": go_duration(config.node_status_report_frequency),
        "healthzPort": healthz_port,
        "healthzBindAddress": healthz_address,
        "streamingConnectionIdleTimeout": go_duration(server.streaming_connection_idle_timeout.unwrap_or_default()),
        "podLogsDir": config.logs.pod_logs_dir.display().to_string(),
        "containerLogMaxSize": rotation.map_or_else(|| "-1".to_owned(), |r| quantity(r.policy.max_size)),
        "containerLogMaxFiles": rotation.map_or(5, |r| r.policy.max_files),
        "containerLogMaxWorkers": rotation.map_or(1, |r| r.max_workers),
        "containerLogMonitorInterval": go_duration(rotation.map_or(std::time::Duration::from_secs(10), |r| r.monitor_interval)),
        "cgroupsPerQOS": config.pod_cgroup_root.is_some(),
        "cgroupRoot": config.pod_cgroup_root.clone().unwrap_or_default(),
        "cgroupDriver": "cgroupfs",
        "kubeletCgroups": config.system_cgroups.kubelet.clone().unwrap_or_default(),
        "systemCgroups": config.system_cgroups.system.clone().unwrap_or_default(),
    })
}

/// A byte count as the kubelet's configuration writes a quantity (`10Mi`, `512Ki`, `7`).
fn quantity(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "Ti"),
        (1 << 30, "Gi"),
        (1 << 20, "Mi"),
        (1 << 10, "Ki"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
        .map_or_else(
            || bytes.to_string(),
            |(unit, name)| format!("{}{name}", bytes / unit),
        )
}

/// Go's `time.Duration.String()` for whole seconds and minutes (`2m0s`, `30s`).
fn go_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// Binds `settings.listen`, builds TLS and the kubelet's authentication and authorization
/// (through `client` in kube mode; none in local mode), and serves `node` until `cancel`.
pub async fn start(
    config: &AgentConfig,
    settings: &ServerSettings,
    client: Option<kube::Client>,
    node: Arc<dyn NodeApi>,
    cancel: CancellationToken,
) -> Result<JoinHandle<()>> {
    let auth = KubeletAuth::new(AuthSettings {
        node_name: config.node_name.clone(),
        authentication: settings.authentication.clone(),
        authorization: settings.authorization.clone(),
        reviewers: client.map_or(Reviewers::None, Reviewers::kube),
    })
    .context("the kubelet server's authentication and authorization")?;
    let node_ip = config.node_ip.parse().ok();
    let cert = ServingCertificate::resolve(&TlsSettings {
        tls_cert_file: settings.tls_cert_file.clone(),
        tls_private_key_file: settings.tls_private_key_file.clone(),
        cert_dir: config.root_dir.join("pki"),
        host: config.node_name.clone(),
        extra_ips: node_ip.into_iter().collect(),
    })
    .context("the kubelet server's serving certificate")?;
    info!(cert = %cert.cert_file.display(), source = ?cert.source, "kubelet server certificate");
    let tls = server_config(cert, auth.client_ca()).context("the kubelet server's TLS")?;
    if let Some(ca) = auth.client_ca() {
        tokio::spawn(ca.clone().reload_periodically(CLIENT_CA_RELOAD_INTERVAL));
    }
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("the kubelet server on --address/--port {}", settings.listen))?;
    let proxy = ProxyConfig {
        idle_timeout: settings.streaming_connection_idle_timeout,
        ..ProxyConfig::default()
    };
    let app = router(node, proxy).layer(AuthLayer::new(Arc::new(auth)));
    info!(listen = %settings.listen, "kubelet server listening");
    Ok(tokio::spawn(async move {
        let stop = async move { cancel.cancelled().await };
        if let Err(e) = serve(listener, ServeOptions::new(tls), app, stop).await {
            warn!("kubelet server: {e}");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream `GetExec`/`GetAttach`/`RunInContainer`: a container that does not run is
    /// `container not found ("c")`, a plain error (HTTP 500), not the runtime's NotFound.
    #[test]
    fn a_container_that_does_not_run_is_not_found_as_upstreams_plain_error() {
        let pod = Pod {
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "main".into(),
                    container_id: Some("containerd://abc".into()),
                    state: Some(k8s_openapi::api::core::v1::ContainerState {
                        running: Some(Default::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            running_container_id(&pod, "main").unwrap(),
            "containerd://abc"
        );
        match running_container_id(&pod, "side") {
            Err(NodeApiError::Runtime(message)) => {
                assert_eq!(message, "container not found (\"side\")");
            }
            other => panic!("{other:?}"),
        }
    }

    /// `/configz` shows the healthz endpoint, the streams' idle timeout, the container log
    /// keys and the cgroup keys with the kubelet's names and forms (a quantity, Go durations).
    #[test]
    fn configz_shows_the_healthz_streaming_and_container_log_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.yaml");
        std::fs::write(
            &file,
            "containerLogMaxSize: 5Mi\ncontainerLogMaxFiles: 3\nstreamingConnectionIdleTimeout: 30m\n\
             healthzPort: 7\ncgroupsPerQOS: true\ncgroupRoot: /r\nkubeletCgroups: /r/kubelet\n",
        )
        .unwrap();
        let cli = <crate::config::Cli as clap::Parser>::try_parse_from([
            "rustlet",
            "--node-name",
            "n",
            "--root-dir",
            "/r",
            "--local",
            dir.path().to_str().unwrap(),
            "--config",
            file.to_str().unwrap(),
            "--client-ca-file",
            "/ca.crt",
        ])
        .unwrap();
        let config = AgentConfig::resolve(cli, false).unwrap();
        let crate::config::KubeletServer::Serve(settings) = &config.server else {
            panic!("the server is on with a client CA");
        };
        let z = configz(&config, settings);
        assert_eq!(z["containerLogMaxSize"], "5Mi");
        assert_eq!(z["containerLogMaxFiles"], 3);
        assert_eq!(z["containerLogMaxWorkers"], 1);
        assert_eq!(z["containerLogMonitorInterval"], "10s");
        assert_eq!(z["streamingConnectionIdleTimeout"], "30m0s");
        assert_eq!(z["healthzPort"], 7);
        assert_eq!(z["healthzBindAddress"], "127.0.0.1");
        assert_eq!(z["podLogsDir"], "/r/pod-logs");
        // The cgroups the e2e_node suite reads back (`recordSystemCgroupProcesses`, the
        // Kubelet Cgroup Manager specs).
        assert_eq!(z["cgroupsPerQOS"], true);
        assert_eq!(z["cgroupRoot"], "/r");
        assert_eq!(z["cgroupDriver"], "cgroupfs");
        assert_eq!(z["kubeletCgroups"], "/r/kubelet");
        assert_eq!(z["systemCgroups"], "");
        assert_eq!(quantity(10 << 20), "10Mi");
        assert_eq!(quantity(1000), "1000");
    }

    /// `/configz` shows Go's duration text, as the kubelet's `metav1.Duration` does.
    #[test]
    fn configz_durations_are_gos() {
        assert_eq!(go_duration(std::time::Duration::from_secs(120)), "2m0s");
        assert_eq!(go_duration(std::time::Duration::from_secs(30)), "30s");
        assert_eq!(
            go_duration(std::time::Duration::from_secs(4 * 3600)),
            "4h0m0s"
        );
    }
}
