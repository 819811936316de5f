//! Pod admission (upstream `HandlePodAdditions` → `canAdmitPod` → `rejectPod`): a pod the
//! node cannot run is rejected when it is first seen: a Warning event with the reason and
//! message, the status Failed with them, and nothing started. Pure: no clock, no I/O (the
//! host's state, [`AdmitHandlers`], is read once at start by the binary).
//!
//! The admit handlers run in upstream's order (`NewMainKubelet`), the first rejection wins:
//! the sysctls ([`crate::sysctl`]), the predicate's OS checks (`lifecycle/predicate.go`), and on
//! Linux AppArmor ([`crate::apparmor`]).
//!
//! Then, when the binary set one, the resource allocation handler ([`ResourceAllocator`],
//! upstream's container manager's `GetAllocateResourcesPodAdmitHandler`: the device plugins'
//! devices for each container); its failure rejects the pod `UnexpectedAdmissionError`. It is
//! asynchronous (a plugin's `Allocate`), so it is not in [`AdmitHandlers`]; it runs last, so a
//! pod the other handlers reject never holds devices.
//!
//! Deviation: upstream's other handlers are not here (eviction, the predicate's resource fit,
//! pod features, node shutdown). The node's OS is the agent's
//! (`std::env::consts::OS`, upstream `runtime.GOOS`), which is also its `kubernetes.io/os`
//! label.

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::apparmor::{self, AppArmorHost};
use crate::sysctl::Allowlist;

/// The node label naming the node's OS (upstream `v1.LabelOSStable`).
pub const LABEL_OS: &str = "kubernetes.io/os";

/// Why a pod is not admitted (upstream `PodAdmitResult` with `Admit: false`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The event's and the status's reason.
    pub reason: &'static str,
    /// The event's message (the status's after "Pod was rejected: ").
    pub message: String,
}

/// The reason of a pod whose `kubernetes.io/os` label is not the node's OS (upstream
/// `rejectPodAdmissionBasedOnOSSelector`).
pub const OS_SELECTOR_MISMATCH: &str = "PodOSSelectorNodeLabelDoesNotMatch";
const OS_SELECTOR_MISMATCH_MESSAGE: &str =
    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label";

/// The reason of a pod whose `spec.os.name` is not the node's OS (upstream
/// `rejectPodAdmissionBasedOnOSField`).
pub const OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
const OS_NOT_SUPPORTED_MESSAGE: &str = "Failed to admit pod as the OS field doesn't match node OS";

/// The reason of a pod whose resources could not be allocated (upstream
/// `lifecycle.UnexpectedAdmissionError`).
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// upstream's resource allocation admit handler: gives a pod's containers, init containers
/// first, the devices their limits name (the device manager's `Allocate`). The binary fills
/// it from `rustlet-cri`'s device manager.
#[async_trait::async_trait]
pub trait ResourceAllocator: Send + Sync {
    /// Allocates `pod`'s resources; the error says why it cannot have them.
    async fn allocate(&self, pod: &Pod) -> Result<(), String>;
}

/// The rejection of a pod whose allocation failed with `error` (upstream
/// `admission.GetPodAdmitResult` of an unexpected error).
pub fn allocation_rejection(error: &str) -> Rejection {
    Rejection {
        reason: UNEXPECTED_ADMISSION_ERROR,
        message: format!("Allocate failed due to {error}, which is unexpected"),
    }
}

/// What the admit handlers know of the node (upstream's `PodAdmitHandlers`, as
/// `NewMainKubelet` registers them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmitHandlers {
    /// The node's OS (`linux`).
    pub node_os: String,
    /// The sysctls pods may set: the safe ones of the running kernel and the config's
    /// `allowedUnsafeSysctls`.
    pub sysctls: Allowlist,
    /// Whether the host enforces AppArmor.
    pub apparmor: AppArmorHost,
}

impl Default for AdmitHandlers {
    /// The agent's OS, the safe sysctls of a kernel of unknown version, and no AppArmor.
    fn default() -> Self {
        Self {
            node_os: std::env::consts::OS.to_owned(),
            sysctls: Allowlist::new(crate::sysctl::safe_sysctl_allowlist(None))
                .expect("the safe sysctls are valid and namespaced"),
            apparmor: AppArmorHost::Disabled(apparmor::NOT_ENABLED),
        }
    }
}

