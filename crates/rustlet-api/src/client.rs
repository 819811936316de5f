//! The agent's API clients: the kubelet's client-side rate limit ([`RateLimitLayer`]) around
//! kube's stack, and a choice about kube's own retries.
//!
//! As upstream (`cmd/kubelet/app/server.go`: `KubeClient`, `EventClient`, `HeartbeatClient`),
//! the agent talks to the API server through three clients of one configuration
//! ([`build_clients`]), so that no kind of traffic waits behind another:
//!
//! * the main client (QPS 50 / burst 100): watches, pod statuses, mirror pods, objects;
//! * the event client, with a bucket of its own (`eventRecordQPS` 50 / `eventBurst` 100):
//!   a flood of events never takes the tokens status writes need;
//! * the heartbeat client, not rate limited and with a deadline: the node Lease and the node
//!   status, which must reach the API server on time however busy the rest is (a late Lease
//!   makes the node NotReady and its pods evicted).
//!
//! kube 5 retries 429, 503 and 504 by itself (up to 15 times, `RetryPolicy::server_retry`),
//! inside the rate limiter, so those retries are not charged to the bucket and stack under the
//! status manager's own backoff. [`KubeRetries::Off`] leaves one retry policy, the callers'.

use std::time::Duration;

use crate::rate_limit::RateLimitLayer;

/// Whether kube's built-in retries of 429/503/504 stay on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KubeRetries {
    /// kube's default: retried inside the client, not seen by the caller.
    #[default]
    Kube,
    /// Every answer reaches the caller, who retries (the status manager backs off itself).
    Off,
}

/// How the clients are built.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// Requests per second after the burst (kubelet `kubeAPIQPS`, 50).
    pub qps: f64,
    /// Requests at once (kubelet `kubeAPIBurst`, 100).
    pub burst: u32,
    /// kube's own retries.
    pub retries: KubeRetries,
    /// The event client's requests per second after its burst (kubelet `eventRecordQPS`, 50).
    pub event_qps: f64,
    /// The event client's requests at once (kubelet `eventBurst`, 100).
    pub event_burst: u32,
    /// The deadline of each heartbeat request (upstream: the node status update frequency,
    /// at most the lease duration; 10 s).
    pub heartbeat_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            qps: 50.0,
            burst: 100,
            retries: KubeRetries::Kube,
            event_qps: 50.0,
            event_burst: 100,
            heartbeat_timeout: Duration::from_secs(10),
        }
    }
}

/// Which of the agent's clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    /// Everything but events and heartbeats.
    Main,
    /// Events.
    Events,
    /// The node Lease and the node status.
    Heartbeat,
}

impl ClientConfig {
    /// The rate limit of one client; every layer has a bucket of its own.
    pub fn rate_limit(&self, kind: ClientKind) -> RateLimitLayer {
        match kind {
            ClientKind::Main => RateLimitLayer::new(self.qps, self.burst),
            ClientKind::Events => RateLimitLayer::new(self.event_qps, self.event_burst),
            // upstream: heartbeatClientConfig.QPS = -1 (no client-side limit).
            ClientKind::Heartbeat => RateLimitLayer::new(f64::INFINITY, 1),
        }
    }
}

/// The three clients of an agent (see the module doc).
#[derive(Clone)]
pub struct ApiClients {
    /// Watches, statuses, mirror pods, objects.
    pub main: kube::Client,
    /// Events, under a bucket of their own.
    pub events: kube::Client,
    /// The node Lease and the node status: no rate limit, a deadline.
    pub heartbeat: kube::Client,
}

impl std::fmt::Debug for ApiClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClients").finish_non_exhaustive()
    }
}

impl ApiClients {
    /// The three clients, each made by `make` around its own [`ClientConfig::rate_limit`]
    /// ([`build_clients`] over kube's stack; tests over an in-process transport).
    pub fn make<E>(
        options: &ClientConfig,
        mut make: impl FnMut(ClientKind, RateLimitLayer) -> Result<kube::Client, E>,
    ) -> Result<Self, E> {
        let mut client = |kind| make(kind, options.rate_limit(kind));
        Ok(Self {
            main: client(ClientKind::Main)?,
            events: client(ClientKind::Events)?,
            heartbeat: client(ClientKind::Heartbeat)?,
        })
    }
}

/// One client from a kube `Config` (from a kubeconfig or in-cluster) under the main rate limit.
pub fn build_client(
    config: kube::Config,
    options: &ClientConfig,
) -> Result<kube::Client, kube::Error> {
    build_one(
        config,
        options,
        ClientKind::Main,
        &options.rate_limit(ClientKind::Main),
    )
}

fn build_one(
    mut config: kube::Config,
    options: &ClientConfig,
    kind: ClientKind,
    limit: &RateLimitLayer,
) -> Result<kube::Client, kube::Error> {
    config.default_retry = options.retries == KubeRetries::Kube;
    if kind == ClientKind::Heartbeat {
        // upstream: heartbeatClientConfig.Timeout, the whole request's deadline; kube's are
        // per phase.
        config.connect_timeout = Some(options.heartbeat_timeout);
        config.read_timeout = Some(options.heartbeat_timeout);
        config.write_timeout = Some(options.heartbeat_timeout);
    }
    if let Ok(agent) = http::HeaderValue::from_str(&user_agent()) {
        config
            .headers
            .retain(|(name, _)| *name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, agent));
    }
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(limit).build())
}

/// The agent's `User-Agent` on every API request, in the shape of upstream's
/// (`kubelet/v1.37.2 (linux/amd64) kubernetes/<commit>`, client-go's `DefaultKubernetesUserAgent`):
/// `rustlet/<version> (<os>/<arch>) kubernetes/<the release it speaks>`, so that the API
/// server's audit log and metrics tell the agent's requests from others'.
pub fn user_agent() -> String {
    let (os, arch) = rustlet_core::node_status::go_os_arch();
    format!(
        "rustlet/{} ({os}/{arch}) kubernetes/{}",
        env!("CARGO_PKG_VERSION"),
        crate::node::KUBELET_VERSION
    )
}

/// The agent's three clients from one kube `Config` (upstream: the kubelet's kube, event and
/// heartbeat clients).
pub fn build_clients(
    config: kube::Config,
    options: &ClientConfig,
) -> Result<ApiClients, kube::Error> {
    ApiClients::make(options, |kind, limit| {
        build_one(config.clone(), options, kind, &limit)
    })
}

#[cfg(test)]
mod user_agent_tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Every client of the agent names itself (upstream's kubelet sends
    /// `kubelet/<version> (<os>/<arch>) kubernetes/<commit>`): the API server's audit log and
    /// its per-client figures need it.
    #[tokio::test]
    async fn every_api_request_carries_the_agents_user_agent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                conn.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
            let answer = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        let clients = build_clients(config, &ClientConfig::default()).unwrap();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(clients.main.clone(), "default");
        assert!(pods.get("x").await.is_err());
        let head = server.await.unwrap().to_lowercase();
        let want = format!("user-agent: {}\r\n", user_agent().to_lowercase());
        assert!(head.contains(&want), "{head}");
        assert!(user_agent().starts_with("rustlet/"), "{}", user_agent());
        assert!(user_agent().ends_with(&format!("kubernetes/{}", crate::node::KUBELET_VERSION)));
    }
}
