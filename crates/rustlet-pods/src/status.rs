//! API pod status generation (upstream `generateAPIPodStatus`, `getPhase`,
//! `convertToAPIContainerStatuses`; spec `pod-lifecycle.md` S1-S13) from what the runtime
//! reports. Pure: no clock, no I/O.
//!
//! Restartable init containers (sidecars) are started and ready as regular containers are (by
//! their probes), and count in the phase as upstream's `getPhase` counts them.
//!
//! The phase follows container restart rules (`ContainerRestartRules`, on by default since
//! v1.35, taken as on): a container that exited counts as restarting or not by its own
//! `restartPolicy` and `restartPolicyRules`, else by the pod's
//! ([`rustlet_core::restart::container_should_restart`]).
//!
//! Simplifications, each a deviation written down: no probes, so a running container is
//! started and ready (B10 without workers); one node IP family.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
    VolumeMountStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rustlet_core::FeatureGates;
use rustlet_core::generate::{
    GenerateContext, NamespaceMode, SandboxStatus, containers_ready_condition,
    pod_initialized_condition, pod_ready_condition, pod_ready_to_start_containers_condition,
};
use rustlet_core::pod::{
    PodPhase, condition_type, is_restartable_init_container, is_static_pod,
    pod_condition_by_kubelet,
};
use rustlet_core::restart::container_should_restart;
use rustlet_volume::subpath::resolve_recursive_read_only;

use crate::runtime::{
    ContainerInstance, ContainerKind, InstanceState, RuntimePodStatus, ephemeral_container,
};

/// A waiting reason the workers impose on a container (upstream's reason cache, S12):
/// `CrashLoopBackOff` while a restart backs off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingReason {
    /// The reason (`CrashLoopBackOff`).
    pub reason: String,
    /// The message.
    pub message: String,
}

/// What a status is generated from.
#[derive(Clone, Copy, Debug)]
pub struct StatusInput<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// What the runtime reports.
    pub runtime: &'a RuntimePodStatus,
    /// The status manager's cached status, else the pod's API status (S1 "old").
    pub old: &'a PodStatus,
    /// The pod is known to be terminal (W21 step 7, W23).
    pub pod_is_terminal: bool,
    /// The node's addresses (S8); empty in standalone mode.
    pub host_ips: &'a [String],
    /// Reasons imposed per container name (S12).
    pub waiting: &'a HashMap<String, WaitingReason>,
    /// Feature gates in force.
    pub gates: &'a FeatureGates,
    /// Probe results per regular container and sidecar name (B10); a name without an entry has no probe
    /// workers (and a runtime that runs no probes gives none).
    pub probes: &'a HashMap<String, ContainerProbes>,
    /// An internal module's request that the pod fail (upstream: a `PodSyncHandler`'s
    /// `ShouldEvict`; here the active deadline, [`past_active_deadline`]).
    pub evict: Option<Eviction>,
    /// Whether the runtime supports recursive read-only mounts (upstream
    /// `runtimeClassSupportsRecursiveReadOnlyMounts`), for the containers' `volumeMounts`.
    pub runtime_supports_rro: bool,
}

/// Why the pod fails on the node (upstream: `lifecycle.ShouldEvictResponse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The pod's `status.reason`.
    pub reason: &'static str,
    /// The pod's `status.message`.
    pub message: &'static str,
}

/// upstream: the active deadline handler's response (`reason`, `message` in
/// `active_deadline.go`).
pub const DEADLINE_EXCEEDED: Eviction = Eviction {
    reason: "DeadlineExceeded",
    message: "Pod was active on the node longer than the specified deadline",
};

/// When the pod's `activeDeadlineSeconds` runs out: its start time (from `status`, the status
/// manager's, else the API's) plus the deadline; `None` without either (upstream:
/// `activeDeadlineHandler.pastActiveDeadline`, which compares `now` with it).
pub fn active_deadline(pod: &Pod, status: &PodStatus) -> Option<k8s_openapi::jiff::Timestamp> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = status
        .start_time
        .as_ref()
        .or_else(|| pod.status.as_ref()?.start_time.as_ref())?;
    start
        .0
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .ok()
}

