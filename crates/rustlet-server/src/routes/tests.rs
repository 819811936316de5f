//! The routes over a fake [`NodeApi`]: upstream's status codes and wording, the log query
//! applied, the session parameters handed to the runtime.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tower::ServiceExt as _;

use super::*;
use crate::logs::reader::StatusError;

/// A running check the test flips.
struct Flag(Arc<AtomicBool>);

#[async_trait::async_trait]
impl ContainerRunning for Flag {
    async fn is_running(&self) -> Result<bool, StatusError> {
        Ok(self.0.load(Ordering::SeqCst))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Log(String),
    Exec(String, Vec<String>, StreamOptions),
    Attach(String, StreamOptions),
    PortForward(Vec<i32>),
    Run(String, Vec<String>),
}

struct FakeNode {
    pods: Vec<Pod>,
    log_dir: PathBuf,
    running: Arc<AtomicBool>,
    calls: Mutex<Vec<Call>>,
    stream_url: Uri,
}

#[async_trait::async_trait]
impl NodeApi for FakeNode {
    async fn pods(&self) -> Vec<Pod> {
        self.pods.clone()
    }
    async fn running_pods(&self) -> Vec<Pod> {
        self.pods
            .iter()
            .map(|p| Pod {
                metadata: p.metadata.clone(),
                ..Default::default()
            })
            .collect()
    }
    fn configz(&self) -> serde_json::Value {
        serde_json::json!({"port": 10250, "address": "0.0.0.0"})
    }
    async fn container_log(
        &self,
        _pod: &Pod,
        container_id: &str,
    ) -> Result<ContainerLogSource, NodeApiError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Log(container_id.to_owned()));
        let id = container_id.trim_start_matches("containerd://");
        Ok(ContainerLogSource {
            path: self.log_dir.join(format!("{id}.log")),
            running: Box::new(Flag(self.running.clone())),
        })
    }
    async fn exec_url(
        &self,
        _pod: &Pod,
        container: &str,
        cmd: Vec<String>,
        streams: StreamOptions,
    ) -> Result<Uri, NodeApiError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Exec(container.to_owned(), cmd, streams));
        Ok(self.stream_url.clone())
    }
    async fn attach_url(
        &self,
        _pod: &Pod,
        container: &str,
        streams: StreamOptions,
    ) -> Result<Uri, NodeApiError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Attach(container.to_owned(), streams));
        Err(NodeApiError::NotFound(format!(
            "container not found ({container:?})"
        )))
    }
    async fn port_forward_url(&self, _pod: &Pod, ports: Vec<i32>) -> Result<Uri, NodeApiError> {
        self.calls.lock().unwrap().push(Call::PortForward(ports));
        Ok(self.stream_url.clone())
    }
    async fn run_in_container(
        &self,
        _pod: &Pod,
        container: &str,
        cmd: Vec<String>,
    ) -> Result<Vec<u8>, NodeApiError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Run(container.to_owned(), cmd.clone()));
        match cmd[0].as_str() {
            "false" => Err(NodeApiError::Runtime(
                "command 'false' exited with 1: ".to_owned(),
            )),
            "true" => Ok(Vec::new()),
            _ => Ok(b"foo bar".to_vec()),
        }
    }
}

fn pod(state: ContainerState, last: Option<ContainerState>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "main".into(),
                container_id: Some("containerd://c2".into()),
                state: Some(state),
                last_state: last,
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    }
}

