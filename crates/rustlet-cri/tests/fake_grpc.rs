//! The client against a minimal gRPC server on a unix socket that answers every call with one
//! fixed message (or never): the version check refuses another CRI version, and a runtime that
//! does not answer gives a timeout naming the call, never a hang.

use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_cri::v1 as cri;
use prost::Message;
use rustlet_cri::{CriClient, CriError};

/// How the fake server answers.
#[derive(Clone)]
enum Answer {
    /// This message, grpc-status 0.
    Message(Bytes),
    /// Nothing, ever.
    Never,
}

fn framed(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(body.len()).unwrap());
    out.put_slice(&body);
    out.freeze()
}

type Body = StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

async fn answer(answer: Answer, _request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let message = match answer {
        Answer::Message(m) => m,
        Answer::Never => std::future::pending().await,
    };
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let frames = vec![Ok(Frame::data(message)), Ok(Frame::trailers(trailers))];
    Ok(Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures::stream::iter(frames)))
        .unwrap())
}

/// Serves `answer` on a unix socket at `path` until the test ends.
fn serve(path: &Path, reply: Answer) {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let reply = reply.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| answer(reply.clone(), r));
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

#[tokio::test]
async fn a_runtime_speaking_another_cri_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("old.sock");
    serve(
        &socket,
        Answer::Message(framed(&cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "oldtainerd".into(),
            runtime_version: "1.4.0".into(),
            runtime_api_version: "v1alpha2".into(),
        })),
    );
    let endpoint = format!("unix://{}", socket.display());
    let err = CriClient::connect(&endpoint, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, CriError::Version { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("oldtainerd 1.4.0") && text.contains("v1alpha2") && text.contains(&endpoint),
        "{text}"
    );

    // The same server speaking v1 passes.
    let socket = dir.path().join("v1.sock");
    serve(
        &socket,
        Answer::Message(framed(&cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "containerd".into(),
            runtime_version: "2.0".into(),
            runtime_api_version: "v1".into(),
        })),
    );
    let client = CriClient::connect(
        &format!("unix://{}", socket.display()),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(client.version().await.unwrap().name, "containerd");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_never_answers_times_out_naming_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    serve(&socket, Answer::Never);
    let client = CriClient::new(
        &format!("unix://{}", socket.display()),
        Duration::from_secs(3),
    )
    .unwrap();
    let err = client.list_containers().await.unwrap_err();
    assert_eq!(
        err,
        CriError::Timeout {
            op: "ListContainers",
            after: Duration::from_secs(3)
        }
    );
    // A stop's deadline is its grace period plus the call timeout.
    let err = client
        .stop_container("c1", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CriError::Timeout {
            op: "StopContainer",
            after: Duration::from_secs(33)
        }
    );
}
