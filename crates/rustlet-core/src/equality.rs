//! Status equality for de-duplication (R11, upstream `isPodStatusByKubeletEqual`).
//!
//! Only kubelet-owned and shared conditions count, and of those only type, status, reason and
//! message; the fields the kubelet never writes (DRA claim statuses, `volumeHealth`, errata 8)
//! are ignored. Everything else is compared the way upstream's semantic deep equality does:
//! an unset string equals `""`, an unset list equals an empty one, quantities by value, times
//! by instant. Every `PodStatus` and `ContainerStatus` field is destructured by name, so a new
//! field in k8s-openapi fails to compile here until someone classifies it (the Rust form of
//! upstream's `TestIsPodStatusByKubeletEqualFutureProof`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, PodCondition, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::features::FeatureGates;
use crate::pod::pod_condition_counts_for_kubelet;
use crate::quantity::quantity_eq;

/// Strings at most this long are compared here, eight bytes at a time, rather than by a
/// `memcmp` call (names, reasons, UIDs: the call costs more than the comparison on this VM).
const SHORT: usize = 64;

/// Eight bytes of `s` from `at` (which has eight), as an integer whose order is theirs.
#[inline(always)]
fn word(s: &[u8], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&s[at..at + 8]);
    u64::from_be_bytes(bytes)
}

/// `a == b` without a `memcmp` call when the lengths differ or both are empty (issue 29: the
/// calls were a quarter of `set_pod_status`, most of a status's strings being empty).
#[inline]
pub fn text_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// `a.cmp(b)` (byte order, as `str`'s) without a `memcmp` call for short strings: the sort
/// of container statuses by name (R10).
#[inline]
pub fn text_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let common = a.len().min(b.len());
    if common > SHORT {
        return a.cmp(b);
    }
    let mut at = 0;
    while at + 8 <= common {
        let (x, y) = (word(a, at), word(b, at));
        if x != y {
            return x.cmp(&y);
        }
        at += 8;
    }
    for (x, y) in a[at..common].iter().zip(&b[at..common]) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

fn str_eq(a: &Option<String>, b: &Option<String>) -> bool {
    text_eq(a.as_deref().unwrap_or(""), b.as_deref().unwrap_or(""))
}

fn list_eq<T>(a: &Option<Vec<T>>, b: &Option<Vec<T>>, eq: impl Fn(&T, &T) -> bool) -> bool {
    let (a, b) = (
        a.as_deref().unwrap_or_default(),
        b.as_deref().unwrap_or_default(),
    );
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| eq(x, y))
}

fn quantities_eq(
    a: &Option<BTreeMap<String, Quantity>>,
    b: &Option<BTreeMap<String, Quantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.as_ref().unwrap_or(&empty), b.as_ref().unwrap_or(&empty));
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| text_eq(ka, kb) && quantity_eq(va, vb))
}

fn resources_eq(a: &Option<ResourceRequirements>, b: &Option<ResourceRequirements>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let ResourceRequirements {
                claims,
                limits,
                requests,
            } = a;
            list_eq(claims, &b.claims, PartialEq::eq)
                && quantities_eq(limits, &b.limits)
                && quantities_eq(requests, &b.requests)
        }
        _ => false,
    }
}

/// `state` and `lastState` are value structs in Go: unset equals empty.
fn state_eq(a: &Option<ContainerState>, b: &Option<ContainerState>) -> bool {
    let empty = ContainerState::default();
    let (a, b) = (a.as_ref().unwrap_or(&empty), b.as_ref().unwrap_or(&empty));
    let ContainerState {
        running,
        terminated,
        waiting,
    } = a;
    let running_eq = match (running, &b.running) {
        (None, None) => true,
        (Some(x), Some(y)) => x.started_at == y.started_at,
        _ => false,
    };
    let terminated_eq = match (terminated, &b.terminated) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            str_eq(&x.container_id, &y.container_id)
                && x.exit_code == y.exit_code
                && x.finished_at == y.finished_at
                && str_eq(&x.message, &y.message)
                && str_eq(&x.reason, &y.reason)
                && x.signal.unwrap_or(0) == y.signal.unwrap_or(0)
                && x.started_at == y.started_at
        }
        _ => false,
    };
    let waiting_eq = match (waiting, &b.waiting) {
        (None, None) => true,
        (Some(x), Some(y)) => str_eq(&x.message, &y.message) && str_eq(&x.reason, &y.reason),
        _ => false,
    };
    running_eq && terminated_eq && waiting_eq
}

