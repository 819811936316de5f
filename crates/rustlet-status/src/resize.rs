//! In-place resize conditions (R48-R54, upstream 1.33+): `PodResizePending` and
//! `PodResizeInProgress`, kept in memory per pod and surfaced by the agent's status generator.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rustlet_core::PodUid;
use rustlet_core::pod::{condition_status, condition_type};

/// Reason of a pending resize that may fit later.
pub const RESIZE_DEFERRED: &str = "Deferred";
/// Reason of a pending resize that can never fit on this node.
pub const RESIZE_INFEASIBLE: &str = "Infeasible";

/// One pod's resize conditions.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ResizeConditions {
    pending: Option<PodCondition>,
    in_progress: Option<PodCondition>,
}

/// The resize-condition cache and its gauges.
#[derive(Debug)]
pub(crate) struct ResizeState {
    conditions: HashMap<PodUid, ResizeConditions>,
    /// `pod_pending_resizes{reason}` (lower-cased reason).
    pub(crate) pending_gauge: Family<Vec<(String, String)>, Gauge>,
    /// `pod_in_progress_resizes`.
    pub(crate) in_progress_gauge: Gauge,
}

/// Upstream `updatedPodResizeCondition` (R48).
fn updated_condition(
    type_: &str,
    old: Option<&PodCondition>,
    reason: &str,
    message: &str,
    generation: i64,
    now: Timestamp,
) -> PodCondition {
    let transition = match old {
        Some(o) if o.reason.as_deref().unwrap_or("") == reason => o.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    PodCondition {
        type_: type_.to_owned(),
        status: condition_status::TRUE.to_owned(),
        reason: (!reason.is_empty()).then(|| reason.to_owned()),
        message: (!message.is_empty()).then(|| message.to_owned()),
        observed_generation: Some(generation),
        last_probe_time: Some(Time(now)),
        last_transition_time: transition,
    }
}

fn reason_of(c: &PodCondition) -> &str {
    c.reason.as_deref().unwrap_or("")
}

impl ResizeState {
    pub(crate) fn new(
        pending_gauge: Family<Vec<(String, String)>, Gauge>,
        in_progress_gauge: Gauge,
    ) -> Self {
        Self {
            conditions: HashMap::new(),
            pending_gauge,
            in_progress_gauge,
        }
    }

    /// R54: recomputes both gauges from the cache.
    pub(crate) fn refresh_gauges(&self) {
        let mut pending: HashMap<String, i64> = HashMap::new();
        let mut in_progress = 0;
        for c in self.conditions.values() {
            if let Some(p) = &c.pending {
                *pending.entry(reason_of(p).to_lowercase()).or_default() += 1;
            }
            if c.in_progress.is_some() {
                in_progress += 1;
            }
        }
        self.pending_gauge.clear();
        for (reason, count) in pending {
            self.pending_gauge
                .get_or_create(&vec![("reason".to_owned(), reason)])
                .set(count);
        }
        self.in_progress_gauge.set(in_progress);
    }

    /// R49.
    pub(crate) fn set_pending(
        &mut self,
        uid: &PodUid,
        reason: &str,
        message: &str,
        generation: i64,
        now: Timestamp,
    ) -> bool {
        let reason = if reason == RESIZE_INFEASIBLE {
            RESIZE_INFEASIBLE
        } else {
            RESIZE_DEFERRED
        };
        let entry = self.conditions.entry(uid.clone()).or_default();
        let old = entry.pending.take();
        let changed = old
            .as_ref()
            .is_none_or(|o| reason_of(o) != reason || o.observed_generation != Some(generation));
        entry.pending = Some(updated_condition(
            condition_type::POD_RESIZE_PENDING,
            old.as_ref(),
            reason,
            message,
            generation,
            now,
        ));
        self.refresh_gauges();
        changed
    }

    /// R50: returns the effective generation and whether anything but the times changed.
    pub(crate) fn set_in_progress(
        &mut self,
        uid: &PodUid,
        reason: &str,
        message: &str,
        generation: i64,
        now: Timestamp,
    ) -> (i64, bool) {
        let entry = self.conditions.entry(uid.clone()).or_default();
        let old = entry.in_progress.take();
        let (reason, message, generation) = match &old {
            Some(o) if reason.is_empty() && message.is_empty() => (
                reason_of(o).to_owned(),
                o.message.clone().unwrap_or_default(),
                o.observed_generation.unwrap_or(0),
            ),
            Some(o) => (
                reason.to_owned(),
                message.to_owned(),
                o.observed_generation.unwrap_or(0),
            ),
            None => (reason.to_owned(), message.to_owned(), generation),
        };
        let new = updated_condition(
            condition_type::POD_RESIZE_IN_PROGRESS,
            old.as_ref(),
            &reason,
            &message,
            generation,
            now,
        );
        let changed = old.as_ref().is_none_or(|o| {
            o.reason != new.reason
                || o.message != new.message
                || o.observed_generation != new.observed_generation
        });
        entry.in_progress = Some(new);
        self.refresh_gauges();
        (generation, changed)
    }

    fn prune(&mut self, uid: &PodUid) {
        if self
            .conditions
            .get(uid)
            .is_some_and(|c| c.pending.is_none() && c.in_progress.is_none())
        {
            self.conditions.remove(uid);
        }
    }

    /// R51.
    pub(crate) fn clear_pending(&mut self, uid: &PodUid) {
        if let Some(c) = self.conditions.get_mut(uid)
            && c.pending.take().is_some()
        {
            self.prune(uid);
            self.refresh_gauges();
        }
    }

    /// R51: the cleared generation and true, or (0, false).
    pub(crate) fn clear_in_progress(&mut self, uid: &PodUid) -> (i64, bool) {
        let Some(old) = self
            .conditions
            .get_mut(uid)
            .and_then(|c| c.in_progress.take())
        else {
            return (0, false);
        };
        self.prune(uid);
        self.refresh_gauges();
        (old.observed_generation.unwrap_or(0), true)
    }

    /// R52: Pending first, then InProgress; empty when neither.
    pub(crate) fn get(&self, uid: &PodUid) -> Vec<PodCondition> {
        self.conditions
            .get(uid)
            .map(|c| c.pending.iter().chain(&c.in_progress).cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn pending_reason(&self, uid: &PodUid) -> Option<String> {
        self.conditions
            .get(uid)?
            .pending
            .as_ref()
            .map(|p| reason_of(p).to_owned())
    }

    /// R53: rebuilds the cache from the API pods' conditions.
    pub(crate) fn backfill(&mut self, pods: &[Pod], now: Timestamp) {
        for pod in pods {
            let uid = PodUid::of(pod);
            for c in pod
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
            {
                let slot = match c.type_.as_str() {
                    condition_type::POD_RESIZE_PENDING => {
                        &mut self.conditions.entry(uid.clone()).or_default().pending
                    }
                    condition_type::POD_RESIZE_IN_PROGRESS => {
                        &mut self.conditions.entry(uid.clone()).or_default().in_progress
                    }
                    _ => continue,
                };
                *slot = Some(PodCondition {
                    last_probe_time: Some(Time(now)),
                    last_transition_time: Some(Time(now)),
                    ..c.clone()
                });
            }
        }
        self.refresh_gauges();
    }

    /// R25/R26: drops a pod's entry.
    pub(crate) fn remove(&mut self, uid: &PodUid) {
        if self.conditions.remove(uid).is_some() {
            self.refresh_gauges();
        }
    }

    /// R25: keeps only these pods.
    pub(crate) fn retain(&mut self, keep: impl Fn(&PodUid) -> bool) {
        let before = self.conditions.len();
        self.conditions.retain(|uid, _| keep(uid));
        if self.conditions.len() != before {
            self.refresh_gauges();
        }
    }
}
