//! The kubelet's authentication and authorization in front of every endpoint of the server.
//!
//! Upstream: `pkg/kubelet/server/server.go` `InstallAuthFilter` (authenticate: failure is
//! `401 Unauthorized`; the request's attributes; authorize each until one is allowed: none is
//! `403 Forbidden (user=…, verb=…, resource=nodes, subresource(s)=[…])`, an authorizer error
//! `500 Authorization error (…)`), `cmd/kubelet/app/auth.go` (`BuildAuth`) and the kubelet
//! configuration's `authentication`/`authorization` defaults
//! (`pkg/kubelet/apis/config/v1beta1/defaults.go`).
//!
//! * [`attributes`]: the verb and `nodes` subresources of a method and path.
//! * [`authn`]: x509 client certificates, bearer tokens (`TokenReview`), anonymous.
//! * [`authz`]: `AlwaysAllow` or `SubjectAccessReview`s.
//! * [`review`]: the two API calls behind traits, and their kube-rs implementation.
//! * [`layer`]: [`AuthLayer`], the tower layer that applies all this to a router.
//! * `fake` (feature `test-util`): fakes of the two reviews.
//!
//! Local mode has no API server: there only client certificates authenticate (webhook
//! authentication, webhook authorization and anonymous are refused at construction) and every
//! verified certificate is allowed.

pub mod attributes;
pub mod authn;
pub mod authz;
pub mod cache;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod layer;
pub mod review;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

pub use attributes::{NodeRequestAttributes, request_attributes};
pub use authn::{Credentials, UserInfo};
pub use authz::Decision;
pub use layer::AuthLayer;
pub use review::{AccessReviewer, KubeReviewer, TokenReviewer};

use crate::tls::{ClientCa, TlsError};

/// `authentication.x509`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct X509Authentication {
    /// `clientCAFile` (`--client-ca-file`): client certificates signed by these CAs
    /// authenticate as their CN, in the groups of their O values.
    pub client_ca_file: Option<PathBuf>,
}

/// `authentication.webhook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookAuthentication {
    /// `enabled` (`--authentication-token-webhook`, default true): bearer tokens through a
    /// `TokenReview`.
    pub enabled: bool,
    /// `cacheTTL` (default 2m).
    pub cache_ttl: Duration,
}

impl Default for WebhookAuthentication {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_ttl: Duration::from_secs(120),
        }
    }
}

/// `authentication.anonymous`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnonymousAuthentication {
    /// `enabled` (`--anonymous-auth`, default false).
    pub enabled: bool,
}

/// `authentication`, with upstream's v1beta1 defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletAuthentication {
    /// `x509`.
    pub x509: X509Authentication,
    /// `webhook`.
    pub webhook: WebhookAuthentication,
    /// `anonymous`.
    pub anonymous: AnonymousAuthentication,
}

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// `AlwaysAllow`: every authenticated request is allowed.
    AlwaysAllow,
    /// `Webhook` (the default): a `SubjectAccessReview` per attribute.
    #[default]
    Webhook,
}

/// `authorization.webhook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookAuthorization {
    /// `cacheAuthorizedTTL` (default 5m).
    pub cache_authorized_ttl: Duration,
    /// `cacheUnauthorizedTTL` (default 30s).
    pub cache_unauthorized_ttl: Duration,
}

