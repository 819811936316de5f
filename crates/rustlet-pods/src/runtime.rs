//! The `Runtime` seam: what the pod workers ask of a container runtime (upstream: the CRI
//! runtime manager's pod actions, reduced to what the workers need), and what it reports back.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use rustlet_core::PodUid;
use rustlet_core::node_status::{NETWORK_READY, RUNTIME_READY, RuntimeCondition};
use rustlet_volume::env_files::EnvFiles;
use rustlet_volume::subpath::ContainerMount;
use tokio::time::Instant;

/// `<namespace>/<name>`, as errors and logs name a pod.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Upstream `format.Pod`: `<name>_<namespace>(<uid>)`, how upstream's messages name a pod.
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The hash of a spec container that its instances carry (upstream `HashContainer`, C19): a
/// running instance whose hash differs from its spec's is restarted (C11), and the crash-loop
/// back-off is keyed by it (C15).
///
/// Deviation: upstream (1.31+) hashes `name` and `image` only, the fields the API server lets
/// change; here every field but `resources` and `resizePolicy` counts (upstream's hash before
/// 1.31, without resources as under in-place resize), since a local manifest edit keeps the
/// pod's UID and may change the command or the environment. FNV-1a (32 bits) over the JSON of
/// the container, in hex.
pub fn container_hash(container: &Container) -> String {
    let hashed = Container {
        resources: None,
        resize_policy: None,
        ..container.clone()
    };
    let json = serde_json::to_vec(&hashed).unwrap_or_default();
    let mut hash: u32 = 0x811c_9dc5;
    for byte in json {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{hash:x}")
}

/// Which list of the pod spec a container comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    /// `spec.initContainers`, run to completion in order before the others.
    Init,
    /// `spec.containers`.
    Regular,
    /// `spec.ephemeralContainers` (`kubectl debug`): started once in the running pod's
    /// sandbox, never restarted, never probed.
    Ephemeral,
}

/// An ephemeral container as the container the runtime starts (upstream casts its
/// `EphemeralContainerCommon` to a `Container`). What the API server refuses on an ephemeral
/// container (ports, probes, lifecycle hooks, resources, a restart policy) is dropped here
/// too, so a manifest that carries them anyway gets none of them. `targetContainerName` has no
/// place in a `Container`: a runtime reads it from the pod's spec (`rustlet-cri` joins the
/// target's process namespace, as upstream).
pub fn ephemeral_container(
    ephemeral: &k8s_openapi::api::core::v1::EphemeralContainer,
) -> Container {
    let e = ephemeral.clone();
    Container {
        name: e.name,
        image: e.image,
        image_pull_policy: e.image_pull_policy,
        command: e.command,
        args: e.args,
        working_dir: e.working_dir,
        env: e.env,
        env_from: e.env_from,
        volume_mounts: e.volume_mounts,
        volume_devices: e.volume_devices,
        security_context: e.security_context,
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path,
        termination_message_policy: e.termination_message_policy,
        ..Container::default()
    }
}

/// A container instance's state as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Created, not started.
    Created,
    /// Running since `started_at`.
    Running {
        /// When the process started.
        started_at: Timestamp,
    },
    /// Exited.
    Exited {
        /// When the process started.
        started_at: Timestamp,
        /// When it exited.
        finished_at: Timestamp,
        /// Its exit code.
        exit_code: i32,
        /// `Completed` for exit code 0, `Error` otherwise (the runtime's reason).
        reason: String,
        /// The termination message (the runtime's message, then what the container wrote to
        /// its `terminationMessagePath`, or its log's tail with `FallbackToLogsOnError`);
        /// empty when none.
        message: String,
    },
    /// The runtime cannot tell (CRI `CONTAINER_UNKNOWN`): the process may still run. Upstream
    /// reports it as terminated with `ContainerStatusUnknown` (S11) and kills it before any
    /// restart (C10, C11).
    Unknown,
}

