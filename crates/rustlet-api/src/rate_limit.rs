//! Client-side rate limiting shared by every caller of one `kube::Client` (kubelet `kubeAPIQPS`
//! 50 and `kubeAPIBurst` 100): a tower layer that takes a token from
//! `rustlet_status::RateLimiter` before each request.
//!
//! ```text
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&RateLimitLayer::new(50.0, 100))
//!     .build();
//! ```

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
        }
    }
}

/// A service that waits for a token before calling the inner one.
#[derive(Clone, Debug)]
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        // The ready inner service is taken for this call; a fresh clone stays for the next
        // (tower's clone-and-swap idiom).
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            limiter.acquire().await;
            ready.call(request).await
        })
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
