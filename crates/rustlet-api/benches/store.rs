//! The local store's status writes: what local mode pays for each pod status the status
//! manager writes (a 1,000-pod storm writes ~1,500), beside the floors it is made of.
//!
//! ```sh
//! cargo bench -p rustlet-api --bench store
//! ```
//!
//! * `status_patch/{store,client}_pending_then_running`: one strategic-merge status patch of a
//!   stored pod (the agent bench's pod: one container, two emptyDir volumes), its Pending and
//!   its Running patch in turn, as `LocalPodStatusClient` sends it (UID precondition): through
//!   `Store::patch_status`, and through the client with the written pod decoded as the status
//!   manager takes it.
//! * `status_patch/floor_*`: the stored pod's whole text parsed and written again (what a
//!   write that treats the pod as one tree pays before any work of its own), its status alone,
//!   and the pod decoded from its text and through a `Value` tree.
//! * `watch/pod_decoded_and_cached`: a written pod as the pod watch delivers it to the pod
//!   cache, beside decoding it through a `Value` tree.
//! * `events/local_recorder_event`: one event about a pod into the store, as local mode's
//!   `LocalEventRecorder` writes it (a storm writes three per container).

use std::hint::black_box;
use std::sync::Arc;

use criterion::Criterion;
use k8s_openapi::api::core::v1::Pod;
use rustlet_api::local::LocalPodStatusClient;
use rustlet_api::local::store::{Kind, ObjectRef, Store};
use rustlet_status::PodStatusClient;
use serde_json::{Value, json};

const PODS: usize = 1000;

/// The agent bench's manifest, as the directory intake stores it.
fn pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("p{i}"),
            "namespace": "default",
            "annotations": {"kubernetes.io/config.source": "file"},
        },
        "spec": {
            "nodeName": "bench",
            "containers": [{
                "name": "c",
                "image": "busybox",
                "volumeMounts": [
                    {"name": "disk", "mountPath": "/disk"},
                    {"name": "mem", "mountPath": "/mem"},
                ],
            }],
            "volumes": [
                {"name": "disk", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ],
        },
    })
}

fn conditions(ready: bool) -> Value {
    let unready = (!ready).then_some("containers with unready status: [c]");
    let condition = |type_: &str, status: bool, message: Option<&str>| {
        let mut c = json!({
            "lastTransitionTime": "2026-12-07T09:39:05Z",
            "status": if status { "True" } else { "False" },
            "type": type_,
        });
        if let Some(message) = message {
            c["message"] = json!(message);
            c["reason"] = json!("ContainersNotReady");
        }
        c
    };
    json!([
        condition("PodReadyToStartContainers", ready, None),
        condition("Initialized", true, None),
        condition("Ready", ready, unready),
        condition("ContainersReady", ready, unready),
        condition("PodScheduled", true, None),
    ])
}

/// The status manager's patch of a pod: its first (Pending, the container being created), or
/// once it runs.
fn status_patch(uid: &str, running: bool) -> Value {
    let mut container = json!({
        "image": "busybox", "imageID": "", "name": "c", "ready": false,
        "restartCount": 0, "started": false,
        "state": {"waiting": {"reason": "ContainerCreating"}},
        "volumeMounts": [
            {"mountPath": "/disk", "name": "disk"},
            {"mountPath": "/mem", "name": "mem"},
        ],
    });
    let mut status = json!({
        "conditions": conditions(running),
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "phase": "Pending",
        "startTime": "2026-12-07T09:39:05Z",
    });
    if running {
        container["containerID"] = json!("simulated://0000000000000002");
        container["imageID"] = json!("busybox");
        container["ready"] = json!(true);
        container["started"] = json!(true);
        container["state"] = json!({"running": {"startedAt": "2026-12-07T09:39:05Z"}});
        status["phase"] = json!("Running");
        status["podIP"] = json!("10.88.0.2");
        status["podIPs"] = json!([{"ip": "10.88.0.2"}]);
    }
    status["containerStatuses"] = json!([container]);
    json!({"metadata": {"uid": uid}, "status": status})
}

/// A store of `PODS` pods; each pod's reference, UID, and its two patches (applied in turn,
/// every patch is a write).
fn filled() -> (Arc<Store>, Vec<(ObjectRef, Value, Value)>) {
    let store = Arc::new(Store::default());
    let pods = (0..PODS)
        .map(|i| {
            let created = store.create(pod(i)).expect("create");
            let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
            let reference = ObjectRef::new(Kind::Pod, "default", &format!("p{i}"));
            (
                reference,
                status_patch(&uid, false),
                status_patch(&uid, true),
            )
        })
        .collect();
    (store, pods)
}