/// One container instance (the runtime keeps the newest two per container name, as upstream's
/// garbage collector leaves them for `lastState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInstance {
    /// `<runtime>://<id>`.
    pub id: String,
    /// The spec container's name.
    pub name: String,
    /// Init or regular.
    pub kind: ContainerKind,
    /// The image it runs, as the spec names it.
    pub image: String,
    /// The image's ID as the runtime resolved it (`imageID`: a digest on CRI).
    pub image_id: String,
    /// 0 for the first instance of a name, then one more per restart.
    pub attempt: i32,
    /// Its state.
    pub state: InstanceState,
    /// The sandbox it was created in ([`Sandbox::id`]).
    pub sandbox_id: String,
    /// The [`container_hash`] of the spec it was created from (upstream's
    /// `io.kubernetes.container.hash`); `None` when the runtime does not know it (a container
    /// an older agent made): never taken for a change.
    pub hash: Option<String>,
}

/// What the runtime knows of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimePodStatus {
    /// The sandbox: `None` when there is none.
    pub sandbox: Option<Sandbox>,
    /// Container instances, newest first.
    pub containers: Vec<ContainerInstance>,
}

impl RuntimePodStatus {
    /// The newest instance of a container name, then the one before it.
    pub fn instances(
        &self,
        name: &str,
    ) -> (Option<&ContainerInstance>, Option<&ContainerInstance>) {
        let mut of_name = self.containers.iter().filter(|c| c.name == name);
        (of_name.next(), of_name.next())
    }

    /// Whether any container instance is running.
    pub fn any_running(&self) -> bool {
        self.containers
            .iter()
            .any(|c| matches!(c.state, InstanceState::Running { .. }))
    }
}

/// What an exec returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// Its stdout then stderr, as text.
    pub output: String,
    /// Its stderr alone, as text (upstream's error of a non-zero exit names it).
    pub stderr: String,
    /// It outlived its timeout and was stopped (`exit_code` is then meaningless).
    pub timed_out: bool,
}

/// A pod sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// The runtime's ID of the sandbox: the containers made in it name it
    /// ([`ContainerInstance::sandbox_id`]).
    pub id: String,
    /// Ready (not stopped).
    pub ready: bool,
    /// The node's network namespace (`hostNetwork`).
    pub host_network: bool,
    /// The pod IP (the node's for host-network pods).
    pub ip: Option<String>,
}

/// A runtime call that failed, named by its operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// RunPodSandbox failed.
    #[error("creating the sandbox of pod {pod}: {message}")]
    CreateSandbox {
        /// `<namespace>/<name>`.
        pod: String,
        /// Why.
        message: String,
    },
    /// CreateContainer or StartContainer failed.
    #[error("starting container {container} of pod {pod}: {message}")]
    StartContainer {
        /// `<namespace>/<name>`.
        pod: String,
        /// The container's name.
        container: String,
        /// Why.
        message: String,
    },
    /// The container could not be created or started, for a reason upstream shows as the
    /// container's waiting reason (`ErrImagePull`, `ImagePullBackOff`, `ErrImageNeverPull`,
    /// `CreateContainerError`, `RunContainerError`) until a later sync succeeds.
    #[error("starting container {container} of pod {pod}: {reason}: {message}")]
    ContainerWaiting {
        /// `<namespace>/<name>`.
        pod: String,
        /// The container's name.
        container: String,
        /// The waiting reason.
        reason: String,
        /// Why.
        message: String,
    },
    /// The runtime cannot do this at all (the simulated runtime runs no processes to exec in).
    #[error("the {runtime} runtime does not support {operation}")]
    Unsupported {
        /// The runtime's name.
        runtime: String,
        /// What was asked.
        operation: String,
    },
    /// ExecSync failed (not: the command exited non-zero).
    #[error("exec in container {container}: {message}")]
    Exec {
        /// The container instance's ID.
        container: String,
        /// Why.
        message: String,
    },
    /// The container instance, sandbox or stream asked for does not exist (CRI `NotFound`).
    #[error("{operation}: not found: {message}")]
    NotFound {
        /// What was asked (`exec in container <id>`).
        operation: String,
        /// Why.
        message: String,
    },
    /// A streaming call (`Exec`, `Attach`, `PortForward`) or a container's log lookup failed.
    #[error("{operation}: {message}")]
    Stream {
        /// What was asked (`exec in container <id>`).
        operation: String,
        /// Why.
        message: String,
    },
    /// `Version` or `Status` failed.
    #[error("asking the {runtime} runtime for its {operation}: {message}")]
    Query {
        /// The runtime's name.
        runtime: String,
        /// `version`, `status`.
        operation: String,
        /// Why.
        message: String,
    },
    /// StopContainer / StopPodSandbox failed.
    #[error("killing pod {pod}: {message}")]
    KillPod {
        /// `<namespace>/<name>`.
        pod: String,
        /// Why.
        message: String,
    },
}

