//! What the API server does to a pod's status: the QoS class it gives a pod it creates
//! (upstream `ComputePodQOS`), and to a write of the status subresource before it stores it
//! (upstream `podStatusStrategy.PrepareForUpdate`, `SetDefaults_PodStatus` and
//! `ValidatePodStatusUpdate`, v1.37 with its default feature gates): the pod IP fields kept in
//! step, a blank QoS class backfilled, and the update refused (422) when a terminated container
//! of a pod that would not restart it comes back, an IP is not one or two of a family, the host
//! IP is not the first host IP, the QoS class changes, a condition type is not a qualified name
//! or an observed generation is negative. The real API server refused each of these where the
//! test API server had taken it (issue 25, the real-cluster test
//! `item_7_the_test_server_refuses_the_pod_status_writes_the_real_api_server_refuses`).
//!
//! Left out, as no node agent writes them: nominated node names, resource claim statuses,
//! volume health, container users and allocated-resources statuses.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ContainerStatus, PodIP, PodSpec, PodStatus};
use rustlet_core::restart::container_should_restart;

use super::validation::{FieldErrors, qualified_name_problems};

/// The condition types validation leaves alone (upstream's `systemConditions`).
const SYSTEM_CONDITIONS: [&str; 3] = ["PodScheduled", "Ready", "Initialized"];

pub use rustlet_core::qos::{compute_pod_qos, qos_class};

/// Upstream `SetDefaults_PodStatus` (the singular pod IP and the list in step; on a mismatch
/// the singular one wins) and `PrepareForUpdate`'s QoS backfill (a blank class keeps the
/// stored one).
pub fn default_pod_status(status: &mut PodStatus, old: &PodStatus) {
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty());
    let first = status
        .pod_ips
        .as_ref()
        .and_then(|ips| ips.first())
        .map(|p| p.ip.clone());
    match (ip, first) {
        (Some(ip), None) => status.pod_ips = Some(vec![PodIP { ip }]),
        (None, Some(first)) => status.pod_ip = Some(first),
        (Some(ip), Some(first)) if ip != first => status.pod_ips = Some(vec![PodIP { ip }]),
        _ => {}
    }
    if status.qos_class.as_deref().unwrap_or_default().is_empty() {
        status.qos_class = old.qos_class.clone();
    }
}

/// Upstream `ValidatePodStatusUpdate` for the fields a node agent writes; `spec` gives the
/// stored pod's (a status write cannot change it), decoded only when a terminated container
/// comes back.
pub fn validate_pod_status_update(
    new: &PodStatus,
    old: &PodStatus,
    spec: &dyn Fn() -> PodSpec,
    errors: &mut FieldErrors,
) {
    for (i, condition) in new.conditions.iter().flatten().enumerate() {
        let field = format!("status.conditions[{i}]");
        if let Some(generation) = condition.observed_generation.filter(|g| *g < 0) {
            errors.invalid(
                &format!("{field}.observedGeneration"),
                &generation.to_string(),
                "must be a non-negative integer",
            );
        }
        if SYSTEM_CONDITIONS.contains(&condition.type_.as_str()) {
            continue;
        }
        for problem in qualified_name_problems(&condition.type_) {
            errors.invalid(
                &format!("{field}.Type"),
                &format!("{:?}", condition.type_),
                &problem,
            );
        }
    }
    if let Some(generation) = new.observed_generation.filter(|g| *g < 0) {
        errors.invalid(
            "status.observedGeneration",
            &generation.to_string(),
            "must be a non-negative integer",
        );
    }
    let (new_qos, old_qos) = (
        new.qos_class.as_deref().unwrap_or_default(),
        old.qos_class.as_deref().unwrap_or_default(),
    );
    if new_qos != old_qos {
        errors.invalid(
            "status.qosClass",
            &format!("{new_qos:?}"),
            "field is immutable",
        );
    }
    validate_state_transitions(new, old, spec, errors);
    validate_ips(
        "status.podIPs",
        new.pod_ips.iter().flatten().map(|p| p.ip.as_str()),
        old.pod_ips.iter().flatten().map(|p| p.ip.as_str()),
        errors,
    );
    // `podIP` and `podIPs[0]` cannot disagree here: the defaults put them in step first.
    if let Some(first) = new.host_ips.as_ref().and_then(|ips| ips.first()) {
        if new.host_ip.as_deref().unwrap_or_default() != first.ip {
            errors.invalid(
                "status.hostIPs[0].ip",
                &format!("{:?}", first.ip),
                "must be equal to `hostIP`",
            );
        }
        validate_ips(
            "status.hostIPs",
            new.host_ips.iter().flatten().map(|h| h.ip.as_str()),
            old.host_ips.iter().flatten().map(|h| h.ip.as_str()),
            errors,
        );
    }
}

