//! Fakes of the `TokenReview` and `SubjectAccessReview` seams (feature `test-util`): known
//! tokens, a set of allowed `(user, verb, subresource)`, call counters, and a switch that
//! makes every review fail.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{
    TokenReviewSpec, TokenReviewStatus, UserInfo as ApiUserInfo,
};
use k8s_openapi::api::authorization::v1::{SubjectAccessReviewSpec, SubjectAccessReviewStatus};

use super::authn::UserInfo;
use super::review::{AccessReviewer, Retry, ReviewError, ReviewKind, TokenReviewer};

/// How a fake answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FakeMode {
    /// Answers from its tables.
    #[default]
    Answer,
    /// Fails every call with a permanent error (no retries).
    Fail,
    /// Fails every call with a transient error (retried with backoff).
    FailTransient,
}

fn failure(mode: FakeMode, kind: ReviewKind) -> Option<ReviewError> {
    let retry = match mode {
        FakeMode::Answer => return None,
        FakeMode::Fail => Retry::Permanent,
        FakeMode::FailTransient => Retry::Transient,
    };
    Some(ReviewError {
        kind,
        retry,
        source: "the fake fails".into(),
    })
}

/// A `TokenReview` fake: known tokens authenticate as their user; others do not.
#[derive(Debug, Default)]
pub struct FakeTokenReviewer {
    tokens: Mutex<HashMap<String, UserInfo>>,
    mode: Mutex<FakeMode>,
    calls: AtomicUsize,
}

impl FakeTokenReviewer {
    /// `token` authenticates as `user`.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.tokens.lock().unwrap().insert(token.to_owned(), user);
    }

    /// Forgets every token (a cached answer still stands until it expires).
    pub fn clear(&self) {
        self.tokens.lock().unwrap().clear();
    }

    /// Sets how it answers.
    pub fn set_mode(&self, mode: FakeMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// How many reviews it answered or failed.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl TokenReviewer for FakeTokenReviewer {
    async fn review_token(&self, spec: TokenReviewSpec) -> Result<TokenReviewStatus, ReviewError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(error) = failure(*self.mode.lock().unwrap(), ReviewKind::Token) {
            return Err(error);
        }
        let token = spec.token;
        Ok(match self.tokens.lock().unwrap().get(&token) {
            Some(user) => TokenReviewStatus {
                authenticated: Some(true),
                user: Some(ApiUserInfo {
                    username: Some(user.name.clone()),
                    uid: Some(user.uid.clone()),
                    groups: Some(user.groups.clone()),
                    extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                }),
                ..TokenReviewStatus::default()
            },
            None => TokenReviewStatus {
                authenticated: Some(false),
                ..TokenReviewStatus::default()
            },
        })
    }
}

/// A `SubjectAccessReview` fake: allows what its set holds; the rest is no opinion.
#[derive(Debug, Default)]
pub struct FakeAccessReviewer {
    allowed: Mutex<HashSet<(String, String, String)>>,
    mode: Mutex<FakeMode>,
    reviews: Mutex<Vec<SubjectAccessReviewSpec>>,
}

impl FakeAccessReviewer {
    /// `user` may `verb` on `nodes/<subresource>`.
    pub fn allow(&self, user: &str, verb: &str, subresource: &str) {
        self.allowed.lock().unwrap().insert((
            user.to_owned(),
            verb.to_owned(),
            subresource.to_owned(),
        ));
    }

    /// Takes every permission back (a cached answer still stands until it expires).
    pub fn clear(&self) {
        self.allowed.lock().unwrap().clear();
    }

    /// Sets how it answers.
    pub fn set_mode(&self, mode: FakeMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Every spec it was asked about, in order.
    pub fn reviews(&self) -> Vec<SubjectAccessReviewSpec> {
        self.reviews.lock().unwrap().clone()
    }
}

#[async_trait]
impl AccessReviewer for FakeAccessReviewer {
    async fn review_access(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> Result<SubjectAccessReviewStatus, ReviewError> {
        self.reviews.lock().unwrap().push(spec.clone());
        if let Some(error) = failure(*self.mode.lock().unwrap(), ReviewKind::Access) {
            return Err(error);
        }
        let attrs = spec.resource_attributes.unwrap_or_default();
        let key = (
            spec.user.unwrap_or_default(),
            attrs.verb.unwrap_or_default(),
            attrs.subresource.unwrap_or_default(),
        );
        let allowed = attrs.resource.as_deref() == Some("nodes")
            && self.allowed.lock().unwrap().contains(&key);
        Ok(SubjectAccessReviewStatus {
            allowed,
            ..SubjectAccessReviewStatus::default()
        })
    }
}
