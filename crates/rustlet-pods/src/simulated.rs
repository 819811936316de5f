//! The simulated runtime: real sandboxes and containers in name only, like kwok or a
//! virtual-kubelet mock provider. Containers "run" from start until the pod's annotations say
//! they exit; the volumes the pod workers mount for them are real.
//!
//! * `rustlet.io/simulate-exit-after: "<seconds>"`: every regular container exits that long
//!   after it starts, with `rustlet.io/simulate-exit-code` (default 0). Without it they run
//!   until the pod is killed.
//! * Init containers exit as soon as they start, with
//!   `rustlet.io/simulate-init-exit-code` (default 0); sidecars (`restartPolicy: Always`) run
//!   until they are killed.
//! * A kill stops every container at once, exit code 0 (a simulated process honours SIGTERM
//!   and exits cleanly; one whose state the runtime lost exits 137); so does a kill of one
//!   container.
//! * Faults for tests: [`SimulatedRuntime::sandbox_died`] (the sandbox and its containers die
//!   by themselves, as after a node reboot) and [`SimulatedRuntime::lose_track`] (the runtime
//!   no longer knows a container's state, CRI `CONTAINER_UNKNOWN`); each is announced through
//!   [`Runtime::changes`].
//! * Stats ([`Runtime::pod_usage`]): the running pods and containers, using no CPU and no
//!   memory.
//! * Pod IPs come from a configurable IPv4 range, one per sandbox; host-network pods get the
//!   node's address.
//!
//! Times are tokio time mapped onto the wall clock from the runtime's creation, so a test in
//! paused time sees consistent timestamps.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rustlet_core::PodUid;
use rustlet_core::pod::is_restartable_init_container;
use rustlet_volume::subpath::ContainerMount;
use tokio::time::Instant;

use crate::runtime::{
    ContainerInstance, ContainerKind, ContainerUsage, CpuUsage, InstanceState, MemoryUsage,
    PodUsage, Runtime, RuntimeError, RuntimePodStatus, Sandbox, container_hash, full_name,
};

/// Annotation: seconds after which every regular container exits.
pub const EXIT_AFTER_ANNOTATION: &str = "rustlet.io/simulate-exit-after";
/// Annotation: the exit code of those exits (default 0).
pub const EXIT_CODE_ANNOTATION: &str = "rustlet.io/simulate-exit-code";
/// Annotation: the exit code of every init container (default 0).
pub const INIT_EXIT_CODE_ANNOTATION: &str = "rustlet.io/simulate-init-exit-code";
/// The exit code of a container killed by a signal it did not handle (128 + SIGKILL).
const KILLED_EXIT_CODE: i32 = 137;

/// Configuration of the simulated runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedConfig {
    /// The node's address: host-network pods' IP.
    pub node_ip: String,
    /// First address of the pod range; each sandbox takes the next one.
    pub pod_ip_base: Ipv4Addr,
    /// How many addresses the range has.
    pub pod_ip_count: u32,
    /// How long a container takes to start.
    pub start_delay: Duration,
    /// How long a pod's containers take to stop when killed (at most the grace period): a
    /// process that finishes its work on SIGTERM.
    pub stop_delay: Duration,
}

impl Default for SimulatedConfig {
    fn default() -> Self {
        Self {
            node_ip: "127.0.0.1".into(),
            pod_ip_base: Ipv4Addr::new(10, 88, 0, 2),
            pod_ip_count: 65_000,
            start_delay: Duration::ZERO,
            stop_delay: Duration::ZERO,
        }
    }
}

#[derive(Debug)]
struct SimContainer {
    instance: ContainerInstance,
    /// When a running instance exits by itself, and with which code.
    exits: Option<(Instant, i32)>,
}

#[derive(Debug, Default)]
struct SimPod {
    sandbox: Option<Sandbox>,
    /// The pod's name and namespace, and when its sandbox was made (for [`Runtime::pod_usage`]).
    name: String,
    namespace: String,
    sandbox_created_at: Option<Timestamp>,
    /// Newest first.
    containers: Vec<SimContainer>,
}

#[derive(Debug)]
struct State {
    pods: HashMap<PodUid, SimPod>,
    next_ip: u32,
    next_id: u64,
    /// Pods whose sandboxes the runtime refuses to make, with why ([`SimulatedRuntime::refuse_sandboxes`]).
    refused_sandboxes: HashMap<PodUid, String>,
}

/// The simulated runtime.
#[derive(Debug)]
pub struct SimulatedRuntime {
    config: SimulatedConfig,
    state: Mutex<State>,
    epoch: (Instant, Timestamp),
    /// Pods whose state changed by a fault (not by a scheduled exit).
    events: tokio::sync::broadcast::Sender<PodUid>,
}