/// Semantic equality of two container statuses.
pub fn container_status_eq(a: &ContainerStatus, b: &ContainerStatus) -> bool {
    let ContainerStatus {
        allocated_resources,
        allocated_resources_status,
        container_id,
        image,
        image_id,
        last_state,
        name,
        ready,
        resources,
        restart_count,
        started,
        state,
        stop_signal,
        user,
        volume_mounts,
    } = a;
    quantities_eq(allocated_resources, &b.allocated_resources)
        && list_eq(
            allocated_resources_status,
            &b.allocated_resources_status,
            PartialEq::eq,
        )
        && str_eq(container_id, &b.container_id)
        && text_eq(image, &b.image)
        && text_eq(image_id, &b.image_id)
        && state_eq(last_state, &b.last_state)
        && text_eq(name, &b.name)
        && *ready == b.ready
        && resources_eq(resources, &b.resources)
        && *restart_count == b.restart_count
        && *started == b.started
        && state_eq(state, &b.state)
        && *stop_signal == b.stop_signal
        && *user == b.user
        && list_eq(volume_mounts, &b.volume_mounts, PartialEq::eq)
}

/// The conditions the kubelet's comparison counts, one per type: the last of each, as
/// upstream's map insertion keeps it. No map: a pod has a handful of conditions, and building
/// two hash maps per call was a fifth of `set_pod_status`.
fn counted_conditions<'a>(
    status: &'a PodStatus,
    gates: &'a FeatureGates,
) -> impl Iterator<Item = &'a PodCondition> + 'a {
    let all = status.conditions.as_deref().unwrap_or_default();
    all.iter().enumerate().filter_map(move |(i, c)| {
        let last = all[i + 1..].iter().all(|later| later.type_ != c.type_);
        (last && pod_condition_counts_for_kubelet(&c.type_, gates)).then_some(c)
    })
}

