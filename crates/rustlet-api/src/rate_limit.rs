//! Client-side rate limiting shared by every caller of one `kube::Client` (kubelet `kubeAPIQPS`
//! 50 and `kubeAPIBurst` 100): a tower layer that takes a token from
//! `rustlet_status::RateLimiter` before each request.
//!
//! [`crate::client::build_client`] puts it around kube's stack.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustlet_status::RateLimiter;
use tower::{Layer, Service};

/// The layer; clones share one bucket.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: Arc<RateLimiter>,
}

impl RateLimitLayer {
    /// `burst` requests at once, then `qps` per second.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            limiter: Arc::new(RateLimiter::new(qps, burst)),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            waiting: None,
            has_token: false,
        }
    }
}

/// A service that is not ready until it holds a token (tower's readiness is the reservation,
/// so the inner service is called directly and need not be `Clone`).
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    has_token: bool,
}

impl<S: Clone> Clone for RateLimited<S> {
    fn clone(&self) -> Self {
        // A clone shares the bucket but not this one's reserved token.
        Self {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            waiting: None,
            has_token: false,
        }
    }
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("has_token", &self.has_token)
            .finish_non_exhaustive()
    }
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.has_token {
            let limiter = self.limiter.clone();
            let waiting = self
                .waiting
                .get_or_insert_with(|| Box::pin(async move { limiter.acquire().await }));
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waiting = None;
            self.has_token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn requests_past_the_burst_wait_for_tokens() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let limited = RateLimitLayer::new(10.0, 2).layer(service);
        let client = kube::Client::new(limited, "default");
        let server = tokio::spawn(async move {
            futures::pin_mut!(handle);
            let mut times = Vec::new();
            for _ in 0..4 {
                let (_req, send) = handle.next_request().await.unwrap();
                times.push(Instant::now());
                let pod = serde_json::json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"}});
                send.send_response(Response::new(Body::from(serde_json::to_vec(&pod).unwrap())));
            }
            times
        });
        let start = Instant::now();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::default_namespaced(client);
        for _ in 0..4 {
            pods.get("p").await.unwrap();
        }
        let times = server.await.unwrap();
        assert_eq!(times[1] - start, Duration::ZERO, "the burst is free");
        assert_eq!(times[2] - start, Duration::from_millis(100));
        assert_eq!(times[3] - start, Duration::from_millis(200));
    }
}
