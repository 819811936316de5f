//! Pod admission (upstream `HandlePodAdditions` → `canAdmitPod` → `rejectPod`; the
//! predicate admit handler's OS checks in `lifecycle/predicate.go`): a pod the node cannot
//! run is rejected when it is first seen: a Warning event with the reason and message, the
//! status Failed with them, and nothing started. Pure: no clock, no I/O.
//!
//! Deviation: of upstream's admit handlers only the OS checks are here (no resource fit,
//! eviction, sysctl or AppArmor admission). The node's OS is the agent's
//! (`std::env::consts::OS`, upstream `runtime.GOOS`), which is also its `kubernetes.io/os`
//! label.

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// The node label naming the node's OS (upstream `v1.LabelOSStable`).
pub const LABEL_OS: &str = "kubernetes.io/os";

/// Why a pod is not admitted (upstream `PodAdmitResult` with `Admit: false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The event's and the status's reason.
    pub reason: &'static str,
    /// The event's message (the status's after "Pod was rejected: ").
    pub message: &'static str,
}

/// A pod whose `kubernetes.io/os` label is not the node's OS (upstream
/// `rejectPodAdmissionBasedOnOSSelector`).
pub const OS_SELECTOR_MISMATCH: Rejection = Rejection {
    reason: "PodOSSelectorNodeLabelDoesNotMatch",
    message: "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
};

/// A pod whose `spec.os.name` is not the node's OS (upstream
/// `rejectPodAdmissionBasedOnOSField`).
pub const OS_NOT_SUPPORTED: Rejection = Rejection {
    reason: "PodOSNotSupported",
    message: "Failed to admit pod as the OS field doesn't match node OS",
};

/// Upstream `canAdmitPod` (its OS checks, in upstream's order) on a node running `node_os`:
/// `None` admits the pod.
pub fn admission_rejection(pod: &Pod, node_os: &str) -> Option<Rejection> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_OS));
    if label.is_some_and(|os| os != node_os) {
        return Some(OS_SELECTOR_MISMATCH);
    }
    let os = pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os.is_some_and(|os| os.name != node_os) {
        return Some(OS_NOT_SUPPORTED);
    }
    None
}

/// Upstream `rejectPod`'s status: Failed, the reason, the message after "Pod was rejected: ",
/// the QoS class kept.
pub fn rejected_status(pod: &Pod, rejection: Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".to_owned()),
        reason: Some(rejection.reason.to_owned()),
        message: Some(format!("Pod was rejected: {}", rejection.message)),
        qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(label: Option<&str>, os: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "wrong-pod-os", "namespace": "ns", "uid": "u",
                         "labels": label.map(|l| serde_json::json!({"kubernetes.io/os": l}))},
            "spec": {"os": os.map(|name| serde_json::json!({"name": name})),
                     "containers": [{"name": "c", "image": "pause"}]},
            "status": {"qosClass": "BestEffort"}
        }))
        .unwrap()
    }

    /// Upstream e2e "PodOSRejection Kubelet [LinuxOnly] should reject pod when the node OS
    /// doesn't match pod's OS" and the predicate's OS checks: a `windows` pod on a `linux`
    /// node is rejected `PodOSNotSupported`; a wrong `kubernetes.io/os` label first.
    #[test]
    fn should_reject_pod_when_the_node_os_doesnt_match_pods_os() {
        assert_eq!(admission_rejection(&pod(None, None), "linux"), None);
        assert_eq!(
            admission_rejection(&pod(Some("linux"), Some("linux")), "linux"),
            None
        );
        assert_eq!(
            admission_rejection(&pod(None, Some("windows")), "linux"),
            Some(OS_NOT_SUPPORTED)
        );
        assert_eq!(
            admission_rejection(&pod(Some("windows"), Some("windows")), "linux"),
            Some(OS_SELECTOR_MISMATCH)
        );
        let status = rejected_status(&pod(None, Some("windows")), OS_NOT_SUPPORTED);
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("PodOSNotSupported"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: Failed to admit pod as the OS field doesn't match node OS")
        );
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    }
}
