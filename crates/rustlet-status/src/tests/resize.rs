//! Upstream `TestPodResizeConditions`, `TestClearPodResizeInProgressCondition`,
//! `TestRecordInProgressResizeCount`, `TestRecordPendingResizesCount`,
//! `TestBackfillPodResizeConditions` (R48-R54).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};

use super::harness::{Harness, test_pod, uid};

fn summary(conditions: &[PodCondition]) -> Vec<(String, String, String, i64)> {
    conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
                c.observed_generation.unwrap_or(0),
            )
        })
        .collect()
}

fn row(t: &str, r: &str, m: &str, g: i64) -> (String, String, String, i64) {
    (t.into(), r.into(), m.into(), g)
}

#[test]
fn test_pod_resize_conditions() {
    let h = Harness::upstream();
    let m = &h.manager;
    let id = uid("12345");
    let get = || summary(&m.get_pod_resize_conditions(&id));
    assert!(get().is_empty());

    assert_eq!(
        m.set_pod_resize_in_progress_condition(&id, "some-reason", "some-message", 1),
        (1, true)
    );
    assert_eq!(
        get(),
        [row("PodResizeInProgress", "some-reason", "some-message", 1)]
    );
    assert_eq!(
        m.set_pod_resize_in_progress_condition(&id, "", "", 1),
        (1, false)
    );
    assert_eq!(
        get(),
        [row("PodResizeInProgress", "some-reason", "some-message", 1)]
    );
    assert_eq!(
        m.set_pod_resize_in_progress_condition(&id, "", "", 2),
        (1, false),
        "generation kept"
    );
    assert_eq!(
        get(),
        [row("PodResizeInProgress", "some-reason", "some-message", 1)]
    );

    m.clear_pod_resize_in_progress_condition(&id);
    assert_eq!(
        m.set_pod_resize_in_progress_condition(&id, "", "", 2),
        (2, true)
    );
    assert_eq!(get(), [row("PodResizeInProgress", "", "", 2)]);

    assert!(m.set_pod_resize_pending_condition(&id, "some-reason", "some-message", 1));
    assert_eq!(
        get(),
        [
            row("PodResizePending", "Deferred", "some-message", 1),
            row("PodResizeInProgress", "", "", 2)
        ]
    );
    assert!(m.is_pod_resize_deferred(&id) && !m.is_pod_resize_infeasible(&id));

    assert!(
        !m.set_pod_resize_pending_condition(&id, "Deferred", "some-other-message", 1),
        "message only"
    );
    assert_eq!(
        get()[0],
        row("PodResizePending", "Deferred", "some-other-message", 1)
    );

    assert!(m.set_pod_resize_pending_condition(&id, "Infeasible", "some-message", 3));
    assert!(m.is_pod_resize_infeasible(&id) && !m.is_pod_resize_deferred(&id));

    assert_eq!(m.clear_pod_resize_in_progress_condition(&id), (2, true));
    assert_eq!(
        get(),
        [row("PodResizePending", "Infeasible", "some-message", 3)]
    );
    m.clear_pod_resize_pending_condition(&id);
    assert!(get().is_empty());
}

#[test]
fn test_clear_pod_resize_in_progress_condition() {
    let h = Harness::upstream();
    let id = uid("12345");
    assert_eq!(
        h.manager.clear_pod_resize_in_progress_condition(&id),
        (0, false)
    );
    assert!(h.manager.get_pod_resize_conditions(&id).is_empty());
    h.manager
        .set_pod_resize_in_progress_condition(&id, "", "", 1);
    assert_eq!(
        h.manager.clear_pod_resize_in_progress_condition(&id),
        (1, true)
    );
    assert!(h.manager.get_pod_resize_conditions(&id).is_empty());
}

