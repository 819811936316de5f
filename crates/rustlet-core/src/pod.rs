//! Small pod helpers: phases, condition lookup and ownership, static and mirror pods.
//!
//! Upstream: `pkg/api/v1/pod/util.go`, `pkg/kubelet/types/pod_status.go`,
//! `pkg/kubelet/types/pod_update.go` (`IsStaticPod`, `IsMirrorPod`).

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodCondition, PodStatus};

use crate::features::FeatureGates;

/// Annotation naming where a pod came from (`file`, `http`, `api`); upstream `ConfigSourceAnnotationKey`.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation present on mirror pods; upstream `ConfigMirrorAnnotationKey`.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// When the pod's source first saw it (since it last left that source); upstream
/// `ConfigFirstSeenAnnotationKey`. A pod whose UID is seen again with another value was
/// removed from its source and added back.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// The config source of pods that came from the API server; upstream `ApiserverSource`.
pub const API_SERVER_SOURCE: &str = "api";

/// Pod condition types the status rules name (upstream `v1.PodConditionType` constants).
pub mod condition_type {
    /// `PodScheduled`.
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// `Ready`.
    pub const READY: &str = "Ready";
    /// `Initialized`.
    pub const INITIALIZED: &str = "Initialized";
    /// `ContainersReady`.
    pub const CONTAINERS_READY: &str = "ContainersReady";
    /// `PodReadyToStartContainers` (formerly `PodHasNetwork`).
    pub const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
    /// `DisruptionTarget`, shared between the kubelet and other controllers.
    pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
    /// `PodResizePending`.
    pub const POD_RESIZE_PENDING: &str = "PodResizePending";
    /// `PodResizeInProgress`.
    pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
    /// `AllContainersRestarting` (v1.35+).
    pub const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";
}

/// Condition status strings.
pub mod condition_status {
    /// `True`.
    pub const TRUE: &str = "True";
    /// `False`.
    pub const FALSE: &str = "False";
    /// `Unknown`.
    pub const UNKNOWN: &str = "Unknown";
}

/// A pod phase. `Other` keeps a value the API should never hold (upstream tests use
/// `"SomeUnknownPhase"`); an absent phase is `Other("")`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Accepted, not all containers started.
    Pending,
    /// Bound and at least one container running or restarting.
    Running,
    /// All containers exited 0 and will not restart.
    Succeeded,
    /// All containers exited, at least one in failure.
    Failed,
    /// The phase could not be obtained.
    Unknown,
    /// Anything else, including no phase at all.
    Other(String),
}

impl PodPhase {
    /// Parses the `status.phase` string.
    pub fn parse(phase: Option<&str>) -> Self {
        match phase.unwrap_or("") {
            "Pending" => Self::Pending,
            "Running" => Self::Running,
            "Succeeded" => Self::Succeeded,
            "Failed" => Self::Failed,
            "Unknown" => Self::Unknown,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The phase of a status.
    pub fn of(status: &PodStatus) -> Self {
        Self::parse(status.phase.as_deref())
    }

    /// The API string.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
            Self::Other(s) => s,
        }
    }

    /// Succeeded or Failed (upstream `IsPodPhaseTerminal`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// True when `status.phase` is Succeeded or Failed.
pub fn is_phase_terminal(status: &PodStatus) -> bool {
    PodPhase::of(status).is_terminal()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A pod is static when its config source annotation is present and is not `api` (errata 7).
pub fn is_static_pod(pod: &Pod) -> bool {
    matches!(annotation(pod, CONFIG_SOURCE_ANNOTATION), Some(source) if source != API_SERVER_SOURCE)
}

/// A mirror pod carries the `kubernetes.io/config.mirror` annotation.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// Upstream `IsRestartableInitContainer`: an init container with `restartPolicy: Always` (a sidecar).
pub fn is_restartable_init_container(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// First status with this name (upstream `GetContainerStatus`).
pub fn container_status<'a>(
    statuses: &'a [ContainerStatus],
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// Index and value of the first condition of this type (upstream `GetPodConditionFromList`).
pub fn condition_in<'a>(
    conditions: &'a [PodCondition],
    type_: &str,
) -> Option<(usize, &'a PodCondition)> {
    conditions
        .iter()
        .enumerate()
        .find(|(_, c)| c.type_ == type_)
}

/// The first condition of this type in a status (upstream `GetPodCondition`).
pub fn condition<'a>(status: &'a PodStatus, type_: &str) -> Option<&'a PodCondition> {
    condition_in(status.conditions.as_deref().unwrap_or_default(), type_).map(|(_, c)| c)
}

/// True when the status has a condition of this type whose status is `True`.
pub fn is_condition_true(status: &PodStatus, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c.status == condition_status::TRUE)
}

