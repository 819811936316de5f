//! Condition generators (G1-G7), upstream `pkg/kubelet/status/generate.go` at v1.35.
//!
//! Each generator is a pure function of the pod, the old status (for per-condition
//! `observedGeneration`) and what the runtime reported. Reasons and messages are upstream's,
//! to the letter; lists render as Go's `%s` of a string slice: `[a b c]`.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition, PodSpec, PodStatus};

use crate::features::FeatureGates;
use crate::pod::{
    PodPhase, condition_in, condition_observed_generation, condition_status, condition_type,
    container_status, is_restartable_init_container,
};

/// Reason: all container statuses are unknown.
pub const UNKNOWN_CONTAINER_STATUSES: &str = "UnknownContainerStatuses";
/// Reason: all related containers have succeeded.
pub const POD_COMPLETED: &str = "PodCompleted";
/// Reason: the pod has failed and so have its containers.
pub const POD_FAILED: &str = "PodFailed";
/// Reason: one or more containers are not ready.
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
/// Reason: one or more init containers have not succeeded.
pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
/// Reason: one or more readiness gates are not ready.
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
/// Reason: a container exit triggered the RestartAllContainers action.
pub const RESTART_ALL_CONTAINERS_STARTED: &str = "RestartAllContainersStarted";

/// What the generators need besides the statuses: the pod, its old status and the gates.
#[derive(Clone, Copy, Debug)]
pub struct GenerateContext<'a> {
    /// The pod (spec and generation).
    pub pod: &'a Pod,
    /// The previous status, for per-condition `observedGeneration`.
    pub old_status: &'a PodStatus,
    /// Feature gates in force.
    pub gates: &'a FeatureGates,
}

impl GenerateContext<'_> {
    fn spec(&self) -> &PodSpec {
        static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
        self.pod
            .spec
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
    }

    fn condition(&self, type_: &str, status: &str) -> PodCondition {
        PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            observed_generation: condition_observed_generation(
                self.old_status,
                self.pod.metadata.generation,
                type_,
                self.gates,
            ),
            ..Default::default()
        }
    }

    fn condition_with(
        &self,
        type_: &str,
        status: &str,
        reason: &str,
        message: String,
    ) -> PodCondition {
        PodCondition {
            reason: Some(reason.to_owned()),
            message: (!message.is_empty()).then_some(message),
            ..self.condition(type_, status)
        }
    }
}

/// Go's `fmt.Sprintf("%s", []string{..})`.
fn go_list(names: &[String]) -> String {
    format!("[{}]", names.join(" "))
}

fn terminal_condition(ctx: &GenerateContext<'_>, type_: &str, phase: &PodPhase) -> PodCondition {
    let mut condition = ctx.condition(type_, condition_status::FALSE);
    condition.reason = match phase {
        PodPhase::Failed => Some(POD_FAILED.to_owned()),
        PodPhase::Succeeded => Some(POD_COMPLETED.to_owned()),
        _ => None,
    };
    condition
}

/// G6: `ContainersReady` for a terminal phase (upstream `generateContainersReadyConditionForTerminalPhase`).
pub fn containers_ready_for_terminal_phase(
    ctx: &GenerateContext<'_>,
    phase: &PodPhase,
) -> PodCondition {
    terminal_condition(ctx, condition_type::CONTAINERS_READY, phase)
}

/// G6: `Ready` for a terminal phase (upstream `generatePodReadyConditionForTerminalPhase`).
pub fn pod_ready_for_terminal_phase(ctx: &GenerateContext<'_>, phase: &PodPhase) -> PodCondition {
    terminal_condition(ctx, condition_type::READY, phase)
}

/// G1: `ContainersReady`. `statuses` of `None` means "unknown" (upstream's nil slice), which
/// differs from an empty list.
pub fn containers_ready_condition(
    ctx: &GenerateContext<'_>,
    statuses: Option<&[ContainerStatus]>,
    phase: &PodPhase,
) -> PodCondition {
    let Some(statuses) = statuses else {
        return ctx.condition_with(
            condition_type::CONTAINERS_READY,
            condition_status::FALSE,
            UNKNOWN_CONTAINER_STATUSES,
            String::new(),
        );
    };
    let spec = ctx.spec();
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_restartable_init_container(c));
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    for container in sidecars.chain(spec.containers.iter()) {
        match container_status(statuses, &container.name) {
            Some(s) if !s.ready => unready.push(container.name.clone()),
            Some(_) => {}
            None => unknown.push(container.name.clone()),
        }
    }
    if (*phase == PodPhase::Succeeded && unknown.is_empty()) || *phase == PodPhase::Failed {
        return containers_ready_for_terminal_phase(ctx, phase);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        messages.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if messages.is_empty() {
        ctx.condition(condition_type::CONTAINERS_READY, condition_status::TRUE)
    } else {
        ctx.condition_with(
            condition_type::CONTAINERS_READY,
            condition_status::FALSE,
            CONTAINERS_NOT_READY,
            messages.join(", "),
        )
    }
}