/// The exit the annotations ask for: `Ok(None)` when the containers do not exit by themselves.
pub fn simulated_exit(pod: &Pod) -> Result<Option<(Duration, i32)>, String> {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key));
    let Some(after) = get(EXIT_AFTER_ANNOTATION) else {
        return Ok(None);
    };
    let seconds: f64 = after
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .ok_or_else(|| {
            format!("annotation {EXIT_AFTER_ANNOTATION}: {after:?} is not a number of seconds")
        })?;
    let code = match get(EXIT_CODE_ANNOTATION) {
        None => 0,
        Some(code) => code.trim().parse::<i32>().map_err(|_| {
            format!("annotation {EXIT_CODE_ANNOTATION}: {code:?} is not an exit code")
        })?,
    };
    Ok(Some((Duration::from_secs_f64(seconds), code)))
}

/// The exit code the annotations give init containers (0 without it).
pub fn simulated_init_exit(pod: &Pod) -> Result<i32, String> {
    match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INIT_EXIT_CODE_ANNOTATION))
    {
        None => Ok(0),
        Some(code) => code.trim().parse::<i32>().map_err(|_| {
            format!("annotation {INIT_EXIT_CODE_ANNOTATION}: {code:?} is not an exit code")
        }),
    }
}

fn exit_reason(code: i32) -> String {
    if code == 0 { "Completed" } else { "Error" }.to_owned()
}

impl SimulatedRuntime {
    /// A runtime with nothing running.
    pub fn new(config: SimulatedConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                pods: HashMap::new(),
                next_ip: 0,
                next_id: 0,
                refused_sandboxes: HashMap::new(),
            }),
            epoch: (
                Instant::now(),
                rustlet_status::Clock::now(&rustlet_status::SystemClock),
            ),
            events: tokio::sync::broadcast::channel(1024).0,
        }
    }

    /// Fault: the pod's sandbox dies by itself, and every container still running in it with
    /// exit code 137 (a node reboot, the sandbox's process killed).
    pub fn sandbox_died(&self, uid: &PodUid) {
        let now = Instant::now();
        let finished_at = self.wall(now);
        {
            let mut state = self.lock();
            let Some(pod) = state.pods.get_mut(uid) else {
                return;
            };
            self.settle(pod, now);
            for container in &mut pod.containers {
                if let InstanceState::Running { started_at } = container.instance.state {
                    container.instance.state = InstanceState::Exited {
                        started_at,
                        finished_at,
                        exit_code: KILLED_EXIT_CODE,
                        reason: exit_reason(KILLED_EXIT_CODE),
                        message: String::new(),
                    };
                    container.exits = None;
                }
            }
            if let Some(sandbox) = &mut pod.sandbox {
                sandbox.ready = false;
            }
        }
        let _ = self.events.send(uid.clone());
    }

    /// Fault: every `RunPodSandbox` of the pod fails with `message` (a sandbox config the
    /// runtime cannot make, a CNI failure), until [`Self::allow_sandboxes`].
    pub fn refuse_sandboxes(&self, uid: &PodUid, message: &str) {
        self.lock()
            .refused_sandboxes
            .insert(uid.clone(), message.to_owned());
    }

    /// Ends [`Self::refuse_sandboxes`] for the pod.
    pub fn allow_sandboxes(&self, uid: &PodUid) {
        self.lock().refused_sandboxes.remove(uid);
    }

    /// Fault: the runtime no longer knows the state of the newest instance of `container` (CRI
    /// `CONTAINER_UNKNOWN`); a kill makes it exited again.
    pub fn lose_track(&self, uid: &PodUid, container: &str) {
        let now = Instant::now();
        {
            let mut state = self.lock();
            let Some(pod) = state.pods.get_mut(uid) else {
                return;
            };
            self.settle(pod, now);
            if let Some(c) = pod
                .containers
                .iter_mut()
                .find(|c| c.instance.name == container)
            {
                c.instance.state = InstanceState::Unknown;
                c.exits = None;
            }
        }
        let _ = self.events.send(uid.clone());
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wall(&self, at: Instant) -> Timestamp {
        let since = at.saturating_duration_since(self.epoch.0);
        self.epoch
            .1
            .checked_add(SignedDuration::try_from(since).unwrap_or(SignedDuration::ZERO))
            .unwrap_or(self.epoch.1)
    }

    /// Moves instances whose exit time has come to `Exited`.
    fn settle(&self, pod: &mut SimPod, now: Instant) {
        for container in &mut pod.containers {
            if let (Some((at, code)), InstanceState::Running { started_at }) =
                (container.exits, &container.instance.state)
                && at <= now
            {
                container.instance.state = InstanceState::Exited {
                    started_at: *started_at,
                    finished_at: self.wall(at),
                    exit_code: code,
                    reason: exit_reason(code),
                    message: String::new(),
                };
                container.exits = None;
            }
        }
    }
}

