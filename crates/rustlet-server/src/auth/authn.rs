//! Who is asking: x509 client certificates, bearer tokens through a `TokenReview` (cached),
//! anonymous when enabled.
//!
//! Upstream: `authenticatorfactory.DelegatingAuthenticatorConfig.New`: the union of the x509
//! authenticator (`request/x509`, `CommonNameUserConversion`) and the bearer-token
//! authenticator (`request/bearertoken` over the cached `TokenReview` webhook), wrapped by
//! `AuthenticatedGroupAdder` (adds `system:authenticated`); with anonymous enabled,
//! `unionauth.NewFailOnError(that, anonymous)`: a request whose credentials fail is refused, not
//! taken as anonymous. The bearer token also comes, in a WebSocket upgrade, as the
//! `base64url.bearer.authorization.k8s.io.<token>` subprotocol (`request/websocket`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenReviewSpec;
use rustls::pki_types::CertificateDer;

use super::cache::{DEFAULT_CAPACITY, ExpiringCache};
use super::review::{RetryBackoff, ReviewError, TokenReviewer};
use crate::tls::ClientCa;

/// `system:anonymous`.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// `system:unauthenticated`.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// `system:authenticated`.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// An authenticated user (upstream's `user.Info`), put in the request's extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name (a certificate's CN, a token's `status.user.username`).
    pub name: String,
    /// The UID (tokens only).
    pub uid: String,
    /// The groups (a certificate's O values; then `system:authenticated`).
    pub groups: Vec<String>,
    /// Extra attributes (tokens only).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// Upstream's anonymous user.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS_USER.to_owned(),
            groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
            ..Self::default()
        }
    }
}

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A verified client certificate.
    ClientCertificate,
    /// A bearer token the API server reviewed (the `Authorization` header is then removed, as
    /// upstream removes it).
    BearerToken,
    /// A bearer token in a WebSocket subprotocol (that subprotocol is then removed from
    /// `Sec-WebSocket-Protocol`, as upstream removes it).
    WebSocketProtocolToken,
    /// No credentials, anonymous enabled.
    Anonymous,
}

/// Why authentication failed (each a 401 `Unauthorized`; the cause is logged).
#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    /// The client certificate did not verify against `clientCAFile`.
    #[error("verifying the client certificate against {ca}")]
    ClientCertificate {
        /// The `clientCAFile`.
        ca: String,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// The verified certificate could not be parsed for its subject.
    #[error("reading the client certificate's subject")]
    CertificateSubject,
    /// The API server did not authenticate the token (upstream: `invalid bearer token`).
    #[error("invalid bearer token")]
    InvalidBearerToken,
    /// The `TokenReview` came back with an error.
    #[error("the TokenReview failed: {0}")]
    TokenReviewStatus(String),
    /// The `TokenReview` did not come back.
    #[error("reviewing a bearer token")]
    TokenReview(#[source] ReviewError),
    /// A WebSocket upgrade's token subprotocol is malformed (upstream's messages).
    #[error("{0}")]
    WebSocketProtocol(&'static str),
    /// Every method that had an opinion failed (upstream's aggregate).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", "))]
    All(Vec<AuthnError>),
}

/// What the request presents.
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    /// The request's headers (`Authorization`; `Sec-WebSocket-Protocol` of an upgrade).
    pub headers: &'a http::HeaderMap,
    /// The connection's client certificates (the leaf first).
    pub peer_certificates: &'a [CertificateDer<'static>],
}

/// Verifies client certificates and names their user. Upstream: `x509.New(verifyOpts,
/// CommonNameUserConversion)`.
#[derive(Debug, Clone)]
pub struct X509Authenticator {
    ca: ClientCa,
}

impl X509Authenticator {
    /// Verifies against `ca`.
    pub fn new(ca: ClientCa) -> Self {
        Self { ca }
    }

    /// The CA bundle it verifies against.
    pub fn ca(&self) -> &ClientCa {
        &self.ca
    }

