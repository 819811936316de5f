//! What a sync does to a pod's sandbox and containers (upstream `computePodActions`,
//! `computeInitContainerActions`, `podSandboxChanged`, `ShouldContainerBeRestarted`; spec
//! `pod-lifecycle.md` C7, C8, C10-C12, C20), computed from the pod and what the runtime reports,
//! before anything is done. Pure: no clock, no I/O.
//!
//! Restartable init containers (sidecars, `restartPolicy: Always`) follow upstream's
//! `computeInitContainerActions`: each starts the next init container once it runs (and its
//! startup probe passed), is restarted whenever it exits (whatever the pod's policy), on a
//! liveness or startup failure and on a definition change, and is not restarted once the pod is
//! done (C12).
//!
//! Container restart rules (`ContainerRestartRules`, on by default since v1.35; Rustlet's
//! agent does not configure gates, so it is taken as on): a regular container's own
//! `restartPolicy` and its `restartPolicyRules` decide whether it is restarted
//! ([`rustlet_core::restart`]).
//!
//! A failed ordinary init container restarts by its own policy and rules too, as upstream's
//! `computeInitContainerActions` asks `ShouldContainerBeRestarted`.
//!
//! Deviations, each written down: in-place resize is not supported; instead of purging the init containers of a replaced sandbox
//! (upstream `purgeInitContainers`), init instances count only in the sandbox they were made in
//! ([`ContainerInstance::sandbox_id`]), which leaves them to the garbage collection and keeps
//! their restart counts.

use k8s_openapi::api::core::v1::{Container, Pod};
use rustlet_core::restart::{container_should_restart, effective_restart_policy};

use rustlet_core::pod::is_restartable_init_container;

use crate::prober::{ProbeKind, ProbeResult};
use crate::runtime::{ContainerInstance, InstanceState, RuntimePodStatus, Sandbox, container_hash};

/// Why a running container is killed (the message of its `Killing` event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec changed (C11): always restarted.
    DefinitionChanged,
    /// Its liveness probe failed.
    Liveness,
    /// Its startup probe failed.
    Startup,
    /// The runtime lost its state (C10, C11): killed before it is started again.
    Unknown,
}

/// One container instance to kill before the starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerToKill {
    /// The instance's ID (`<runtime>://<id>`).
    pub id: String,
    /// The spec container's name.
    pub name: String,
    /// Why.
    pub reason: KillReason,
    /// The `Killing` event's message (upstream's wording).
    pub message: String,
}

/// What one sync does (upstream `podActions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox first (a sandbox replaced, or the pod done).
    pub kill_pod: bool,
    /// Create a new sandbox (after the kill).
    pub create_sandbox: bool,
    /// The pod had a sandbox that is replaced (event `SandboxChanged`).
    pub sandbox_changed: bool,
    /// The init containers to start, in spec order (indexes into `spec.initContainers`;
    /// upstream `InitContainersToStart`): at most one ordinary init container, the next, and
    /// the sidecars to (re)start.
    pub init_to_start: Vec<usize>,
    /// The regular containers to start (indexes into `spec.containers`).
    pub start: Vec<usize>,
    /// The ephemeral containers to start (indexes into `spec.ephemeralContainers`): those
    /// that never had an instance (upstream `EphemeralContainersToStart`; never restarted).
    pub ephemeral: Vec<usize>,
    /// Instances to kill before the starts.
    pub kill: Vec<ContainerToKill>,
}