#[async_trait]
impl Runtime for SimulatedRuntime {
    fn name(&self) -> &str {
        "simulated"
    }

    fn now(&self) -> Timestamp {
        self.wall(Instant::now())
    }

    async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError> {
        let uid = PodUid::of(pod);
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let mut state = self.lock();
        if let Some(message) = state.refused_sandboxes.get(&uid) {
            return Err(RuntimeError::CreateSandbox {
                pod: full_name(pod),
                message: message.clone(),
            });
        }
        if let Some(sandbox) = state.pods.get(&uid).and_then(|p| p.sandbox.clone())
            && sandbox.ready
        {
            return Ok(sandbox);
        }
        let ip = if host_network {
            self.config.node_ip.clone()
        } else {
            if state.next_ip >= self.config.pod_ip_count {
                state.next_ip = 0;
            }
            let base = u32::from(self.config.pod_ip_base);
            let ip = Ipv4Addr::from(base.wrapping_add(state.next_ip));
            state.next_ip += 1;
            ip.to_string()
        };
        state.next_id += 1;
        let sandbox = Sandbox {
            id: format!("{:016x}", state.next_id),
            ready: true,
            host_network,
            ip: Some(ip),
        };
        let created_at = self.wall(Instant::now());
        let sim = state.pods.entry(uid).or_default();
        sim.sandbox = Some(sandbox.clone());
        sim.name = pod.metadata.name.clone().unwrap_or_default();
        sim.namespace = pod.metadata.namespace.clone().unwrap_or_default();
        sim.sandbox_created_at = Some(created_at);
        Ok(sandbox)
    }

    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
    ) -> Result<(), RuntimeError> {
        let failed = |message: String| RuntimeError::StartContainer {
            pod: full_name(pod),
            container: container.name.clone(),
            message,
        };
        // As a real runtime's CreateContainer: every bind source must exist.
        if let Some(missing) = mounts.iter().find(|m| !m.host_path.exists()) {
            return Err(failed(format!(
                "the source of mount {:?} ({}) does not exist",
                missing.container_path,
                missing.host_path.display()
            )));
        }
        let exit = match kind {
            ContainerKind::Init if is_restartable_init_container(container) => None,
            ContainerKind::Init => {
                Some((Duration::ZERO, simulated_init_exit(pod).map_err(failed)?))
            }
            ContainerKind::Regular => simulated_exit(pod).map_err(failed)?,
            // A debugging shell: it runs until the pod stops.
            ContainerKind::Ephemeral => None,
        };
        if !self.config.start_delay.is_zero() {
            tokio::time::sleep(self.config.start_delay).await;
        }
        let now = Instant::now();
        let uid = PodUid::of(pod);
        let mut state = self.lock();
        state.next_id += 1;
        let id = format!("simulated://{:016x}", state.next_id);
        let started_at = self.wall(now);
        let sim = state.pods.entry(uid).or_default();
        let Some(sandbox_id) = sim
            .sandbox
            .as_ref()
            .filter(|s| s.ready)
            .map(|s| s.id.clone())
        else {
            return Err(failed("the pod has no ready sandbox".into()));
        };
        let attempt = sim
            .containers
            .iter()
            .find(|c| c.instance.name == container.name)
            .map_or(0, |c| c.instance.attempt + 1);
        sim.containers.insert(
            0,
            SimContainer {
                instance: ContainerInstance {
                    id,
                    name: container.name.clone(),
                    kind,
                    image: container.image.clone().unwrap_or_default(),
                    image_id: container.image.clone().unwrap_or_default(),
                    attempt,
                    state: InstanceState::Running { started_at },
                    sandbox_id,
                    hash: Some(container_hash(container)),
                },
                exits: exit.map(|(after, code)| (now + after, code)),
            },
        );
        // Keep the newest two instances per name (the previous one is `lastState`).
        let mut seen: HashMap<String, usize> = HashMap::new();
        sim.containers.retain(|c| {
            let n = seen.entry(c.instance.name.clone()).or_default();
            *n += 1;
            *n <= 2
        });
        Ok(())
    }

    /// The pods with a ready sandbox and their running containers, using no CPU and no
    /// memory (nothing runs).
    async fn pod_usage(&self) -> Result<Vec<PodUsage>, RuntimeError> {
        let now = Instant::now();
        let at = self.wall(now);
        let cpu = CpuUsage {
            at,
            usage_core_nanos: Some(0),
            usage_nano_cores: Some(0),
        };
        let memory = MemoryUsage {
            at,
            working_set: Some(0),
            available: None,
            usage: Some(0),
            rss: Some(0),
            page_faults: Some(0),
            major_page_faults: Some(0),
        };
        let mut state = self.lock();
        let mut out = Vec::new();
        for (uid, pod) in &mut state.pods {
            self.settle(pod, now);
            if !pod.sandbox.as_ref().is_some_and(|s| s.ready) {
                continue;
            }
            let containers = pod
                .containers
                .iter()
                .filter_map(|c| match c.instance.state {
                    InstanceState::Running { started_at } => Some(ContainerUsage {
                        id: c.instance.id.clone(),
                        name: c.instance.name.clone(),
                        created_at: started_at,
                        cpu: Some(cpu),
                        memory: Some(memory),
                        swap: None,
                        writable_layer: None,
                    }),
                    _ => None,
                })
                .collect();
            out.push(PodUsage {
                uid: uid.clone(),
                sandbox_id: pod
                    .sandbox
                    .as_ref()
                    .map(|s| s.id.clone())
                    .unwrap_or_default(),
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                created_at: pod.sandbox_created_at.unwrap_or(at),
                cpu: Some(cpu),
                memory: Some(memory),
                swap: None,
                containers,
            });
        }
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(out)
    }

    async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus {
        let now = Instant::now();
        let mut state = self.lock();
        let Some(pod) = state.pods.get_mut(uid) else {
            return RuntimePodStatus::default();
        };
        self.settle(pod, now);
        RuntimePodStatus {
            sandbox: pod.sandbox.clone(),
            containers: pod.containers.iter().map(|c| c.instance.clone()).collect(),
        }
    }

    async fn kill_pod(&self, pod: &Pod, grace: Duration) -> Result<(), RuntimeError> {
        let stop = self.config.stop_delay.min(grace);
        let any_running = || {
            self.lock().pods.get(&PodUid::of(pod)).is_some_and(|sim| {
                sim.containers
                    .iter()
                    .any(|c| matches!(c.instance.state, InstanceState::Running { .. }))
            })
        };
        if !stop.is_zero() && any_running() {
            tokio::time::sleep(stop).await;
        }
        let now = Instant::now();
        let finished_at = self.wall(now);
        let mut state = self.lock();
        let Some(sim) = state.pods.get_mut(&PodUid::of(pod)) else {
            return Ok(());
        };
        self.settle(sim, now);
        for container in &mut sim.containers {
            let (started_at, exit_code) = match container.instance.state {
                InstanceState::Running { started_at } => (started_at, 0),
                InstanceState::Unknown => (finished_at, KILLED_EXIT_CODE),
                InstanceState::Created | InstanceState::Exited { .. } => continue,
            };
            container.instance.state = InstanceState::Exited {
                started_at,
                finished_at,
                exit_code,
                reason: exit_reason(exit_code),
                message: String::new(),
            };
            container.exits = None;
        }
        if let Some(sandbox) = &mut sim.sandbox {
            sandbox.ready = false;
        }
        Ok(())
    }

    async fn remove_pod(&self, uid: &PodUid) {
        self.lock().pods.remove(uid);
    }

    async fn kill_container(
        &self,
        pod: &Pod,
        id: &str,
        _grace: Duration,
    ) -> Result<(), RuntimeError> {
        let now = Instant::now();
        let finished_at = self.wall(now);
        let mut state = self.lock();
        let Some(sim) = state.pods.get_mut(&PodUid::of(pod)) else {
            return Ok(());
        };
        self.settle(sim, now);
        if let Some(container) = sim.containers.iter_mut().find(|c| c.instance.id == id) {
            // A process the runtime lost track of does not get to exit cleanly.
            let (started_at, exit_code) = match container.instance.state {
                InstanceState::Running { started_at } => (started_at, 0),
                InstanceState::Unknown | InstanceState::Created => (finished_at, KILLED_EXIT_CODE),
                InstanceState::Exited { .. } => return Ok(()),
            };
            container.instance.state = InstanceState::Exited {
                started_at,
                finished_at,
                exit_code,
                reason: exit_reason(exit_code),
                message: String::new(),
            };
            container.exits = None;
        }
        Ok(())
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<PodUid>> {
        Some(self.events.subscribe())
    }

    fn next_change(&self, uid: &PodUid) -> Option<Instant> {
        let state = self.lock();
        state
            .pods
            .get(uid)?
            .containers
            .iter()
            .filter_map(|c| c.exits.map(|(at, _)| at))
            .min()
    }
}
