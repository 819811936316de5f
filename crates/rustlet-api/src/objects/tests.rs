//! HTTP shapes of the PV/PVC getters and the TokenRequest, and the token refresh rule.

use std::sync::{Arc, Mutex};

use futures::pin_mut;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::client::Body;
use rustlet_status::Clock;
use serde_json::{Value, json};
use tower_test::mock::{Handle, pair};

use rustlet_core::PodUid;
use rustlet_volume::objects::{TokenRequestKey, VolumeObjects};

use super::ApiObjects;
use crate::backend::Backend;
use crate::content::ObjectSourceConfig;

struct ManualClock(Mutex<Timestamp>);

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

impl ManualClock {
    fn set(&self, now: Timestamp) {
        *self.0.lock().unwrap() = now;
    }
}

/// The token `objects` serves for [`key`].
async fn served(objects: &ApiObjects) -> String {
    objects.service_account_token(&key()).await.unwrap().token
}

/// [`key`] for another audience: another token of the same pod.
fn other_audience() -> TokenRequestKey {
    TokenRequestKey {
        audiences: vec!["other".into()],
        ..key()
    }
}

fn start() -> Timestamp {
    "2026-12-02T10:00:00Z".parse().unwrap()
}

fn objects() -> (
    ApiObjects,
    Arc<ManualClock>,
    Handle<Request<Body>, Response<Body>>,
) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    let clock = Arc::new(ManualClock(Mutex::new(start())));
    let objects = ApiObjects::with_clock(
        Backend::Cluster(kube::Client::new(service, "default")),
        ObjectSourceConfig::default(),
        clock.clone(),
    );
    (objects, clock, handle)
}

fn reply(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn not_found() -> Response<Body> {
    reply(
        StatusCode::NOT_FOUND,
        &json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"gone"}),
    )
}

async fn body(req: Request<Body>) -> Value {
    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn claim_and_volume_are_plain_gets() {
    let (objects, _, handle) = objects();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/ns1/persistentvolumeclaims/data"
        );
        send.send_response(reply(
            StatusCode::OK,
            &json!({"apiVersion":"v1","kind":"PersistentVolumeClaim",
                "metadata":{"name":"data","namespace":"ns1","uid":"claim-uid"},
                "spec":{"volumeName":"pv-1"}}),
        ));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().path(), "/api/v1/persistentvolumes/pv-1");
        send.send_response(reply(
            StatusCode::OK,
            &json!({"apiVersion":"v1","kind":"PersistentVolume",
                "metadata":{"name":"pv-1"},
                "spec":{"local":{"path":"/mnt/disks/a"},"claimRef":{"uid":"claim-uid"}}}),
        ));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.uri().path(), "/api/v1/persistentvolumes/missing");
        send.send_response(not_found());
    });
    let claim = objects
        .persistent_volume_claim("ns1", "data")
        .await
        .unwrap();
    let volume_name = claim.spec.unwrap().volume_name.unwrap();
    let pv = objects.persistent_volume(&volume_name).await.unwrap();
    assert_eq!(pv.spec.unwrap().local.unwrap().path, "/mnt/disks/a");
    let err = objects.persistent_volume("missing").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(err.to_string(), "get persistentvolume missing: not found");
    server.await.unwrap();
}

fn key() -> TokenRequestKey {
    TokenRequestKey {
        namespace: "ns1".into(),
        service_account: "builder".into(),
        audiences: vec!["vault".into()],
        expiration_seconds: 3607,
        pod_name: "web".into(),
        pod_uid: "pod-uid".into(),
    }
}

fn token_reply(token: &str, expires: Timestamp) -> Response<Body> {
    reply(
        StatusCode::CREATED,
        &json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest",
            "metadata":{"name":"builder","namespace":"ns1"},
            "spec":{"audiences":["vault"],"expirationSeconds":3607},
            "status":{"token":token,"expirationTimestamp":expires.to_string()}}),
    )
}

#[tokio::test]
async fn token_request_is_bound_to_the_pod_cached_and_renewed_at_80_percent() {
    let (objects, clock, handle) = objects();
    let expires = start() + SignedDuration::from_secs(3607);
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        for (token, expires) in [
            ("t1", expires),
            ("t2", expires + SignedDuration::from_secs(3000)),
        ] {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(req.method(), Method::POST);
            assert_eq!(
                req.uri().path(),
                "/api/v1/namespaces/ns1/serviceaccounts/builder/token"
            );
            assert_eq!(
                req.headers()["content-type"].to_str().unwrap(),
                "application/json"
            );
            let sent = body(req).await;
            assert_eq!(sent["apiVersion"], "authentication.k8s.io/v1");
            assert_eq!(sent["kind"], "TokenRequest");
            assert_eq!(
                sent["spec"],
                json!({"audiences":["vault"],"expirationSeconds":3607,
                    "boundObjectRef":{"apiVersion":"v1","kind":"Pod","name":"web","uid":"pod-uid"}})
            );
            send.send_response(token_reply(token, expires));
        }
    });
    let first = objects.service_account_token(&key()).await.unwrap();
    assert_eq!(first.token, "t1");
    assert_eq!(first.expires_at, expires);
    // At 79% of the lifetime the cached token is served without a request.
    clock.set(start() + SignedDuration::from_secs(3607 * 79 / 100));
    assert_eq!(served(&objects).await, "t1");
    // At 80% a new one is requested.
    clock.set(start() + SignedDuration::from_secs(3607 * 81 / 100));
    assert_eq!(served(&objects).await, "t2");
    server.await.unwrap();
}

