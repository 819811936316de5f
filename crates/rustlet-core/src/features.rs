//! Feature gates that change status rules, as a plain config struct.
//!
//! Upstream reads a process-wide gate registry; here the gates travel with the call, so tests
//! can flip one without global state. Defaults follow upstream v1.35.

/// The upstream feature gates that the status rules consult.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// `PodObservedGenerationTracking` (beta, on in v1.34+): write `observedGeneration` into
    /// the pod status and into kubelet-generated conditions (R2, section 3.3).
    pub pod_observed_generation_tracking: bool,
    /// `PodReadyToStartContainersCondition` (beta, on since v1.29): the
    /// `PodReadyToStartContainers` condition is kubelet-owned (section 1.5).
    pub pod_ready_to_start_containers_condition: bool,
    /// `ContainerRestartRules` (v1.34+, on since v1.35): container-level restart policy and
    /// rules take part in the terminated-to-running transition check (R6 step 3, errata 1).
    /// The pod workers' restart decision and phase take it as on
    /// ([`crate::restart::container_should_restart`]).
    pub container_restart_rules: bool,
    /// `RestartAllContainersOnContainerExits` (alpha in v1.35, off): an initialized pod stays
    /// initialized while its containers restart in place (G3 step 5).
    pub restart_all_containers_on_container_exits: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            pod_observed_generation_tracking: true,
            pod_ready_to_start_containers_condition: true,
            container_restart_rules: true,
            restart_all_containers_on_container_exits: false,
        }
    }
}
