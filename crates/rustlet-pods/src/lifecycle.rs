//! Container lifecycle hooks (upstream `pkg/kubelet/lifecycle/handlers.go`): one run of a
//! `postStart` or `preStop` handler against a running container instance: `exec` through
//! [`Runtime::exec_sync`], `httpGet` from the agent to the pod's IP (or the handler's host),
//! `sleep` on the agent. When a hook runs, and what its failure does, is the runtime's
//! (upstream `startContainer` and `killContainer`; `rustlet-cri`'s `CriRuntime`).
//!
//! Deviations: an `exec` hook is bounded by the runtime client's call timeout (upstream passes
//! no timeout, `RunInContainer(.., 0)`); an HTTPS hook whose server answers plain HTTP is not
//! retried over HTTP (upstream's `LifecycleHTTPFallback`, which its own comment calls a
//! temporary migration path).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::prober::{HttpTarget, http_get};
use crate::runtime::{Runtime, format_pod};

/// The waiting reason of a container whose `postStart` hook failed (upstream
/// `ErrPostStartHook`); its message is the hook's ([`HookError`]).
pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
/// The reason of the Warning event of a failed `postStart` hook (upstream
/// `events.FailedPostStartHook`, also the message of the `Killing` event of the kill that
/// follows). The event's message is `PostStartHook failed`, never the hook's output.
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
/// The reason of the Warning event of a failed `preStop` hook (upstream
/// `events.FailedPreStopHook`); its message is `PreStopHook failed`.
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";

/// The user agent of an HTTP hook (upstream: `NewRequestForHTTPGetAction(.., "lifecycle")`).
const USER_AGENT: &str = "kube-lifecycle/1.37";

/// What a hook runs against.
#[derive(Clone, Copy, Debug)]
pub struct HookTarget<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The spec container whose hook runs.
    pub container: &'a Container,
    /// The running instance (`<runtime>://<id>`).
    pub instance_id: &'a str,
    /// The pod's IP (an `httpGet` without `host` goes there).
    pub pod_ip: &'a str,
}

/// A hook that failed, with upstream's messages (`handlerRunner.Run`), which become the
/// container's waiting message for `postStart`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// The command exited non-zero, or could not run.
    #[error(
        "Exec lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}",
        go_list(command)
    )]
    Exec {
        /// The hook's command.
        command: Vec<String>,
        /// The container.
        container: String,
        /// The pod (upstream `format.Pod`: `<name>_<namespace>(<uid>)`).
        pod: String,
        /// Why.
        error: String,
        /// What it printed.
        output: String,
    },
    /// No HTTP response.
    #[error(
        "HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}"
    )]
    Http {
        /// The handler's path.
        path: String,
        /// The container.
        container: String,
        /// The pod (upstream `format.Pod`).
        pod: String,
        /// Why.
        error: String,
    },
    /// No action (`exec`, `httpGet`, `sleep`) in the handler.
    #[error("Cannot run handler: invalid handler for Container {container:?} in Pod {pod:?}")]
    Invalid {
        /// The container.
        container: String,
        /// The pod (upstream `format.Pod`).
        pod: String,
    },
}

