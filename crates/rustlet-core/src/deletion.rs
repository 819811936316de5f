//! When a pod may be deleted from the API (R40) and the deletion-safety seam.
//!
//! Upstream: `canBeDeleted`, `PodDeletionSafetyProvider`, `status/testing/fake_pod_deletion_safety.go`.

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{PodPhase, is_mirror_pod};

/// Tells whether a pod's containers could still be running (upstream
/// `PodDeletionSafetyProvider`); the agent's pod workers implement it.
#[cfg_attr(any(test, feature = "test-util"), mockall::automock)]
pub trait PodDeletionSafety: Send + Sync {
    /// True while the pod worker says containers may run, or resources may still need releasing.
    fn pod_could_have_running_containers(&self, pod: &Pod) -> bool;
}

/// A fixed answer, like upstream's `FakePodDeletionSafetyProvider`.
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedDeletionSafety {
    /// What `pod_could_have_running_containers` answers for every pod.
    pub has_running_containers: bool,
}

impl PodDeletionSafety for FixedDeletionSafety {
    fn pod_could_have_running_containers(&self, _pod: &Pod) -> bool {
        self.has_running_containers
    }
}

/// Whether a pod's final DELETE may be sent, and if not, why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletionDecision {
    /// Send `DELETE` with `gracePeriodSeconds: 0` and the pod's UID as precondition.
    Delete,
    /// Nobody asked: the pod has no deletion timestamp.
    NotRequested,
    /// Mirror pods are never deleted by the status manager.
    MirrorPod,
    /// The API (or pod manager) copy's phase is not yet Succeeded or Failed.
    PhaseNotTerminal,
    /// `TerminatePod` has not run yet: the pod's resources are not reclaimed.
    NotFinished,
}

/// R40, decided on the API or pod-manager copy of the pod (not the local status) and the
/// cached `pod_is_finished`.
///
/// ```
/// use k8s_openapi::api::core::v1::{Pod, PodStatus};
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
/// use rustlet_core::{DeletionDecision, Timestamp, deletion_decision};
///
/// let mut pod = Pod::default();
/// assert_eq!(deletion_decision(&pod, true), DeletionDecision::NotRequested);
/// pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
/// pod.status = Some(PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() });
/// assert_eq!(deletion_decision(&pod, false), DeletionDecision::NotFinished);
/// assert_eq!(deletion_decision(&pod, true), DeletionDecision::Delete);
/// ```
pub fn deletion_decision(pod: &Pod, pod_is_finished: bool) -> DeletionDecision {
    if pod.metadata.deletion_timestamp.is_none() {
        DeletionDecision::NotRequested
    } else if is_mirror_pod(pod) {
        DeletionDecision::MirrorPod
    } else if !PodPhase::parse(pod.status.as_ref().and_then(|s| s.phase.as_deref())).is_terminal() {
        DeletionDecision::PhaseNotTerminal
    } else if !pod_is_finished {
        DeletionDecision::NotFinished
    } else {
        DeletionDecision::Delete
    }
}

/// R40 as a yes or no (upstream `canBeDeleted`).
pub fn can_be_deleted(pod: &Pod, pod_is_finished: bool) -> bool {
    deletion_decision(pod, pod_is_finished) == DeletionDecision::Delete
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::CONFIG_MIRROR_ANNOTATION;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn deleted_pod(phase: &str) -> Pod {
        let mut pod = test_pod();
        pod.metadata.deletion_timestamp = Some(Time(ts("2026-01-01T00:00:00Z")));
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn r40_deletion_needs_timestamp_terminal_api_phase_and_finished() {
        assert_eq!(
            deletion_decision(&test_pod(), true),
            DeletionDecision::NotRequested
        );
        assert_eq!(
            deletion_decision(&deleted_pod("Running"), true),
            DeletionDecision::PhaseNotTerminal
        );
        assert_eq!(
            deletion_decision(&deleted_pod("Failed"), false),
            DeletionDecision::NotFinished
        );
        assert_eq!(
            deletion_decision(&deleted_pod("Failed"), true),
            DeletionDecision::Delete
        );
        assert!(can_be_deleted(&deleted_pod("Succeeded"), true));
    }

    #[test]
    fn r66_mirror_pods_are_never_deleted() {
        let mut mirror = deleted_pod("Failed");
        mirror.metadata.annotations =
            Some([(CONFIG_MIRROR_ANNOTATION.to_owned(), "x".to_owned())].into());
        assert_eq!(
            deletion_decision(&mirror, true),
            DeletionDecision::MirrorPod
        );
    }

    #[test]
    fn deletion_safety_seam_is_mockable_and_has_a_fixed_fake() {
        let mut mock = MockPodDeletionSafety::new();
        mock.expect_pod_could_have_running_containers()
            .times(1)
            .return_const(true);
        assert!(mock.pod_could_have_running_containers(&test_pod()));
        assert!(!FixedDeletionSafety::default().pod_could_have_running_containers(&test_pod()));
    }
}
