//! rustlet-status as a library: a status manager over a `PodStatusClient` of your own. This one
//! talks to no API server: it prints each request the manager would send and answers as a
//! server would, so you can see what the manager does with one status update.
//!
//! Run with `cargo run -p rustlet-status --example print_client`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::PodUid;
use rustlet_core::deletion::FixedDeletionSafety;
use rustlet_status::{
    ClientError, PodManager, PodStatusClient, StatusManager, StatusManagerConfig,
    StatusManagerDeps, UidTranslations, UpdateResult,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A client that prints instead of calling an API server, and tells `main` about each patch.
struct PrintingClient {
    /// The pods "on the server".
    pods: Mutex<HashMap<String, Pod>>,
    patched: mpsc::UnboundedSender<serde_json::Value>,
}

#[async_trait]
impl PodStatusClient for PrintingClient {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClientError> {
        println!("GET    /api/v1/namespaces/{namespace}/pods/{name}");
        let pods = self.pods.lock().expect("not poisoned");
        pods.get(name)
            .cloned()
            .ok_or_else(|| ClientError::NotFound(name.to_owned()))
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Pod, ClientError> {
        println!("PATCH  /api/v1/namespaces/{namespace}/pods/{name}/status");
        println!(
            "{}",
            serde_json::to_string_pretty(patch).expect("a patch is JSON")
        );
        let pod = {
            let mut pods = self.pods.lock().expect("not poisoned");
            let pod = pods
                .get_mut(name)
                .ok_or_else(|| ClientError::NotFound(name.to_owned()))?;
            // A real server applies the strategic merge patch; the phase is enough here.
            if let Some(phase) = patch["status"]["phase"].as_str() {
                pod.status.get_or_insert_with(PodStatus::default).phase = Some(phase.to_owned());
            }
            pod.clone()
        };
        let _ = self.patched.send(patch.clone());
        Ok(pod)
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClientError> {
        println!("DELETE /api/v1/namespaces/{namespace}/pods/{name} (uid precondition {uid})");
        Ok(())
    }
}

/// The pods this node knows: here, one fixed pod and no static pods.
struct OnePod(Arc<Pod>);

impl PodManager for OnePod {
    fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        (self.0.metadata.uid.as_deref() == Some(uid.as_str())).then(|| self.0.clone())
    }
    fn mirror_pod_of(&self, _pod: &Pod) -> Option<Arc<Pod>> {
        None
    }
    fn translate_pod_uid(&self, uid: &PodUid) -> PodUid {
        uid.clone()
    }
    fn uid_translations(&self) -> UidTranslations {
        UidTranslations::default()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pod = Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some("web".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some("6f0c1b7e-0000-4000-8000-000000000001".to_owned()),
            resource_version: Some("1".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Pending".to_owned()),
            ..PodStatus::default()
        }),
    });
    let (patched, mut patches) = mpsc::unbounded_channel();
    let client = PrintingClient {
        pods: Mutex::new(HashMap::from([("web".to_owned(), (*pod).clone())])),
        patched,
    };
    let manager = StatusManager::new(
        StatusManagerDeps::new(
            Some(Arc::new(client)),
            Arc::new(OnePod(pod.clone())),
            Arc::new(FixedDeletionSafety::default()),
        ),
        StatusManagerConfig::default(),
    );
    let cancel = CancellationToken::new();
    let task = manager
        .start(cancel.clone())
        .expect("a manager with a client starts");

    let running = PodStatus {
        phase: Some("Running".to_owned()),
        ..PodStatus::default()
    };
    match manager.set_pod_status(&pod, running) {
        UpdateResult::Stored(version) => println!("stored version {version}; syncing"),
        other => panic!("expected the status stored, got {other:?}"),
    }

    // The sync task sends the patch on its own; wait for it, then stop the task.
    let patch = patches.recv().await.expect("the manager sends a patch");
    assert_eq!(patch["status"]["phase"], "Running");
    assert_eq!(
        patch["metadata"]["uid"], "6f0c1b7e-0000-4000-8000-000000000001",
        "every patch carries the pod's UID as a precondition"
    );
    cancel.cancel();
    task.await.expect("the sync task stops cleanly");
    println!("synced; stopped");
}