/// The probe results a pass reads besides the pod and the runtime's report.
pub trait ProbeFailures {
    /// This running instance's result of this probe kind (liveness or startup); `None` while
    /// the probe has not given one (upstream's results manager `Get` not `found`).
    fn result(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult>;

    /// Whether this running instance's probe of this kind failed.
    fn failed(&self, id: &str, kind: ProbeKind) -> bool {
        self.result(id, kind) == Some(ProbeResult::Failure)
    }
}

/// No probe runs (a runtime without processes): every probe is taken as passed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbes;

impl ProbeFailures for NoProbes {
    fn result(&self, _id: &str, _kind: ProbeKind) -> Option<ProbeResult> {
        Some(ProbeResult::Success)
    }
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Upstream `shouldRestartOnFailure`.
fn restarts_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

/// C20: upstream `ShouldContainerBeRestarted`, on the newest instance of the container: an
/// exited one as its restart rules say ([`container_should_restart`]).
pub fn should_container_be_restarted(
    pod: &Pod,
    container: &Container,
    newest: Option<&ContainerInstance>,
) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(newest) = newest else {
        return true;
    };
    match &newest.state {
        InstanceState::Running { .. } => false,
        InstanceState::Unknown | InstanceState::Created => true,
        InstanceState::Exited { exit_code, .. } => {
            let empty = k8s_openapi::api::core::v1::PodSpec::default();
            container_should_restart(container, pod.spec.as_ref().unwrap_or(&empty), *exit_code)
        }
    }
}

/// C7: upstream `PodSandboxChanged`: `Some(had_one)` when a (new) sandbox must be made.
fn sandbox_to_create(pod: &Pod, sandbox: Option<&Sandbox>) -> Option<bool> {
    let Some(sandbox) = sandbox else {
        return Some(false);
    };
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let changed = !sandbox.ready
        || sandbox.host_network != host_network
        || (!host_network && sandbox.ip.as_deref().is_none_or(str::is_empty));
    changed.then_some(true)
}

fn succeeded(instance: Option<&ContainerInstance>) -> bool {
    matches!(
        instance.map(|i| &i.state),
        Some(InstanceState::Exited { exit_code: 0, .. })
    )
}

/// Upstream `computeInitContainerActions` (C10 with sidecars): fills `actions.init_to_start`
/// (and `kill`, or `kill_pod` for a run-once pod whose ordinary init container failed) and
/// returns whether the pod has initialized, when its regular containers are looked at.
///
/// The init containers are read from the last to the first: the last one with an instance in
/// this sandbox decides what comes next; those before it are "previously initialized", and of
/// them only the sidecars are kept running.
fn init_container_actions(
    pod: &Pod,
    runtime: &RuntimePodStatus,
    sandbox_id: &str,
    probes: &dyn ProbeFailures,
    actions: &mut PodActions,
) -> bool {
    let empty = k8s_openapi::api::core::v1::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    if init.is_empty() {
        return true;
    }
    // A regular container created or running: every init container ran once (an exited one
    // does not count: a node reboot leaves them all exited).
    let mut initialized = spec.containers.iter().any(|c| {
        matches!(
            runtime.instances(&c.name).0.map(|i| &i.state),
            Some(InstanceState::Created | InstanceState::Running { .. })
        )
    });
    let mut previously_initialized = initialized;
    let restart_on_failure = restarts_on_failure(pod);
    let mut to_start = Vec::new();
    let mut kill = |instance: &ContainerInstance, reason: KillReason, message: String| {
        actions.kill.push(ContainerToKill {
            id: instance.id.clone(),
            name: instance.name.clone(),
            reason,
            message,
        });
    };
    for (index, container) in init.iter().enumerate().rev() {
        let sidecar = is_restartable_init_container(container);
        let last = index + 1 == init.len();
        // The newest instance made in this sandbox.
        let Some(newest) = runtime
            .containers
            .iter()
            .find(|i| i.name == container.name && i.sandbox_id == sandbox_id)
        else {
            // Gone from the runtime after initialization: a sidecar starts again.
            if previously_initialized && sidecar {
                to_start.push(index);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match &newest.state {
            // Created but never started (the runtime failed to start it): started again.
            InstanceState::Created => to_start.push(index),
            InstanceState::Running { .. } if !sidecar => {}
            InstanceState::Running { .. } => 'sidecar: {
                if container.startup_probe.is_some() {
                    match probes.result(&newest.id, ProbeKind::Startup) {
                        // Not started yet: wait for the probe.
                        None => break 'sidecar,
                        Some(ProbeResult::Success) => {}
                        Some(ProbeResult::Failure) => {
                            kill(
                                newest,
                                KillReason::Startup,
                                format!("Init container {} failed startup probe", container.name),
                            );
                            to_start.push(index);
                            break 'sidecar;
                        }
                    }
                }
                if last {
                    initialized = true;
                } else if !previously_initialized {
                    // Started for the first time: the next init container follows.
                    to_start.push(index + 1);
                }
                if newest
                    .hash
                    .as_ref()
                    .is_some_and(|hash| *hash != container_hash(container))
                {
                    kill(
                        newest,
                        KillReason::DefinitionChanged,
                        format!("Init container {} definition changed", container.name),
                    );
                    to_start.push(index);
                    break 'sidecar;
                }
                // Its liveness does not hold back the next init container.
                if container.liveness_probe.is_some()
                    && probes.result(&newest.id, ProbeKind::Liveness) == Some(ProbeResult::Failure)
                {
                    kill(
                        newest,
                        KillReason::Liveness,
                        format!("Init container {} failed liveness probe", container.name),
                    );
                    to_start.push(index);
                }
            }
            // A sidecar that exited is restarted, whatever the pod's policy.
            InstanceState::Exited { .. } if sidecar => to_start.push(index),
            InstanceState::Exited { exit_code: 0, .. } => {
                if last {
                    initialized = true;
                } else {
                    to_start.push(index + 1);
                }
            }
            // A failed init container restarts by its own policy and rules, else the pod's
            // (ContainerRestartRules: upstream asks `ShouldContainerBeRestarted`).
            InstanceState::Exited { .. }
                if !should_container_be_restarted(pod, container, Some(newest)) =>
            {
                actions.kill_pod = true;
                return false;
            }
            InstanceState::Exited { .. } => to_start.push(index),
            InstanceState::Unknown => {
                // No exit code for the rules: the container's own policy only, else the pod's.
                let restarts = match container.restart_policy.as_deref() {
                    Some(policy) => policy != "Never",
                    None => restart_on_failure,
                };
                if !sidecar && !restarts {
                    actions.kill_pod = true;
                    return false;
                }
                kill(
                    newest,
                    KillReason::Unknown,
                    "Init container is in \"Unknown\" state, try killing it before restart".into(),
                );
                to_start.push(index);
            }
        }
        previously_initialized = true;
    }
    // No init container started yet: the first one.
    if !previously_initialized {
        to_start.push(0);
    }
    to_start.reverse();
    actions.init_to_start = to_start;
    initialized
}

/// C8-C12: upstream `computePodActions`.
pub fn compute_pod_actions(
    pod: &Pod,
    runtime: &RuntimePodStatus,
    probes: &dyn ProbeFailures,
) -> PodActions {
    let empty = k8s_openapi::api::core::v1::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let mut actions = PodActions::default();

    // C8: a new sandbox; everything in the old one is killed first.
    if let Some(had_one) = sandbox_to_create(pod, runtime.sandbox.as_ref()) {
        actions.kill_pod = true;
        actions.sandbox_changed = had_one;
        // A pod that never restarts, whose containers ran in the sandbox that died, is done:
        // killed, never given a new sandbox.
        if !restarts_on_failure(pod) && had_one && !runtime.containers.is_empty() {
            return actions;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                // Run once on success: the container's own policy, else the pod's.
                !(effective_restart_policy(spec, c) == "OnFailure"
                    && succeeded(runtime.instances(&c.name).0))
            })
            .map(|(index, _)| index)
            .collect();
        let any_regular_created = spec
            .containers
            .iter()
            .any(|c| runtime.instances(&c.name).0.is_some());
        if to_start.is_empty() && any_regular_created {
            return actions;
        }
        actions.create_sandbox = true;
        // C13: the init containers run again from the first, before anything else.
        if init.is_empty() {
            actions.start = to_start;
        } else {
            actions.init_to_start = vec![0];
        }
        return actions;
    }
    let sandbox_id = runtime.sandbox.as_ref().map_or("", |s| s.id.as_str());

    // Ephemeral containers start even while initialization goes on, each once: one that has
    // an instance, whatever its state, is never started again.
    actions.ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| runtime.instances(&c.name).0.is_none())
        .map(|(index, _)| index)
        .collect();