/// upstream: `activeDeadlineHandler.ShouldEvict`: the pod fails once `now` reached its
/// [`active_deadline`].
pub fn past_active_deadline(
    pod: &Pod,
    status: &PodStatus,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Eviction> {
    active_deadline(pod, status)
        .filter(|deadline| now >= *deadline)
        .map(|_| DEADLINE_EXCEEDED)
}

/// A regular container's or sidecar's probe state for its newest instance (B10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerProbes {
    /// `None`: no startup probe; else whether it succeeded.
    pub startup: Option<bool>,
    /// `None`: no readiness probe; else whether it succeeded.
    pub readiness: Option<bool>,
}

fn time(t: k8s_openapi::jiff::Timestamp) -> Time {
    Time(t)
}

/// The reason of a container whose state the runtime lost while it ran (upstream's).
pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// The message of that state (upstream's `convertToAPIContainerStatuses`).
pub const CONTAINER_STATUS_UNKNOWN_MESSAGE: &str =
    "The container could not be located when the pod was terminated";

/// Whether an old status says the container ran.
fn was_running(old: Option<&ContainerStatus>) -> bool {
    old.and_then(|o| o.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

/// S11: an instance's API state. An instance in an unknown state that `old` showed running is
/// terminated with `ContainerStatusUnknown` and exit code 137 (upstream: "container ran and
/// failed" is not "container never ran", so a run-once pod does not run twice); otherwise it
/// waits, without a reason.
fn state_of(instance: &ContainerInstance, old: Option<&ContainerStatus>) -> ContainerState {
    match &instance.state {
        InstanceState::Unknown if was_running(old) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(CONTAINER_STATUS_UNKNOWN.to_owned()),
                message: Some(CONTAINER_STATUS_UNKNOWN_MESSAGE.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        InstanceState::Unknown => ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        },
        InstanceState::Created => ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        },
        InstanceState::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(time(*started_at)),
            }),
            ..Default::default()
        },
        InstanceState::Exited {
            started_at,
            finished_at,
            exit_code,
            reason,
            message,
        } => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: *exit_code,
                reason: Some(reason.clone()),
                message: (!message.is_empty()).then(|| message.clone()),
                started_at: Some(time(*started_at)),
                finished_at: Some(time(*finished_at)),
                container_id: Some(instance.id.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

/// Upstream `convertToAPIContainerStatuses`: the container's `volumeMounts` as the spec asks
/// them (the CRI does not know the volumes' names); a read-only mount's `recursiveReadOnly`
/// is `Enabled` when it is resolved to be, else `Disabled` (also when it cannot be resolved:
/// the container then waits with `CreateContainerConfigError`).
fn volume_mount_statuses(
    spec: &Container,
    runtime_supports_rro: bool,
) -> Option<Vec<VolumeMountStatus>> {
    let mounts = spec.volume_mounts.as_deref().filter(|m| !m.is_empty())?;
    Some(
        mounts
            .iter()
            .map(|mount| {
                let read_only = mount.read_only.unwrap_or(false);
                let recursive_read_only = read_only.then(|| {
                    match resolve_recursive_read_only(mount, runtime_supports_rro) {
                        Ok(true) => "Enabled",
                        Ok(false) => "Disabled",
                        Err(err) => {
                            tracing::error!(error = %err, "failed to resolve recursive read-only mode");
                            "Disabled"
                        }
                    }
                    .to_owned()
                });
                VolumeMountStatus {
                    name: mount.name.clone(),
                    mount_path: mount.mount_path.clone(),
                    // Go's `omitempty`: a writable mount says nothing.
                    read_only: read_only.then_some(true),
                    recursive_read_only,
                    ..Default::default()
                }
            })
            .collect(),
    )
}

/// S9-S12 for one spec container.
fn container_status(
    input: &StatusInput<'_>,
    spec: &Container,
    kind: ContainerKind,
    old: Option<&ContainerStatus>,
) -> ContainerStatus {
    let name = spec.name.as_str();
    let image = spec.image.as_deref().unwrap_or_default();
    let has_init = input
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|i| !i.is_empty());
    let default_reason = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    // S9.
    let mut status = match old {
        Some(old) if old.state.as_ref().is_some_and(|s| s.terminated.is_some()) => old.clone(),
        _ => ContainerStatus {
            name: name.to_owned(),
            image: image.to_owned(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(default_reason.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            restart_count: old.map_or(0, |o| o.restart_count),
            last_state: old.and_then(|o| o.last_state.clone()),
            volume_mounts: volume_mount_statuses(spec, input.runtime_supports_rro),
            ..Default::default()
        },
    };
    // S11.
    let (newest, previous) = input.runtime.instances(name);
    if let Some(newest) = newest {
        // Upstream counts a lost running container as one restart more than `old` said.
        let restart_count = match (&newest.state, old) {
            (InstanceState::Unknown, Some(old)) if was_running(Some(old)) => old.restart_count + 1,
            _ => newest.attempt,
        };
        status = ContainerStatus {
            name: name.to_owned(),
            image: newest.image.clone(),
            image_id: newest.image_id.clone(),
            container_id: Some(newest.id.clone()),
            restart_count,
            state: Some(state_of(newest, old)),
            last_state: previous.map(|p| state_of(p, old)),
            volume_mounts: old.and_then(|o| o.volume_mounts.clone()),
            ..Default::default()
        };
    }
    // S12.
    if let Some(waiting) = input.waiting.get(name) {
        if let Some(terminated) = status.state.as_ref().and_then(|s| s.terminated.clone()) {
            status.last_state = Some(ContainerState {
                terminated: Some(terminated),
                ..Default::default()
            });
        }
        status.state = Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(waiting.reason.clone()),
                message: Some(waiting.message.clone()),
            }),
            ..Default::default()
        });
    }
    // B10.
    let state = status.state.clone().unwrap_or_default();
    let running = state.running.is_some();
    if kind == ContainerKind::Ephemeral {
        // upstream: the probe manager sets `started` and `ready` of regular and init
        // containers only.
        status.ready = false;
        status.started = None;
    } else if kind == ContainerKind::Init && !is_restartable_init_container(spec) {
        status.ready = state.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
        status.started = Some(running);
    } else {
        let probes = input.probes.get(name).copied().unwrap_or_default();
        let started = running && probes.startup.unwrap_or(true);
        status.started = Some(started);
        status.ready = started && probes.readiness.unwrap_or(true);
    }
    status
}

