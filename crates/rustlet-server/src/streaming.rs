//! `/exec`, `/attach`, `/portForward` (and `/run`): the runtime serves each session on a URL its
//! CRI `Exec`/`Attach`/`PortForward` answer names; the kubelet proxies the client's upgrade
//! request there and then copies bytes both ways (upstream: `server.go` `getExec` →
//! `proxyStream` → `proxy.NewUpgradeAwareHandler(url, nil, false, true, …)`; it proxies, it
//! does not redirect).
//!
//! Whatever the protocol (SPDY/3.1 from the API server, a WebSocket from a client that speaks
//! it), the bytes after the `101 Switching Protocols` are the runtime's business: nothing here
//! parses them. An idle session (no byte either way) ends after the idle timeout
//! (`streamingConnectionIdleTimeout`, 4 h by default; none when it is `0`). Deviation: upstream
//! fed that setting to the in-process streaming server of the runtimes it once built in
//! (`getStreamingConfig`'s `StreamIdleTimeout`); with a remote runtime only the runtime's own
//! stream server times sessions out (containerd's `stream_idle_timeout`), so the agent's proxy
//! applies it here, as the kubelet's documentation of the setting promises.

use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tracing::debug;

/// The kubelet's default `streamingConnectionIdleTimeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// The largest response head the runtime may send before its body or the upgraded stream.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The largest error body relayed from the runtime (a refused upgrade).
const MAX_ERROR_BODY_BYTES: usize = 1024 * 1024;

/// How a session is proxied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Connecting to the runtime's stream server and reading its answer's head.
    pub connect_timeout: Duration,
    /// A session with no byte either way for this long is closed; `None`: never (upstream's
    /// `streamingConnectionIdleTimeout: 0`).
    pub idle_timeout: Option<Duration>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

/// Why a session could not be proxied.
#[derive(Debug, thiserror::Error)]
pub enum StreamingError {
    /// The client's request asks for no protocol upgrade (upstream: `upgradeRequired`).
    #[error("Upgrade request required")]
    UpgradeRequired,
    /// The runtime's URL is not `http://host:port/...`.
    #[error("the runtime's stream URL {0} is not http://host:port/path")]
    BadRuntimeUrl(String),
    /// Connecting to the runtime's stream server, or talking to it, failed or took too long.
    #[error("proxying to the runtime's stream server {url}: {reason}")]
    Runtime {
        /// The runtime's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

impl StreamingError {
    /// The answer to the client: 400 for a request that is no upgrade (upstream's wording),
    /// 502 when the runtime could not be reached.
    pub fn into_response(self) -> Response<Body> {
        let status = match self {
            StreamingError::UpgradeRequired => StatusCode::BAD_REQUEST,
            StreamingError::BadRuntimeUrl(_) | StreamingError::Runtime { .. } => {
                StatusCode::BAD_GATEWAY
            }
        };
        let mut response = Response::new(Body::from(self.to_string()));
        *response.status_mut() = status;
        response
    }
}

/// Whether `headers` ask for a protocol upgrade (`Connection: upgrade` and an `Upgrade`).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
    });
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Proxies the client's upgrade request `req` to the runtime's stream URL `runtime_url`: the
/// runtime's answer goes back to the client; when it is `101 Switching Protocols`, a task
/// copies bytes both ways until either side closes or the session is idle for
/// `config.idle_timeout` (when it has one).
pub async fn proxy_upgrade(
    mut req: Request<Body>,
    runtime_url: &Uri,
    config: ProxyConfig,
) -> Result<Response<Body>, StreamingError> {
    if !is_upgrade_request(req.headers()) {
        return Err(StreamingError::UpgradeRequired);
    }
    let bad_url = || StreamingError::BadRuntimeUrl(runtime_url.to_string());
    if runtime_url.scheme_str() != Some("http") {
        return Err(bad_url());
    }
    let authority = runtime_url.authority().ok_or_else(bad_url)?.clone();
    let port = authority.port_u16().ok_or_else(bad_url)?;
    let runtime_err = |reason: String| StreamingError::Runtime {
        url: runtime_url.to_string(),
        reason,
    };
    let timed = |what: &'static str| move |_| format!("{what}: no answer in time");

    let mut upstream = tokio::time::timeout(
        config.connect_timeout,
        TcpStream::connect((authority.host(), port)),
    )
    .await
    .map_err(timed("connecting"))
    .map_err(runtime_err)?
    .map_err(|e| runtime_err(format!("connecting: {e}")))?;

    let head = request_head(&req, runtime_url, authority.as_str());
    let (status, headers, rest) = tokio::time::timeout(config.connect_timeout, async {
        upstream.write_all(head.as_bytes()).await?;
        read_response_head(&mut upstream).await
    })
    .await
    .map_err(timed("the upgrade"))
    .map_err(runtime_err)?
    .map_err(|e| runtime_err(format!("the upgrade: {e}")))?;

    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (an unknown session token, a bad request): relay its answer.
        let body = tokio::time::timeout(
            config.connect_timeout,
            read_error_body(&mut upstream, rest, response.headers()),
        )
        .await
        .unwrap_or_default();
        response.headers_mut().remove(header::TRANSFER_ENCODING);
        *response.body_mut() = Body::from(body);
        return Ok(response);
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let idle = config.idle_timeout;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if !rest.is_empty() && client.write_all(&rest).await.is_err() {
                    return;
                }
                let outcome = copy_until_idle(&mut client, &mut upstream, idle).await;
                debug!("stream session ended: {outcome:?}");
            }
            Err(e) => debug!("the client's connection was not upgraded: {e}"),
        }
    });
    Ok(response)
}

