//! The two API calls the kubelet's authentication and authorization make, behind traits: a
//! `TokenReview` (`authentication.k8s.io/v1`) and a `SubjectAccessReview`
//! (`authorization.k8s.io/v1`), and their kube-rs implementation. The fakes are in
//! `auth::fake` (feature `test-util`).

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};

/// Which review failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewKind {
    /// `TokenReview`.
    Token,
    /// `SubjectAccessReview`.
    Access,
}

impl std::fmt::Display for ReviewKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReviewKind::Token => "creating a TokenReview",
            ReviewKind::Access => "creating a SubjectAccessReview",
        })
    }
}

/// Whether a failed call may succeed if tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The connection failed, or the API server answered 429 or 5xx.
    Transient,
    /// Anything else (a 4xx, a body that does not decode).
    Permanent,
}

/// A review that did not come back.
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct ReviewError {
    /// Which review.
    pub kind: ReviewKind,
    /// Whether to try again.
    pub retry: Retry,
    /// The cause.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Creates `TokenReview`s. Upstream: `authenticationv1.TokenReviewInterface`.
#[async_trait]
pub trait TokenReviewer: Send + Sync {
    /// The API server's answer about `spec` (its `status`).
    async fn review_token(&self, spec: TokenReviewSpec) -> Result<TokenReviewStatus, ReviewError>;
}

/// Creates `SubjectAccessReview`s. Upstream: `authorizationv1.SubjectAccessReviewInterface`.
#[async_trait]
pub trait AccessReviewer: Send + Sync {
    /// The API server's answer about `spec` (its `status`).
    async fn review_access(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> Result<SubjectAccessReviewStatus, ReviewError>;
}

/// Upstream's `DefaultAuthWebhookRetryBackoff`: 500 ms, times 1.5, five tries (no jitter here).
#[derive(Debug, Clone, Copy)]
pub struct RetryBackoff {
    /// The first wait.
    pub initial: Duration,
    /// What each wait is multiplied by.
    pub factor: f64,
    /// How many tries in all.
    pub steps: u32,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            factor: 1.5,
            steps: 5,
        }
    }
}

impl RetryBackoff {
    /// Runs `call` until it succeeds, fails for good, or the tries are spent. Upstream:
    /// `webhook.WithExponentialBackoff` with `DefaultShouldRetry` (approximated by [`Retry`]).
    pub async fn run<T, F, Fut>(&self, mut call: F) -> Result<T, ReviewError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ReviewError>>,
    {
        let mut wait = self.initial;
        let mut tries = 1;
        loop {
            match call().await {
                Err(error) if error.retry == Retry::Transient && tries < self.steps.max(1) => {
                    tracing::debug!(error = %error, source = %error.source, tries, "retrying a review");
                    tokio::time::sleep(wait).await;
                    wait = wait.mul_f64(self.factor);
                    tries += 1;
                }
                result => return result,
            }
        }
    }
}

/// Both reviews through kube-rs.
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    /// Reviews through `client` (the node's own credentials: its `system:nodes` group may
    /// create both kinds, by the Node authorizer's static rules).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

fn classify(kind: ReviewKind, error: kube::Error) -> ReviewError {
    let retry = match &error {
        kube::Error::Api(status) if status.code == 429 || status.code >= 500 => Retry::Transient,
        kube::Error::Api(_) => Retry::Permanent,
        kube::Error::SerdeError(_) => Retry::Permanent,
        // Connection, TLS and transport errors.
        _ => Retry::Transient,
    };
    ReviewError {
        kind,
        retry,
        source: Box::new(error),
    }
}

fn missing_status(kind: ReviewKind) -> ReviewError {
    ReviewError {
        kind,
        retry: Retry::Permanent,
        source: "the API server's answer has no status".into(),
    }
}

#[async_trait]
impl TokenReviewer for KubeReviewer {
    async fn review_token(&self, spec: TokenReviewSpec) -> Result<TokenReviewStatus, ReviewError> {
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec,
            ..Default::default()
        };
        let created = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| classify(ReviewKind::Token, e))?;
        created
            .status
            .ok_or_else(|| missing_status(ReviewKind::Token))
    }
}

#[async_trait]
impl AccessReviewer for KubeReviewer {
    async fn review_access(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> Result<SubjectAccessReviewStatus, ReviewError> {
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let created = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| classify(ReviewKind::Access, e))?;
        created
            .status
            .ok_or_else(|| missing_status(ReviewKind::Access))
    }
}
