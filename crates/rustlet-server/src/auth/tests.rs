//! Tests of the kubelet filter through [`AuthLayer`] over a router: upstream's
//! `TestAuthFilters`, `TestAuthenticationError`, `TestAuthenticationFailure`,
//! `TestAuthorizationSuccess` (server_test.go), the caches' TTLs on paused time, x509 with
//! rcgen certificates, anonymous, and local mode.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::response::Response;
use http::{Method, Request, StatusCode};
use tower::{Layer, ServiceExt};

use super::attributes::tests::{METHODS, authz_test_paths};
use super::fake::{FakeAccessReviewer, FakeMode, FakeTokenReviewer};
use super::*;
use crate::test_pki::{ClientCert, TestCa};
use crate::tls::PeerCertificates;

const NODE: &str = "test";
const USER: &str = "phibby";
const TOKEN: &str = "phibby-token";

struct Harness {
    tokens: Arc<FakeTokenReviewer>,
    access: Arc<FakeAccessReviewer>,
    auth: Arc<KubeletAuth>,
}

fn user(name: &str) -> UserInfo {
    UserInfo {
        name: name.to_owned(),
        ..UserInfo::default()
    }
}

fn harness(authentication: KubeletAuthentication, authorization: KubeletAuthorization) -> Harness {
    let tokens = Arc::new(FakeTokenReviewer::default());
    let access = Arc::new(FakeAccessReviewer::default());
    tokens.add_token(TOKEN, user(USER));
    let auth = KubeletAuth::new(AuthSettings {
        node_name: NODE.to_owned(),
        authentication,
        authorization,
        reviewers: Reviewers::Api {
            tokens: tokens.clone(),
            access: access.clone(),
        },
    })
    .unwrap();
    Harness {
        tokens,
        access,
        auth: Arc::new(auth),
    }
}

fn defaults() -> Harness {
    harness(
        KubeletAuthentication::default(),
        KubeletAuthorization::default(),
    )
}

/// Every path answers with the admitted user's name, so a test sees what reached the routes.
fn router() -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(|Extension(admitted): Extension<Admitted>| async move {
            format!("{} {:?}", admitted.user.name, admitted.user.groups)
        })
}

async fn send(auth: &Arc<KubeletAuth>, request: Request<Body>) -> (StatusCode, String) {
    let response: Response = AuthLayer::new(auth.clone())
        .layer(router())
        .oneshot(request)
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn with_token(method: Method, path: &str, token: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("Authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

fn with_cert(path: &str, cert: &ClientCert) -> Request<Body> {
    let mut request = Request::builder().uri(path).body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(PeerCertificates(Arc::new(cert.chain.clone())));
    request
}

fn bare(path: &str) -> Request<Body> {
    Request::builder().uri(path).body(Body::empty()).unwrap()
}

fn no_cache() -> KubeletAuthorization {
    KubeletAuthorization {
        mode: AuthorizationMode::Webhook,
        webhook: WebhookAuthorization {
            cache_authorized_ttl: Duration::ZERO,
            cache_unauthorized_ttl: Duration::ZERO,
        },
    }
}

/// Upstream: `TestAuthFilters`: every path of the table, every method; the authorizer has no
/// opinion, so each is 403 after a review of each of its attributes, in order.
#[tokio::test]
async fn test_auth_filters() {
    let h = harness(KubeletAuthentication::default(), no_cache());
    for (path, subresources) in authz_test_paths() {
        for (method, verb) in METHODS {
            let before = h.access.reviews().len();
            let (status, body) = send(&h.auth, with_token(method.clone(), path, TOKEN)).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method}:{path}");
            assert_eq!(
                body,
                format!(
                    "Forbidden (user={USER}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
                    subresources.join(" ")
                ),
                "{method}:{path}"
            );
            let reviews = h.access.reviews()[before..].to_vec();
            let expected: Vec<_> = subresources
                .iter()
                .map(|s| {
                    authz::access_review_spec(
                        &UserInfo {
                            groups: vec![authn::AUTHENTICATED_GROUP.to_owned()],
                            ..user(USER)
                        },
                        authz::Attribute {
                            verb,
                            subresource: s,
                            node_name: NODE,
                        },
                    )
                })
                .collect();
            assert_eq!(reviews, expected, "{method}:{path}");
        }
    }
}

/// Upstream: `TestAuthenticationError` (an authorizer error): 500 with upstream's message,
/// naming the subresource whose review failed.
#[tokio::test]
async fn test_authentication_error() {
    let h = defaults();
    h.access.set_mode(FakeMode::Fail);
    let (status, body) = send(&h.auth, with_token(Method::GET, "/healthz", TOKEN)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "Authorization error (user=phibby, verb=get, resource=nodes, subresource=healthz)"
    );
}

/// Upstream: `TestAuthenticationFailure`: 401 `Unauthorized`, and no authorization asked.
#[tokio::test]
async fn test_authentication_failure() {
    let h = defaults();
    for request in [
        bare("/healthz"),
        with_token(Method::GET, "/healthz", "unknown-token"),
    ] {
        let (status, body) = send(&h.auth, request).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, "Unauthorized")
        );
    }
    assert!(h.access.reviews().is_empty());
}

