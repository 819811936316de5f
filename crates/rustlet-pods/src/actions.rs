//! What a sync does to a pod's sandbox and containers (upstream `computePodActions`,
//! `computeInitContainerActions`, `podSandboxChanged`, `ShouldContainerBeRestarted`; spec
//! `pod-lifecycle.md` C7, C8, C10-C12, C20), computed from the pod and what the runtime reports,
//! before anything is done. Pure: no clock, no I/O.
//!
//! Container restart rules (`ContainerRestartRules`, on by default since v1.35; Rustlet's
//! agent does not configure gates, so it is taken as on): a regular container's own
//! `restartPolicy` and its `restartPolicyRules` decide whether it is restarted
//! ([`rustlet_core::restart`]).
//!
//! Deviations, each written down: restartable init containers (sidecars) are treated as
//! ordinary init containers (as the status generation does), and a failed ordinary init
//! container is restarted by the pod's policy only, not by its own (upstream asks
//! `ShouldContainerBeRestarted`); ephemeral containers and in-place
//! resize are not supported; instead of purging the init containers of a replaced sandbox
//! (upstream `purgeInitContainers`), init instances count only in the sandbox they were made in
//! ([`ContainerInstance::sandbox_id`]), which leaves them to the garbage collection and keeps
//! their restart counts.

use k8s_openapi::api::core::v1::{Container, Pod};
use rustlet_core::restart::{container_should_restart, effective_restart_policy};

use crate::prober::ProbeKind;
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
    /// The init container to start next (an index into `spec.initContainers`).
    pub next_init: Option<usize>,
    /// The regular containers to start (indexes into `spec.containers`).
    pub start: Vec<usize>,
    /// Instances to kill before the starts.
    pub kill: Vec<ContainerToKill>,
}

/// The probe results a pass reads besides the pod and the runtime's report.
pub trait ProbeFailures {
    /// Whether this running instance's probe of this kind (liveness or startup) failed.
    fn failed(&self, id: &str, kind: ProbeKind) -> bool;
}

/// No probe failed (a runtime that runs no probes).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProbes;

impl ProbeFailures for NoProbes {
    fn failed(&self, _id: &str, _kind: ProbeKind) -> bool {
        false
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

/// Where initialization stands (upstream `computeInitContainerActions` for ordinary init
/// containers).
enum Init {
    /// Every init container succeeded in this sandbox (or a regular container runs).
    Done,
    /// One runs: wait for it.
    Running,
    /// Start this one next.
    Start(usize),
    /// This one failed (exit code not 0, or its state is unknown).
    Failed(usize),
}

fn init_progress(
    init: &[Container],
    regular: &[Container],
    runtime: &RuntimePodStatus,
    sandbox_id: &str,
) -> Init {
    // Initialized: a regular container was created or runs (an exited one does not count: a
    // node reboot leaves them all exited).
    let regular_up = regular.iter().any(|c| {
        matches!(
            runtime.instances(&c.name).0.map(|i| &i.state),
            Some(InstanceState::Created | InstanceState::Running { .. })
        )
    });
    if regular_up || init.is_empty() {
        return Init::Done;
    }
    // The newest instance of each init container made in this sandbox, from the last to the
    // first.
    for (index, container) in init.iter().enumerate().rev() {
        let Some(newest) = runtime
            .containers
            .iter()
            .find(|i| i.name == container.name && i.sandbox_id == sandbox_id)
        else {
            continue;
        };
        return match &newest.state {
            InstanceState::Running { .. } => Init::Running,
            InstanceState::Created => Init::Start(index),
            InstanceState::Exited { exit_code: 0, .. } if index + 1 == init.len() => Init::Done,
            InstanceState::Exited { exit_code: 0, .. } => Init::Start(index + 1),
            InstanceState::Exited { .. } | InstanceState::Unknown => Init::Failed(index),
        };
    }
    Init::Start(0)
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
            actions.next_init = Some(0);
        }
        return actions;
    }
    let sandbox_id = runtime.sandbox.as_ref().map_or("", |s| s.id.as_str());

    // C10: initialization.
    match init_progress(init, &spec.containers, runtime, sandbox_id) {
        Init::Done => {}
        Init::Running => return actions,
        Init::Start(index) => {
            actions.next_init = Some(index);
            return actions;
        }
        Init::Failed(index) => {
            if !restarts_on_failure(pod) {
                actions.kill_pod = true;
                return actions;
            }
            let container = &init[index];
            if let Some(unknown) = runtime
                .containers
                .iter()
                .find(|i| i.name == container.name && i.state == InstanceState::Unknown)
            {
                actions.kill.push(ContainerToKill {
                    id: unknown.id.clone(),
                    name: container.name.clone(),
                    reason: KillReason::Unknown,
                    message:
                        "Init container is in \"Unknown\" state, try killing it before restart"
                            .into(),
                });
            }
            actions.next_init = Some(index);
            return actions;
        }
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
    if keep == 0 && actions.start.is_empty() {
        actions.kill_pod = true;
    }
    actions
}