fn terminated(id: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(id.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Fixture {
    node: Arc<FakeNode>,
    app: Router,
    _dir: tempfile::TempDir,
}

/// A stream URL nothing listens on (the proxy answers 502 after the runtime was asked).
fn dead_url() -> Uri {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/exec/x").parse().unwrap()
}

fn fixture(pods: Vec<Pod>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c1.log"),
        "2026-01-01T00:00:00.000000001Z stdout F previous instance\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("c2.log"),
        "2026-01-01T00:00:01.5Z stdout F one\n\
         2026-01-01T00:00:02Z stderr P tw\n\
         2026-01-01T00:00:02Z stderr F o\n\
         2026-01-01T00:00:03Z stdout F three\n",
    )
    .unwrap();
    let node = Arc::new(FakeNode {
        pods,
        log_dir: dir.path().to_path_buf(),
        running: Arc::new(AtomicBool::new(false)),
        calls: Mutex::new(Vec::new()),
        stream_url: dead_url(),
    });
    let app = router(node.clone(), ProxyConfig::default());
    Fixture {
        node,
        app,
        _dir: dir,
    }
}

async fn call(app: &Router, method: &str, uri: &str, upgrade: bool) -> (StatusCode, String) {
    call_upgrading(app, method, uri, upgrade.then_some("SPDY/3.1")).await
}

/// [`call`] upgrading to `protocol` (`SPDY/3.1`, `websocket`) when one is given.
async fn call_upgrading(
    app: &Router,
    method: &str,
    uri: &str,
    protocol: Option<&str>,
) -> (StatusCode, String) {
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(protocol) = protocol {
        req = req
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, protocol);
    }
    let response = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// upstream `TestServeRunInContainer`'s neighbours: `/healthz` is `ok`, `/pods` a `v1 PodList`
/// of the node's pods, `/runningpods/` one of the runtime's, `/configz` the `kubeletconfig`
/// object.
#[tokio::test]
async fn healthz_pods_and_configz_answer_as_upstream() {
    let f = fixture(vec![pod(running(), None)]);
    assert_eq!(
        call(&f.app, "GET", "/healthz", false).await,
        (StatusCode::OK, "ok".into())
    );
    let (status, body) = call(&f.app, "GET", "/pods", false).await;
    assert_eq!(status, StatusCode::OK);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(
        (&list["apiVersion"], &list["metadata"]),
        (&"v1".into(), &serde_json::json!({}))
    );
    assert_eq!(list["items"][0]["metadata"]["name"], "web");
    let (status, body) = call(&f.app, "GET", "/runningpods/", false).await;
    assert_eq!(status, StatusCode::OK);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["uid"], "uid-1");
    let (status, body) = call(&f.app, "GET", "/configz", false).await;
    assert_eq!(status, StatusCode::OK);
    let config: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(config["kubeletconfig"]["port"], 10250);
    assert_eq!(
        call(&f.app, "POST", "/pods", false).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// upstream `TestContainerLogs` and friends: the query applies (tail counts the file's lines,
/// partial ones too; timestamps prefix each joined line), the running instance's log is read.
#[tokio::test]
async fn container_logs_reads_the_running_instance_with_the_query() {
    let f = fixture(vec![pod(running(), Some(terminated("containerd://c1")))]);
    let (status, body) = call(&f.app, "GET", "/containerLogs/default/web/main", false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "one\ntwo\nthree\n");
    let (_, body) = call(
        &f.app,
        "GET",
        "/containerLogs/default/web/main?tailLines=3&timestamps=true",
        false,
    )
    .await;
    assert_eq!(
        body,
        "2026-01-01T00:00:02.000000000Z two\n2026-01-01T00:00:03.000000000Z three\n"
    );
    let (_, body) = call(
        &f.app,
        "GET",
        "/containerLogs/default/web/main?limitBytes=5",
        false,
    )
    .await;
    assert_eq!(body, "one\nt");
    let (_, body) = call(
        &f.app,
        "GET",
        "/containerLogs/default/web/main?previous=true",
        false,
    )
    .await;
    assert_eq!(body, "previous instance\n");
    assert_eq!(
        *f.node.calls.lock().unwrap(),
        vec![
            Call::Log("containerd://c2".into()),
            Call::Log("containerd://c2".into()),
            Call::Log("containerd://c2".into()),
            Call::Log("containerd://c1".into()),
        ]
    );
}

/// upstream `getContainerLogs`' answers: unknown pod and container 404, invalid options 422,
/// no previous instance 400 with `validateContainerLogStatus`' wording.
#[tokio::test]
async fn container_logs_refusals_have_upstreams_status_and_wording() {
    let f = fixture(vec![pod(running(), None)]);
    assert_eq!(
        call(&f.app, "GET", "/containerLogs/default/nope/main", false).await,
        (StatusCode::NOT_FOUND, "pod \"nope\" does not exist".into())
    );
    assert_eq!(
        call(&f.app, "GET", "/containerLogs/default/web/other", false).await,
        (
            StatusCode::NOT_FOUND,
            "container \"other\" not found in pod \"web\"".into()
        )
    );
    assert_eq!(
        call(
            &f.app,
            "GET",
            "/containerLogs/default/web/main?tailLines=-1",
            false
        )
        .await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#.into()
        )
    );
    assert_eq!(
        call(
            &f.app,
            "GET",
            "/containerLogs/default/web/main?previous=1",
            false
        )
        .await,
        (
            StatusCode::BAD_REQUEST,
            "previous terminated container \"main\" in pod \"web\" not found".into()
        )
    );
}

/// upstream `validateContainerLogStatus`: running, then terminated (or its last instance),
/// then last terminated; a waiting container names its reason.
#[test]
fn container_log_id_follows_validate_container_log_status() {
    let status = |state, last| pod(state, last).status.unwrap();
    assert_eq!(
        container_log_id("web", &status(running(), None), "main", false),
        Ok("containerd://c2".into())
    );
    assert_eq!(
        container_log_id(
            "web",
            &status(terminated(""), Some(terminated("containerd://c1"))),
            "main",
            false
        ),
        Ok("containerd://c1".into())
    );
    assert_eq!(
        container_log_id("web", &status(terminated(""), None), "main", false),
        Err("container \"main\" in pod \"web\" is terminated".into())
    );
    let waiting = ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("ErrImagePull".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        container_log_id("web", &status(waiting, None), "main", false),
        Err("container \"main\" in pod \"web\" is waiting to start: image can't be pulled".into())
    );
    assert_eq!(
        container_log_id("web", &status(running(), None), "x", false),
        Err("container \"x\" in pod \"web\" is not available".into())
    );
}

/// A follow sends what the file has before the container stops (chunked, flushed per write)
/// and ends once the container is no longer running.
#[tokio::test]
async fn a_follow_streams_before_the_container_stops_and_ends_after() {
    let f = fixture(vec![pod(running(), None)]);
    f.node.running.store(true, Ordering::SeqCst);
    let response = f
        .app
        .clone()
        .oneshot(
            http::Request::get("/containerLogs/default/web/main?follow=true")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut got = Vec::new();
    while got != b"one\ntwo\nthree\n" {
        let frame = body.frame().await.expect("a frame while running").unwrap();
        got.extend_from_slice(&frame.into_data().unwrap());
    }
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(f.node.log_dir.join("c2.log"))
        .unwrap()
        .write_all(b"2026-01-01T00:00:04Z stdout F four\n")
        .unwrap();
    f.node.running.store(false, Ordering::SeqCst);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"four\n");
}

/// upstream `getExec`: the repeated `command=` and the `=1` stream flags (the kubelet's names
/// `input`, `output`, `error`, `tty`, as the API server sends them) reach the runtime's
/// `Exec`, the UID form checks the pod's UID, a session without streams is a 400.
#[tokio::test]
async fn exec_passes_command_and_streams_to_the_runtime_and_proxies() {
    let f = fixture(vec![pod(running(), None)]);
    let (status, body) = call(
        &f.app,
        "POST",
        "/exec/default/web/main?command=sh&command=-c&command=echo%20hi&output=1&error=1",
        true,
    )
    .await;
    // The runtime's URL was asked for, then the proxy found no stream server there.
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(
        *f.node.calls.lock().unwrap(),
        vec![Call::Exec(
            "main".into(),
            vec!["sh".into(), "-c".into(), "echo hi".into()],
            StreamOptions {
                stdout: true,
                stderr: true,
                ..Default::default()
            }
        )]
    );
    f.node.calls.lock().unwrap().clear();
    assert_eq!(
        call(&f.app, "POST", "/exec/default/web/main?command=true", true).await,
        (
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr".into()
        )
    );
    // upstream's `findContainer` finds the pod by name: a UID that is not the pod's still
    // reaches the runtime.
    assert_eq!(
        call(
            &f.app,
            "POST",
            "/exec/default/web/uid-2/main?command=true&output=1",
            true
        )
        .await
        .0,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(
        call(
            &f.app,
            "POST",
            "/exec/default/nope/main?command=true&output=1",
            true
        )
        .await,
        (StatusCode::NOT_FOUND, "pod does not exist".into())
    );
    assert_eq!(
        call(
            &f.app,
            "POST",
            "/exec/default/web/uid-1/main?command=true&output=1",
            false
        )
        .await,
        (StatusCode::BAD_REQUEST, "Upgrade request required".into())
    );
    // The wrong UID's and the plain request's: both asked the runtime (upstream checks the
    // upgrade in the proxy, after `GetExec`).
    let asked = Call::Exec(
        "main".into(),
        vec!["true".into()],
        StreamOptions {
            stdout: true,
            ..Default::default()
        },
    );
    assert_eq!(*f.node.calls.lock().unwrap(), vec![asked.clone(), asked]);
}

/// upstream `getAttach`/`getPortForward`: a TTY drops stderr, the runtime's NotFound is a 404,
/// a port-forward with a wrong UID is `pod not found`; `NewV4Options`: a WebSocket's `port=`s
/// reach the runtime (refused with upstream's wording when missing or bad), a SPDY request's
/// are not read.
#[tokio::test]
async fn attach_and_port_forward_as_upstream() {
    let f = fixture(vec![pod(running(), None)]);
    assert_eq!(
        call(
            &f.app,
            "GET",
            "/attach/default/web/main?input=1&error=1&tty=1",
            true
        )
        .await,
        (
            StatusCode::NOT_FOUND,
            "container not found (\"main\")".into()
        )
    );
    assert_eq!(
        call(&f.app, "GET", "/portForward/default/web/uid-2", true).await,
        (StatusCode::NOT_FOUND, "pod not found".into())
    );
    let ws = Some("websocket");
    assert_eq!(
        call_upgrading(
            &f.app,
            "GET",
            "/portForward/default/web/uid-1?port=80&port=8080,9090",
            ws
        )
        .await
        .0,
        StatusCode::BAD_GATEWAY
    );
    // SPDY names its ports per stream: the query's are not read.
    assert_eq!(
        call(&f.app, "GET", "/portForward/default/web?port=http", true)
            .await
            .0,
        StatusCode::BAD_GATEWAY
    );
    for (query, refusal) in [
        ("", "query parameter \"port\" is required"),
        ("?port=", "query parameter \"port\" cannot be empty"),
        (
            "?port=http",
            "unable to parse \"http\" as a port: strconv.ParseUint: parsing \"http\": invalid syntax",
        ),
        (
            "?port=80,70000",
            "unable to parse \"80,70000\" as a port: strconv.ParseUint: parsing \"70000\": value out of range",
        ),
        ("?port=0", "port \"0\" must be > 0"),
    ] {
        // Refused before the pod is looked up, as upstream's `getPortForward`.
        let uri = format!("/portForward/default/nope{query}");
        assert_eq!(
            call_upgrading(&f.app, "GET", &uri, ws).await,
            (StatusCode::BAD_REQUEST, refusal.into()),
            "{query}"
        );
    }
    assert_eq!(
        *f.node.calls.lock().unwrap(),
        vec![
            Call::Attach(
                "main".into(),
                StreamOptions {
                    stdin: true,
                    tty: true,
                    ..Default::default()
                }
            ),
            Call::PortForward(vec![80, 8080, 9090]),
            Call::PortForward(Vec::new()),
        ]
    );
}

/// upstream `TestServeRunInContainer`: `POST /run/{ns}/{pod}/{container}?cmd=ls%20-a` runs
/// `["ls", "-a"]` in the container and answers its output; the `{uid}` form too; a failed
/// command is a 500 with the error's text, an unknown pod a 404; GET is not a route.
#[tokio::test]
async fn run_in_container_answers_the_commands_output() {
    let f = fixture(vec![pod(running(), None)]);
    let response = f
        .app
        .clone()
        .oneshot(
            http::Request::builder()
                .method("POST")
                .uri("/run/default/web/main?cmd=ls%20-a")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"foo bar");
    assert_eq!(
        call(
            &f.app,
            "POST",
            "/run/default/web/uid-1/main?cmd=true",
            false
        )
        .await,
        (StatusCode::OK, String::new())
    );
    assert_eq!(
        call(&f.app, "POST", "/run/default/web/main?cmd=false", false).await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "command 'false' exited with 1: ".into()
        )
    );
    assert_eq!(
        call(&f.app, "POST", "/run/default/nope/main?cmd=true", false).await,
        (StatusCode::NOT_FOUND, "pod does not exist".into())
    );
    assert_eq!(
        call(&f.app, "GET", "/run/default/web/main?cmd=true", false)
            .await
            .0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        *f.node.calls.lock().unwrap(),
        vec![
            Call::Run("main".into(), vec!["ls".into(), "-a".into()]),
            Call::Run("main".into(), vec!["true".into()]),
            Call::Run("main".into(), vec!["false".into()]),
        ]
    );
}

/// `/stats/summary` without a stats provider: upstream's `handleError`, a 500 with
/// `Internal Error: ...`; `/metrics/resource` then says `resource_scrape_error 1` in the
/// Prometheus text format; `/metrics/probes` is empty without probes.
#[tokio::test]
async fn stats_routes_report_a_failed_summary_as_upstream() {
    let f = fixture(vec![pod(running(), None)]);
    let (status, body) = call(&f.app, "GET", "/stats/summary", false).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("Internal Error: "), "{body}");
    let response = f
        .app
        .clone()
        .oneshot(
            http::Request::get("/metrics/resource")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).ends_with("resource_scrape_error 1\n"));
    assert_eq!(
        call(&f.app, "GET", "/metrics/probes", false).await,
        (StatusCode::OK, String::new())
    );
    // Upstream "ContainerMetrics when querying /metrics/cadvisor": served beside them; a
    // node without a stats provider answers as `/stats/summary` does.
    let (status, body) = call(&f.app, "GET", "/metrics/cadvisor", false).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("Internal Error: "), "{body}");
}

/// A log's last bytes and the body's end are never ready together: a Go client would read
/// both in one TLS record and get the bytes with `io.EOF`, which the API server's WebSocket
/// copy of `pods/log` drops (the `Pods should support retrieving logs from the container over
/// websockets` spec saw an empty log).
#[tokio::test]
async fn a_streamed_bodys_end_is_not_ready_with_its_last_data() {
    use tokio::io::AsyncWriteExt as _;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let response = stream_body(move |mut out| async move {
        out.write_all(b"container is alive\n").await.unwrap();
        drop(out);
        let _ = done_tx.send(());
    });
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "container is alive\n");
    // The writer is done and its pipe closed: the end is all that is left.
    done_rx.await.unwrap();
    let mut end = std::pin::pin!(body.frame());
    assert!(
        futures::poll!(end.as_mut()).is_pending(),
        "the end waits a turn after the last data"
    );
    assert!(end.await.is_none(), "then the body ends");
}
