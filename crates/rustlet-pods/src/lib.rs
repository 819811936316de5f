//! rustlet-pods: the pod workers, which drive every pod bound to the node from its first sight
//! to its deletion and feed the status and volume managers; the `Runtime` seam; the simulated
//! runtime; API pod status generation.
//!
//! * [`workers`]: upstream's pod workers and sync methods. [`workers::PodLifecycles`] is the
//!   state table the managers read (`PodStateProvider`, `PodDeletionSafety`) and the mirror
//!   pods follow (which static pod started, which still runs: upstream's
//!   `startedStaticPodsByFullname`);
//!   [`workers::PodWorkers`] follows the pod source, one task per pod UID.
//! * [`actions`]: what a sync does to the sandbox and the containers (`computePodActions`).
//! * [`admission`]: whether the node admits a pod first seen (`canAdmitPod`: the sysctl,
//!   OS and AppArmor admit handlers, [`sysctl`] and [`apparmor`] the first and the last; then
//!   the [`admission::ResourceAllocator`] seam, the device plugins' `Allocate`).
//! * [`runtime`]: the [`runtime::Runtime`] trait, the seam where a CRI runtime plugs in.
//! * [`prober`]: liveness, readiness and startup probes (exec through the runtime, HTTP GET,
//!   TCP, gRPC through the [`prober::GrpcProber`] seam), on a runtime that runs processes.
//! * [`simulated`]: a runtime without processes (kwok-like): real volumes and statuses.
//! * [`status`]: `generateAPIPodStatus` and `getPhase`, pure.
//!
//! # Invariants
//!
//! * One worker per pod UID; a UID's lifecycle only moves forward (Syncing → Terminating →
//!   Terminated → Finished) and is forgotten only once the pod left the source.
//! * No container starts once a pod is terminating; `terminate_pod` is called only after the
//!   runtime stopped every container, the volume manager unmounted every volume and the pod
//!   directory was removed (never across a mount point), so the status manager's deletion
//!   (grace 0, UID precondition) comes after the pod's resources are reclaimed.
//! * Stopping the agent stops the workers where they are: nothing is killed or unmounted.
//!
//! # Boundaries
//!
//! Depends on `rustlet-core`, `rustlet-status`, `rustlet-volume` and `rustlet-mount`; never on
//! kube, `rustlet-api` or the binary. A CRI runtime lives in its own crate and implements
//! [`runtime::Runtime`].

pub mod actions;
pub mod admission;
pub mod apparmor;
mod fault;
pub mod lifecycle;
pub mod prober;
pub mod runtime;
pub mod simulated;
pub mod status;
pub mod sysctl;
pub mod workers;

#[cfg(test)]
mod restart_rules_tests;
#[cfg(test)]
mod sidecar_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod worker_tests;

pub use runtime::{Runtime, RuntimeError};
pub use simulated::{SimulatedConfig, SimulatedRuntime};
pub use workers::{Lifecycle, PodLifecycles, PodWorkers, PodWorkersConfig, PodWorkersDeps};

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
