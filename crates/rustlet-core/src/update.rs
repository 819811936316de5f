//! The pure part of accepting a status update (R1-R12): upstream `updateStatusInternal`
//! without the lock, the channel and the logging.
//!
//! The caller (the status manager) owns the cache; it passes the cached entry in and stores
//! what [`prepare_update`] returns. Nothing here reads a clock: `now` is an argument.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::equality::is_pod_status_by_kubelet_equal;
use crate::features::FeatureGates;
use crate::normalize::normalize_status;
use crate::pod::{PodPhase, is_static_pod, status_observed_generation};
use crate::transition::{
    TransitionError, check_container_state_transition, update_last_transition_times,
};

/// One cached pod status (upstream `versionedPodStatus`).
#[derive(Clone, Debug, PartialEq)]
pub struct VersionedPodStatus {
    /// Strictly increasing by one per accepted update; the first accepted update is 1.
    pub version: u64,
    /// Name of the pod (of the mirror pod, for a static pod) to sync to.
    pub pod_name: String,
    /// Namespace of that pod.
    pub pod_namespace: String,
    /// Set by `TerminatePod`; sticky for non-static pods (R5).
    pub pod_is_finished: bool,
    /// The pod is a static pod: its status goes to its mirror pod, and nowhere once the pod
    /// manager no longer knows the static pod.
    pub static_pod: bool,
    /// When the first update not yet synced was accepted; `None` once the sync task has
    /// recorded this version as written, so the next update starts the clock again (R61:
    /// a deliberate deviation, upstream never resets it).
    pub at: Option<Timestamp>,
    /// The normalised status (R10).
    pub status: PodStatus,
}

/// Which mutator an update comes from; it decides the force and finished flags (R3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateSource {
    /// `SetPodStatus`: forced when the pod has a deletion timestamp; sets observedGeneration.
    SetPodStatus,
    /// `SetContainerReadiness` / `SetContainerStartup`: never forced.
    ContainerProbe,
    /// `TerminatePod`: always forced, marks the pod finished.
    TerminatePod,
}

/// What the caller knows besides the update itself.
#[derive(Clone, Copy, Debug)]
pub struct UpdateContext<'a> {
    /// The cached entry for this pod UID, if any.
    pub cached: Option<&'a VersionedPodStatus>,
    /// The mirror pod's status when the pod is static and its mirror is known (R4).
    pub mirror_status: Option<&'a PodStatus>,
    /// The current time.
    pub now: Timestamp,
    /// Feature gates in force.
    pub gates: &'a FeatureGates,
}

/// The result of [`prepare_update`].
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateOutcome {
    /// Store this entry and kick the sync task.
    Accepted(Box<Accepted>),
    /// Equal to the cached status and not forced (R11): nothing to store, no kick.
    Unchanged,
    /// A container tried to leave the terminated state (R6): nothing changes.
    Rejected(TransitionError),
}

/// An accepted update and what was noticed on the way.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    /// The new cache entry.
    pub entry: VersionedPodStatus,
    /// `Some((kept, attempted))` when the update tried to move a terminal phase elsewhere and
    /// the terminal phase was kept (defence in depth; upstream does this in the status
    /// generator, see the spec's 0.3 and lesson 8).
    pub phase_regression_prevented: Option<(String, String)>,
    /// `pod_is_finished` was false in the update but forced true by R5.
    pub finished_was_sticky: bool,
    /// Containers this update reports terminated for the first time (R13, for the
    /// `TerminatedContainersTotal` counter).
    pub newly_terminated: Vec<NewlyTerminated>,
}

/// Which list a container status is in (the counter's `container_type` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    /// `initContainerStatuses`.
    Init,
    /// `containerStatuses`.
    Regular,
    /// `ephemeralContainerStatuses`.
    Ephemeral,
}

/// One container that moved into the terminated state (R13).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewlyTerminated {
    /// Its list.
    pub kind: ContainerKind,
    /// Its name.
    pub name: String,
    /// Its exit code.
    pub exit_code: i32,
    /// Its termination reason, possibly empty.
    pub reason: String,
}

/// R13: statuses terminated in `new` whose same-named status in `old` is absent or not terminated.
pub fn newly_terminated(old: &PodStatus, new: &PodStatus) -> Vec<NewlyTerminated> {
    let lists = [
        (
            ContainerKind::Init,
            &old.init_container_statuses,
            &new.init_container_statuses,
        ),
        (
            ContainerKind::Regular,
            &old.container_statuses,
            &new.container_statuses,
        ),
        (
            ContainerKind::Ephemeral,
            &old.ephemeral_container_statuses,
            &new.ephemeral_container_statuses,
        ),
    ];
    let mut out = Vec::new();
    for (kind, old_list, new_list) in lists {
        for status in new_list.iter().flatten() {
            let Some(t) = status.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                continue;
            };
            let was_terminated = old_list.iter().flatten().any(|o| {
                o.name == status.name && o.state.as_ref().is_some_and(|s| s.terminated.is_some())
            });
            if !was_terminated {
                out.push(NewlyTerminated {
                    kind,
                    name: status.name.clone(),
                    exit_code: t.exit_code,
                    reason: t.reason.clone().unwrap_or_default(),
                });
            }
        }
    }
    out
}