#[tokio::test]
async fn forgotten_pod_tokens_are_requested_again() {
    let (objects, _, handle) = objects();
    let expires = start() + SignedDuration::from_secs(3607);
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        for token in ["t1", "t2"] {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(token_reply(token, expires));
        }
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(reply(StatusCode::CREATED, &json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","metadata":{},"status":{"expirationTimestamp":expires.to_string()}})));
    });
    assert_eq!(served(&objects).await, "t1");
    objects.forget_tokens_of(&PodUid::new("pod-uid"));
    assert_eq!(served(&objects).await, "t2");
    let other = other_audience();
    let err = objects.service_account_token(&other).await.unwrap_err();
    assert!(!err.is_not_found());
    assert!(err.to_string().contains("status.token"), "{err}");
    server.await.unwrap();
}

fn unavailable() -> Response<Body> {
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503,"message":"etcd is down"}),
    )
}

/// Upstream `TestTokenCachingAndExpiration`: a refresh that fails while the cached token is
/// still valid serves that token; once it has expired the failure is the caller's.
#[tokio::test]
async fn token_caching_and_expiration_a_failed_refresh_serves_the_token_until_it_expires() {
    let (objects, clock, handle) = objects();
    let expires = start() + SignedDuration::from_secs(3607);
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(token_reply("t1", expires));
        for _ in 0..2 {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(unavailable());
        }
    });
    assert_eq!(served(&objects).await, "t1");
    // Past 80 %: the refresh is asked for and fails, and the old token still serves.
    clock.set(start() + SignedDuration::from_secs(3600));
    assert_eq!(served(&objects).await, "t1");
    // Expired: the refresh fails and so does the call.
    clock.set(expires + SignedDuration::from_secs(1));
    let err = objects.service_account_token(&key()).await.unwrap_err();
    assert!(err.to_string().contains("etcd is down"), "{err}");
    server.await.unwrap();
}

/// The refresh follows the lifetime the API server issued the token for (the answer's
/// `spec.expirationSeconds`, which a server's maximum may shorten), not the one asked for.
#[tokio::test]
async fn a_token_is_refreshed_at_80_percent_of_the_lifetime_it_was_issued_for() {
    let (objects, clock, handle) = objects();
    let expires = start() + SignedDuration::from_secs(600);
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        for token in ["t1", "t2"] {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(reply(
                StatusCode::CREATED,
                &json!({"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest",
                    "metadata":{},"spec":{"audiences":["vault"],"expirationSeconds":600},
                    "status":{"token":token,"expirationTimestamp":expires.to_string()}}),
            ));
        }
    });
    assert_eq!(served(&objects).await, "t1");
    // 3607 s asked for: 80 % of it would be 2885 s. 80 % of the 600 issued is 480 s, less a
    // jitter of up to ten seconds.
    clock.set(start() + SignedDuration::from_secs(469));
    assert_eq!(served(&objects).await, "t1");
    clock.set(start() + SignedDuration::from_secs(481));
    assert_eq!(served(&objects).await, "t2");
    server.await.unwrap();
}

/// Upstream's token manager drops expired tokens from its cache (its minute-long cleanup); here
/// a new token does: a token of a request no pod asks for any more does not stay behind.
#[tokio::test]
async fn a_new_token_drops_the_expired_ones_from_the_cache() {
    let (objects, clock, handle) = objects();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        for (token, expires) in [("t1", 600), ("t2", 3600)] {
            let (_, send) = handle.next_request().await.unwrap();
            send.send_response(token_reply(
                token,
                start() + SignedDuration::from_secs(expires),
            ));
        }
    });
    assert_eq!(served(&objects).await, "t1");
    assert_eq!(objects.tokens().len(), 1);
    clock.set(start() + SignedDuration::from_secs(601));
    let other = other_audience();
    let token = objects.service_account_token(&other).await.unwrap();
    assert_eq!(token.token, "t2");
    let held: Vec<TokenRequestKey> = objects.tokens().keys().cloned().collect();
    assert_eq!(held, vec![other], "the expired t1 is gone");
    server.await.unwrap();
}
