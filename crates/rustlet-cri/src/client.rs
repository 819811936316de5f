//! The CRI v1 client over a unix socket: one gRPC channel for the runtime and image services,
//! every call under a deadline, every failure a [`CriError`] naming the call.
//!
//! The channel connects lazily and reconnects by itself, so a runtime that goes away and comes
//! back is used again without restarting the agent; [`CriClient::connect`] checks once, at
//! start, that something answers and speaks CRI v1 (upstream `getRuntimeAndImageServices`).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{self as cri};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// containerd's socket: the default of `--container-runtime-endpoint`.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The CRI version this client speaks.
pub const CRI_VERSION: &str = "v1";

/// A CRI call that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not a `unix://` address.
    #[error("container runtime endpoint {endpoint:?}: {message}")]
    Endpoint {
        /// As given.
        endpoint: String,
        /// Why it is refused.
        message: String,
    },
    /// The runtime did not answer the version check at start.
    #[error(
        "the container runtime at {endpoint} does not answer ({message}): is containerd running there?"
    )]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The runtime answered with another CRI version.
    #[error(
        "the container runtime at {endpoint} ({runtime}) speaks CRI {version:?}; this agent needs {CRI_VERSION}"
    )]
    Version {
        /// The endpoint.
        endpoint: String,
        /// Its name and version.
        runtime: String,
        /// The CRI version it speaks.
        version: String,
    },
    /// A call returned an error status.
    #[error("CRI {op}: {code:?}: {message}")]
    Call {
        /// The CRI call (`RunPodSandbox`, ...).
        op: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The runtime's message.
        message: String,
    },
    /// A call did not return within its deadline.
    #[error("CRI {op}: no answer within {after:?}")]
    Timeout {
        /// The CRI call.
        op: &'static str,
        /// The deadline.
        after: Duration,
    },
}

impl CriError {
    /// Whether the runtime said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Call {
                code: tonic::Code::NotFound,
                ..
            }
        )
    }
}