/// The streams of an exec or attach session (upstream: `remotecommandserver.Options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Streams {
    /// The client sends stdin.
    pub stdin: bool,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (never with a TTY).
    pub stderr: bool,
    /// A pseudo-terminal.
    pub tty: bool,
}

/// A container instance's log file and whether the instance runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLogInfo {
    /// The file the runtime writes (CRI `log_path`).
    pub path: std::path::PathBuf,
    /// Whether the instance is running.
    pub running: bool,
}

/// A running container instance's log file, for the container log manager's rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningContainerLog {
    /// The runtime's container ID (without the `<runtime>://` scheme: the CRI's own).
    pub id: String,
    /// The file the runtime writes (CRI `ContainerStatus.log_path`).
    pub path: std::path::PathBuf,
}

/// CPU use as the runtime measures it (CRI `CpuUsage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuUsage {
    /// When measured.
    pub at: Timestamp,
    /// CPU time used since creation, in core-nanoseconds.
    pub usage_core_nanos: Option<u64>,
    /// CPU use over the runtime's last window, in core-nanoseconds per second (the agent
    /// makes it of two readings when the runtime does not).
    pub usage_nano_cores: Option<u64>,
}

/// Memory use as the runtime measures it (CRI `MemoryUsage`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUsage {
    /// When measured.
    pub at: Timestamp,
    /// Usage minus the inactive file pages.
    pub working_set: Option<u64>,
    /// The limit minus the working set.
    pub available: Option<u64>,
    /// All memory in use.
    pub usage: Option<u64>,
    /// Anonymous memory.
    pub rss: Option<u64>,
    /// Minor page faults.
    pub page_faults: Option<u64>,
    /// Major page faults.
    pub major_page_faults: Option<u64>,
}

/// Swap use as the runtime measures it (CRI `SwapUsage`), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapUsage {
    /// When measured.
    pub at: Timestamp,
    /// Swap in use.
    pub usage: Option<u64>,
    /// The swap limit minus the swap in use.
    pub available: Option<u64>,
}

/// A filesystem's use as the runtime measures it (CRI `FilesystemUsage`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsUsage {
    /// When measured.
    pub at: Timestamp,
    /// The filesystem's mount point.
    pub mountpoint: String,
    /// The bytes this use takes.
    pub used_bytes: Option<u64>,
    /// The inodes this use takes.
    pub inodes_used: Option<u64>,
}

/// A running container's figures (CRI `ContainerStats` with its `CreatedAt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerUsage {
    /// The instance's ID (`<runtime>://...`).
    pub id: String,
    /// The spec container's name.
    pub name: String,
    /// When the instance was created.
    pub created_at: Timestamp,
    /// CPU.
    pub cpu: Option<CpuUsage>,
    /// Memory.
    pub memory: Option<MemoryUsage>,
    /// Swap.
    pub swap: Option<SwapUsage>,
    /// The writable layer.
    pub writable_layer: Option<FsUsage>,
}

/// A pod's figures: its sandbox's (CRI `PodSandboxStats`) and its running containers'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodUsage {
    /// The pod's UID.
    pub uid: PodUid,
    /// Its sandbox's ID (the runtime's own, without a scheme).
    pub sandbox_id: String,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// When its sandbox was created.
    pub created_at: Timestamp,
    /// The pod cgroup's CPU.
    pub cpu: Option<CpuUsage>,
    /// The pod cgroup's memory.
    pub memory: Option<MemoryUsage>,
    /// The pod cgroup's swap.
    pub swap: Option<SwapUsage>,
    /// Its running containers.
    pub containers: Vec<ContainerUsage>,
}