/// G2: `Ready` = `ContainersReady` and every readiness gate's condition `True` in `conditions`.
pub fn pod_ready_condition(
    ctx: &GenerateContext<'_>,
    conditions: &[PodCondition],
    statuses: Option<&[ContainerStatus]>,
    phase: &PodPhase,
) -> PodCondition {
    let containers_ready = containers_ready_condition(ctx, statuses, phase);
    if containers_ready.status != condition_status::TRUE {
        return PodCondition {
            type_: condition_type::READY.to_owned(),
            observed_generation: ctx.condition(condition_type::READY, "").observed_generation,
            ..containers_ready
        };
    }
    let mut messages = Vec::new();
    for gate in ctx.spec().readiness_gates.iter().flatten() {
        match condition_in(conditions, &gate.condition_type) {
            None => messages.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate.condition_type
            )),
            Some((_, c)) if c.status != condition_status::TRUE => messages.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if messages.is_empty() {
        ctx.condition(condition_type::READY, condition_status::TRUE)
    } else {
        ctx.condition_with(
            condition_type::READY,
            condition_status::FALSE,
            READINESS_GATES_NOT_READY,
            messages.join(", "),
        )
    }
}

/// Upstream `HasAnyRegularContainerStarted`: a regular container (by spec name) is running or
/// terminated.
pub fn has_any_regular_container_started(spec: &PodSpec, statuses: &[ContainerStatus]) -> bool {
    statuses.iter().any(|s| {
        spec.containers.iter().any(|c| c.name == s.name)
            && s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    })
}

/// G3: `Initialized`. Sidecars count once started, regular init containers once ready.
pub fn pod_initialized_condition(
    ctx: &GenerateContext<'_>,
    statuses: Option<&[ContainerStatus]>,
    phase: &PodPhase,
) -> PodCondition {
    let spec = ctx.spec();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let Some(statuses) = statuses.or(if init.is_empty() { Some(&[]) } else { None }) else {
        return ctx.condition_with(
            condition_type::INITIALIZED,
            condition_status::FALSE,
            UNKNOWN_CONTAINER_STATUSES,
            String::new(),
        );
    };
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for container in init {
        match container_status(statuses, &container.name) {
            None => unknown.push(container.name.clone()),
            Some(s) => {
                let initialized = if is_restartable_init_container(container) {
                    s.started == Some(true)
                } else {
                    s.ready
                };
                if !initialized {
                    incomplete.push(container.name.clone());
                }
            }
        }
    }
    if *phase == PodPhase::Succeeded && unknown.is_empty() {
        return ctx.condition_with(
            condition_type::INITIALIZED,
            condition_status::TRUE,
            POD_COMPLETED,
            String::new(),
        );
    }
    if has_any_regular_container_started(spec, statuses) {
        return ctx.condition(condition_type::INITIALIZED, condition_status::TRUE);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        messages.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if messages.is_empty() {
        return ctx.condition(condition_type::INITIALIZED, condition_status::TRUE);
    }
    let was_initialized =
        ctx.gates.restart_all_containers_on_container_exits
            && ctx.old_status.conditions.iter().flatten().any(|c| {
                c.type_ == condition_type::INITIALIZED && c.status == condition_status::TRUE
            });
    if was_initialized {
        return ctx.condition(condition_type::INITIALIZED, condition_status::TRUE);
    }
    ctx.condition_with(
        condition_type::INITIALIZED,
        condition_status::FALSE,
        CONTAINERS_NOT_INITIALIZED,
        messages.join(", "),
    )
}

/// The network namespace mode a sandbox reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceMode {
    /// The pod has its own namespace.
    Pod,
    /// The node's namespace (host network).
    Node,
    /// A container's namespace.
    Container,
    /// Another target's namespace.
    Target,
}

