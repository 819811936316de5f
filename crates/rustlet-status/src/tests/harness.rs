//! The test fixture: upstream's `newTestManager`, `consumeUpdates`, `verifyUpdates`,
//! `verifyActions`, `testSyncBatch`, driven by hand on paused tokio time.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use rustlet_core::PodUid;
use rustlet_core::deletion::FixedDeletionSafety;
use rustlet_core::pod::is_static_pod;

use crate::config::StatusManagerConfig;
use crate::manager::{StatusManager, StatusManagerDeps};
use crate::metrics::StatusMetrics;
use crate::seams::{Clock, SystemClock};
use crate::sync::{BatchKind, Syncer};
use crate::testing::{FakePodManager, FakePodStatusClient};

pub(super) struct Harness {
    pub manager: StatusManager,
    pub syncer: Syncer,
    pub client: FakePodStatusClient,
    pub pods: FakePodManager,
    pub metrics: StatusMetrics,
}

/// Upstream `getTestPod()`.
pub(super) fn test_pod() -> Pod {
    rustlet_core::testutil::test_pod()
}

pub(super) fn uid(s: &str) -> PodUid {
    PodUid::new(s)
}

/// Upstream `getRandomPodStatus()`: a status whose only field is a message.
pub(super) fn random_status(n: u64) -> PodStatus {
    PodStatus {
        message: Some(format!("random-{n}")),
        ..Default::default()
    }
}

impl Harness {
    /// Upstream `newTestManager` with the test pod in the pod manager and in the API.
    pub fn new(config: StatusManagerConfig) -> Self {
        Self::with(config, FixedDeletionSafety::default())
    }

    pub fn upstream() -> Self {
        Self::new(StatusManagerConfig::upstream())
    }

    pub fn with(config: StatusManagerConfig, safety: FixedDeletionSafety) -> Self {
        Self::with_clock(config, safety, Arc::new(SystemClock))
    }

    pub fn with_clock(
        config: StatusManagerConfig,
        safety: FixedDeletionSafety,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let client = FakePodStatusClient::new();
        let pods = FakePodManager::new();
        pods.add_pod(test_pod());
        client.put_pod(test_pod());
        let metrics = StatusMetrics::default();
        let deps = StatusManagerDeps {
            client: Some(Arc::new(client.clone())),
            pods: Arc::new(pods.clone()),
            safety: Arc::new(safety),
            latency: None,
            clock,
            metrics: metrics.clone(),
        };
        let manager = StatusManager::new(deps, config);
        let syncer = manager.take_syncer();
        Self {
            manager,
            syncer,
            client,
            pods,
            metrics,
        }
    }

    /// Drains the kick channel, running a kick batch per kick; returns the syncs.
    pub async fn consume_updates(&mut self) -> usize {
        let mut count = 0;
        while self.syncer.kick_rx.try_recv().is_ok() {
            count += self.syncer.sync_batch(BatchKind::Kick).await;
        }
        count
    }

    pub async fn verify_updates(&mut self, expected: usize) {
        assert_eq!(self.consume_updates().await, expected, "syncs");
    }

    /// Drains, then compares the recorded verbs and clears them.
    pub async fn verify_actions(&mut self, expected: &[&str]) {
        self.consume_updates().await;
        assert_eq!(self.client.take_verbs(), expected, "actions");
    }

    pub async fn sync_batch(&mut self, kind: BatchKind) -> usize {
        self.syncer.sync_batch(kind).await
    }

    /// Upstream `testSyncBatch`: copy every cached status into the pod manager's pod (and mirror)
    /// so reconciliation finds nothing, then run a full batch.
    pub async fn test_sync_batch(&mut self) -> usize {
        for pod in self.pods.pods() {
            let pod_uid = uid(pod.metadata.uid.as_deref().unwrap_or_default());
            if let Some(status) = self.manager.get_versioned_status(&pod_uid) {
                self.pods.set_status(&pod_uid, status.status.clone());
                if is_static_pod(&pod)
                    && let Some(mirror) = crate::seams::PodManager::mirror_pod_of(&self.pods, &pod)
                {
                    self.pods.set_status(
                        &uid(mirror.metadata.uid.as_deref().unwrap_or_default()),
                        status.status,
                    );
                }
            }
        }
        self.sync_batch(BatchKind::Full).await
    }
}
