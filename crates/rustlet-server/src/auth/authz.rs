//! Whether the user may: `AlwaysAllow`, or a `SubjectAccessReview` per attribute, cached.
//!
//! Upstream: `cmd/kubelet/app/auth.go` `BuildAuthz`, `authorizerfactory.DelegatingAuthorizerConfig`
//! and `plugin/pkg/authorizer/webhook` (`WebhookAuthorizer.Authorize`): the review's spec is the
//! user and the resource attributes; `allowed` is Allow, `denied` Deny, neither NoOpinion;
//! allowed answers are cached for `cacheAuthorizedTTL`, the others for `cacheUnauthorizedTTL`
//! (keyed by the spec); errors are not cached.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReviewSpec};

use super::attributes::{API_VERSION, RESOURCE};
use super::authn::UserInfo;
use super::cache::{DEFAULT_CAPACITY, ExpiringCache};
use super::review::{AccessReviewer, RetryBackoff, ReviewError};

/// An authorizer's answer. Upstream: `authorizer.Decision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Explicitly denied.
    Deny,
    /// Neither (the request is forbidden unless another attribute is allowed).
    NoOpinion,
}

/// One attribute: `verb` on `nodes/<subresource>` named `node_name`.
#[derive(Debug, Clone, Copy)]
pub struct Attribute<'a> {
    /// The API verb.
    pub verb: &'a str,
    /// The subresource.
    pub subresource: &'a str,
    /// The node's name.
    pub node_name: &'a str,
}

/// The `SubjectAccessReview` spec upstream's webhook authorizer sends for `attribute`
/// (empty strings left out, as Go's `omitempty` does).
pub fn access_review_spec(user: &UserInfo, attribute: Attribute<'_>) -> SubjectAccessReviewSpec {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    SubjectAccessReviewSpec {
        user: some(&user.name),
        uid: some(&user.uid),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes: Some(ResourceAttributes {
            namespace: None,
            verb: some(attribute.verb),
            group: None,
            version: Some(API_VERSION.to_owned()),
            resource: Some(RESOURCE.to_owned()),
            subresource: some(attribute.subresource),
            name: some(attribute.node_name),
            ..ResourceAttributes::default()
        }),
        non_resource_attributes: None,
    }
}

/// `SubjectAccessReview`s with upstream's caches.
pub struct WebhookAuthorizer {
    reviewer: Arc<dyn AccessReviewer>,
    cache: ExpiringCache<String, Decision>,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    backoff: RetryBackoff,
}

impl std::fmt::Debug for WebhookAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookAuthorizer")
            .field("authorized_ttl", &self.authorized_ttl)
            .field("unauthorized_ttl", &self.unauthorized_ttl)
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl WebhookAuthorizer {
    /// Reviews through `reviewer`.
    pub fn new(
        reviewer: Arc<dyn AccessReviewer>,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        Self {
            reviewer,
            cache: ExpiringCache::new(DEFAULT_CAPACITY),
            authorized_ttl,
            unauthorized_ttl,
            backoff: RetryBackoff::default(),
        }
    }

    /// The decision about `attribute` for `user`.
    pub async fn authorize(
        &self,
        user: &UserInfo,
        attribute: Attribute<'_>,
    ) -> Result<Decision, ReviewError> {
        let spec = access_review_spec(user, attribute);
        // Upstream keys its cache by the spec's JSON too.
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if let Some(decision) = self.cache.get(&key) {
            return Ok(decision);
        }
        let status = self
            .backoff
            .run(|| self.reviewer.review_access(spec.clone()))
            .await?;
        let decision = if status.allowed {
            Decision::Allow
        } else if status.denied == Some(true) {
            Decision::Deny
        } else {
            Decision::NoOpinion
        };
        let ttl = match decision {
            Decision::Allow => self.authorized_ttl,
            Decision::Deny | Decision::NoOpinion => self.unauthorized_ttl,
        };
        self.cache.insert(key, decision, ttl);
        Ok(decision)
    }
}

/// The configured authorizer.
#[derive(Debug)]
pub enum Authorizer {
    /// `authorization.mode: AlwaysAllow`.
    AlwaysAllow,
    /// `authorization.mode: Webhook`.
    Webhook(WebhookAuthorizer),
}

impl Authorizer {
    /// The decision about `attribute` for `user`.
    pub async fn authorize(
        &self,
        user: &UserInfo,
        attribute: Attribute<'_>,
    ) -> Result<Decision, ReviewError> {
        match self {
            Authorizer::AlwaysAllow => Ok(Decision::Allow),
            Authorizer::Webhook(webhook) => webhook.authorize(user, attribute).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_review_spec_is_upstreams() {
        let user = UserInfo {
            name: "alice".into(),
            uid: String::new(),
            groups: vec!["devs".into(), "system:authenticated".into()],
            extra: Default::default(),
        };
        let spec = access_review_spec(
            &user,
            Attribute {
                verb: "get",
                subresource: "proxy",
                node_name: "node-a",
            },
        );
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({
                "user": "alice",
                "groups": ["devs", "system:authenticated"],
                "resourceAttributes": {
                    "verb": "get",
                    "version": "v1",
                    "resource": "nodes",
                    "subresource": "proxy",
                    "name": "node-a",
                },
            })
        );
    }
}