fn pending_series(h: &Harness) -> BTreeMap<String, i64> {
    let mut registry = prometheus_client::registry::Registry::default();
    h.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("pod_pending_resizes{reason=\""))
        .filter_map(|l| {
            let (reason, value) = l.split_once("\"} ")?;
            Some((reason.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn test_record_in_progress_resize_count() {
    let h = Harness::upstream();
    assert_eq!(h.metrics.in_progress_resizes.get(), 0, "no pods");
    h.manager
        .set_pod_resize_pending_condition(&uid("a"), "Deferred", "", 1);
    assert_eq!(h.metrics.in_progress_resizes.get(), 0, "only pending");
    h.manager
        .set_pod_resize_in_progress_condition(&uid("a"), "", "", 1);
    assert_eq!(h.metrics.in_progress_resizes.get(), 1);
    h.manager
        .set_pod_resize_in_progress_condition(&uid("b"), "Error", "boom", 1);
    assert_eq!(h.metrics.in_progress_resizes.get(), 2);
}

#[test]
fn test_record_pending_resizes_count() {
    let h = Harness::upstream();
    assert!(pending_series(&h).is_empty());
    h.manager
        .set_pod_resize_pending_condition(&uid("a"), "Deferred", "", 1);
    assert_eq!(pending_series(&h), BTreeMap::from([("deferred".into(), 1)]));
    h.manager
        .set_pod_resize_pending_condition(&uid("a"), "Infeasible", "", 1);
    h.manager
        .set_pod_resize_pending_condition(&uid("b"), "Infeasible", "", 1);
    assert_eq!(
        pending_series(&h),
        BTreeMap::from([("infeasible".into(), 2)])
    );
    h.manager
        .set_pod_resize_pending_condition(&uid("b"), "Deferred", "", 1);
    assert_eq!(
        pending_series(&h),
        BTreeMap::from([("deferred".into(), 1), ("infeasible".into(), 1)])
    );
    h.manager.clear_pod_resize_pending_condition(&uid("a"));
    h.manager.clear_pod_resize_pending_condition(&uid("b"));
    h.manager
        .set_pod_resize_in_progress_condition(&uid("c"), "", "", 1);
    assert!(
        pending_series(&h).is_empty(),
        "in progress only: no pending series"
    );
}

fn pod_with(uid_: &str, conditions: Vec<PodCondition>) -> Pod {
    let mut pod = test_pod();
    pod.metadata.uid = Some(uid_.into());
    pod.status = Some(PodStatus {
        conditions: Some(conditions),
        ..Default::default()
    });
    pod
}

fn c(type_: &str, reason: &str, generation: i64) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: (!reason.is_empty()).then(|| reason.to_owned()),
        message: Some(format!("{type_} message")),
        observed_generation: Some(generation),
        ..Default::default()
    }
}

#[test]
fn test_backfill_pod_resize_conditions() {
    let h = Harness::upstream();
    let pods = vec![
        pod_with("p1", vec![c("PodResizeInProgress", "", 1)]),
        pod_with("p2", vec![c("PodResizeInProgress", "Error", 2)]),
        pod_with(
            "p3",
            vec![
                c("PodResizeInProgress", "", 3),
                c("PodResizePending", "Deferred", 3),
            ],
        ),
        pod_with("p4", vec![c("PodResizePending", "Infeasible", 4)]),
        pod_with("p5", vec![c("PodScheduled", "", 5)]),
    ];
    h.manager.backfill_pod_resize_conditions(&pods);
    assert_eq!(
        summary(&h.manager.get_pod_resize_conditions(&uid("p2"))),
        [row(
            "PodResizeInProgress",
            "Error",
            "PodResizeInProgress message",
            2
        )]
    );
    assert_eq!(h.manager.get_pod_resize_conditions(&uid("p3")).len(), 2);
    assert!(h.manager.is_pod_resize_infeasible(&uid("p4")));
    assert!(h.manager.get_pod_resize_conditions(&uid("p5")).is_empty());
    assert_eq!(
        pending_series(&h),
        BTreeMap::from([("deferred".into(), 1), ("infeasible".into(), 1)])
    );
    assert_eq!(h.metrics.in_progress_resizes.get(), 3);
}

#[test]
fn r25_orphan_removal_drops_resize_conditions() {
    let h = Harness::upstream();
    h.manager
        .set_pod_resize_in_progress_condition(&uid("gone"), "", "", 1);
    h.manager.remove_orphaned_statuses(&Default::default());
    assert!(h.manager.get_pod_resize_conditions(&uid("gone")).is_empty());
    assert_eq!(h.metrics.in_progress_resizes.get(), 0);
}