impl AdmitHandlers {
    /// Upstream `canAdmitPod`: `None` admits the pod.
    pub fn admit(&self, pod: &Pod) -> Option<Rejection> {
        if let Some(rejection) = self.sysctls.admit(pod) {
            return Some(rejection);
        }
        if let Some(rejection) = os_rejection(pod, &self.node_os) {
            return Some(rejection);
        }
        // AppArmor is a Linux security module: upstream registers its handler on Linux only.
        if self.node_os == "linux" {
            return apparmor::admit(pod, self.apparmor);
        }
        None
    }
}

/// The predicate admit handler's OS checks on a node running `node_os`, in upstream's order.
fn os_rejection(pod: &Pod, node_os: &str) -> Option<Rejection> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_OS));
    if label.is_some_and(|os| os != node_os) {
        return Some(Rejection {
            reason: OS_SELECTOR_MISMATCH,
            message: OS_SELECTOR_MISMATCH_MESSAGE.to_owned(),
        });
    }
    let os = pod.spec.as_ref().and_then(|s| s.os.as_ref());
    if os.is_some_and(|os| os.name != node_os) {
        return Some(Rejection {
            reason: OS_NOT_SUPPORTED,
            message: OS_NOT_SUPPORTED_MESSAGE.to_owned(),
        });
    }
    None
}

/// Upstream `rejectPod`'s status: Failed, the reason, the message after "Pod was rejected: ",
/// the QoS class kept.
pub fn rejected_status(pod: &Pod, rejection: &Rejection) -> PodStatus {
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

    fn os_rejection_of(reason: &'static str) -> Option<Rejection> {
        let message = match reason {
            OS_NOT_SUPPORTED => OS_NOT_SUPPORTED_MESSAGE,
            _ => OS_SELECTOR_MISMATCH_MESSAGE,
        };
        Some(Rejection {
            reason,
            message: message.to_owned(),
        })
    }

    /// Upstream e2e "PodOSRejection Kubelet [LinuxOnly] should reject pod when the node OS
    /// doesn't match pod's OS" and the predicate's OS checks: a `windows` pod on a `linux`
    /// node is rejected `PodOSNotSupported`; a wrong `kubernetes.io/os` label first.
    #[test]
    fn should_reject_pod_when_the_node_os_doesnt_match_pods_os() {
        let linux = AdmitHandlers {
            node_os: "linux".into(),
            ..AdmitHandlers::default()
        };
        assert_eq!(linux.admit(&pod(None, None)), None);
        assert_eq!(linux.admit(&pod(Some("linux"), Some("linux"))), None);
        assert_eq!(
            linux.admit(&pod(None, Some("windows"))),
            os_rejection_of(OS_NOT_SUPPORTED)
        );
        assert_eq!(
            linux.admit(&pod(Some("windows"), Some("windows"))),
            os_rejection_of(OS_SELECTOR_MISMATCH)
        );
        let rejection = linux.admit(&pod(None, Some("windows"))).unwrap();
        let status = rejected_status(&pod(None, Some("windows")), &rejection);
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("PodOSNotSupported"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: Failed to admit pod as the OS field doesn't match node OS")
        );
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    }

    /// Upstream's order of the admit handlers (`NewMainKubelet`): the sysctls before the OS
    /// checks, AppArmor after them and only on Linux.
    #[test]
    fn the_admit_handlers_run_in_upstreams_order() {
        let mut p = pod(Some("windows"), None);
        let spec = p.spec.as_mut().unwrap();
        spec.security_context = Some(
            serde_json::from_value(
                serde_json::json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                               "appArmorProfile": {"type": "RuntimeDefault"}}),
            )
            .unwrap(),
        );
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        let linux = AdmitHandlers {
            node_os: "linux".into(),
            ..AdmitHandlers::default()
        };
        assert_eq!(linux.admit(&p).unwrap().reason, "SysctlForbidden");
        let spec = p.spec.as_mut().unwrap();
        spec.security_context.as_mut().unwrap().sysctls = None;
        assert_eq!(linux.admit(&p).unwrap().reason, OS_SELECTOR_MISMATCH);
        p.metadata.labels = None;
        assert_eq!(linux.admit(&p).unwrap().reason, "AppArmor");
        let other = AdmitHandlers {
            node_os: "windows".into(),
            ..AdmitHandlers::default()
        };
        assert_eq!(other.admit(&p), None);
    }
}