    /// No opinion without a certificate or with an empty CN; an error for a certificate that
    /// does not verify; else user = CN, groups = O.
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'_>],
    ) -> Result<Option<UserInfo>, AuthnError> {
        if chain.is_empty() {
            return Ok(None);
        }
        self.ca
            .verify(chain)
            .map_err(|source| AuthnError::ClientCertificate {
                ca: self.ca.path().display().to_string(),
                source,
            })?;
        let (common_name, organizations) = subject(&chain[0])?;
        if common_name.is_empty() {
            return Ok(None);
        }
        Ok(Some(UserInfo {
            name: common_name,
            groups: organizations,
            ..UserInfo::default()
        }))
    }
}

/// The CN (the last, as Go's `pkix.Name` keeps) and the O values of a certificate's subject.
pub fn subject(der: &CertificateDer<'_>) -> Result<(String, Vec<String>), AuthnError> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) =
        X509Certificate::from_der(der.as_ref()).map_err(|_| AuthnError::CertificateSubject)?;
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str()
            .map(str::to_owned)
            .map_err(|_| AuthnError::CertificateSubject)
    };
    let mut common_name = String::new();
    for attr in cert.subject().iter_common_name() {
        common_name = text(attr)?;
    }
    let organizations = cert
        .subject()
        .iter_organization()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((common_name, organizations))
}

/// The bearer token of an `Authorization` header, or `None` when it has none. Upstream:
/// `bearertoken.Authenticator.AuthenticateRequest` (trimmed, split on spaces, scheme
/// case-insensitive, an empty token is no token).
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let auth = authorization.trim();
    if auth.is_empty() {
        return None;
    }
    let mut parts = auth.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    Some(token)
}

/// The subprotocol prefix that carries a bearer token in a WebSocket upgrade.
pub const BEARER_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// A bearer token found among a WebSocket upgrade's subprotocols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSocketToken {
    /// The decoded token.
    pub token: String,
    /// The other subprotocols, joined with `,` (what `Sec-WebSocket-Protocol` becomes once the
    /// token authenticated).
    pub other_protocols: String,
}

/// Upstream's `wsstream.IsWebSocketRequest`: `Upgrade: websocket` and a `Connection` header
/// that mentions `upgrade`.
pub fn is_websocket_request(headers: &http::HeaderMap) -> bool {
    let upgrade = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    upgrade
        && headers.get_all(http::header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("upgrade"))
        })
}

/// The token of a WebSocket upgrade's `base64url.bearer.authorization.k8s.io.` subprotocol,
/// `None` when there is none. Upstream: `websocket.ProtocolAuthenticator.AuthenticateRequest`
/// (one such subprotocol at most, raw base64url of UTF-8, and another subprotocol beside it).
pub fn websocket_token(headers: &http::HeaderMap) -> Result<Option<WebSocketToken>, AuthnError> {
    use base64::Engine;
    if !is_websocket_request(headers) {
        return Ok(None);
    }
    let mut token: Option<String> = None;
    let mut others = Vec::new();
    for value in headers.get_all(http::header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(value) = value.to_str() else { continue };
        for protocol in value.split(',').map(str::trim) {
            let Some(encoded) = protocol.strip_prefix(BEARER_PROTOCOL_PREFIX) else {
                others.push(protocol);
                continue;
            };
            if token.is_some() {
                return Err(AuthnError::WebSocketProtocol(
                    "multiple base64.bearer.authorization tokens specified",
                ));
            }
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(encoded)
                .map_err(|_| {
                    AuthnError::WebSocketProtocol(
                        "invalid base64.bearer.authorization token encoding",
                    )
                })?;
            token = Some(String::from_utf8(decoded).map_err(|_| {
                AuthnError::WebSocketProtocol("invalid base64.bearer.authorization token")
            })?);
        }
    }
    match token {
        Some(token) if !token.is_empty() => {
            if others.is_empty() {
                return Err(AuthnError::WebSocketProtocol(
                    "missing additional subprotocol",
                ));
            }
            Ok(Some(WebSocketToken {
                token,
                other_protocols: others.join(","),
            }))
        }
        _ => Ok(None),
    }
}

/// What a token's review said, as cached.
#[derive(Debug, Clone)]
enum TokenDecision {
    Authenticated(UserInfo),
    Unauthenticated,
}