/// S4: upstream `getPhase`, with `ContainerRestartRules` (on by default since v1.35, taken as
/// on). A sidecar is pending until it runs and has started; once `pod_has_initialized` (a
/// regular container was created or runs in the runtime: upstream
/// `HasAnyActiveRegularContainerStarted`) a sidecar that is not started no longer holds the pod
/// pending. A running sidecar counts as running; an exited one is not counted, so a run-once
/// pod whose regular containers are done is Succeeded or Failed by them alone. A failed
/// ordinary init container that does not restart (by its own policy and rules, else the pod's)
/// fails the pod; stopped regular containers leave it Running while one of them restarts, else
/// Succeeded or Failed.
///
/// ```
/// use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
/// use rustlet_core::PodPhase;
/// use rustlet_pods::status::get_phase;
///
/// let pod = Pod {
///     spec: Some(PodSpec {
///         containers: vec![Container { name: "app".into(), ..Container::default() }],
///         ..PodSpec::default()
///     }),
///     ..Pod::default()
/// };
/// // No status for its container yet: Pending.
/// assert_eq!(get_phase(&pod, &[], &[], false, false), PodPhase::Pending);
/// let waiting = ContainerStatus { name: "app".into(), ..ContainerStatus::default() };
/// assert_eq!(get_phase(&pod, &[], &[waiting], false, false), PodPhase::Pending);
/// ```
pub fn get_phase(
    pod: &Pod,
    init: &[ContainerStatus],
    regular: &[ContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> PodPhase {
    let spec = or_default(pod.spec.as_ref());
    // ContainerRestartRules: whether a container that exited with this code restarts.
    let restarts = |c: &Container, exit_code: i32| container_should_restart(c, &spec, exit_code);
    let (mut pending_init, mut pending_sidecars, mut failed_init_not_restartable) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    let mut stopped_not_restartable = 0;
    for c in spec.init_containers.iter().flatten() {
        let status = init.iter().find(|s| s.name == c.name);
        if is_restartable_init_container(c) {
            let Some(s) = status else {
                unknown += 1;
                continue;
            };
            let state = or_default(s.state.as_ref());
            if state.running.is_some() {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            } else if state.terminated.is_some() {
                // An exited sidecar does not count.
            } else if state.waiting.is_some() {
                if last_exit_code(s).is_none() {
                    pending_sidecars += 1;
                    waiting += 1;
                }
            } else {
                pending_sidecars += 1;
                unknown += 1;
            }
            continue;
        }
        let Some(s) = status else {
            pending_init += 1;
            continue;
        };
        let state = or_default(s.state.as_ref());
        // The exit code of the run that ended: the current state's, or the last one's while
        // it waits to restart.
        let exit_code = if state.running.is_some() {
            None
        } else if let Some(t) = &state.terminated {
            Some(t.exit_code)
        } else if state.waiting.is_some() {
            last_exit_code(s)
        } else {
            None
        };
        match exit_code {
            None => pending_init += 1,
            Some(0) => {}
            // Failed: the pod fails unless the container restarts.
            Some(code) => {
                if !restarts(c, code) {
                    failed_init_not_restartable += 1;
                }
            }
        }
    }
    for c in &spec.containers {
        let Some(s) = regular.iter().find(|s| s.name == c.name) else {
            unknown += 1;
            continue;
        };
        let state = or_default(s.state.as_ref());
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if !restarts(c, t.exit_code) {
                stopped_not_restartable += 1;
            }
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.waiting.is_some() {
            if let Some(code) = last_exit_code(s) {
                stopped += 1;
                if !restarts(c, code) {
                    stopped_not_restartable += 1;
                }
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init_not_restartable > 0 {
        return PodPhase::Failed;
    }
    if pending_init > 0 || (pending_sidecars > 0 && !pod_has_initialized) || waiting > 0 {
        return PodPhase::Pending;
    }
    if running > 0 && unknown == 0 {
        return PodPhase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        // A terminal pod's containers are not restarted, whatever the policies say.
        if pod_is_terminal && !is_static_pod(pod) {
            return if stopped == succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        return if stopped != stopped_not_restartable {
            // At least one container restarts.
            PodPhase::Running
        } else if stopped == succeeded {
            PodPhase::Succeeded
        } else {
            PodPhase::Failed
        };
    }
    PodPhase::Pending
}

/// Upstream `HasAnyActiveRegularContainerStarted`: a regular container was created or runs.
fn any_regular_container_active(pod: &Pod, runtime: &RuntimePodStatus) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        matches!(
            runtime.instances(&c.name).0.map(|i| &i.state),
            Some(InstanceState::Created | InstanceState::Running { .. })
        )
    })
}

/// The exit code of a container's last run, if it ended (`lastState.terminated`).
fn last_exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .map(|t| t.exit_code)
}

/// `value` borrowed, or a default one when absent (issue 29: status generation copied the
/// pod's spec twice, its status and each container's state to get past the `Option`; the
/// spec's copies and drops alone were 2 % of the agent's CPU in a storm of 1,000 pods).
fn or_default<T: Clone + Default>(value: Option<&T>) -> std::borrow::Cow<'_, T> {
    value.map_or_else(
        || std::borrow::Cow::Owned(T::default()),
        std::borrow::Cow::Borrowed,
    )
}

/// Upstream `generateAPIPodStatus` (S2-S8).
pub fn generate_api_status(input: &StatusInput<'_>) -> PodStatus {
    let pod = input.pod;
    let spec = or_default(pod.spec.as_ref());
    let old = input.old;
    let statuses = |containers: &[k8s_openapi::api::core::v1::Container],
                    old_list: &Option<Vec<ContainerStatus>>,
                    kind: ContainerKind| {
        containers
            .iter()
            .map(|c| {
                let o = old_list
                    .as_ref()
                    .and_then(|l| l.iter().find(|s| s.name == c.name));
                container_status(input, c, kind, o)
            })
            .collect::<Vec<ContainerStatus>>()
    };
    let init = statuses(
        spec.init_containers.as_deref().unwrap_or_default(),
        &old.init_container_statuses,
        ContainerKind::Init,
    );
    let mut regular = statuses(
        &spec.containers,
        &old.container_statuses,
        ContainerKind::Regular,
    );
    regular.sort_by(|a, b| a.name.cmp(&b.name));
    let ephemeral_specs: Vec<k8s_openapi::api::core::v1::Container> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(ephemeral_container)
        .collect();
    let mut ephemeral = statuses(
        &ephemeral_specs,
        &old.ephemeral_container_statuses,
        ContainerKind::Ephemeral,
    );
    ephemeral.sort_by(|a, b| a.name.cmp(&b.name));

    // S4, S5.
    let api_status = or_default(pod.status.as_ref());
    let mut phase = get_phase(
        pod,
        &init,
        &regular,
        input.pod_is_terminal,
        any_regular_container_active(pod, input.runtime),
    );
    if !phase.is_terminal() {
        let old_phase = PodPhase::of(old);
        let api_phase = PodPhase::of(&api_status);
        if old_phase.is_terminal() {
            phase = old_phase;
        } else if api_phase.is_terminal() {
            phase = api_phase;
        }
    }
    let (mut reason, mut message) = if PodPhase::of(old) == phase {
        (
            old.reason.clone().or(api_status.reason.clone()),
            old.message.clone().or(api_status.message.clone()),
        )
    } else {
        (None, None)
    };
    // upstream: the PodSyncHandlers' `ShouldEvict` overrides the phase, reason and message;
    // a phase the API server shows terminal stays (no transition out of a terminal phase).
    if let Some(eviction) = input.evict {
        let api_phase = PodPhase::of(&api_status);
        phase = if api_phase.is_terminal() {
            api_phase
        } else {
            PodPhase::Failed
        };
        reason = Some(eviction.reason.to_owned());
        message = Some(eviction.message.to_owned());
    }

    // S2.
    let sandbox = input.runtime.sandbox.as_ref();
    let ip = sandbox
        .and_then(|s| s.ip.clone())
        .or_else(|| old.pod_ip.clone());
    let host_network = spec.host_network.unwrap_or(false);
    let ip = if host_network {
        ip.or_else(|| input.host_ips.first().cloned())
    } else {
        ip
    };

    // S7.
    let ctx = GenerateContext {
        pod,
        old_status: old,
        gates: input.gates,
    };
    let mut conditions: Vec<PodCondition> = api_status
        .conditions
        .iter()
        .flatten()
        .filter(|c| !pod_condition_by_kubelet(&c.type_, input.gates))
        .cloned()
        .collect();
    if let Some(disruption) = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == condition_type::DISRUPTION_TARGET)
        && !conditions.iter().any(|c| c.type_ == disruption.type_)
    {
        conditions.push(disruption.clone());
    }
    let sandboxes: Vec<SandboxStatus> = sandbox
        .map(|s| SandboxStatus {
            ready: s.ready,
            network_namespace: if s.host_network {
                NamespaceMode::Node
            } else {
                NamespaceMode::Pod
            },
            ip: s.ip.clone(),
        })
        .into_iter()
        .collect();
    conditions.push(pod_ready_to_start_containers_condition(&ctx, &sandboxes));
    let all: Vec<ContainerStatus> = init.iter().chain(regular.iter()).cloned().collect();
    conditions.push(pod_initialized_condition(&ctx, Some(&all), &phase));
    let ready = pod_ready_condition(&ctx, &conditions, Some(&all), &phase);
    conditions.push(ready);
    conditions.push(containers_ready_condition(&ctx, Some(&all), &phase));
    conditions.push(PodCondition {
        type_: condition_type::POD_SCHEDULED.to_owned(),
        status: "True".to_owned(),
        ..Default::default()
    });

    PodStatus {
        phase: Some(phase.as_str().to_owned()),
        reason,
        message,
        conditions: Some(conditions),
        host_ip: input.host_ips.first().cloned(),
        host_ips: (!input.host_ips.is_empty()).then(|| {
            input
                .host_ips
                .iter()
                .take(2)
                .map(|ip| HostIP { ip: ip.clone() })
                .collect()
        }),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(regular),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        qos_class: api_status.qos_class.clone().or(old.qos_class.clone()),
        start_time: old.start_time.clone().or(api_status.start_time.clone()),
        ..Default::default()
    }
}
