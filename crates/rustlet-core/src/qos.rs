//! A pod's QoS class (upstream `pkg/apis/core/v1/helper/qos`): what the API server gives a
//! pod it creates ([`compute_pod_qos`]) and what the kubelet reads back ([`pod_qos`], upstream
//! `GetPodQOS`: the status's class when the API server set one).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::quantity_cmp;

/// The QoS classes (upstream `PodQOSClass`).
pub mod qos_class {
    /// Every resource's request equals its limit.
    pub const GUARANTEED: &str = "Guaranteed";
    /// Some request or limit, not guaranteed.
    pub const BURSTABLE: &str = "Burstable";
    /// No request or limit.
    pub const BEST_EFFORT: &str = "BestEffort";
}

/// Upstream `ComputePodQOS` (v1.37, `PodLevelResources` and `PodLevelResourcesFixKubeletQOSClass`
/// on by default), on a defaulted spec (requests defaulted to limits): the pod-level resources
/// when they name CPU, memory or huge pages, else every container's, init containers
/// included. Deviation: pod-level requests are not defaulted first (upstream
/// `DefaultPodLevelResources`).
pub fn compute_pod_qos(spec: &PodSpec) -> &'static str {
    if let Some(resources) = spec
        .resources
        .as_ref()
        .filter(|r| pod_level_resources_set(r))
    {
        return requirements_qos(resources);
    }
    let mut pod_qos = None;
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for container in containers {
        let qos = container
            .resources
            .as_ref()
            .map_or(qos_class::BEST_EFFORT, requirements_qos);
        match pod_qos {
            _ if qos == qos_class::BURSTABLE => return qos,
            None => pod_qos = Some(qos),
            Some(other) if other != qos => return qos_class::BURSTABLE,
            Some(_) => {}
        }
    }
    pod_qos.unwrap_or(qos_class::BEST_EFFORT)
}

/// Upstream `IsPodLevelResourcesSet`.
fn pod_level_resources_set(resources: &ResourceRequirements) -> bool {
    let supported =
        |name: &String| name == "cpu" || name == "memory" || name.starts_with("hugepages-");
    resources
        .requests
        .iter()
        .flatten()
        .any(|(n, _)| supported(n))
        || resources.limits.iter().flatten().any(|(n, _)| supported(n))
}

/// Upstream `requirementsQOS`.
fn requirements_qos(resources: &ResourceRequirements) -> &'static str {
    let none = |m: &Option<BTreeMap<String, Quantity>>| m.as_ref().is_none_or(|m| m.is_empty());
    if none(&resources.requests) && none(&resources.limits) {
        return qos_class::BEST_EFFORT;
    }
    let cpu = resource_qos(resources, "cpu");
    let memory = resource_qos(resources, "memory");
    if cpu == memory {
        cpu
    } else {
        qos_class::BURSTABLE
    }
}

/// Upstream `resourceQOS`: an absent request or limit is zero.
fn resource_qos(resources: &ResourceRequirements, name: &str) -> &'static str {
    fn quantity<'a>(m: &'a Option<BTreeMap<String, Quantity>>, name: &str) -> &'a str {
        m.as_ref()
            .and_then(|m| m.get(name))
            .map_or("0", |q| q.0.as_str())
    }
    let (request, limit) = (
        quantity(&resources.requests, name),
        quantity(&resources.limits, name),
    );
    if quantity_cmp(request, limit) != Some(Ordering::Equal) {
        qos_class::BURSTABLE
    } else if quantity_cmp(request, "0") == Some(Ordering::Equal) {
        qos_class::BEST_EFFORT
    } else {
        qos_class::GUARANTEED
    }
}

/// Upstream `GetPodQOS`: the class in the pod's status when it is one of the three (the API
/// server sets it on create and never changes it), else [`compute_pod_qos`] of its spec.
pub fn pod_qos(pod: &Pod) -> &'static str {
    let stored = pod.status.as_ref().and_then(|s| s.qos_class.as_deref());
    match stored {
        Some(qos_class::GUARANTEED) => qos_class::GUARANTEED,
        Some(qos_class::BURSTABLE) => qos_class::BURSTABLE,
        Some(qos_class::BEST_EFFORT) => qos_class::BEST_EFFORT,
        _ => pod
            .spec
            .as_ref()
            .map_or(qos_class::BEST_EFFORT, compute_pod_qos),
    }
}