/// The next write, turn by turn: every pod's Pending patch, then every pod's Running patch,
/// and again (so each patch changes the pod).
fn next_write<'a>(
    pods: &'a [(ObjectRef, Value, Value)],
    turn: &mut usize,
) -> (&'a ObjectRef, &'a Value) {
    let (reference, pending, running) = &pods[*turn % PODS];
    let pending_turn = (*turn / PODS).is_multiple_of(2);
    *turn += 1;
    (reference, if pending_turn { pending } else { running })
}

fn status_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("status_patch");
    let (store, pods) = filled();
    // Every pod Running once, so the floors measure a pod as the storm leaves it.
    for (reference, _, running) in &pods {
        store.patch_status(reference, running).expect("patch");
    }
    let mut turn = 0usize;
    group.bench_function("store_pending_then_running", |b| {
        b.iter(|| {
            let (reference, patch) = next_write(&pods, &mut turn);
            black_box(store.patch_status(reference, patch).expect("patch"));
        })
    });
    let client = LocalPodStatusClient::new(store.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    group.bench_function("client_pending_then_running", |b| {
        b.iter(|| {
            let (reference, patch) = next_write(&pods, &mut turn);
            let pod: Pod = runtime
                .block_on(client.patch_pod_status("default", &reference.name, patch))
                .expect("patch");
            black_box(pod);
        })
    });
    let stored = store.get(&pods[0].0).expect("get");
    let text = stored.to_string();
    let status_text = stored["status"].to_string();
    group.bench_function("floor_whole_pod_parsed_and_written", |b| {
        b.iter(|| {
            let value: Value = serde_json::from_str(black_box(&text)).expect("parse");
            black_box(value.to_string());
        })
    });
    group.bench_function("floor_status_parsed_and_written", |b| {
        b.iter(|| {
            let value: Value = serde_json::from_str(black_box(&status_text)).expect("parse");
            black_box(value.to_string());
        })
    });
    group.bench_function("floor_whole_pod_decoded_from_text", |b| {
        b.iter(|| {
            let pod: Pod = serde_json::from_str(black_box(&text)).expect("decode");
            black_box(pod);
        })
    });
    group.bench_function("floor_whole_pod_decoded_through_a_value", |b| {
        b.iter(|| {
            let value: Value = serde_json::from_str(black_box(&text)).expect("parse");
            let pod: Pod = serde_json::from_value(value).expect("decode");
            black_box(pod);
        })
    });
    group.finish();
    watch_delivery(c, &store, &pods);
}

/// What the pod watch pays for each version the store writes: the pod decoded from its text
/// and put in the pod cache (which gives back its lists' spare room), beside decoding it
/// through a `Value` tree (exact lists, nothing to give back), as it was before.
fn watch_delivery(c: &mut Criterion, store: &Store, pods: &[(ObjectRef, Value, Value)]) {
    use kube::runtime::watcher::Event;
    use rustlet_api::pod_cache::PodCache;
    let mut group = c.benchmark_group("watch");
    let texts: Vec<String> = pods
        .iter()
        .map(|(reference, _, _)| store.get(reference).expect("get").to_string())
        .collect();
    let cache = PodCache::new();
    let mut turn = 0usize;
    group.bench_function("pod_decoded_and_cached", |b| {
        b.iter(|| {
            let text = &texts[turn % PODS];
            turn += 1;
            let pod: Pod = serde_json::from_str(black_box(text)).expect("decode");
            cache.apply(Event::Apply(pod));
        })
    });
    group.bench_function("pod_decoded_through_a_value_and_cached", |b| {
        b.iter(|| {
            let text = &texts[turn % PODS];
            turn += 1;
            let value: Value = serde_json::from_str(black_box(text)).expect("parse");
            let pod: Pod = serde_json::from_value(value).expect("decode");
            cache.apply(Event::Apply(pod));
        })
    });
    group.finish();
}

/// One event about a pod into a store of 1,000 pods' events (a storm records three per
/// container: Pulled, Created, Started), as local mode records it.
fn events(c: &mut Criterion) {
    use rustlet_api::local::events::LocalEventRecorder;
    use rustlet_volume::events::{EventKind, EventRecorder};
    let mut group = c.benchmark_group("events");
    let store = Arc::new(Store::default());
    let recorder = LocalEventRecorder::new(
        store.clone(),
        Arc::new(rustlet_status::SystemClock),
        "kubelet",
        "bench",
    );
    let pods: Vec<Pod> = (0..PODS)
        .map(|i| serde_json::from_value(store.create(pod(i)).expect("create")).expect("pod"))
        .collect();
    let mut turn = 0usize;
    group.bench_function("local_recorder_event", |b| {
        b.iter(|| {
            let pod = &pods[turn % PODS];
            // A new message each time: each event is a new object, as a storm's are.
            let message = format!("Started container c ({turn})");
            turn += 1;
            recorder.event(pod, EventKind::Normal, "Started", &message);
        })
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    status_writes(&mut c);
    events(&mut c);
    c.final_summary();
}