/// Bearer tokens through `TokenReview`s, answers cached for `cache_ttl` (authenticated or
/// not; errors are not cached). Upstream: `webhooktoken.NewFromInterface` under
/// `cache.New(tokenAuth, false, cacheTTL, cacheTTL)`.
pub struct TokenAuthenticator {
    reviewer: Arc<dyn TokenReviewer>,
    cache: ExpiringCache<[u8; 32], TokenDecision>,
    cache_ttl: Duration,
    backoff: RetryBackoff,
}

impl std::fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuthenticator")
            .field("cache_ttl", &self.cache_ttl)
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl TokenAuthenticator {
    /// Reviews through `reviewer`, caching for `cache_ttl` (zero: no cache).
    pub fn new(reviewer: Arc<dyn TokenReviewer>, cache_ttl: Duration) -> Self {
        Self {
            reviewer,
            cache: ExpiringCache::new(DEFAULT_CAPACITY),
            cache_ttl,
            backoff: RetryBackoff::default(),
        }
    }

    /// The user of `token`. Upstream: `WebhookTokenAuthenticator.AuthenticateToken` (no
    /// audiences: the kubelet's are implicit) and `bearertoken`'s `invalid bearer token`.
    pub async fn authenticate(&self, token: &str) -> Result<UserInfo, AuthnError> {
        // The cache holds a digest, never the token.
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let decision = match self.cache.get(&key) {
            Some(decision) => decision,
            None => {
                let spec = TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: None,
                };
                let status = self
                    .backoff
                    .run(|| self.reviewer.review_token(spec.clone()))
                    .await
                    .map_err(AuthnError::TokenReview)?;
                let decision = if status.authenticated == Some(true) {
                    let user = status.user.unwrap_or_default();
                    TokenDecision::Authenticated(UserInfo {
                        name: user.username.unwrap_or_default(),
                        uid: user.uid.unwrap_or_default(),
                        groups: user.groups.unwrap_or_default(),
                        extra: user.extra.unwrap_or_default(),
                    })
                } else if let Some(error) = status.error.filter(|e| !e.is_empty()) {
                    return Err(AuthnError::TokenReviewStatus(error));
                } else {
                    TokenDecision::Unauthenticated
                };
                self.cache.insert(key, decision.clone(), self.cache_ttl);
                decision
            }
        };
        match decision {
            TokenDecision::Authenticated(user) => Ok(user),
            TokenDecision::Unauthenticated => Err(AuthnError::InvalidBearerToken),
        }
    }
}

/// Whether requests without credentials are taken as `system:anonymous`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anonymous {
    /// `authentication.anonymous.enabled: true`.
    Allowed,
    /// The default: such requests get 401.
    Refused,
}

/// The kubelet's request authenticator.
#[derive(Debug)]
pub struct Authenticator {
    /// With `clientCAFile`.
    pub x509: Option<X509Authenticator>,
    /// With `authentication.webhook.enabled`.
    pub token: Option<TokenAuthenticator>,
    /// `authentication.anonymous.enabled`.
    pub anonymous: Anonymous,
}

impl Authenticator {
    /// The user of a request and how it was found; `Ok(None)` when nothing had an opinion
    /// (401); an error when credentials were presented and failed (401, even with anonymous
    /// enabled).
    pub async fn authenticate(
        &self,
        credentials: Credentials<'_>,
    ) -> Result<Option<(UserInfo, Method)>, AuthnError> {
        let mut errors = Vec::new();
        if let Some(x509) = &self.x509 {
            match x509.authenticate(credentials.peer_certificates) {
                Ok(Some(user)) => {
                    return Ok(Some((
                        add_authenticated_group(user),
                        Method::ClientCertificate,
                    )));
                }
                Ok(None) => {}
                Err(error) => errors.push(error),
            }
        }
        if let Some(tokens) = &self.token {
            let header = credentials
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if let Some(token) = header.and_then(bearer_token) {
                match tokens.authenticate(token).await {
                    Ok(user) => {
                        return Ok(Some((add_authenticated_group(user), Method::BearerToken)));
                    }
                    Err(error) => errors.push(error),
                }
            }
            match websocket_token(credentials.headers) {
                Ok(Some(found)) => match tokens.authenticate(&found.token).await {
                    Ok(user) => {
                        let user = add_authenticated_group(user);
                        return Ok(Some((user, Method::WebSocketProtocolToken)));
                    }
                    Err(error) => errors.push(error),
                },
                Ok(None) => {}
                Err(error) => errors.push(error),
            }
        }
        if !errors.is_empty() {
            return Err(if errors.len() == 1 {
                errors.remove(0)
            } else {
                AuthnError::All(errors)
            });
        }
        Ok(match self.anonymous {
            Anonymous::Allowed => Some((UserInfo::anonymous(), Method::Anonymous)),
            Anonymous::Refused => None,
        })
    }
}