/// R11: true when `new` says nothing the kubelet has not already said in `old`.
pub fn is_pod_status_by_kubelet_equal(
    old: &PodStatus,
    new: &PodStatus,
    gates: &FeatureGates,
) -> bool {
    if counted_conditions(old, gates).count() != counted_conditions(new, gates).count() {
        return false;
    }
    let old_conditions = old.conditions.as_deref().unwrap_or_default();
    let conditions_equal = counted_conditions(new, gates).all(|n| {
        // The last of the type in `old` (counted: whether a type counts depends on it alone).
        old_conditions
            .iter()
            .rev()
            .find(|o| text_eq(&o.type_, &n.type_))
            .is_some_and(|o| {
                text_eq(&o.status, &n.status)
                    && str_eq(&o.reason, &n.reason)
                    && str_eq(&o.message, &n.message)
            })
    });
    if !conditions_equal {
        return false;
    }

    let PodStatus {
        allocated_resources,
        conditions: _, // compared above
        container_statuses,
        ephemeral_container_statuses,
        extended_resource_claim_status: _, // ignored: DRA, never written by the kubelet
        host_ip,
        host_ips,
        init_container_statuses,
        message,
        node_allocatable_resource_claim_statuses: _, // ignored: DRA
        nominated_node_name,
        observed_generation,
        phase,
        pod_ip,
        pod_ips,
        qos_class,
        reason,
        resize,
        resource_claim_statuses: _, // ignored: DRA
        resources,
        start_time,
        volume_health: _, // ignored: not kubelet-owned (errata 8)
    } = old;
    quantities_eq(allocated_resources, &new.allocated_resources)
        && list_eq(
            container_statuses,
            &new.container_statuses,
            container_status_eq,
        )
        && list_eq(
            ephemeral_container_statuses,
            &new.ephemeral_container_statuses,
            container_status_eq,
        )
        && str_eq(host_ip, &new.host_ip)
        && list_eq(host_ips, &new.host_ips, PartialEq::eq)
        && list_eq(
            init_container_statuses,
            &new.init_container_statuses,
            container_status_eq,
        )
        && str_eq(message, &new.message)
        && str_eq(nominated_node_name, &new.nominated_node_name)
        && observed_generation.unwrap_or(0) == new.observed_generation.unwrap_or(0)
        && str_eq(phase, &new.phase)
        && str_eq(pod_ip, &new.pod_ip)
        && list_eq(pod_ips, &new.pod_ips, PartialEq::eq)
        && str_eq(qos_class, &new.qos_class)
        && str_eq(reason, &new.reason)
        && str_eq(resize, &new.resize)
        && resources_eq(resources, &new.resources)
        && *start_time == new.start_time
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::normalize_status;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::{HostIP, PodIP, PodResourceClaimStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn gates() -> FeatureGates {
        FeatureGates::default()
    }

    /// `text_eq` and `text_cmp` answer as `str`'s `==` and `cmp` for every pair of a set of
    /// strings around the word and short-string boundaries, differing at every position.
    #[test]
    fn text_eq_and_text_cmp_answer_as_str_does() {
        let mut words: Vec<String> = vec![String::new(), "é".into(), "\u{ff}".into()];
        for len in [1, 7, 8, 9, 15, 16, 17, 36, 63, 64, 65, 100] {
            let base: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            words.push(base.clone());
            for at in 0..len {
                let mut bytes = base.clone().into_bytes();
                bytes[at] = b'A';
                words.push(String::from_utf8(bytes.clone()).unwrap());
                bytes[at] = b'z';
                words.push(String::from_utf8(bytes).unwrap());
            }
            words.push(format!("{base}a"));
        }
        for a in &words {
            for b in &words {
                assert_eq!(text_eq(a, b), a == b, "{a:?} == {b:?}");
                assert_eq!(text_cmp(a, b), a.cmp(b), "{a:?} cmp {b:?}");
            }
        }
    }

    fn shuffled(names: &[String], seed: u64) -> Vec<ContainerStatus> {
        // A small deterministic shuffle (xorshift) so the test needs no RNG crate.
        let mut v: Vec<ContainerStatus> = names.iter().map(|n| status_named(n)).collect();
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
        v
    }

    #[test]
    fn test_status_equality() {
        let names: Vec<String> = (0..10).map(|i| format!("container{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let spec = spec_with(&refs, &refs);
        let mut first: Option<PodStatus> = None;
        for seed in 0..10 {
            let mut status = PodStatus {
                container_statuses: Some(shuffled(&names, seed)),
                init_container_statuses: Some(shuffled(&names, seed + 100)),
                ephemeral_container_statuses: Some(shuffled(&names, seed + 200)),
                ..Default::default()
            };
            normalize_status(Some(&spec), &mut status);
            if let Some(first) = &first {
                assert!(
                    is_pod_status_by_kubelet_equal(first, &status, &gates()),
                    "seed {seed}"
                );
            } else {
                first = Some(status);
            }
        }
        let base = first.unwrap();

        let with_feature = |s: &str| PodStatus {
            conditions: Some(vec![cond("www.example.com/feature", s)]),
            ..base.clone()
        };
        assert!(is_pod_status_by_kubelet_equal(
            &with_feature("True"),
            &with_feature("False"),
            &gates()
        ));

        let with_claims = PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "claim".into(),
                resource_claim_name: Some("c".into()),
            }]),
            ..base.clone()
        };
        assert!(is_pod_status_by_kubelet_equal(
            &base,
            &with_claims,
            &gates()
        ));
    }

    fn base() -> PodStatus {
        PodStatus::default()
    }

    #[test]
    fn test_is_pod_status_by_kubelet_equal_future_proof() {
        use k8s_openapi::api::core::v1::{
            NodeAllocatableResourceClaimStatus, PodExtendedResourceClaimStatus, PodVolumeHealth,
        };
        let ignored: Vec<(&str, PodStatus)> = vec![
            (
                "resourceClaimStatuses",
                PodStatus {
                    resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                        name: "x".into(),
                        ..Default::default()
                    }]),
                    ..base()
                },
            ),
            (
                "extendedResourceClaimStatus",
                PodStatus {
                    extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                        resource_claim_name: "c".into(),
                        ..Default::default()
                    }),
                    ..base()
                },
            ),
            (
                "nodeAllocatableResourceClaimStatuses",
                PodStatus {
                    node_allocatable_resource_claim_statuses: Some(vec![
                        NodeAllocatableResourceClaimStatus::default(),
                    ]),
                    ..base()
                },
            ),
            (
                "volumeHealth",
                PodStatus {
                    volume_health: Some(vec![PodVolumeHealth::default()]),
                    ..base()
                },
            ),
            (
                "foreign condition",
                PodStatus {
                    conditions: Some(vec![cond("example.com/x", "True")]),
                    ..base()
                },
            ),
        ];
        for (field, status) in ignored {
            assert!(
                is_pod_status_by_kubelet_equal(&base(), &status, &gates()),
                "{field}"
            );
        }

        let q = |s: &str| Some(BTreeMap::from([("cpu".to_owned(), Quantity(s.to_owned()))]));
        let owned: Vec<(&str, PodStatus)> = vec![
            (
                "phase",
                PodStatus {
                    phase: Some("Succeeded".into()),
                    ..base()
                },
            ),
            (
                "conditions",
                PodStatus {
                    conditions: Some(vec![cond("Ready", "True")]),
                    ..base()
                },
            ),
            (
                "message",
                PodStatus {
                    message: Some("m".into()),
                    ..base()
                },
            ),
            (
                "reason",
                PodStatus {
                    reason: Some("r".into()),
                    ..base()
                },
            ),
            (
                "nominatedNodeName",
                PodStatus {
                    nominated_node_name: Some("n".into()),
                    ..base()
                },
            ),
            (
                "hostIP",
                PodStatus {
                    host_ip: Some("1.2.3.4".into()),
                    ..base()
                },
            ),
            (
                "hostIPs",
                PodStatus {
                    host_ips: Some(vec![HostIP {
                        ip: "1.2.3.4".into(),
                    }]),
                    ..base()
                },
            ),
            (
                "podIP",
                PodStatus {
                    pod_ip: Some("10.0.0.1".into()),
                    ..base()
                },
            ),
            (
                "podIPs",
                PodStatus {
                    pod_ips: Some(vec![PodIP {
                        ip: "10.0.0.1".into(),
                    }]),
                    ..base()
                },
            ),
            (
                "startTime",
                PodStatus {
                    start_time: Some(Time(ts("2026-01-01T00:00:00Z"))),
                    ..base()
                },
            ),
            (
                "initContainerStatuses",
                PodStatus {
                    init_container_statuses: Some(vec![status_in("i", running())]),
                    ..base()
                },
            ),
            (
                "containerStatuses",
                PodStatus {
                    container_statuses: Some(vec![status_in("c", running())]),
                    ..base()
                },
            ),
            (
                "ephemeralContainerStatuses",
                PodStatus {
                    ephemeral_container_statuses: Some(vec![status_in("e", running())]),
                    ..base()
                },
            ),
            (
                "qosClass",
                PodStatus {
                    qos_class: Some("Guaranteed".into()),
                    ..base()
                },
            ),
            (
                "resize",
                PodStatus {
                    resize: Some("InProgress".into()),
                    ..base()
                },
            ),
            (
                "allocatedResources",
                PodStatus {
                    allocated_resources: q("100m"),
                    ..base()
                },
            ),
            (
                "observedGeneration",
                PodStatus {
                    observed_generation: Some(1),
                    ..base()
                },
            ),
            (
                "resources",
                PodStatus {
                    resources: Some(ResourceRequirements {
                        requests: q("100m"),
                        ..Default::default()
                    }),
                    ..base()
                },
            ),
        ];
        for (field, status) in owned {
            assert!(
                !is_pod_status_by_kubelet_equal(&base(), &status, &gates()),
                "{field}"
            );
            assert!(
                !is_pod_status_by_kubelet_equal(&status, &base(), &gates()),
                "{field} (rev)"
            );
        }
    }

    #[test]
    fn r11_owned_condition_fields_compared_but_not_times() {
        let a = PodStatus {
            conditions: Some(vec![condition_at(
                "Ready",
                "True",
                ts("2026-01-01T00:00:00Z"),
            )]),
            ..base()
        };
        let later = PodStatus {
            conditions: Some(vec![condition_at(
                "Ready",
                "True",
                ts("2026-02-01T00:00:00Z"),
            )]),
            ..base()
        };
        assert!(is_pod_status_by_kubelet_equal(&a, &later, &gates()));
        let other_reason = PodStatus {
            conditions: Some(vec![cond_reason("Ready", "True", "X")]),
            ..base()
        };
        assert!(!is_pod_status_by_kubelet_equal(&a, &other_reason, &gates()));
        // Removing an owned condition is a change (the size check).
        assert!(!is_pod_status_by_kubelet_equal(&a, &base(), &gates()));
    }

    /// R11 with a condition type listed twice: the last of each type counts, as upstream's map
    /// insertion keeps it, and a duplicate does not count twice (the size check).
    #[test]
    fn r11_the_last_condition_of_a_type_counts() {
        let with = |conditions: Vec<PodCondition>| PodStatus {
            conditions: Some(conditions),
            ..base()
        };
        let once = with(vec![cond_reason("Ready", "True", "B")]);
        let twice = with(vec![
            cond_reason("Ready", "False", "A"),
            cond_reason("Ready", "True", "B"),
        ]);
        assert!(is_pod_status_by_kubelet_equal(&once, &twice, &gates()));
        assert!(is_pod_status_by_kubelet_equal(&twice, &once, &gates()));
        let first_wins = with(vec![cond_reason("Ready", "False", "A")]);
        assert!(!is_pod_status_by_kubelet_equal(
            &first_wins,
            &twice,
            &gates()
        ));
        assert!(!is_pod_status_by_kubelet_equal(
            &twice,
            &first_wins,
            &gates()
        ));
        let two_types = with(vec![
            cond_reason("Ready", "True", "B"),
            cond_reason("ContainersReady", "True", "B"),
        ]);
        assert!(!is_pod_status_by_kubelet_equal(
            &twice,
            &two_types,
            &gates()
        ));
    }

    #[test]
    fn r11_semantic_equality_of_empty_values_and_quantities() {
        let empty_strings = PodStatus {
            message: Some(String::new()),
            pod_ips: Some(vec![]),
            observed_generation: Some(0),
            ..base()
        };
        assert!(is_pod_status_by_kubelet_equal(
            &base(),
            &empty_strings,
            &gates()
        ));
        let q = |s: &str| Some(BTreeMap::from([("cpu".to_owned(), Quantity(s.to_owned()))]));
        let a = PodStatus {
            allocated_resources: q("100m"),
            ..base()
        };
        let b = PodStatus {
            allocated_resources: q("0.1"),
            ..base()
        };
        assert!(is_pod_status_by_kubelet_equal(&a, &b, &gates()));
        let started_none = PodStatus {
            container_statuses: Some(vec![status_named("c")]),
            ..base()
        };
        let mut started_false = started_none.clone();
        started_false.container_statuses.as_mut().unwrap()[0].started = Some(false);
        assert!(
            !is_pod_status_by_kubelet_equal(&started_none, &started_false, &gates()),
            "R18: nil to false is a change"
        );
    }
}
