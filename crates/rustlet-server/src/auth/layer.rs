//! [`AuthLayer`]: the kubelet's filter as a tower layer. Wrap the whole router with it
//! (`AuthLayer::new(auth).layer(router)`), as upstream's filter wraps the whole restful
//! container: a path no route serves is still authenticated and authorized first. The
//! connection's client certificates come from the request's [`PeerCertificates`] extension
//! ([`crate::tls::serve`] puts them there); an admitted request carries [`Admitted`] in its
//! extensions, and its `Authorization` header is gone when a bearer token authenticated it
//! (upstream removes it too), as is the token's subprotocol from `Sec-WebSocket-Protocol`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, Request, header};

use super::{Admitted, Credentials, KubeletAuth, Refusal, authn};
use crate::tls::PeerCertificates;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Arc<KubeletAuth>,
}

impl AuthLayer {
    /// A layer over `auth`.
    pub fn new(auth: Arc<KubeletAuth>) -> Self {
        Self { auth }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            auth: self.auth.clone(),
            inner,
        }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    auth: Arc<KubeletAuth>,
    inner: S,
}

/// The refusal as upstream writes it (`WriteErrorString`: the status, the text).
pub fn refusal_response(refusal: &Refusal) -> Response {
    let mut response = Response::new(Body::from(refusal.body()));
    *response.status_mut() = refusal.status();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<S, B> tower::Service<Request<B>> for AuthService<S>
where
    S: tower::Service<Request<B>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service goes with this request; its clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let peer = parts
                .extensions
                .get::<PeerCertificates>()
                .cloned()
                .unwrap_or_default();
            let credentials = Credentials {
                headers: &parts.headers,
                peer_certificates: &peer.0,
            };
            let admitted: Admitted = match auth
                .check(&parts.method, parts.uri.path(), credentials)
                .await
            {
                Ok(admitted) => admitted,
                Err(refusal) => return Ok(refusal_response(&refusal)),
            };
            match admitted.method {
                authn::Method::BearerToken => {
                    parts.headers.remove(header::AUTHORIZATION);
                }
                authn::Method::WebSocketProtocolToken => {
                    if let Ok(Some(found)) = authn::websocket_token(&parts.headers)
                        && let Ok(value) = HeaderValue::from_str(&found.other_protocols)
                    {
                        parts.headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
                    }
                }
                authn::Method::ClientCertificate | authn::Method::Anonymous => {}
            }
            parts.extensions.insert(admitted);
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}
