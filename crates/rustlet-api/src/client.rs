//! The one `kube::Client` every adapter shares: the kubelet's client-side rate limit
//! ([`RateLimitLayer`], QPS 50 / burst 100 by default) around kube's stack, and a choice about
//! kube's own retries.
//!
//! kube 5 retries 429, 503 and 504 by itself (up to 15 times, `RetryPolicy::server_retry`),
//! inside the rate limiter, so those retries are not charged to the bucket and stack under the
//! status manager's own backoff. [`KubeRetries::Off`] leaves one retry policy, the callers'.

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

/// How the shared client is built.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// Requests per second after the burst (kubelet `kubeAPIQPS`, 50).
    pub qps: f64,
    /// Requests at once (kubelet `kubeAPIBurst`, 100).
    pub burst: u32,
    /// kube's own retries.
    pub retries: KubeRetries,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            qps: 50.0,
            burst: 100,
            retries: KubeRetries::Kube,
        }
    }
}

/// Build the shared client from a kube `Config` (from a kubeconfig or in-cluster).
pub fn build_client(
    mut config: kube::Config,
    options: &ClientConfig,
) -> Result<kube::Client, kube::Error> {
    config.default_retry = options.retries == KubeRetries::Kube;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&RateLimitLayer::new(options.qps, options.burst))
        .build())
}