/// A list as Go's `%v` writes a `[]string`: `[ls -a]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// Runs `handler` once (upstream: `handlerRunner.Run`). An `httpGet` succeeds on any HTTP
/// response, whatever its status code (upstream discards the response); `sleep` waits its
/// seconds (zero allowed: `PodLifecycleSleepActionAllowZero`, GA). A caller that bounds the
/// hook (the grace period of `preStop`) drops the future.
pub async fn run_hook(
    runtime: &dyn Runtime,
    target: HookTarget<'_>,
    handler: &LifecycleHandler,
) -> Result<(), HookError> {
    let container = target.container.name.clone();
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        let exec_error = |error: String, output: String| HookError::Exec {
            command: command.clone(),
            container: container.clone(),
            pod: format_pod(target.pod),
            error,
            output,
        };
        return match runtime
            .exec_sync(target.instance_id, &command, Duration::ZERO)
            .await
        {
            Ok(out) if out.timed_out => Err(exec_error(
                // upstream: `ErrCommandTimedOut` (here after the client's call timeout).
                format!("command timed out: {:?} timed out", command.join(" ")),
                out.output,
            )),
            Ok(out) if out.exit_code == 0 => Ok(()),
            // upstream: the CRI client's `CodeExitError` (`remote_runtime.go` execSyncV1).
            Ok(out) => Err(exec_error(
                format!(
                    "command '{}' exited with {}: {}",
                    command.join(" "),
                    out.exit_code,
                    out.stderr
                ),
                out.output,
            )),
            Err(e) => Err(exec_error(e.to_string(), String::new())),
        };
    }
    if let Some(http) = &handler.http_get {
        let http_error = |error: String| HookError::Http {
            path: http.path.clone().unwrap_or_default(),
            container: container.clone(),
            pod: format_pod(target.pod),
            error,
        };
        let request = HttpTarget::of(http, target.container, target.pod_ip).map_err(http_error)?;
        return match http_get(&request, USER_AGENT, 0).await {
            Ok(_) => Ok(()),
            Err(e) => Err(http_error(e)),
        };
    }
    if let Some(sleep) = &handler.sleep {
        // upstream: runSleepHandler.
        let seconds = u64::try_from(sleep.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        return Ok(());
    }
    Err(HookError::Invalid {
        container,
        pod: format_pod(target.pod),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerKind, ExecOutput, RuntimeError, RuntimePodStatus, Sandbox};
    use crate::simulated::{SimulatedConfig, SimulatedRuntime};
    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, SleepAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use rustlet_core::PodUid;
    use rustlet_volume::subpath::ContainerMount;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// The simulated runtime whose execs exit with `exit_code`, recording each command.
    struct Execs {
        inner: SimulatedRuntime,
        exit_code: i32,
        commands: Mutex<Vec<(String, Vec<String>)>>,
    }

    #[async_trait]
    impl Runtime for Execs {
        fn name(&self) -> &str {
            "execs"
        }
        async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError> {
            self.inner.run_pod_sandbox(pod).await
        }
        async fn start_container(
            &self,
            pod: &Pod,
            container: &Container,
            kind: ContainerKind,
            mounts: &[ContainerMount],
        ) -> Result<(), RuntimeError> {
            self.inner
                .start_container(pod, container, kind, mounts)
                .await
        }
        async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus {
            self.inner.pod_status(uid).await
        }
        async fn kill_pod(&self, pod: &Pod, grace: Duration) -> Result<(), RuntimeError> {
            self.inner.kill_pod(pod, grace).await
        }
        async fn remove_pod(&self, uid: &PodUid) {
            self.inner.remove_pod(uid).await;
        }
        fn next_change(&self, uid: &PodUid) -> Option<Instant> {
            self.inner.next_change(uid)
        }
        async fn exec_sync(
            &self,
            id: &str,
            cmd: &[String],
            _timeout: Duration,
        ) -> Result<ExecOutput, RuntimeError> {
            self.commands
                .lock()
                .unwrap()
                .push((id.to_owned(), cmd.to_vec()));
            // All it prints goes to stderr.
            Ok(ExecOutput {
                exit_code: self.exit_code,
                output: "printed".into(),
                stderr: "printed".into(),
                timed_out: false,
            })
        }
    }

    fn execs(exit_code: i32) -> Execs {
        Execs {
            inner: SimulatedRuntime::new(SimulatedConfig::default()),
            exit_code,
            commands: Mutex::default(),
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn container() -> Container {
        Container {
            name: "c".into(),
            ..Default::default()
        }
    }

    fn target<'a>(pod: &'a Pod, container: &'a Container) -> HookTarget<'a> {
        HookTarget {
            pod,
            container,
            instance_id: "containerd://abc",
            pod_ip: "127.0.0.1",
        }
    }

    fn exec(command: &[&str]) -> LifecycleHandler {
        LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
            }),
            ..Default::default()
        }
    }

    /// upstream: TestRunHandlerExec: the command runs in the instance; a non-zero exit is the
    /// hook's failure with upstream's message and the command's output.
    #[tokio::test]
    async fn run_handler_exec_runs_the_command_in_the_instance() {
        let (pod, container) = (pod(), container());
        let runtime = execs(0);
        run_hook(&runtime, target(&pod, &container), &exec(&["ls", "-a"]))
            .await
            .unwrap();
        assert_eq!(
            *runtime.commands.lock().unwrap(),
            vec![(
                "containerd://abc".to_owned(),
                vec!["ls".to_owned(), "-a".to_owned()]
            )]
        );
        let failing = execs(1);
        let error = run_hook(&failing, target(&pod, &container), &exec(&["false"]))
            .await
            .unwrap_err();
        assert!(matches!(&error, HookError::Exec { output, .. } if output == "printed"));
        assert!(
            error
                .to_string()
                .starts_with(r#"Exec lifecycle hook ([false]) for Container "c" in Pod"#),
            "{error}"
        );
    }

    /// upstream: TestRunHandlerExecFailure: the message of a failed exec hook is upstream's,
    /// word for word (the command as Go's `%v` of a list, the pod as `format.Pod`, the CRI
    /// client's exit error with the stderr, and the combined output).
    #[tokio::test]
    async fn run_handler_exec_failure_has_upstreams_message() {
        let (pod, container) = (pod(), container());
        let failing = execs(2);
        let error = run_hook(&failing, target(&pod, &container), &exec(&["ls", "--a"]))
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"Exec lifecycle hook ([ls --a]) for Container "c" in Pod "p_ns(u1)" failed - error: command 'ls --a' exited with 2: printed, message: "printed""#
        );
    }

    /// upstream: TestRunHandlerHttp, TestRunHandlerHttpFailure: the GET goes to the pod's IP
    /// and the handler's port and path; any response is success (even a 500), no response is
    /// the hook's failure.
    #[tokio::test]
    async fn run_handler_http_succeeds_on_any_response_and_fails_without_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0_u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert_ne!(n, 0);
                seen.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(b"HTTP/1.1 500 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let http = |port: u16| LifecycleHandler {
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(i32::from(port)),
                path: Some("/echo?msg=poststart".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (pod, container) = (pod(), container());
        let runtime = execs(0);
        run_hook(&runtime, target(&pod, &container), &http(port))
            .await
            .unwrap();
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /echo?msg=poststart HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("kube-lifecycle/"), "{request}");
        // Nothing listens there any more.
        let error = run_hook(&runtime, target(&pod, &container), &http(port))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, HookError::Http { path, .. } if path == "/echo?msg=poststart"),
            "{error}"
        );
    }

    /// upstream: TestRunSleepHandler: `sleep` waits its seconds (zero: not at all); a handler
    /// without an action is refused.
    #[tokio::test(start_paused = true)]
    async fn run_sleep_handler_waits_its_seconds() {
        let (pod, container) = (pod(), container());
        let runtime = execs(0);
        let sleep = |seconds| LifecycleHandler {
            sleep: Some(SleepAction { seconds }),
            ..Default::default()
        };
        let start = Instant::now();
        run_hook(&runtime, target(&pod, &container), &sleep(5))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        let start = Instant::now();
        run_hook(&runtime, target(&pod, &container), &sleep(0))
            .await
            .unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(matches!(
            run_hook(
                &runtime,
                target(&pod, &container),
                &LifecycleHandler::default()
            )
            .await,
            Err(HookError::Invalid { .. })
        ));
    }
}