impl Default for WebhookAuthorization {
    fn default() -> Self {
        Self {
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

/// `authorization`, with upstream's v1beta1 defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletAuthorization {
    /// `mode`.
    pub mode: AuthorizationMode,
    /// `webhook`.
    pub webhook: WebhookAuthorization,
}

impl KubeletAuthentication {
    /// Local mode's only choice: client certificates of `client_ca_file`.
    pub fn client_certificates_only(client_ca_file: PathBuf) -> Self {
        Self {
            x509: X509Authentication {
                client_ca_file: Some(client_ca_file),
            },
            webhook: WebhookAuthentication {
                enabled: false,
                ..WebhookAuthentication::default()
            },
            anonymous: AnonymousAuthentication { enabled: false },
        }
    }
}

/// Where the reviews go.
#[derive(Clone)]
pub enum Reviewers {
    /// Kube mode: the API server (or a fake).
    Api {
        /// `TokenReview`s.
        tokens: Arc<dyn TokenReviewer>,
        /// `SubjectAccessReview`s.
        access: Arc<dyn AccessReviewer>,
    },
    /// Local mode: no API server.
    None,
}

impl Reviewers {
    /// Both through one kube client.
    pub fn kube(client: kube::Client) -> Self {
        let reviewer = Arc::new(KubeReviewer::new(client));
        Self::Api {
            tokens: reviewer.clone(),
            access: reviewer,
        }
    }
}

/// Everything [`KubeletAuth::new`] needs.
#[derive(Clone)]
pub struct AuthSettings {
    /// The node's name (every attribute's `name`).
    pub node_name: String,
    /// `authentication`.
    pub authentication: KubeletAuthentication,
    /// `authorization`.
    pub authorization: KubeletAuthorization,
    /// Where the reviews go.
    pub reviewers: Reviewers,
}

/// A configuration the server cannot be built from.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// Nothing could authenticate a request (upstream: `No authentication method configured`).
    #[error(
        "no authentication method configured: set authentication.x509.clientCAFile, \
         authentication.webhook.enabled or authentication.anonymous.enabled"
    )]
    NoAuthenticationMethod,
    /// A webhook setting without an API server (upstream: `no client provided, cannot use
    /// webhook authentication`).
    #[error("{setting} needs an API server; local mode takes client certificates only")]
    NeedsApiServer {
        /// The setting.
        setting: &'static str,
    },
    /// Anonymous requests in local mode, where nothing could authorize them.
    #[error(
        "authentication.anonymous.enabled in local mode: local mode takes client certificates only"
    )]
    AnonymousInLocalMode,
    /// `clientCAFile` could not be loaded.
    #[error("loading authentication.x509.clientCAFile")]
    ClientCa(#[source] TlsError),
}

/// Why a request is refused: the status and upstream's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Authentication failed, or nothing authenticated the request.
    Unauthorized,
    /// No attribute was allowed.
    Forbidden {
        /// The user's name.
        user: String,
        /// The verb.
        verb: &'static str,
        /// Every subresource tried.
        subresources: Vec<&'static str>,
    },
    /// The authorizer failed.
    AuthorizationError {
        /// The user's name.
        user: String,
        /// The verb.
        verb: &'static str,
        /// The subresource whose review failed.
        subresource: &'static str,
    },
}

