//! A token bucket (QPS and burst) shared by every request of the status manager, on tokio
//! time so that tests with paused time see it exactly.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Client-side rate limiter: `burst` requests at once, then `qps` per second.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A full bucket. An infinite or non-positive `qps` disables the limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    fn unlimited(&self) -> bool {
        !self.qps.is_finite() || self.qps <= 0.0
    }

    /// Takes one token, waiting for it when the bucket is empty.
    pub async fn acquire(&self) {
        if self.unlimited() {
            return;
        }
        let wait = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let (tokens, last) = *state;
            let refilled =
                (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
            let after = refilled - 1.0;
            *state = (after, now);
            // A negative balance is a debt: the caller waits until it is paid back.
            (after < 0.0).then(|| Duration::from_secs_f64(-after / self.qps))
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let limiter = RateLimiter::new(50.0, 100);
        let start = Instant::now();
        for _ in 0..100 {
            limiter.acquire().await;
        }
        assert_eq!(Instant::now(), start, "the burst is free");
        for _ in 0..50 {
            limiter.acquire().await;
        }
        let waited = Instant::now() - start;
        assert!(
            waited >= Duration::from_millis(999) && waited <= Duration::from_millis(1001),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn infinite_qps_never_waits() {
        let limiter = RateLimiter::new(f64::INFINITY, 1);
        let start = Instant::now();
        for _ in 0..1000 {
            limiter.acquire().await;
        }
        assert_eq!(Instant::now(), start);
    }
}