/// Upstream: `TestAuthorizationSuccess`.
#[tokio::test]
async fn test_authorization_success() {
    let h = defaults();
    h.access.allow(USER, "get", "healthz");
    let (status, body) = send(&h.auth, with_token(Method::GET, "/healthz", TOKEN)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
}

/// KEP-2862: `nodes/pods` first, then `nodes/proxy`; any allow is enough.
#[tokio::test]
async fn fine_grained_authorization_falls_back_to_proxy() {
    let h = defaults();
    h.access.allow(USER, "get", "proxy");
    let (status, _) = send(&h.auth, with_token(Method::GET, "/pods", TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    let subresources: Vec<_> = h
        .access
        .reviews()
        .into_iter()
        .map(|r| r.resource_attributes.unwrap().subresource.unwrap())
        .collect();
    assert_eq!(subresources, ["pods", "proxy"]);

    // Allowed on the fine-grained one: no fallback review.
    h.access.allow(USER, "get", "configz");
    let before = h.access.reviews().len();
    let (status, _) = send(&h.auth, with_token(Method::GET, "/configz", TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.access.reviews().len(), before + 1);
}

/// The bearer token authenticated: the routes never see it (upstream deletes the header).
#[tokio::test]
async fn the_authorization_header_is_removed_after_a_token_authenticated() {
    let h = harness(
        KubeletAuthentication::default(),
        KubeletAuthorization {
            mode: AuthorizationMode::AlwaysAllow,
            ..Default::default()
        },
    );
    let app = AuthLayer::new(h.auth.clone()).layer(Router::new().fallback(
        |headers: http::HeaderMap| async move { format!("{:?}", headers.get("authorization")) },
    ));
    let response = app
        .oneshot(with_token(Method::GET, "/pods", TOKEN))
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(body, "None");
}

/// A token in a WebSocket upgrade's subprotocols authenticates; the routes see the other
/// subprotocols only. Upstream: `websocket.ProtocolAuthenticator`.
#[tokio::test]
async fn a_websocket_protocol_token_authenticates_and_is_removed() {
    let h = harness(
        KubeletAuthentication::default(),
        KubeletAuthorization {
            mode: AuthorizationMode::AlwaysAllow,
            ..Default::default()
        },
    );
    let app = AuthLayer::new(h.auth.clone()).layer(Router::new().fallback(
        |Extension(admitted): Extension<Admitted>, headers: http::HeaderMap| async move {
            format!(
                "{} {:?}",
                admitted.user.name,
                headers.get("sec-websocket-protocol")
            )
        },
    ));
    // base64url("phibby-token") = cGhpYmJ5LXRva2Vu
    let request = Request::builder()
        .uri("/exec/ns/p/c?command=ls")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header(
            "sec-websocket-protocol",
            "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.cGhpYmJ5LXRva2Vu",
        )
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(body, r#"phibby Some("v5.channel.k8s.io")"#);
}

/// Transient failures are retried with upstream's backoff (five tries: 0.5 s, then × 1.5),
/// then the request fails; permanent ones are not retried.
#[tokio::test(start_paused = true)]
async fn transient_review_failures_are_retried_five_times() {
    let h = defaults();
    h.tokens.set_mode(FakeMode::FailTransient);
    let (status, _) = send(&h.auth, with_token(Method::GET, "/pods", TOKEN)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(h.tokens.calls(), 5);
    h.tokens.set_mode(FakeMode::Fail);
    send(&h.auth, with_token(Method::GET, "/pods", TOKEN)).await;
    assert_eq!(h.tokens.calls(), 6);
}

/// `authentication.webhook.cacheTTL` (2m): an answer, authenticated or not, stands for 2m.
#[tokio::test(start_paused = true)]
async fn token_reviews_are_cached_for_the_cache_ttl() {
    let h = harness(
        KubeletAuthentication::default(),
        KubeletAuthorization {
            mode: AuthorizationMode::AlwaysAllow,
            ..Default::default()
        },
    );
    let get = || with_token(Method::GET, "/pods", TOKEN);
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::OK);
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::OK);
    assert_eq!(h.tokens.calls(), 1);

    h.tokens.clear();
    tokio::time::advance(Duration::from_secs(119)).await;
    assert_eq!(
        send(&h.auth, get()).await.0,
        StatusCode::OK,
        "cached for 2m"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(h.tokens.calls(), 2);

    // The refusal is cached as long.
    h.tokens.add_token(TOKEN, user(USER));
    tokio::time::advance(Duration::from_secs(119)).await;
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::UNAUTHORIZED);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::OK);
    assert_eq!(h.tokens.calls(), 3);
}

/// Errors are never cached: the next request asks again.
#[tokio::test(start_paused = true)]
async fn review_errors_are_not_cached() {
    let h = defaults();
    h.tokens.set_mode(FakeMode::Fail);
    assert_eq!(
        send(&h.auth, with_token(Method::GET, "/pods", TOKEN))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    h.tokens.set_mode(FakeMode::Answer);
    h.access.set_mode(FakeMode::Fail);
    assert_eq!(
        send(&h.auth, with_token(Method::GET, "/pods", TOKEN))
            .await
            .0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    h.access.set_mode(FakeMode::Answer);
    h.access.allow(USER, "get", "pods");
    assert_eq!(
        send(&h.auth, with_token(Method::GET, "/pods", TOKEN))
            .await
            .0,
        StatusCode::OK
    );
}

/// `authorization.webhook.cacheAuthorizedTTL` (5m) and `cacheUnauthorizedTTL` (30s).
#[tokio::test(start_paused = true)]
async fn access_reviews_are_cached_5m_when_allowed_and_30s_when_not() {
    let h = defaults();
    let get = || with_token(Method::GET, "/stats/summary", TOKEN);
    h.access.allow(USER, "get", "stats");
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::OK);
    h.access.clear();
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(
        send(&h.auth, get()).await.0,
        StatusCode::OK,
        "allowed for 5m"
    );
    assert_eq!(h.access.reviews().len(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::FORBIDDEN);
    assert_eq!(h.access.reviews().len(), 2);

    h.access.allow(USER, "get", "stats");
    tokio::time::advance(Duration::from_secs(29)).await;
    assert_eq!(
        send(&h.auth, get()).await.0,
        StatusCode::FORBIDDEN,
        "refused for 30s"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(send(&h.auth, get()).await.0, StatusCode::OK);
    assert_eq!(h.access.reviews().len(), 3);
}

fn x509_only(dir: &std::path::Path, ca: &TestCa) -> KubeletAuthentication {
    KubeletAuthentication::client_certificates_only(ca.write(dir, "client-ca.crt"))
}

/// Upstream: `CommonNameUserConversion`: user = CN, groups = O, then `system:authenticated`.
#[tokio::test]
async fn a_client_certificate_authenticates_as_its_cn_in_its_o_groups() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("client-ca");
    let h = harness(x509_only(dir.path(), &ca), KubeletAuthorization::default());
    h.access.allow("alice", "get", "proxy");
    let alice = ca.client("alice", Some("devs"));
    let (status, body) = send(&h.auth, with_cert("/containerLogs/ns/p/c", &alice)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, r#"alice ["devs", "system:authenticated"]"#);
    let review = &h.access.reviews()[0];
    assert_eq!(review.user.as_deref(), Some("alice"));
    assert_eq!(
        review.groups.as_deref(),
        Some(&["devs".to_owned(), "system:authenticated".to_owned()][..])
    );
}

/// A certificate from another CA is an authentication error: 401, even with anonymous
/// enabled (upstream's `NewFailOnError`), and even beside a valid token it is the token that
/// authenticates (the union tries each).
#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("client-ca");
    let other = TestCa::new("other-ca");
    let mut authentication = x509_only(dir.path(), &ca);
    authentication.anonymous.enabled = true;
    authentication.webhook.enabled = true;
    let h = harness(
        authentication,
        KubeletAuthorization {
            mode: AuthorizationMode::AlwaysAllow,
            ..Default::default()
        },
    );
    let mallory = other.client("alice", Some("system:masters"));
    let (status, body) = send(&h.auth, with_cert("/pods", &mallory)).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );

    let mut request = with_cert("/pods", &mallory);
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (status, body) = send(&h.auth, request).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("phibby "), "{body}");
}

/// No CN: no opinion (upstream), so anonymous when enabled; no credentials at all, the same.
#[tokio::test]
async fn anonymous_when_enabled_is_system_anonymous_in_system_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("client-ca");
    let mut authentication = x509_only(dir.path(), &ca);
    authentication.anonymous.enabled = true;
    authentication.webhook.enabled = true;
    let h = harness(authentication, KubeletAuthorization::default());
    h.access.allow("system:anonymous", "get", "healthz");
    let nameless = ca.client("", Some("devs"));
    for request in [bare("/healthz/ping"), with_cert("/healthz/ping", &nameless)] {
        let (status, body) = send(&h.auth, request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, r#"system:anonymous ["system:unauthenticated"]"#);
    }
    // A token the API server refuses is not anonymous.
    let (status, _) = send(&h.auth, with_token(Method::GET, "/healthz/ping", "bad")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Anonymous is authorized like anyone.
    let (status, body) = send(&h.auth, bare("/exec/ns/p/c")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[proxy])\n"
    );
}

/// Local mode: client certificates only; every verified certificate is allowed.
#[tokio::test]
async fn local_mode_takes_client_certificates_only() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("client-ca");
    let local = |authentication, mode| {
        KubeletAuth::new(AuthSettings {
            node_name: NODE.to_owned(),
            authentication,
            authorization: KubeletAuthorization {
                mode,
                ..Default::default()
            },
            reviewers: Reviewers::None,
        })
    };
    assert!(matches!(
        local(
            KubeletAuthentication::default(),
            AuthorizationMode::AlwaysAllow
        ),
        Err(AuthConfigError::NeedsApiServer {
            setting: "authentication.webhook.enabled"
        })
    ));
    assert!(matches!(
        local(x509_only(dir.path(), &ca), AuthorizationMode::Webhook),
        Err(AuthConfigError::NeedsApiServer {
            setting: "authorization.mode: Webhook"
        })
    ));
    let mut anonymous = x509_only(dir.path(), &ca);
    anonymous.anonymous.enabled = true;
    assert!(matches!(
        local(anonymous, AuthorizationMode::AlwaysAllow),
        Err(AuthConfigError::AnonymousInLocalMode)
    ));
    let nothing = KubeletAuthentication {
        webhook: WebhookAuthentication {
            enabled: false,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(matches!(
        local(nothing, AuthorizationMode::AlwaysAllow),
        Err(AuthConfigError::NoAuthenticationMethod)
    ));

    let auth = Arc::new(local(x509_only(dir.path(), &ca), AuthorizationMode::AlwaysAllow).unwrap());
    let (status, _) = send(&auth, with_cert("/exec/ns/p/c", &ca.client("alice", None))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&auth, with_token(Method::GET, "/pods", TOKEN)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let other = TestCa::new("other-ca");
    let (status, _) = send(&auth, with_cert("/pods", &other.client("alice", None))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// Upstream's v1beta1 defaults.
#[test]
fn the_defaults_are_upstreams() {
    let authn = KubeletAuthentication::default();
    assert_eq!(authn.x509.client_ca_file, None);
    assert!(authn.webhook.enabled);
    assert_eq!(authn.webhook.cache_ttl, Duration::from_secs(120));
    assert!(!authn.anonymous.enabled);
    let authz = KubeletAuthorization::default();
    assert_eq!(authz.mode, AuthorizationMode::Webhook);
    assert_eq!(authz.webhook.cache_authorized_ttl, Duration::from_secs(300));
    assert_eq!(
        authz.webhook.cache_unauthorized_ttl,
        Duration::from_secs(30)
    );
}