/// Upstream: `group.AuthenticatedGroupAdder`: `system:authenticated` is added unless the user
/// is anonymous or already in it or in `system:unauthenticated`.
fn add_authenticated_group(mut user: UserInfo) -> UserInfo {
    if user.name == ANONYMOUS_USER
        || user
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP)
    {
        return user;
    }
    user.groups.push(AUTHENTICATED_GROUP.to_owned());
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream: `TestAuthenticateRequest*` of `bearertoken_test.go`, the header forms.
    #[test]
    fn bearer_token_reads_the_header_as_upstream() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("  bearer abc  "), Some("abc"));
        assert_eq!(bearer_token("BEARER abc extra"), Some("abc"));
        assert_eq!(
            bearer_token("Bearer  abc"),
            None,
            "the space before the token"
        );
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token(""), None);
    }

    fn upgrade(protocols: &[&str]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert("connection", "Upgrade".parse().unwrap());
        headers.insert("upgrade", "websocket".parse().unwrap());
        for p in protocols {
            headers.append("sec-websocket-protocol", p.parse().unwrap());
        }
        headers
    }

    /// Upstream: `TestAuthenticateRequest*` of `request/websocket/protocol_test.go`.
    #[test]
    fn websocket_token_reads_the_subprotocols_as_upstream() {
        // base64url("token") = dG9rZW4
        let found = websocket_token(&upgrade(&[
            "base64url.bearer.authorization.k8s.io.dG9rZW4,dummy",
            "v5.channel.k8s.io",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(found.token, "token");
        assert_eq!(found.other_protocols, "dummy,v5.channel.k8s.io");

        assert_eq!(websocket_token(&upgrade(&["dummy"])).unwrap(), None);
        let mut plain = upgrade(&["base64url.bearer.authorization.k8s.io.dG9rZW4,dummy"]);
        plain.remove("upgrade");
        assert_eq!(
            websocket_token(&plain).unwrap(),
            None,
            "not a WebSocket upgrade"
        );
        let token = "base64url.bearer.authorization.k8s.io.dG9rZW4";
        for (protocols, message) in [
            (token.to_owned(), "missing additional subprotocol"),
            (
                format!("{token},{token},dummy"),
                "multiple base64.bearer.authorization tokens specified",
            ),
            (
                "base64url.bearer.authorization.k8s.io.!!!,dummy".to_owned(),
                "invalid base64.bearer.authorization token encoding",
            ),
            (
                "base64url.bearer.authorization.k8s.io._w,dummy".to_owned(),
                "invalid base64.bearer.authorization token",
            ),
        ] {
            let error = websocket_token(&upgrade(&[&protocols])).unwrap_err();
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn the_authenticated_group_is_added_once() {
        let user = UserInfo {
            name: "u".into(),
            groups: vec!["o".into()],
            ..UserInfo::default()
        };
        assert_eq!(
            add_authenticated_group(user).groups,
            ["o", AUTHENTICATED_GROUP]
        );
        let already = UserInfo {
            name: "u".into(),
            groups: vec![AUTHENTICATED_GROUP.into()],
            ..UserInfo::default()
        };
        assert_eq!(
            add_authenticated_group(already).groups,
            [AUTHENTICATED_GROUP]
        );
        assert_eq!(
            add_authenticated_group(UserInfo::anonymous()),
            UserInfo::anonymous()
        );
    }
}
