//! rustlet-core: the pure state rules of Rustlet's status manager, and the identifier types
//! the volume manager shares.
//!
//! Mirrors the pure parts of upstream `pkg/kubelet/status` (`status_manager.go`,
//! `generate.go`), `pkg/kubelet/types/pod_status.go` and `pkg/api/v1/pod/util.go`. Rule
//! numbers (R1-R67, G1-G8) refer to `shared/spec/status-manager.md`.
//!
//! # Invariants
//!
//! * **Sans-IO.** No clock, no file, no network, no async runtime: "now" is an argument, and
//!   every function is deterministic in its inputs. This crate must never import tokio, kube,
//!   nix or anything above it in the workspace (the tidy test checks the manifest).
//! * **Kubernetes objects are k8s-openapi types** (`Pod`, `PodStatus`, `ContainerStatus`); none is
//!   written by hand here.
//! * **A stored status is normalised** ([`normalize::normalize_status`]): whole seconds, sorted
//!   container statuses, bounded termination messages; normalising twice changes nothing.
//! * **A terminal phase never goes back**: [`update::prepare_update`] keeps a terminal old phase
//!   and [`merge::merge_pod_status`] never replaces a terminal API phase.
//! * **Foreign conditions are never written or dropped** by [`merge::merge_pod_status`].
//!
//! # Entry points
//!
//! * [`update::prepare_update`]: accept or refuse one update (R1-R12) and build the cache entry.
//! * [`merge::merge_pod_status`]: what to send, given the API's status (R41-R46).
//! * [`deletion::deletion_decision`] and the [`deletion::PodDeletionSafety`] seam (R40).
//! * [`terminate::terminate_status`]: the final status of a pod (R19-R23).
//! * [`generate`]: the condition generators (G1-G7); [`probe`]: readiness and startup (R15-R18).
//! * [`restart::container_should_restart`]: whether a container that exited is restarted (its
//!   own `restartPolicy` and `restartPolicyRules`, else the pod's).
//! * [`names`]: the DNS name formats the node checks again (a pod's host name).
//! * [`qos`]: a pod's QoS class (`ComputePodQOS`, `GetPodQOS`).
//! * [`refs::referenced_names`]: the ConfigMaps and Secrets a pod references (what the content
//!   sources watch).
//! * [`changes::ChangeLog`]: which pods changed since a cursor, so periodic passes visit only
//!   those.
//!
//! Left to `rustlet-status` because they are about the cache or the API, not pure rules:
//! the version map and kick channel (R12 signal, R27-R33), GET/PATCH/DELETE (R34-R39), cache
//! removal (R25, R26), resize conditions (R48-R54), metrics (the R13 counter itself, R59-R61);
//! [`update::Accepted::newly_terminated`] gives the counter its input.

pub mod changes;
pub mod deletion;
pub mod equality;
pub mod features;
pub mod generate;
pub mod ids;
pub mod merge;
pub mod names;
pub mod node;
pub mod node_status;
pub mod normalize;
pub mod patch;
pub mod pod;
pub mod probe;
pub mod qos;
pub mod quantity;
pub mod refs;
pub mod restart;
pub mod terminate;
pub mod transition;
pub mod update;

#[cfg(any(test, feature = "test-util"))]
pub mod testutil;

#[cfg(test)]
mod tests;

pub use changes::{ChangeLog, PodChanges};
pub use deletion::{DeletionDecision, PodDeletionSafety, can_be_deleted, deletion_decision};
pub use equality::is_pod_status_by_kubelet_equal;
pub use features::FeatureGates;
pub use ids::{
    PodUid, UniquePodName, UniqueVolumeName, UnsafePathComponent, UnsafeReason, path_component,
};
pub use merge::{MergeContext, merge_pod_status};
pub use normalize::normalize_status;
pub use pod::PodPhase;
pub use update::{UpdateContext, UpdateOutcome, UpdateSource, VersionedPodStatus, prepare_update};

/// The timestamp type of every "now" argument (k8s-openapi's `Time` wraps it).
pub use k8s_openapi::jiff::Timestamp;

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