/// Runs R2-R12 for one update and returns what to store.
///
/// ```
/// use k8s_openapi::api::core::v1::{Pod, PodStatus};
/// use rustlet_core::{FeatureGates, Timestamp, UpdateContext, UpdateSource, prepare_update};
///
/// let gates = FeatureGates::default();
/// let ctx = UpdateContext {
///     cached: None,
///     mirror_status: None,
///     now: Timestamp::from_second(1_700_000_000).unwrap(),
///     gates: &gates,
/// };
/// let running = PodStatus { phase: Some("Running".into()), ..PodStatus::default() };
/// let outcome = prepare_update(&Pod::default(), running, UpdateSource::SetPodStatus, ctx);
/// let entry = outcome.accepted().expect("a first update is accepted");
/// assert_eq!(entry.version, 1);
/// assert!(entry.status.start_time.is_some(), "R8: the start time is set once");
/// ```
pub fn prepare_update(
    pod: &Pod,
    mut status: PodStatus,
    source: UpdateSource,
    ctx: UpdateContext<'_>,
) -> UpdateOutcome {
    let static_pod = is_static_pod(pod);
    let (force, mut finished) = match source {
        UpdateSource::SetPodStatus => (pod.metadata.deletion_timestamp.is_some(), false),
        UpdateSource::ContainerProbe => (false, false),
        UpdateSource::TerminatePod => (true, true),
    };
    if source == UpdateSource::SetPodStatus {
        status.observed_generation = status_observed_generation(pod, ctx.gates); // R2
    }

    // R4: the old status.
    let empty = PodStatus::default();
    let old = match (ctx.cached, ctx.mirror_status) {
        (Some(cached), _) => &cached.status,
        (None, Some(mirror)) => mirror,
        (None, None) => pod.status.as_ref().unwrap_or(&empty),
    };

    // R5: finished is sticky for non-static pods.
    let mut finished_was_sticky = false;
    if let Some(cached) = ctx.cached
        && !static_pod
        && cached.pod_is_finished
        && !finished
    {
        finished = true;
        finished_was_sticky = true;
    }

    // R6.
    let default_spec = Default::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    if let Err(err) = check_container_state_transition(old, &status, spec, ctx.gates) {
        return UpdateOutcome::Rejected(err);
    }

    // A terminal phase never goes back (the generator's guard, kept here too).
    let old_phase = PodPhase::of(old);
    let new_phase = PodPhase::of(&status);
    let mut phase_regression_prevented = None;
    if old_phase.is_terminal() && new_phase != old_phase {
        phase_regression_prevented =
            Some((old_phase.as_str().to_owned(), new_phase.as_str().to_owned()));
        status.phase = old.phase.clone();
    }

    update_last_transition_times(&mut status, old, ctx.now); // R7

    // R8: StartTime never changes once set.
    match &old.start_time {
        Some(t) => status.start_time = Some(t.clone()),
        None if status.start_time.is_none() => status.start_time = Some(Time(ctx.now)),
        None => {}
    }

    // R9: observedGeneration never goes down.
    if old.observed_generation.unwrap_or(0) > status.observed_generation.unwrap_or(0) {
        status.observed_generation = old.observed_generation;
    }

    normalize_status(pod.spec.as_ref(), &mut status); // R10
    let newly_terminated = newly_terminated(old, &status); // R13

    // R11.
    if let Some(cached) = ctx.cached
        && !force
        && is_pod_status_by_kubelet_equal(&cached.status, &status, ctx.gates)
    {
        return UpdateOutcome::Unchanged;
    }

    // R12.
    let entry = VersionedPodStatus {
        version: ctx.cached.map_or(0, |c| c.version) + 1,
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_is_finished: finished,
        static_pod: crate::pod::is_static_pod(pod),
        at: Some(ctx.cached.and_then(|c| c.at).unwrap_or(ctx.now)),
        status,
    };
    UpdateOutcome::Accepted(Box::new(Accepted {
        entry,
        phase_regression_prevented,
        finished_was_sticky,
        newly_terminated,
    }))
}

impl UpdateOutcome {
    /// The accepted entry, if any.
    pub fn accepted(&self) -> Option<&VersionedPodStatus> {
        match self {
            Self::Accepted(a) => Some(&a.entry),
            _ => None,
        }
    }
}