/// Condition types owned by the kubelet (upstream `PodConditionByKubelet`, section 1.5).
pub fn pod_condition_by_kubelet(type_: &str, gates: &FeatureGates) -> bool {
    use condition_type::*;
    match type_ {
        POD_SCHEDULED
        | READY
        | INITIALIZED
        | CONTAINERS_READY
        | POD_RESIZE_IN_PROGRESS
        | POD_RESIZE_PENDING => true,
        POD_READY_TO_START_CONTAINERS => gates.pod_ready_to_start_containers_condition,
        _ => false,
    }
}

/// Condition types shared between the kubelet and other writers (upstream
/// `PodConditionSharedByKubelet`): only `DisruptionTarget`.
pub fn pod_condition_shared_by_kubelet(type_: &str) -> bool {
    type_ == condition_type::DISRUPTION_TARGET
}

/// Either owned or shared: the conditions that count for the kubelet's equality (R11).
pub fn pod_condition_counts_for_kubelet(type_: &str, gates: &FeatureGates) -> bool {
    pod_condition_by_kubelet(type_, gates) || pod_condition_shared_by_kubelet(type_)
}

/// Upstream `CalculatePodConditionObservedGeneration`: the pod's generation when tracking is on
/// or when the old status already carries a non-zero generation on that condition; else none.
pub fn condition_observed_generation(
    old: &PodStatus,
    generation: Option<i64>,
    type_: &str,
    gates: &FeatureGates,
) -> Option<i64> {
    let generation = generation.filter(|g| *g != 0)?;
    if gates.pod_observed_generation_tracking {
        return Some(generation);
    }
    let old_has = condition(old, type_).is_some_and(|c| c.observed_generation.unwrap_or(0) != 0);
    old_has.then_some(generation)
}

/// Upstream `CalculatePodStatusObservedGeneration` (R2).
pub fn status_observed_generation(pod: &Pod, gates: &FeatureGates) -> Option<i64> {
    let generation = pod.metadata.generation.filter(|g| *g != 0)?;
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    (gates.pod_observed_generation_tracking || current != 0).then_some(generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod_with_annotations(pairs: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                annotations: Some(
                    pairs
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn test_pod_condition_by_kubelet() {
        let gates = FeatureGates::default();
        for owned in [
            "PodScheduled",
            "Ready",
            "Initialized",
            "ContainersReady",
            "PodReadyToStartContainers",
        ] {
            assert!(pod_condition_by_kubelet(owned, &gates), "{owned}");
        }
        for foreign in ["abcd", "Unschedulable"] {
            assert!(!pod_condition_by_kubelet(foreign, &gates), "{foreign}");
        }
        let off = FeatureGates {
            pod_ready_to_start_containers_condition: false,
            ..gates
        };
        assert!(!pod_condition_by_kubelet("PodReadyToStartContainers", &off));
    }

    #[test]
    fn test_pod_condition_shared_by_kubelet() {
        assert!(pod_condition_shared_by_kubelet("DisruptionTarget"));
        assert!(!pod_condition_shared_by_kubelet("abcd"));
        assert!(!pod_condition_shared_by_kubelet("Unschedulable"));
    }

    #[test]
    fn errata7_static_only_with_a_non_api_source_annotation() {
        assert!(!is_static_pod(&Pod::default()));
        assert!(!is_static_pod(&pod_with_annotations(&[(
            CONFIG_SOURCE_ANNOTATION,
            "api"
        )])));
        assert!(is_static_pod(&pod_with_annotations(&[(
            CONFIG_SOURCE_ANNOTATION,
            "file"
        )])));
        assert!(is_mirror_pod(&pod_with_annotations(&[(
            CONFIG_MIRROR_ANNOTATION,
            "x"
        )])));
        assert!(!is_mirror_pod(&Pod::default()));
    }

    #[test]
    fn phases_parse_and_classify() {
        assert!(PodPhase::parse(Some("Failed")).is_terminal());
        assert!(PodPhase::parse(Some("Succeeded")).is_terminal());
        assert!(!PodPhase::parse(Some("Running")).is_terminal());
        assert_eq!(PodPhase::parse(None), PodPhase::Other(String::new()));
        assert_eq!(
            PodPhase::parse(Some("SomeUnknownPhase")).as_str(),
            "SomeUnknownPhase"
        );
    }

    #[test]
    fn r2_status_observed_generation() {
        let mut pod = Pod::default();
        pod.metadata.generation = Some(4);
        let on = FeatureGates::default();
        let off = FeatureGates {
            pod_observed_generation_tracking: false,
            ..on.clone()
        };
        assert_eq!(status_observed_generation(&pod, &on), Some(4));
        assert_eq!(status_observed_generation(&pod, &off), None);
        pod.status = Some(PodStatus {
            observed_generation: Some(2),
            ..Default::default()
        });
        assert_eq!(
            status_observed_generation(&pod, &off),
            Some(4),
            "no clear/restore fight"
        );
    }
}