/// The container runtime as the pod workers use it.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// A short name (`simulated`, `cri`), for logs and the `containerID` scheme.
    fn name(&self) -> &str;

    /// Now, on the clock of the runtime's `started_at` and `finished_at` (the wall clock; the
    /// simulated runtime's own in paused test time). The crash-loop back-off measures from a
    /// container's `finished_at` with it (C15).
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::UNIX_EPOCH
            .checked_add(
                k8s_openapi::jiff::SignedDuration::try_from(since_epoch).unwrap_or_default(),
            )
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// The runtime's type as the node reports it (upstream `containerRuntime.Type`: CRI
    /// `Version`'s `runtime_name`, `containerd`). Default: [`Self::name`].
    fn type_name(&self) -> String {
        self.name().to_owned()
    }

    /// The runtime's version (upstream `containerRuntime.Version`: CRI `Version`'s
    /// `runtime_version`); the node reports `<name>://<version>`. Default: the agent's own
    /// version (the simulated runtime is part of it).
    async fn version(&self) -> Result<String, RuntimeError> {
        Ok(env!("CARGO_PKG_VERSION").to_owned())
    }

    /// The runtime's conditions (upstream `containerRuntime.Status`: CRI `Status`'s
    /// `RuntimeReady` and `NetworkReady`), which make the node Ready or not. Default: both hold
    /// (a runtime without processes needs no daemon and no pod network).
    async fn status(&self) -> Result<Vec<RuntimeCondition>, RuntimeError> {
        Ok(vec![
            RuntimeCondition::ready(RUNTIME_READY),
            RuntimeCondition::ready(NETWORK_READY),
        ])
    }

    /// Whether the runtime's default handler supports recursive read-only mounts (upstream
    /// `runtimeClassSupportsRecursiveReadOnlyMounts`: the CRI `Status`'s handler features,
    /// as last read). Default: no.
    fn supports_recursive_read_only_mounts(&self) -> bool {
        false
    }

    /// The runtime's handlers and their features, as its last [`Runtime::status`] said
    /// (upstream `runtimeState.runtimeHandlers`, the node's `status.runtimeHandlers`).
    /// Default: none (the runtime does not tell).
    fn runtime_handlers(&self) -> Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler> {
        Vec::new()
    }

    /// Creates the pod's sandbox if it has no ready one; returns it.
    async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError>;

    /// Creates and starts a new instance of `container` with `mounts` (the volume manager's
    /// `container_mounts`: each volume directory or prepared subPath, and whether read-only).
    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
    ) -> Result<(), RuntimeError>;

    /// [`Runtime::start_container`] with the values of the container's `fileKeyRef`
    /// variables (EnvFiles), read from the pod's volumes by the volume manager
    /// (`VolumeManager::env_files`) before the container is made; the pod workers call this.
    /// Default: a runtime that makes no environment ignores them.
    async fn start_container_with_env_files(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
        env_files: &EnvFiles,
    ) -> Result<(), RuntimeError> {
        let _ = env_files;
        self.start_container(pod, container, kind, mounts).await
    }

    /// What runs for this pod now.
    async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus;

    /// Stops every container (after at most `grace`) and the sandbox.
    async fn kill_pod(&self, pod: &Pod, grace: Duration) -> Result<(), RuntimeError>;

    /// Forgets a killed pod's containers and sandbox.
    async fn remove_pod(&self, uid: &PodUid);

    /// Whether the pods' probes run (processes exist to probe). The simulated runtime says no:
    /// its containers count as started and ready as soon as they run.
    fn runs_probes(&self) -> bool {
        false
    }

    /// Runs `cmd` in a running container instance (its `id`, `<runtime>://...`) with a timeout
    /// (upstream's exec probe, CRI `ExecSync`).
    async fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let _ = (id, cmd, timeout);
        Err(RuntimeError::Unsupported {
            runtime: self.name().to_owned(),
            operation: "exec".into(),
        })
    }

    /// The URL of the runtime's stream server for `cmd` in the running container instance
    /// `id` (`<runtime>://...`) with `streams` (upstream: `GetExec`, CRI `Exec`).
    async fn exec_stream(
        &self,
        id: &str,
        cmd: &[String],
        streams: Streams,
    ) -> Result<String, RuntimeError> {
        let _ = (id, cmd, streams);
        Err(self.unsupported("exec streams"))
    }

    /// The URL of the runtime's stream server to attach to the container instance `id`
    /// (upstream: `GetAttach`, CRI `Attach`).
    async fn attach_stream(&self, id: &str, streams: Streams) -> Result<String, RuntimeError> {
        let _ = (id, streams);
        Err(self.unsupported("attach"))
    }

    /// The URL of the runtime's stream server to forward `ports` (none: the client names them
    /// per stream) of the pod's sandbox (upstream: `GetPortForward`, CRI `PortForward`).
    async fn port_forward_stream(
        &self,
        uid: &PodUid,
        ports: &[i32],
    ) -> Result<String, RuntimeError> {
        let _ = (uid, ports);
        Err(self.unsupported("port-forward"))
    }

    /// The log file of the container instance `id` and whether it is running now (CRI
    /// `ContainerStatus`' `log_path` and state).
    async fn container_log(&self, id: &str) -> Result<ContainerLogInfo, RuntimeError> {
        let _ = id;
        Err(self.unsupported("container logs"))
    }

    /// The running containers' log files (upstream's container log manager: CRI
    /// `ListContainers` of the running ones, then `ContainerStatus.log_path` of each).
    async fn running_container_logs(&self) -> Result<Vec<RunningContainerLog>, RuntimeError> {
        Err(self.unsupported("container log rotation"))
    }

    /// CRI `ReopenContainerLog` of the container `id` (as [`RunningContainerLog::id`]): the
    /// runtime closes its log file and creates a new one at the same path.
    async fn reopen_container_log(&self, id: &str) -> Result<(), RuntimeError> {
        let _ = id;
        Err(self.unsupported("container log rotation"))
    }

    /// The figures of the pods with a ready sandbox and of their running containers
    /// (upstream: the CRI stats provider's `ListPodStats`, from CRI `ListPodSandboxStats` and
    /// `ListContainerStats`).
    async fn pod_usage(&self) -> Result<Vec<PodUsage>, RuntimeError> {
        Err(self.unsupported("stats"))
    }

    /// The image filesystems' use (CRI `ImageFsInfo`).
    async fn image_fs_usage(&self) -> Result<Vec<FsUsage>, RuntimeError> {
        Err(self.unsupported("image filesystem stats"))
    }

    /// [`RuntimeError::Unsupported`] of `operation` on this runtime.
    fn unsupported(&self, operation: &str) -> RuntimeError {
        RuntimeError::Unsupported {
            runtime: self.name().to_owned(),
            operation: operation.to_owned(),
        }
    }

    /// Stops one container instance (after at most `grace`): a liveness or startup probe
    /// failed.
    async fn kill_container(
        &self,
        pod: &Pod,
        id: &str,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let _ = (id, grace);
        Err(RuntimeError::KillPod {
            pod: full_name(pod),
            message: format!("the {} runtime cannot stop one container", self.name()),
        })
    }

    /// Stops and removes what the runtime runs for pods not in `keep` (upstream's housekeeping
    /// `killing unwanted pods` and the container GC): after an agent restart, pods deleted
    /// meanwhile. Called by the workers' housekeeping once the pod sources were read; returns
    /// quickly (long stops go on in the background).
    async fn remove_orphans(&self, keep: &HashSet<PodUid>) {
        let _ = keep;
    }

    /// The pods whose containers may run, as the runtime last saw them (a ready sandbox, or a
    /// container not exited): upstream's `runningRuntimePods` (W26 step 4). The workers mark
    /// those no worker knows as still running, so their volumes wait until the orphan pass has
    /// stopped them (W26 step 12). A runtime that keeps nothing across agent restarts has
    /// none.
    fn pods_that_may_run(&self) -> HashSet<PodUid> {
        HashSet::new()
    }

    /// When this pod's state may next change by itself (a container exits); `None`: not by
    /// itself. A runtime that cannot tell returns its relist period; one that announces
    /// changes ([`Self::changes`]) only a safety net.
    fn next_change(&self, uid: &PodUid) -> Option<Instant>;

    /// The UIDs of pods whose state changed by itself, as the runtime sees them (upstream's
    /// PLEG events): the workers wake the pod's worker. `None`: the runtime announces nothing
    /// and [`Self::next_change`] says when to look.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<PodUid>> {
        None
    }
}