/// The socket path of a `unix://` endpoint (or of a bare absolute path, as the kubelet takes).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let refuse = |message: &str| CriError::Endpoint {
        endpoint: endpoint.to_owned(),
        message: message.to_owned(),
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some((scheme, _)) => {
            return Err(refuse(&format!(
                "scheme {scheme:?} is not supported (only unix://)"
            )));
        }
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err(refuse("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

/// The runtime's answer to `Version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// `containerd`.
    pub name: String,
    /// `1.6.20~ds1`.
    pub version: String,
    /// `v1`.
    pub api_version: String,
}

/// A CRI client: the runtime and image services over one channel.
#[derive(Clone, Debug)]
pub struct CriClient {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
}

impl CriClient {
    /// A client of `endpoint` whose calls each have `timeout` (upstream's runtime request
    /// timeout is 2 minutes; pulls and stops get longer ones). Nothing is dialled yet.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        // The URI is a placeholder: the connector dials the socket.
        let channel =
            Endpoint::from_static("http://[::]:50051")
                .connect_timeout(timeout)
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }));
        Ok(Self {
            endpoint: endpoint.to_owned(),
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            timeout,
        })
    }

    /// [`Self::new`], then the version check: a clear error when nothing answers or the runtime
    /// speaks another CRI version.
    ///
    /// Needs a runtime, so compiled but not run here (see `examples/run_container.rs`):
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rustlet_cri::CriError> {
    /// use std::time::Duration;
    /// let client = rustlet_cri::CriClient::connect(
    ///     "unix:///run/containerd/containerd.sock",
    ///     Duration::from_secs(10),
    /// )
    /// .await?;
    /// for sandbox in client.list_pod_sandboxes().await? {
    ///     println!("{}", sandbox.id);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let client = Self::new(endpoint, timeout)?;
        let version = client.version().await.map_err(|e| CriError::Unreachable {
            endpoint: endpoint.to_owned(),
            message: match e {
                CriError::Call { message, .. } => message,
                other => other.to_string(),
            },
        })?;
        if version.api_version != CRI_VERSION {
            return Err(CriError::Version {
                endpoint: endpoint.to_owned(),
                runtime: format!("{} {}", version.name, version.version),
                version: version.api_version,
            });
        }
        Ok(client)
    }

    /// The endpoint it talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn call<T, F>(&self, op: &'static str, after: Duration, fut: F) -> Result<T, CriError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(after, fut).await {
            Err(_) => Err(CriError::Timeout { op, after }),
            Ok(Err(status)) => Err(CriError::Call {
                op,
                code: status.code(),
                message: status.message().to_owned(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// `Version`.
    pub async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::VersionRequest {
            version: "0.1.0".into(),
        };
        let v = self
            .call("Version", self.timeout, rt.version(request))
            .await?;
        Ok(RuntimeVersion {
            name: v.runtime_name,
            version: v.runtime_version,
            api_version: v.runtime_api_version,
        })
    }

    /// `Status`: the runtime's conditions (`RuntimeReady`, `NetworkReady`), as the node status
    /// reads them (upstream `updateRuntimeUp`), and its handlers with their features (none
    /// from a runtime older than CRI 1.30's, such as containerd 1.6).
    pub async fn status(
        &self,
    ) -> Result<(Vec<cri::RuntimeCondition>, Vec<cri::RuntimeHandler>), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::StatusRequest { verbose: false };
        let r = self
            .call("Status", self.timeout, rt.status(request))
            .await?;
        Ok((
            r.status.map(|s| s.conditions).unwrap_or_default(),
            r.runtime_handlers,
        ))
    }

    /// `RunPodSandbox`: the new sandbox's ID.
    pub async fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> Result<String, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        let r = self
            .call("RunPodSandbox", self.timeout, rt.run_pod_sandbox(request))
            .await?;
        Ok(r.pod_sandbox_id)
    }

    /// `PodSandboxStatus`.
    pub async fn pod_sandbox_status(&self, id: &str) -> Result<cri::PodSandboxStatus, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: false,
        };
        let r = self
            .call(
                "PodSandboxStatus",
                self.timeout,
                rt.pod_sandbox_status(request),
            )
            .await?;
        r.status.ok_or_else(|| CriError::Call {
            op: "PodSandboxStatus",
            code: tonic::Code::Internal,
            message: format!("no status for sandbox {id}"),
        })
    }

    /// `StopPodSandbox`.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call("StopPodSandbox", self.timeout, rt.stop_pod_sandbox(request))
            .await
            .map(drop)
    }

    /// `RemovePodSandbox`.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.call(
            "RemovePodSandbox",
            self.timeout,
            rt.remove_pod_sandbox(request),
        )
        .await
        .map(drop)
    }

    /// `ListPodSandbox`, all of them.
    pub async fn list_pod_sandboxes(&self) -> Result<Vec<cri::PodSandbox>, CriError> {
        self.list_pod_sandboxes_labelled(&HashMap::new()).await
    }

    /// `ListPodSandbox` of the sandboxes that carry every label of `selector` (asked of the
    /// runtime and checked again here, so a runtime that ignores the filter lists no more).
    pub async fn list_pod_sandboxes_labelled(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<cri::PodSandbox>, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ListPodSandboxRequest {
            filter: (!selector.is_empty()).then(|| cri::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        };
        let r = self
            .call("ListPodSandbox", self.timeout, rt.list_pod_sandbox(request))
            .await?;
        let mut items = r.items;
        items.retain(|s| carries(&s.labels, selector));
        Ok(items)
    }

    /// `CreateContainer` in a sandbox: the new container's ID.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let r = self
            .call(
                "CreateContainer",
                self.timeout,
                rt.create_container(request),
            )
            .await?;
        Ok(r.container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.call("StartContainer", self.timeout, rt.start_container(request))
            .await
            .map(drop)
    }

    /// `StopContainer` with `grace` before SIGKILL; its deadline is the grace plus the usual
    /// timeout (as upstream's).
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        self.call(
            "StopContainer",
            grace + self.timeout,
            rt.stop_container(request),
        )
        .await
        .map(drop)
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.call(
            "RemoveContainer",
            self.timeout,
            rt.remove_container(request),
        )
        .await
        .map(drop)
    }

    /// `ListContainers`, all of them.
    pub async fn list_containers(&self) -> Result<Vec<cri::Container>, CriError> {
        self.list_containers_labelled(&HashMap::new()).await
    }

    /// `ListContainers` of the containers that carry every label of `selector` (as
    /// [`Self::list_pod_sandboxes_labelled`]).
    pub async fn list_containers_labelled(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<cri::Container>, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ListContainersRequest {
            filter: (!selector.is_empty()).then(|| cri::ContainerFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        };
        let r = self
            .call("ListContainers", self.timeout, rt.list_containers(request))
            .await?;
        let mut containers = r.containers;
        containers.retain(|c| carries(&c.labels, selector));
        Ok(containers)
    }

    /// `ReopenContainerLog`: the runtime closes the container's log file and opens a new one
    /// at the same path (after the log manager renamed it).
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ReopenContainerLogRequest {
            container_id: id.to_owned(),
        };
        self.call(
            "ReopenContainerLog",
            self.timeout,
            rt.reopen_container_log(request),
        )
        .await
        .map(drop)
    }

    /// `ListContainers` of the running containers that carry every label of `selector`.
    pub async fn list_running_containers_labelled(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<cri::Container>, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                label_selector: selector.clone(),
                ..Default::default()
            }),
        };
        let r = self
            .call("ListContainers", self.timeout, rt.list_containers(request))
            .await?;
        let mut containers = r.containers;
        containers.retain(|c| {
            carries(&c.labels, selector) && c.state == cri::ContainerState::ContainerRunning as i32
        });
        Ok(containers)
    }

    /// `ContainerStatus`.
    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        let r = self
            .call(
                "ContainerStatus",
                self.timeout,
                rt.container_status(request),
            )
            .await?;
        r.status.ok_or_else(|| CriError::Call {
            op: "ContainerStatus",
            code: tonic::Code::Internal,
            message: format!("no status for container {id}"),
        })
    }

    /// `ExecSync`: exit code, stdout and stderr; `timeout` is the command's (0: none), the
    /// call's deadline that plus the usual timeout.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        self.call("ExecSync", timeout + self.timeout, rt.exec_sync(request))
            .await
    }

    /// `Exec`: the URL of the runtime's stream server where the session runs.
    pub async fn exec(&self, request: cri::ExecRequest) -> Result<String, CriError> {
        let mut rt = self.runtime.clone();
        let r = self.call("Exec", self.timeout, rt.exec(request)).await?;
        Ok(r.url)
    }

    /// `Attach`: the URL of the runtime's stream server where the session runs.
    pub async fn attach(&self, request: cri::AttachRequest) -> Result<String, CriError> {
        let mut rt = self.runtime.clone();
        let r = self
            .call("Attach", self.timeout, rt.attach(request))
            .await?;
        Ok(r.url)
    }

    /// `PortForward`: the URL of the runtime's stream server where the session runs.
    pub async fn port_forward(
        &self,
        sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            port: ports,
        };
        let r = self
            .call("PortForward", self.timeout, rt.port_forward(request))
            .await?;
        Ok(r.url)
    }

    /// `ListContainerStats` of the containers that carry every label of `selector`.
    pub async fn list_container_stats(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<cri::ContainerStats>, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ListContainerStatsRequest {
            filter: (!selector.is_empty()).then(|| cri::ContainerStatsFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        };
        let r = self
            .call(
                "ListContainerStats",
                self.timeout,
                rt.list_container_stats(request),
            )
            .await?;
        Ok(r.stats)
    }

    /// `ListPodSandboxStats` of the sandboxes that carry every label of `selector`.
    pub async fn list_pod_sandbox_stats(
        &self,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<cri::PodSandboxStats>, CriError> {
        let mut rt = self.runtime.clone();
        let request = cri::ListPodSandboxStatsRequest {
            filter: (!selector.is_empty()).then(|| cri::PodSandboxStatsFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        };
        let r = self
            .call(
                "ListPodSandboxStats",
                self.timeout,
                rt.list_pod_sandbox_stats(request),
            )
            .await?;
        Ok(r.stats)
    }

    /// `ImageFsInfo`: the image filesystems' use.
    pub async fn image_fs_info(&self) -> Result<Vec<cri::FilesystemUsage>, CriError> {
        let mut im = self.images.clone();
        let r = self
            .call(
                "ImageFsInfo",
                self.timeout,
                im.image_fs_info(cri::ImageFsInfoRequest {}),
            )
            .await?;
        Ok(r.image_filesystems)
    }

    /// `ImageStatus`: `None` when the image is absent.
    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>, CriError> {
        let mut im = self.images.clone();
        let request = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        };
        let r = self
            .call("ImageStatus", self.timeout, im.image_status(request))
            .await?;
        Ok(r.image)
    }

    /// `PullImage`: the image reference (digest) pulled; `deadline` bounds the pull.
    pub async fn pull_image(
        &self,
        image: &str,
        sandbox_config: cri::PodSandboxConfig,
        deadline: Duration,
    ) -> Result<String, CriError> {
        let mut im = self.images.clone();
        let request = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: Some(sandbox_config),
        };
        let r = self
            .call("PullImage", deadline, im.pull_image(request))
            .await?;
        Ok(r.image_ref)
    }
}

/// Whether `labels` has every label of `selector` (CRI's `label_selector`: exact values).
fn carries(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets_with_absolute_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/tmp/c.sock").unwrap(),
            PathBuf::from("/tmp/c.sock")
        );
        let tcp = socket_path("tcp://127.0.0.1:1234").unwrap_err();
        assert!(tcp.to_string().contains("only unix://"), "{tcp}");
        let relative = socket_path("unix://run/c.sock").unwrap_err();
        assert!(relative.to_string().contains("absolute"), "{relative}");
    }

    #[tokio::test]
    async fn an_absent_runtime_is_a_clear_error_naming_the_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/none.sock", dir.path().display());
        let err = CriClient::connect(&endpoint, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, CriError::Unreachable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&endpoint) && text.contains("containerd"),
            "{text}"
        );
    }
}