impl Refusal {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
            Refusal::AuthorizationError { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Upstream's body. The 403 ends in a newline as upstream's `Sprintf(... %v)\n` does (Go
    /// prints the subresources as `[pods proxy]`).
    pub fn body(&self) -> String {
        match self {
            Refusal::Unauthorized => "Unauthorized".to_owned(),
            Refusal::Forbidden {
                user,
                verb,
                subresources,
            } => format!(
                "Forbidden (user={user}, verb={verb}, resource={}, subresource(s)=[{}])\n",
                attributes::RESOURCE,
                subresources.join(" ")
            ),
            Refusal::AuthorizationError {
                user,
                verb,
                subresource,
            } => format!(
                "Authorization error (user={user}, verb={verb}, resource={}, subresource={subresource})",
                attributes::RESOURCE
            ),
        }
    }
}

/// What the filter let through: the user and how it was authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The user.
    pub user: UserInfo,
    /// How.
    pub method: authn::Method,
}

/// The kubelet's authenticator, attribute getter and authorizer. Upstream: `KubeletAuth`.
#[derive(Debug)]
pub struct KubeletAuth {
    node_name: String,
    authenticator: authn::Authenticator,
    authorizer: authz::Authorizer,
}

impl KubeletAuth {
    /// Builds both from the configuration. Upstream: `BuildAuth` (`BuildAuthn`, `BuildAuthz`).
    pub fn new(settings: AuthSettings) -> Result<Self, AuthConfigError> {
        let AuthSettings {
            node_name,
            authentication,
            authorization,
            reviewers,
        } = settings;
        let x509 = match &authentication.x509.client_ca_file {
            Some(path) => Some(authn::X509Authenticator::new(
                ClientCa::load(path).map_err(AuthConfigError::ClientCa)?,
            )),
            None => None,
        };
        let (tokens, access) = match reviewers {
            Reviewers::Api { tokens, access } => (Some(tokens), Some(access)),
            Reviewers::None => (None, None),
        };
        let token = match (authentication.webhook.enabled, tokens) {
            (true, Some(tokens)) => Some(authn::TokenAuthenticator::new(
                tokens,
                authentication.webhook.cache_ttl,
            )),
            (true, None) => {
                return Err(AuthConfigError::NeedsApiServer {
                    setting: "authentication.webhook.enabled",
                });
            }
            (false, _) => None,
        };
        if access.is_none() && authentication.anonymous.enabled {
            return Err(AuthConfigError::AnonymousInLocalMode);
        }
        if x509.is_none() && token.is_none() && !authentication.anonymous.enabled {
            return Err(AuthConfigError::NoAuthenticationMethod);
        }
        let authorizer = match (authorization.mode, access) {
            (AuthorizationMode::AlwaysAllow, _) => authz::Authorizer::AlwaysAllow,
            (AuthorizationMode::Webhook, Some(access)) => {
                authz::Authorizer::Webhook(authz::WebhookAuthorizer::new(
                    access,
                    authorization.webhook.cache_authorized_ttl,
                    authorization.webhook.cache_unauthorized_ttl,
                ))
            }
            (AuthorizationMode::Webhook, None) => {
                return Err(AuthConfigError::NeedsApiServer {
                    setting: "authorization.mode: Webhook",
                });
            }
        };
        let anonymous = if authentication.anonymous.enabled {
            authn::Anonymous::Allowed
        } else {
            authn::Anonymous::Refused
        };
        Ok(Self {
            node_name,
            authenticator: authn::Authenticator {
                x509,
                token,
                anonymous,
            },
            authorizer,
        })
    }

    /// The client CA bundle (with `clientCAFile`): give it to [`crate::tls::server_config`]
    /// for the handshake's CA names, and spawn its
    /// [`reload_periodically`](ClientCa::reload_periodically) so that a rotated bundle is used.
    pub fn client_ca(&self) -> Option<&ClientCa> {
        self.authenticator
            .x509
            .as_ref()
            .map(authn::X509Authenticator::ca)
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Authenticates and authorizes `method` on `path` (the raw path of the request target).
    /// Upstream: the `InstallAuthFilter` filter.
    pub async fn check(
        &self,
        method: &http::Method,
        raw_path: &str,
        credentials: Credentials<'_>,
    ) -> Result<Admitted, Refusal> {
        let (user, how) = match self.authenticator.authenticate(credentials).await {
            Ok(Some(found)) => found,
            Ok(None) => return Err(Refusal::Unauthorized),
            Err(error) => {
                tracing::error!(error = %error, source = ?std::error::Error::source(&error),
                    "Unable to authenticate the request due to an error");
                return Err(Refusal::Unauthorized);
            }
        };
        let attrs = request_attributes(&self.node_name, method, &attributes::decode_path(raw_path));
        for subresource in &attrs.subresources {
            let attribute = authz::Attribute {
                verb: attrs.verb,
                subresource,
                node_name: &self.node_name,
            };
            match self.authorizer.authorize(&user, attribute).await {
                Ok(Decision::Allow) => return Ok(Admitted { user, method: how }),
                Ok(Decision::Deny | Decision::NoOpinion) => {}
                Err(error) => {
                    tracing::error!(error = %error, source = %error.source, user = %user.name,
                        verb = attrs.verb, subresource, "Authorization error");
                    return Err(Refusal::AuthorizationError {
                        user: user.name,
                        verb: attrs.verb,
                        subresource,
                    });
                }
            }
        }
        tracing::debug!(user = %user.name, verb = attrs.verb, subresources = ?attrs.subresources, "Forbidden");
        Err(Refusal::Forbidden {
            user: user.name,
            verb: attrs.verb,
            subresources: attrs.subresources,
        })
    }
}

#[cfg(test)]
mod tests;
