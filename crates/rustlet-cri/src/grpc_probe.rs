//! The gRPC health check of `grpc` probes (upstream `pkg/probe/grpc`): the pod workers'
//! [`GrpcProber`] seam over tonic and `tonic-health`'s `grpc.health.v1` client.
//!
//! One probe is one `grpc.health.v1.Health/Check` of the action's service at the pod IP and
//! port, in plaintext, with the probe's timeout as the deadline of the whole of it. As
//! upstream's (which dials with `WithBlock`), a refused or failed connection is tried again
//! (after 1 s, then 1.6 times longer each time) until the deadline, so a port where nothing
//! listens fails after the timeout with upstream's "timeout: failed to connect service". Every
//! outcome is a success or a failure in upstream's words, never an error:
//!
//! | what happened | output |
//! |---|---|
//! | `SERVING` | `service healthy` (success) |
//! | another status | `service unhealthy (responded with "NOT_SERVING")` |
//! | no connection before the deadline | `timeout: failed to connect service "10.0.0.5:5000" within 5s: context deadline exceeded` |
//! | an address that cannot be dialled | `error: failed to connect service at "…": …` |
//! | `UNIMPLEMENTED` (no health service) | `error: this server does not implement the grpc health protocol (grpc.health.v1.Health): …` |
//! | no answer before the deadline, or `DEADLINE_EXCEEDED` | `timeout: health rpc did not complete within 5s` |
//! | another RPC error | `error: health rpc probe failed: rpc error: code = NotFound desc = unknown service` |
//!
//! Deviations: the deadline is not sent as `grpc-timeout` (grpc-go sends it; a tonic server
//! answers an expired one `CANCELLED`, which would not read as the timeout it is); upstream's
//! dial waits for the server's HTTP/2 settings, so a server that
//! accepts the connection and never speaks fails with the connect timeout; tonic's connect
//! returns once its own preface is sent, so that case fails with the RPC timeout instead.

use std::time::Duration;

use rustlet_pods::prober::{GrpcProber, Outcome};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tracing::debug;

/// The user agent of a probe (upstream: `kube-probe/<major>.<minor>`).
const USER_AGENT: &str = "kube-probe/1.37";

/// The first wait before a connection is tried again (grpc-go's base delay).
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The gRPC health check over tonic: upstream's `grpcProber`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcHealthProber;

impl GrpcHealthProber {
    /// The prober.
    pub fn new() -> Self {
        Self
    }
}

#[async_trait::async_trait]
impl GrpcProber for GrpcHealthProber {
    async fn probe(&self, host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let addr = join_host_port(host, port);
        let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
            .and_then(|e| e.user_agent(USER_AGENT))
        {
            Ok(e) => e.connect_timeout(timeout),
            Err(e) => {
                return Outcome::failure(format!(
                    "error: failed to connect service at {addr:?}: {}",
                    chain(&e)
                ));
            }
        };
        let Some(channel) = connect(&endpoint, &addr, deadline).await else {
            return Outcome::failure(format!(
                "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
                go_duration(timeout)
            ));
        };
        // The deadline is kept here, not sent as `grpc-timeout`: a tonic server answers an
        // expired one `CANCELLED`, which would read as another error than the timeout.
        let request = tonic::Request::new(HealthCheckRequest {
            service: service.to_owned(),
        });
        let answer =
            tokio::time::timeout_at(deadline, HealthClient::new(channel).check(request)).await;
        let rpc_timeout = || {
            Outcome::failure(format!(
                "timeout: health rpc did not complete within {}",
                go_duration(timeout)
            ))
        };
        match answer {
            Err(_) => rpc_timeout(),
            Ok(Err(status)) => match status.code() {
                tonic::Code::Unimplemented => Outcome::failure(format!(
                    "error: this server does not implement the grpc health protocol \
                     (grpc.health.v1.Health): {}",
                    status.message()
                )),
                tonic::Code::DeadlineExceeded => rpc_timeout(),
                code => Outcome::failure(format!(
                    "error: health rpc probe failed: rpc error: code = {} desc = {}",
                    go_code(code),
                    status.message()
                )),
            },
            Ok(Ok(response)) => answered(response.get_ref()),
        }
    }
}

