//! `normalize_status` (R10): the canonical form a status is stored and compared in.
//!
//! Upstream: `normalizeStatus`, `kubetypes.SortedContainerStatuses`, `SortInitContainerStatuses`.
//! Deviations, both deliberate: a termination message is cut at the last UTF-8 char boundary at
//! or below the budget (upstream cuts bytes and can split a character), and sorting by name is
//! stable (upstream's order among duplicate names is undefined).

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::equality::text_cmp;

/// Upstream `MaxPodTerminationMessageLogLength`: the byte budget shared by all containers.
pub const MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH: usize = 12 * 1024;

/// Drops the sub-second part of a timestamp, rounding toward the past as RFC 3339 formatting
/// of a Go time does.
pub fn truncate_to_second(ts: Timestamp) -> Timestamp {
    let mut secs = ts.as_second();
    if ts.subsec_nanosecond() < 0 {
        secs -= 1;
    }
    Timestamp::from_second(secs).unwrap_or(ts)
}

fn truncate_time(t: &mut Option<Time>) {
    if let Some(Time(ts)) = t {
        *ts = truncate_to_second(*ts);
    }
}

/// Cuts `s` to at most `max` bytes on a char boundary.
pub fn truncate_on_char_boundary(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
}

/// The per-container termination message budget: 12 KiB shared by every regular, init and
/// ephemeral container of the spec (all of it when the spec has none).
pub fn termination_message_budget(spec: Option<&PodSpec>) -> usize {
    let count = spec.map_or(0, |s| {
        s.containers.len()
            + s.init_containers.as_ref().map_or(0, Vec::len)
            + s.ephemeral_containers.as_ref().map_or(0, Vec::len)
    });
    MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH
        .checked_div(count)
        .unwrap_or(MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH)
}

fn normalize_state(state: &mut Option<ContainerState>, budget: usize) {
    let Some(state) = state else { return };
    if let Some(running) = &mut state.running {
        truncate_time(&mut running.started_at);
    }
    if let Some(terminated) = &mut state.terminated {
        truncate_time(&mut terminated.started_at);
        truncate_time(&mut terminated.finished_at);
        if let Some(message) = &mut terminated.message {
            truncate_on_char_boundary(message, budget);
        }
    }
}

fn normalize_container_statuses(statuses: &mut [ContainerStatus], budget: usize) {
    for status in statuses {
        normalize_state(&mut status.state, budget);
        normalize_state(&mut status.last_state, budget);
    }
}

/// Upstream `SortInitContainerStatuses`: moves init statuses into spec order; statuses whose
/// names are not in the spec end up after the matched ones.
pub fn sort_init_container_statuses(spec: Option<&PodSpec>, statuses: &mut [ContainerStatus]) {
    let Some(init) = spec.and_then(|s| s.init_containers.as_ref()) else {
        return;
    };
    let mut current = 0;
    for container in init {
        if let Some(offset) = statuses[current..]
            .iter()
            .position(|s| s.name == container.name)
        {
            statuses.swap(current, current + offset);
            current += 1;
        }
    }
}

