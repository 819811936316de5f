//! The order in which a pod's containers stop (upstream `terminationOrdering`,
//! `pkg/kubelet/kuberuntime/kuberuntime_termination_order.go`): every container's `preStop`
//! hook runs at once, the regular containers then stop at once, and each sidecar (an init
//! container with `restartPolicy: Always`) waits, within what is left of its grace period, until
//! every regular container and every sidecar after it in the spec has stopped: the sidecars stop
//! after the regular containers, in reverse order. A sidecar whose `preStop` hook used up the
//! grace period does not wait (upstream waits `if gracePeriod > 0`).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use rustlet_core::pod::is_restartable_init_container;
use tokio::sync::watch;
use tokio::time::Instant;

/// Who waits for whom, for one stop of a pod.
pub(crate) struct TerminationOrdering {
    /// Per container name: the stops it waits for.
    prereqs: HashMap<String, Vec<watch::Receiver<bool>>>,
    /// Per container name: set once it stopped (at once for one that does not run).
    terminated: HashMap<String, watch::Sender<bool>>,
}

impl TerminationOrdering {
    /// The ordering of `pod`'s containers, of which those named in `running` are stopped.
    pub(crate) fn new(pod: &Pod, running: &[&str]) -> Self {
        let mut ordering = Self {
            prereqs: HashMap::new(),
            terminated: HashMap::new(),
        };
        let Some(spec) = pod.spec.as_ref() else {
            return ordering;
        };
        let mut channel = |name: &str| {
            let (tx, rx) = watch::channel(!running.contains(&name));
            ordering.terminated.insert(name.to_owned(), tx);
            rx
        };
        let regular: Vec<watch::Receiver<bool>> =
            spec.containers.iter().map(|c| channel(&c.name)).collect();
        let mut later_sidecar: Option<watch::Receiver<bool>> = None;
        let mut prereqs = HashMap::new();
        for container in spec.init_containers.iter().flatten().rev() {
            let done = channel(&container.name);
            if is_restartable_init_container(container) {
                let mut waits = regular.clone();
                waits.extend(later_sidecar.replace(done));
                prereqs.insert(container.name.clone(), waits);
            }
        }
        ordering.prereqs = prereqs;
        ordering
    }

    /// Waits until `name` may stop, at most `grace`; returns how long it waited (upstream
    /// `waitForTurn`).
    pub(crate) async fn wait_for_turn(&self, name: &str, grace: Duration) -> Duration {
        let start = Instant::now();
        if grace.is_zero() {
            return Duration::ZERO;
        }
        let Some(waits) = self.prereqs.get(name) else {
            return Duration::ZERO;
        };
        let all = async {
            for rx in waits {
                let mut rx = rx.clone();
                // A sender dropped: nothing more to wait for.
                let _ = rx.wait_for(|stopped| *stopped).await;
            }
        };
        let _ = tokio::time::timeout(grace, all).await;
        start.elapsed()
    }

    /// `name` has stopped (upstream `containerTerminated`).
    pub(crate) fn terminated(&self, name: &str) {
        if let Some(tx) = self.terminated.get(name) {
            tx.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "side-1", "restartPolicy": "Always"},
                    {"name": "init"},
                    {"name": "side-2", "restartPolicy": "Always"},
                ],
                "containers": [{"name": "a"}, {"name": "b"}],
            }
        }))
        .unwrap()
    }

    /// Upstream `TestTerminationOrderingSidecarStopAfterMain` and
    /// `TestTerminationOrderingSidecarsInReverseOrder`: the sidecars stop after every regular
    /// container, the later sidecar first; a regular container waits for nothing.
    #[tokio::test(start_paused = true)]
    async fn sidecars_stop_after_the_regular_containers_in_reverse_order() {
        let pod = pod();
        let ordering = Arc::new(TerminationOrdering::new(
            &pod,
            &["side-1", "side-2", "a", "b"],
        ));
        let order = Arc::new(Mutex::new(Vec::new()));
        let grace = Duration::from_secs(30);
        let stop = |name: &'static str, after: Duration| {
            let (ordering, order) = (ordering.clone(), order.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                ordering.wait_for_turn(name, grace).await;
                order.lock().unwrap().push(name);
                ordering.terminated(name);
            })
        };
        let tasks = [
            stop("side-1", Duration::ZERO),
            stop("side-2", Duration::ZERO),
            stop("a", Duration::from_secs(1)),
            stop("b", Duration::from_secs(3)),
        ];
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["a", "b", "side-2", "side-1"]);
    }

    /// Upstream `waitForTurn`: the wait ends with the grace period, and a container that does
    /// not run is not waited for.
    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_with_the_grace_period_and_skips_what_does_not_run() {
        let pod = pod();
        let ordering = TerminationOrdering::new(&pod, &["side-1", "a"]);
        let waited = ordering
            .wait_for_turn("side-1", Duration::from_secs(5))
            .await;
        assert_eq!(waited, Duration::from_secs(5), "a never stopped");
        ordering.terminated("a");
        let waited = ordering
            .wait_for_turn("side-1", Duration::from_secs(5))
            .await;
        assert_eq!(waited, Duration::ZERO, "b and side-2 do not run");
        assert_eq!(
            ordering.wait_for_turn("a", Duration::from_secs(5)).await,
            Duration::ZERO
        );
    }
}