    // C10: initialization.
    if !init_container_actions(pod, runtime, sandbox_id, probes, &mut actions) || actions.kill_pod {
        return actions;
    }

    // C11: regular containers.
    let mut keep = 0;
    for (index, container) in spec.containers.iter().enumerate() {
        let newest = runtime.instances(&container.name).0;
        let Some(running) = newest.filter(|i| matches!(i.state, InstanceState::Running { .. }))
        else {
            if should_container_be_restarted(pod, container, newest) {
                actions.start.push(index);
                if let Some(unknown) = newest.filter(|i| i.state == InstanceState::Unknown) {
                    actions.kill.push(ContainerToKill {
                        id: unknown.id.clone(),
                        name: container.name.clone(),
                        reason: KillReason::Unknown,
                        message: "Container is in \"Unknown\" state, try killing it before restart"
                            .into(),
                    });
                }
            }
            continue;
        };
        // A probe's kill: the container's own policy, else the pod's (its rules need an exit
        // code, and it still runs).
        let mut restart = effective_restart_policy(spec, container) != "Never";
        let (reason, mut message) = if running
            .hash
            .as_ref()
            .is_some_and(|hash| *hash != container_hash(container))
        {
            // Restarted whatever the policy: the spec changed.
            restart = true;
            (
                KillReason::DefinitionChanged,
                format!("Container {} definition changed", container.name),
            )
        } else if probes.failed(&running.id, ProbeKind::Liveness) {
            (
                KillReason::Liveness,
                format!("Container {} failed liveness probe", container.name),
            )
        } else if probes.failed(&running.id, ProbeKind::Startup) {
            (
                KillReason::Startup,
                format!("Container {} failed startup probe", container.name),
            )
        } else {
            keep += 1;
            continue;
        };
        if restart {
            message.push_str(", will be restarted");
            actions.start.push(index);
        }
        actions.kill.push(ContainerToKill {
            id: running.id.clone(),
            name: container.name.clone(),
            reason,
            message,
        });
    }
    // C12: nothing runs and nothing starts: the pod is done.
    // Its sidecars are not restarted: they do not keep the pod alive.
    if keep == 0 && actions.start.is_empty() {
        actions.kill_pod = true;
        actions.init_to_start.clear();
    }
    actions
}