/// R10: second precision for every timestamp, termination messages within budget, regular and
/// ephemeral statuses sorted by name, init statuses in spec order. Idempotent.
pub fn normalize_status(spec: Option<&PodSpec>, status: &mut PodStatus) {
    let budget = termination_message_budget(spec);
    truncate_time(&mut status.start_time);
    for condition in status.conditions.iter_mut().flatten() {
        truncate_time(&mut condition.last_probe_time);
        truncate_time(&mut condition.last_transition_time);
    }
    if let Some(statuses) = &mut status.container_statuses {
        normalize_container_statuses(statuses, budget);
        statuses.sort_by(|a, b| text_cmp(&a.name, &b.name));
    }
    if let Some(statuses) = &mut status.init_container_statuses {
        normalize_container_statuses(statuses, budget);
        sort_init_container_statuses(spec, statuses);
    }
    if let Some(statuses) = &mut status.ephemeral_container_statuses {
        normalize_container_statuses(statuses, budget);
        statuses.sort_by(|a, b| text_cmp(&a.name, &b.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::{
        ContainerStateRunning, ContainerStateTerminated, EphemeralContainer,
    };

    fn message_status(name: &str, len: usize) -> ContainerStatus {
        ContainerStatus {
            name: name.to_owned(),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    message: Some("x".repeat(len)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn last_message_len(s: &ContainerStatus) -> usize {
        s.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .len()
    }

    #[test]
    fn test_status_normalization_enforces_max_bytes() {
        // Upstream: 48 statuses, messages of 192/200/208 bytes, 16 each of init, regular and
        // ephemeral, and an empty spec (so the budget stays 12288).
        let sizes = [192, 200, 208];
        let mk = |prefix: &str| -> Vec<ContainerStatus> {
            (0..16)
                .map(|i| message_status(&format!("{prefix}{i:02}"), sizes[i % 3]))
                .collect()
        };
        let mut status = PodStatus {
            init_container_statuses: Some(mk("init")),
            container_statuses: Some(mk("c")),
            ephemeral_container_statuses: Some(mk("e")),
            ..Default::default()
        };
        normalize_status(Some(&PodSpec::default()), &mut status);
        let init = status.init_container_statuses.as_ref().unwrap();
        let total: usize = init.iter().map(last_message_len).sum();
        for s in init {
            let len = last_message_len(s);
            assert!((192..=256).contains(&len), "{len}");
        }
        assert!(total <= MAX_POD_TERMINATION_MESSAGE_LOG_LENGTH);
    }

    #[test]
    fn r10_messages_over_budget_are_cut_per_container() {
        // Three spec containers and one ephemeral container share 12288 bytes: 3072 each.
        let mut spec = spec_with(&[], &["a", "b", "c"]);
        spec.ephemeral_containers = Some(vec![EphemeralContainer {
            name: "dbg".into(),
            ..Default::default()
        }]);
        let mut status = PodStatus {
            container_statuses: Some(vec![message_status("a", 10_000)]),
            ..Default::default()
        };
        normalize_status(Some(&spec), &mut status);
        assert_eq!(
            last_message_len(&status.container_statuses.as_ref().unwrap()[0]),
            3072
        );
    }

    #[test]
    fn r10_truncation_never_splits_a_utf8_character() {
        let mut s = "é".repeat(10); // 20 bytes
        truncate_on_char_boundary(&mut s, 5);
        assert_eq!(s, "éé");
        let mut short = "abc".to_owned();
        truncate_on_char_boundary(&mut short, 5);
        assert_eq!(short, "abc");
    }

    #[test]
    fn test_status_normalize_time_stamp() {
        let now = ts("2026-01-02T03:04:05.678901234Z");
        let second = ts("2026-01-02T03:04:05Z");
        let running = ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(now)),
            }),
            ..Default::default()
        };
        let terminated = ContainerState {
            terminated: Some(ContainerStateTerminated {
                started_at: Some(Time(now)),
                finished_at: Some(Time(now)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cs = |name: &str| ContainerStatus {
            name: name.into(),
            state: Some(running.clone()),
            last_state: Some(terminated.clone()),
            ..Default::default()
        };
        let mut status = PodStatus {
            start_time: Some(Time(now)),
            conditions: Some(vec![condition_at("Ready", "True", now)]),
            container_statuses: Some(vec![cs("c")]),
            init_container_statuses: Some(vec![cs("i")]),
            ephemeral_container_statuses: Some(vec![cs("e")]),
            ..Default::default()
        };
        normalize_status(None, &mut status);
        assert_eq!(status.start_time, Some(Time(second)));
        let c = &status.conditions.as_ref().unwrap()[0];
        assert_eq!(c.last_transition_time, Some(Time(second)));
        for list in [
            &status.container_statuses,
            &status.init_container_statuses,
            &status.ephemeral_container_statuses,
        ] {
            let s = &list.as_ref().unwrap()[0];
            let r = s.state.as_ref().unwrap().running.as_ref().unwrap();
            assert_eq!(r.started_at, Some(Time(second)));
            let t = s.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
            assert_eq!(t.started_at, Some(Time(second)));
            assert_eq!(t.finished_at, Some(Time(second)));
        }
    }

    #[test]
    fn r10_times_before_the_epoch_round_to_the_earlier_second() {
        assert_eq!(
            truncate_to_second(ts("1969-12-31T23:59:58.5Z")),
            ts("1969-12-31T23:59:58Z")
        );
    }

    #[test]
    fn r10_sorts_regular_by_name_and_init_in_spec_order() {
        let spec = spec_with(&["i3", "i1", "i2"], &["b", "a"]);
        let mut status = PodStatus {
            container_statuses: Some(vec![status_named("b"), status_named("a")]),
            init_container_statuses: Some(vec![
                status_named("zz"),
                status_named("i2"),
                status_named("i1"),
                status_named("i3"),
            ]),
            ..Default::default()
        };
        normalize_status(Some(&spec), &mut status);
        assert_eq!(names(&status.container_statuses), ["a", "b"]);
        assert_eq!(
            names(&status.init_container_statuses),
            ["i3", "i1", "i2", "zz"]
        );
    }
}