/// The request line and headers sent to the runtime: the client's method and headers (its
/// `Host` replaced by the runtime's), the runtime URL's path and query.
fn request_head(req: &Request<Body>, runtime_url: &Uri, authority: &str) -> String {
    let target = runtime_url
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut head = format!(
        "{} {target} HTTP/1.1\r\nHost: {authority}\r\n",
        req.method()
    );
    for (name, value) in req.headers() {
        if name == header::HOST {
            continue;
        }
        if let Ok(value) = value.to_str() {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("\r\n");
    head
}

/// Reads the runtime's response head; returns its status, headers and the bytes read past it.
async fn read_response_head(
    stream: &mut TcpStream,
) -> std::io::Result<(StatusCode, HeaderMap, Vec<u8>)> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(invalid("the runtime closed before its answer".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut parsed = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut parsed);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = StatusCode::from_u16(response.code.unwrap_or(500))
                    .map_err(|e| invalid(e.to_string()))?;
                let mut headers = HeaderMap::new();
                for h in response.headers.iter() {
                    let name = HeaderName::from_bytes(h.name.as_bytes())
                        .map_err(|e| invalid(e.to_string()))?;
                    let value =
                        HeaderValue::from_bytes(h.value).map_err(|e| invalid(e.to_string()))?;
                    headers.append(name, value);
                }
                return Ok((status, headers, buf.split_off(len)));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => {}
            Ok(httparse::Status::Partial) => {
                return Err(invalid(format!(
                    "the runtime's answer head exceeds {MAX_HEAD_BYTES} bytes"
                )));
            }
            Err(e) => return Err(invalid(format!("the runtime's answer: {e}"))),
        }
    }
}

/// The body of a refused upgrade: `Content-Length` bytes, or to the end, at most
/// [`MAX_ERROR_BODY_BYTES`].
async fn read_error_body(
    stream: &mut TcpStream,
    mut body: Vec<u8>,
    headers: &HeaderMap,
) -> Vec<u8> {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let want = length
        .unwrap_or(MAX_ERROR_BODY_BYTES)
        .min(MAX_ERROR_BODY_BYTES);
    let mut chunk = [0u8; 4096];
    while body.len() < want {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(want);
    body
}

/// How a proxied session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// Both sides closed their sending half (or one side closed its connection).
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// A read or write failed.
    Failed(String),
}