/// Upstream `ValidateContainerStateTransition`, `ValidateInitContainerStateTransition` (with
/// `ContainerRestartRules`, on by default since v1.35: `ContainerShouldRestart` decides) and
/// `ValidateEphemeralContainerStateTransition`: a terminated container that may not restart
/// may not be reported as anything else. The field index is the old status's.
fn validate_state_transitions(
    new: &PodStatus,
    old: &PodStatus,
    spec: &dyn Fn() -> PodSpec,
    errors: &mut FieldErrors,
) {
    /// Which list of the spec a status list is of.
    #[derive(Clone, Copy)]
    enum List {
        Regular,
        Init,
    }
    let lists = [
        (
            List::Regular,
            "status.containerStatuses",
            &new.container_statuses,
            &old.container_statuses,
        ),
        (
            List::Init,
            "status.initContainerStatuses",
            &new.init_container_statuses,
            &old.init_container_statuses,
        ),
    ];
    // The terminated containers that came back: (list, field index, name, exit code).
    let mut back = Vec::new();
    for (list, field, new_list, old_list) in lists {
        for (i, old_status) in old_list.iter().flatten().enumerate() {
            if let Some(exit_code) = terminated_exit_code(old_status)
                && came_back(old_status, new_list.as_deref().unwrap_or_default())
            {
                back.push((list, field, i, &old_status.name, exit_code));
            }
        }
    }
    if !back.is_empty() {
        let spec = spec();
        // upstream: `AllContainersCouldRestart` (the RestartAllContainers action, on by
        // default since v1.36): any container may come back.
        let all_could_restart = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .flat_map(|c| c.restart_policy_rules.iter().flatten())
            .any(|rule| rule.action == "RestartAllContainers");
        for (list, field, i, name, exit_code) in back {
            let containers = match list {
                List::Regular => spec.containers.as_slice(),
                List::Init => spec.init_containers.as_deref().unwrap_or_default(),
            };
            let may_restart = all_could_restart
                || containers
                    .iter()
                    .find(|c| &c.name == name)
                    .is_some_and(|c| container_should_restart(c, &spec, exit_code));
            if !may_restart {
                errors.forbidden(
                    &format!("{field}[{i}].state"),
                    "may not be transitioned to non-terminated state",
                );
            }
        }
    }
    let new_ephemeral = new
        .ephemeral_container_statuses
        .as_deref()
        .unwrap_or_default();
    for (i, old_status) in old
        .ephemeral_container_statuses
        .iter()
        .flatten()
        .enumerate()
    {
        if terminated_exit_code(old_status).is_some() && came_back(old_status, new_ephemeral) {
            errors.forbidden(
                &format!("status.ephemeralContainerStatuses[{i}].state"),
                "may not be transitioned to non-terminated state",
            );
        }
    }
}

fn terminated_exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// A status of the same name in `new` is not terminated.
fn came_back(old: &ContainerStatus, new: &[ContainerStatus]) -> bool {
    new.iter()
        .any(|n| n.name == old.name && n.state.as_ref().is_none_or(|s| s.terminated.is_none()))
}

/// Upstream `IsValidIPForLegacyField` under `StrictIPCIDRValidation` (on by default since
/// v1.36) for each new address (an address the old list had is kept as it is), then at most
/// one address of each family.
fn validate_ips<'a>(
    field: &str,
    new: impl Iterator<Item = &'a str> + Clone,
    old: impl Iterator<Item = &'a str> + Clone,
    errors: &mut FieldErrors,
) {
    let mut families = Vec::new();
    for (i, ip) in new.clone().enumerate() {
        let parsed = ip.parse::<IpAddr>().ok();
        families.push(parsed.map(|a| a.is_ipv4()));
        if old.clone().any(|o| o == ip) {
            continue;
        }
        let value = format!("{ip:?}");
        let item = format!("{field}[{i}]");
        match parsed {
            Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => {
                errors.invalid(&item, &value, "must not be an IPv4-mapped IPv6 address")
            }
            Some(_) => {}
            None if is_ipv4_with_leading_zeros(ip) => {
                errors.invalid(&item, &value, "must not have leading 0s");
            }
            None => errors.invalid(
                &item,
                &value,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ),
        }
    }
    if families.len() > 1 {
        // upstream: `IsDualStackIPStrings` (an address that does not parse makes it false).
        let dual_stack = families.iter().all(Option::is_some)
            && families.contains(&Some(true))
            && families.contains(&Some(false));
        if !dual_stack || families.len() > 2 {
            let list: Vec<String> = new.map(|ip| format!("{{\"IP\":{ip:?}}}")).collect();
            errors.invalid(
                field,
                &format!("[{}]", list.join(",")),
                "may specify no more than one IP for each IP family",
            );
        }
    }
}

/// An IPv4 address Go's sloppy parser takes and the strict one refuses: four decimal parts of
/// at most 255, one with a leading zero.
fn is_ipv4_with_leading_zeros(ip: &str) -> bool {
    let parts: Vec<&str> = ip.split('.').collect();
    parts.len() == 4
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().is_ok_and(|n| n <= 255)
        })
        && parts.iter().any(|p| p.len() > 1 && p.starts_with('0'))
}

#[cfg(test)]
mod tests;