/// What the runtime says about one pod sandbox (the part of a CRI `PodSandboxStatus` that G4
/// reads). The newest sandbox comes first, as the runtime lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    /// State `SANDBOX_READY`.
    pub ready: bool,
    /// The sandbox's network namespace mode.
    pub network_namespace: NamespaceMode,
    /// The pod IP the sandbox's network got, if any.
    pub ip: Option<String>,
}

/// Upstream `PodSandboxChanged` reduced to its verdict: a new sandbox is needed when there is
/// none, more than one is ready, the newest is not ready, its network mode no longer matches
/// `hostNetwork`, or a pod-network sandbox has no IP.
pub fn pod_sandbox_changed(pod: &Pod, sandboxes: &[SandboxStatus]) -> bool {
    let Some(newest) = sandboxes.first() else {
        return true;
    };
    if sandboxes.iter().filter(|s| s.ready).count() > 1 || !newest.ready {
        return true;
    }
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let wanted = if host_network {
        NamespaceMode::Node
    } else {
        NamespaceMode::Pod
    };
    newest.network_namespace != wanted
        || (!host_network && newest.ip.as_deref().unwrap_or("").is_empty())
}

/// G4: `PodReadyToStartContainers` is True when no new sandbox is needed.
pub fn pod_ready_to_start_containers_condition(
    ctx: &GenerateContext<'_>,
    sandboxes: &[SandboxStatus],
) -> PodCondition {
    let status = if pod_sandbox_changed(ctx.pod, sandboxes) {
        condition_status::FALSE
    } else {
        condition_status::TRUE
    };
    ctx.condition(condition_type::POD_READY_TO_START_CONTAINERS, status)
}

/// The runtime's verdicts that G5 needs (upstream `ShouldAllContainersRestart` and
/// `AllContainersRestartCleanedUp`, computed by the runtime layer from container states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartAllState {
    /// No container exit asked for a restart of all containers.
    NotRequested,
    /// A restart of all containers was requested and is still in progress.
    InProgress,
    /// The requested restart has been cleaned up.
    CleanedUp,
}

/// G5: `AllContainersRestarting` (v1.35+); carries no observedGeneration.
pub fn all_containers_restarting_condition(
    restart: RestartAllState,
    phase: &PodPhase,
) -> PodCondition {
    let mk = |status: &str, reason: Option<&str>, message: Option<&str>| PodCondition {
        type_: condition_type::ALL_CONTAINERS_RESTARTING.to_owned(),
        status: status.to_owned(),
        reason: reason.map(str::to_owned),
        message: message.map(str::to_owned),
        ..Default::default()
    };
    match (phase, restart) {
        (PodPhase::Succeeded, _) => mk(condition_status::FALSE, Some(POD_COMPLETED), None),
        (PodPhase::Failed, _) => mk(condition_status::FALSE, Some(POD_FAILED), None),
        (_, RestartAllState::NotRequested | RestartAllState::CleanedUp) => {
            mk(condition_status::FALSE, None, None)
        }
        (_, RestartAllState::InProgress) => mk(
            condition_status::TRUE,
            Some(RESTART_ALL_CONTAINERS_STARTED),
            Some("container exited with restart policy rule"),
        ),
    }
}

/// G7: upstream `NeedToReconcilePodReadiness`: a pod with readiness gates whose `Ready`
/// condition's status or message differs from the one generated from its own status.
///
/// Deviation (the spec allows it): the regeneration sees init statuses too, so a pod with
/// sidecars and readiness gates does not report "needs reconcile" on every check.
pub fn need_to_reconcile_pod_readiness(pod: &Pod, gates: &FeatureGates) -> bool {
    let has_gates = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.readiness_gates.as_ref().is_some_and(|g| !g.is_empty()));
    if !has_gates {
        return false;
    }
    let empty = PodStatus::default();
    let status = pod.status.as_ref().unwrap_or(&empty);
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let Some((_, current)) = condition_in(conditions, condition_type::READY) else {
        return false;
    };
    let all: Option<Vec<ContainerStatus>> =
        match (&status.init_container_statuses, &status.container_statuses) {
            (None, None) => None,
            (init, regular) => Some(init.iter().chain(regular).flatten().cloned().collect()),
        };
    let ctx = GenerateContext {
        pod,
        old_status: status,
        gates,
    };
    let generated = pod_ready_condition(&ctx, conditions, all.as_deref(), &PodPhase::of(status));
    current.status != generated.status
        || current.message.as_deref().unwrap_or("") != generated.message.as_deref().unwrap_or("")
}