/// Copies bytes both ways between `a` and `b` until both have finished sending, or nothing
/// moved for `idle` (when it is `Some`). A side that finishes sending gets its peer's write
/// half shut down.
pub async fn copy_until_idle<A, B>(a: &mut A, b: &mut B, idle: Option<Duration>) -> SessionEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let mut a_buf = vec![0u8; 32 * 1024];
    let mut b_buf = vec![0u8; 32 * 1024];
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        let step = async {
            tokio::select! {
                read = a_read.read(&mut a_buf), if a_open => match read {
                    Ok(0) => { a_open = false; b_write.shutdown().await }
                    Ok(n) => b_write.write_all(&a_buf[..n]).await,
                    Err(e) => Err(e),
                },
                read = b_read.read(&mut b_buf), if b_open => match read {
                    Ok(0) => { b_open = false; a_write.shutdown().await }
                    Ok(n) => a_write.write_all(&b_buf[..n]).await,
                    Err(e) => Err(e),
                },
            }
        };
        let step = match idle {
            Some(idle) => match tokio::time::timeout(idle, step).await {
                Ok(step) => step,
                Err(_) => return SessionEnd::Idle,
            },
            None => step.await,
        };
        match step {
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
                return SessionEnd::Closed;
            }
            Err(e) => return SessionEnd::Failed(e.to_string()),
            Ok(()) => {}
        }
    }
    SessionEnd::Closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::any;
    use tokio::net::TcpListener;

    /// A stream server like containerd's: checks the upgrade request it gets, answers 101
    /// with a greeting, then echoes. Returns its URL and the head it received.
    async fn fake_runtime() -> (Uri, tokio::sync::oneshot::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                conn.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8(head).unwrap());
            conn.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                  X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\nhello",
            )
            .await
            .unwrap();
            let mut buf = [0u8; 1024];
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => conn.write_all(&buf[..n]).await.unwrap(),
                }
            }
        });
        let url = format!("http://127.0.0.1:{port}/exec/Tok3n")
            .parse()
            .unwrap();
        (url, rx)
    }

    /// The agent's side: every request is proxied to `url`.
    async fn agent(url: Uri, config: ProxyConfig) -> u16 {
        let app = Router::new().route(
            "/{*rest}",
            any(move |req: Request<Body>| {
                let url = url.clone();
                async move {
                    match proxy_upgrade(req, &url, config).await {
                        Ok(r) => r,
                        Err(e) => e.into_response(),
                    }
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }

    async fn read_until(conn: &mut TcpStream, end: &[u8]) -> Vec<u8> {
        let mut got = Vec::new();
        while !got.windows(end.len()).any(|w| w == end) {
            let mut buf = [0u8; 1024];
            let n = conn.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed early; got {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    /// upstream `TestServeExecInContainer`'s shape: the upgrade request reaches the runtime's
    /// URL with its protocol headers, the 101 and the runtime's bytes reach the client, and
    /// what the client sends reaches the runtime.
    #[tokio::test]
    async fn an_exec_upgrade_is_proxied_to_the_runtime_and_bytes_flow_both_ways() {
        let (url, head) = fake_runtime().await;
        let port = agent(url, ProxyConfig::default()).await;
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client
            .write_all(
                b"POST /exec/ns/pod/main?command=sh&stdin=1 HTTP/1.1\r\nHost: node-a:10250\r\n\
                  Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                  X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
            )
            .await
            .unwrap();
        let got = read_until(&mut client, b"hello").await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 101"), "{text}");
        assert!(
            text.to_lowercase()
                .contains("x-stream-protocol-version: v4.channel.k8s.io")
        );
        let head = head.await.unwrap();
        assert!(head.starts_with("POST /exec/Tok3n HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("\r\nupgrade: SPDY/3.1\r\n"), "{head}");
        assert!(
            !head.contains("node-a:10250"),
            "the client's Host is replaced: {head}"
        );
        client.write_all(b"ping").await.unwrap();
        read_until(&mut client, b"ping").await;
    }

    /// upstream's `upgradeRequired`: a plain request gets 400 `Upgrade request required` and
    /// never reaches the runtime.
    #[tokio::test]
    async fn a_request_without_an_upgrade_is_refused() {
        let (url, head) = fake_runtime().await;
        let port = agent(url, ProxyConfig::default()).await;
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client
            .write_all(b"GET /exec/ns/pod/main HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.ends_with("Upgrade request required"), "{answer}");
        drop(head);
    }

    /// A runtime that refuses the session (an unknown token): its status and body reach the
    /// client.
    #[tokio::test]
    async fn a_refusal_of_the_runtime_is_relayed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await.unwrap();
            conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 13\r\n\r\nunknown token")
                .await
                .unwrap();
        });
        let url: Uri = format!("http://127.0.0.1:{port}/exec/nope")
            .parse()
            .unwrap();
        let agent_port = agent(url, ProxyConfig::default()).await;
        let mut client = TcpStream::connect(("127.0.0.1", agent_port)).await.unwrap();
        client
            .write_all(
                b"GET /exec/ns/pod/main HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
                  Upgrade: SPDY/3.1\r\n\r\n",
            )
            .await
            .unwrap();
        let got = read_until(&mut client, b"unknown token").await;
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 404"));
    }

    /// `streamingConnectionIdleTimeout`: a session where nothing moves ends (both
    /// connections close) once the idle timeout passes; paused time makes it immediate.
    #[tokio::test(start_paused = true)]
    async fn an_idle_session_ends_after_the_idle_timeout() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b, mut b_peer) = tokio::io::duplex(64);
        let session = tokio::spawn(async move {
            copy_until_idle(&mut a, &mut b, Some(Duration::from_secs(60))).await
        });
        a_peer.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        b_peer.read_exact(&mut one).await.unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(session.await.unwrap(), SessionEnd::Idle);
        assert!(started.elapsed() >= Duration::from_secs(60));
    }

    /// upstream's `streamingConnectionIdleTimeout: 0` ("0 indicates no timeout"): a session
    /// that passes nothing for days is still open, and bytes still flow.
    #[tokio::test(start_paused = true)]
    async fn without_an_idle_timeout_an_idle_session_stays_open() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b, mut b_peer) = tokio::io::duplex(64);
        let session = tokio::spawn(async move { copy_until_idle(&mut a, &mut b, None).await });
        tokio::time::sleep(Duration::from_secs(30 * 24 * 3600)).await;
        assert!(!session.is_finished());
        a_peer.write_all(b"late").await.unwrap();
        let mut got = [0u8; 4];
        b_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"late");
    }

    /// `streamingConnectionIdleTimeout` through the proxy: once nothing moved for the idle
    /// timeout, the client's upgraded connection is closed.
    #[tokio::test]
    async fn an_idle_proxied_session_is_closed_after_the_idle_timeout() {
        let (url, _head) = fake_runtime().await;
        let config = ProxyConfig {
            idle_timeout: Some(Duration::from_millis(100)),
            ..ProxyConfig::default()
        };
        let port = agent(url, config).await;
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client
            .write_all(
                b"POST /exec/ns/pod/main?command=sh&input=1 HTTP/1.1\r\nHost: x\r\n\
                  Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n",
            )
            .await
            .unwrap();
        read_until(&mut client, b"hello").await;
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
    }

    /// Each side finishing its sending half is passed on; the session ends when both have.
    #[tokio::test]
    async fn half_closes_are_passed_on_and_end_the_session() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b, mut b_peer) = tokio::io::duplex(64);
        let session = tokio::spawn(async move {
            copy_until_idle(&mut a, &mut b, Some(DEFAULT_IDLE_TIMEOUT)).await
        });
        a_peer.write_all(b"last").await.unwrap();
        a_peer.shutdown().await.unwrap();
        let mut got = Vec::new();
        b_peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last");
        b_peer.shutdown().await.unwrap();
        assert_eq!(session.await.unwrap(), SessionEnd::Closed);
    }
}