/// A `Check` response as a probe outcome.
fn answered(response: &HealthCheckResponse) -> Outcome {
    match ServingStatus::try_from(response.status) {
        Ok(ServingStatus::Serving) => Outcome::success("service healthy"),
        // Go prints an enum value it does not know as its number.
        status => Outcome::failure(format!(
            "service unhealthy (responded with {:?})",
            status.map_or_else(|_| response.status.to_string(), |s| s.as_str_name().into())
        )),
    }
}

/// A channel to `endpoint`, tried again until `deadline` (grpc-go's blocking dial); `None`
/// when the deadline came first.
async fn connect(endpoint: &Endpoint, addr: &str, deadline: Instant) -> Option<Channel> {
    let mut wait = FIRST_RETRY;
    loop {
        match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(channel)) => return Some(channel),
            Ok(Err(e)) => debug!(addr, error = %chain(&e), "gRPC probe: connecting failed"),
            Err(_) => return None,
        }
        let next = Instant::now() + wait;
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            return None;
        }
        tokio::time::sleep_until(next).await;
        wait = wait.mul_f64(1.6);
    }
}

/// An error with its sources, `: `-separated (what Go's wrapped errors print).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Go's `net.JoinHostPort`: an IPv6 host in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A gRPC code as grpc-go's `codes.Code.String()` names it.
fn go_code(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Go's `time.Duration.String()` for a probe's timeout: `5s`, `1m30s`, `1h0m0s`, `1.5s`.
fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    let seconds = if nanos == 0 {
        format!("{}s", secs % 60)
    } else {
        let fraction = format!("{nanos:09}");
        format!("{}.{}s", secs % 60, fraction.trim_end_matches('0'))
    };
    match (secs / 3600, secs % 3600 / 60) {
        (0, 0) if secs < 60 => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{GrpcHealthServer, HealthAnswer};
    use rustlet_pods::prober::ProbeResult;

    fn loopback() -> std::net::TcpListener {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap()
    }

    async fn check(port: u16, service: &str, timeout: Duration) -> Outcome {
        GrpcHealthProber::new()
            .probe("127.0.0.1", port, service, timeout)
            .await
    }

    /// upstream `TestGrpcProber_Probe`'s cases against agnhost's `grpc-health-checking` as
    /// the e2e specs run it ("should *not* be restarted with a GRPC liveness probe": SERVING;
    /// its `--service` and `/make-not-serving`: an unknown service and NOT_SERVING).
    #[tokio::test]
    async fn a_serving_server_passes_and_not_serving_or_an_unknown_service_fails() {
        let server = GrpcHealthServer::start(loopback(), "");
        let port = server.port();
        let second = Duration::from_secs(1);
        assert_eq!(
            check(port, "", second).await,
            Outcome::success("service healthy")
        );
        assert_eq!(
            check(port, "liveness", second).await,
            Outcome::failure(
                "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
            )
        );
        server.set(HealthAnswer::NotServing);
        assert_eq!(
            check(port, "", second).await,
            Outcome::failure("service unhealthy (responded with \"NOT_SERVING\")")
        );
        server.set(HealthAnswer::Unimplemented);
        assert_eq!(
            check(port, "", second).await,
            Outcome::failure(
                "error: this server does not implement the grpc health protocol \
                 (grpc.health.v1.Health): unimplemented"
            )
        );
        server.set(HealthAnswer::Serving);
        let named = GrpcHealthServer::start(loopback(), "liveness");
        assert_eq!(
            check(named.port(), "liveness", second).await.result,
            ProbeResult::Success
        );
        assert_eq!(check(port, "", second).await.result, ProbeResult::Success);
    }

    /// upstream "should be restarted with a GRPC liveness probe" (port 2333, nothing there):
    /// the connection is tried until the deadline and the probe fails with the connect
    /// timeout, not at once and not as an error.
    #[tokio::test]
    async fn nothing_listening_fails_with_the_connect_timeout_after_the_deadline() {
        let port = loopback().local_addr().unwrap().port();
        let started = std::time::Instant::now();
        let outcome = check(port, "", Duration::from_secs(2)).await;
        let took = started.elapsed();
        assert_eq!(
            outcome,
            Outcome::failure(format!(
                "timeout: failed to connect service \"127.0.0.1:{port}\" within 2s: \
                 context deadline exceeded"
            ))
        );
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
            "{took:?}"
        );
    }

    /// A server that takes the call and never answers: the RPC's deadline is the probe's
    /// timeout.
    #[tokio::test]
    async fn a_server_that_never_answers_fails_with_the_rpc_timeout() {
        let server = GrpcHealthServer::start(loopback(), "");
        server.set(HealthAnswer::Hang);
        let started = std::time::Instant::now();
        let outcome = check(server.port(), "", Duration::from_secs(1)).await;
        assert_eq!(
            outcome,
            Outcome::failure("timeout: health rpc did not complete within 1s")
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    /// A listener that is not a gRPC server (an HTTP/1 answer, then the connection closed):
    /// a failure naming the RPC error.
    #[tokio::test]
    async fn a_server_that_is_not_grpc_fails() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serve = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0_u8; 256];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                    .await;
            }
        });
        let outcome = check(port, "", Duration::from_secs(1)).await;
        serve.abort();
        assert_eq!(outcome.result, ProbeResult::Failure);
        assert!(
            outcome
                .output
                .starts_with("error: health rpc probe failed: rpc error: code = ")
                || outcome.output.starts_with("timeout: "),
            "{}",
            outcome.output
        );
    }

    #[test]
    fn an_unknown_status_is_named_by_its_number_as_go_prints_it() {
        assert_eq!(
            answered(&HealthCheckResponse { status: 3 }),
            Outcome::failure("service unhealthy (responded with \"SERVICE_UNKNOWN\")")
        );
        assert_eq!(
            answered(&HealthCheckResponse { status: 7 }),
            Outcome::failure("service unhealthy (responded with \"7\")")
        );
        assert_eq!(
            answered(&HealthCheckResponse { status: 1 }),
            Outcome::success("service healthy")
        );
    }

    #[test]
    fn go_formats_of_durations_codes_and_addresses() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(59)), "59s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_code(tonic::Code::Cancelled), "Canceled");
        assert_eq!(go_code(tonic::Code::Ok), "OK");
        assert_eq!(join_host_port("10.0.0.5", 5000), "10.0.0.5:5000");
        assert_eq!(join_host_port("fd00::5", 5000), "[fd00::5]:5000");
    }

    /// A pod without an IP (its sandbox not reported yet): nothing is reached, a failure.
    #[tokio::test]
    async fn an_empty_host_fails() {
        let outcome = GrpcHealthProber::new()
            .probe("", 5000, "", Duration::from_secs(1))
            .await;
        assert_eq!(
            outcome,
            Outcome::failure(
                "timeout: failed to connect service \":5000\" within 1s: context deadline exceeded"
            )
        );
    }

    /// A host that is no URI authority at all cannot be dialled.
    #[tokio::test]
    async fn a_host_that_cannot_be_dialled_fails_at_once() {
        let started = std::time::Instant::now();
        let outcome = GrpcHealthProber::new()
            .probe("bad host/x", 5000, "", Duration::from_secs(5))
            .await;
        assert_eq!(outcome.result, ProbeResult::Failure);
        assert!(
            outcome
                .output
                .starts_with("error: failed to connect service at \"bad host/x:5000\": "),
            "{}",
            outcome.output
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
