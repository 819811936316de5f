//! The pod cache: events, static/mirror translation, and the watch's HTTP shape.

use futures::pin_mut;
use http::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use kube::runtime::watcher::Event;
use rustlet_core::PodUid;
use rustlet_core::pod::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
use rustlet_status::PodManager;
use rustlet_volume::populator::PodSource;
use serde_json::json;

use super::PodCache;

fn pod(name: &str, uid: &str, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn events_build_the_view_and_a_relist_replaces_it() {
    let cache = PodCache::new();
    let changes = cache.subscribe();
    assert!(!cache.all_sources_ready());
    cache.apply(Event::Init);
    cache.apply(Event::InitApply(pod("a", "uid-a", &[])));
    cache.apply(Event::InitApply(pod("b", "uid-b", &[])));
    cache.apply(Event::InitDone);
    assert!(cache.all_sources_ready());
    assert!(changes.has_changed().unwrap());
    assert!(cache.pod_by_uid(&PodUid::new("uid-a")).is_some());
    cache.apply(Event::Delete(pod("a", "uid-a", &[])));
    assert!(cache.pod_by_uid(&PodUid::new("uid-a")).is_none());
    cache.apply(Event::Apply(pod("c", "uid-c", &[])));
    // A relist without b: b is gone, c stays only if listed.
    cache.apply(Event::Init);
    cache.apply(Event::InitApply(pod("c", "uid-c", &[])));
    cache.apply(Event::InitDone);
    let mut uids: Vec<_> = cache
        .pods()
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    uids.sort();
    assert_eq!(uids, ["uid-c"]);
}

#[test]
fn static_pods_translate_to_and_from_their_mirror() {
    let cache = PodCache::new();
    let static_pod = pod(
        "kube-proxy",
        "static-uid",
        &[(CONFIG_SOURCE_ANNOTATION, "file")],
    );
    cache.upsert_static(static_pod.clone());
    let t = cache.uid_translations();
    assert_eq!(
        t.pod_to_mirror.get(&PodUid::new("static-uid")),
        Some(&PodUid::default()),
        "no mirror yet"
    );
    cache.apply(Event::Apply(pod(
        "kube-proxy",
        "mirror-uid",
        &[
            (CONFIG_SOURCE_ANNOTATION, "api"),
            (CONFIG_MIRROR_ANNOTATION, "x"),
        ],
    )));
    assert_eq!(
        cache.translate_pod_uid(&PodUid::new("mirror-uid")),
        PodUid::new("static-uid")
    );
    assert_eq!(
        cache.translate_pod_uid(&PodUid::new("other")),
        PodUid::new("other")
    );
    assert_eq!(
        cache
            .mirror_pod_of(&static_pod)
            .unwrap()
            .metadata
            .uid
            .as_deref(),
        Some("mirror-uid")
    );
    let t = cache.uid_translations();
    assert_eq!(
        t.pod_to_mirror.get(&PodUid::new("static-uid")),
        Some(&PodUid::new("mirror-uid"))
    );
    assert_eq!(
        t.mirror_to_pod.get(&PodUid::new("mirror-uid")),
        Some(&PodUid::new("static-uid"))
    );
    assert!(
        cache.pod_by_uid(&PodUid::new("mirror-uid")).is_none(),
        "mirror pods are not in pod_by_uid"
    );
    // A relist keeps the static pod (it does not come from the API).
    cache.apply(Event::Init);
    cache.apply(Event::InitDone);
    assert!(cache.pod_by_uid(&PodUid::new("static-uid")).is_some());
}

#[tokio::test]
async fn the_watch_lists_only_this_nodes_pods() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cache = std::sync::Arc::new(PodCache::new());
    let runner = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.run(&crate::Backend::Cluster(client), "node-a").await })
    };
    pin_mut!(handle);
    let (req, send) = handle.next_request().await.unwrap();
    let uri = req.uri().to_string();
    assert!(uri.starts_with("/api/v1/pods?"), "{uri}");
    assert!(
        uri.contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{uri}"
    );
    let list = json!({"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"10"},"items":[
        {"metadata":{"name":"a","namespace":"ns","uid":"uid-a","resourceVersion":"9"},"spec":{"nodeName":"node-a","containers":[{"name":"c","image":"busybox"}]}}
    ]});
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&list).unwrap(),
    )));
    // The watch that follows: its URI carries the selector and the list's resourceVersion.
    let (req, _send) = handle.next_request().await.unwrap();
    let uri = req.uri().to_string();
    assert!(
        uri.contains("watch=true")
            && uri.contains("fieldSelector=spec.nodeName%3Dnode-a")
            && uri.contains("resourceVersion=10"),
        "{uri}"
    );
    assert!(cache.all_sources_ready());
    assert!(cache.pod_by_uid(&PodUid::new("uid-a")).is_some());
    runner.abort();
}

/// Issue 10 item 18: a pod from the API is never static, whatever it is annotated with
/// (upstream's config layer sets the source to `api`).
#[test]
fn a_user_pod_annotated_file_is_not_taken_for_a_static_pod() {
    let cache = PodCache::new();
    cache.apply(Event::Apply(pod(
        "sneaky",
        "uid-s",
        &[(CONFIG_SOURCE_ANNOTATION, "file")],
    )));
    let stored = cache.pod_by_uid(&PodUid::new("uid-s")).unwrap();
    assert!(!rustlet_core::pod::is_static_pod(&stored));
    assert!(cache.static_pods().is_empty());
    assert!(cache.uid_translations().pod_to_mirror.is_empty());
}

/// Issue 10 item 18: each read of the static source replaces the static set, so a withdrawn
/// or edited manifest's old pod goes; an unchanged read signals nothing.
#[test]
fn the_static_set_is_replaced_by_each_read_of_the_source() {
    let cache = PodCache::new();
    let a = pod("a", "static-a", &[(CONFIG_SOURCE_ANNOTATION, "file")]);
    let b = pod("b", "static-b", &[(CONFIG_SOURCE_ANNOTATION, "file")]);
    cache.apply(Event::Apply(pod("api", "uid-api", &[])));
    cache.set_static_pods(vec![a.clone(), b.clone()]);
    assert_eq!(cache.static_pods().len(), 2);
    let mut changes = cache.subscribe();
    changes.mark_unchanged();
    cache.set_static_pods(vec![a.clone(), b.clone()]);
    assert!(!changes.has_changed().unwrap(), "nothing changed");
    let b2 = pod("b", "static-b2", &[(CONFIG_SOURCE_ANNOTATION, "file")]);
    cache.set_static_pods(vec![b2]);
    assert!(changes.has_changed().unwrap());
    let mut uids: Vec<_> = cache
        .pods()
        .iter()
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    uids.sort();
    assert_eq!(
        uids,
        ["static-b2", "uid-api"],
        "a withdrawn, b replaced, API pod kept"
    );
}

/// Issue 10 item 18: with a static source, the sources are ready only once it was read too
/// (else, after a restart, the volumes of running static pods could be torn down).
#[test]
fn with_a_static_source_the_sources_are_ready_only_once_it_was_read() {
    let cache = PodCache::with_static_source();
    cache.apply(Event::Init);
    cache.apply(Event::InitDone);
    assert!(
        !cache.all_sources_ready(),
        "the static source was not read yet"
    );
    cache.set_static_pods(Vec::new());
    assert!(cache.all_sources_ready());
}

/// The change log the status manager's full batch reads: every event names its pod (a
/// mirror's names the mirror), a relist says everything may have changed, and a static pod
/// withdrawn from the manifests is named too.
#[test]
fn the_change_log_names_each_changed_pod_and_a_relist_says_all() {
    use rustlet_core::PodChanges;
    // The same log serves both managers.
    let log = |cache: &PodCache, cursor| {
        let status = PodManager::changes_since(cache, cursor);
        assert_eq!(PodSource::changes_since(cache, cursor), status);
        status
    };
    let cache = PodCache::new();
    cache.apply(Event::Init);
    cache.apply(Event::InitApply(pod("a", "uid-a", &[])));
    cache.apply(Event::InitDone);
    let PodChanges::All { cursor } = log(&cache, 0) else {
        panic!("a reader that saw nothing is told everything");
    };
    cache.apply(Event::Apply(pod("b", "uid-b", &[])));
    cache.apply(Event::Delete(pod("a", "uid-a", &[])));
    cache.apply(Event::Apply(pod(
        "s",
        "uid-mirror",
        &[(CONFIG_MIRROR_ANNOTATION, "x")],
    )));
    let PodChanges::Since { cursor, uids } = log(&cache, cursor) else {
        panic!("within the log");
    };
    let names: Vec<&str> = uids.iter().map(PodUid::as_str).collect();
    assert_eq!(names, ["uid-b", "uid-a", "uid-mirror"]);
    cache.set_static_pods(vec![pod(
        "s",
        "uid-s",
        &[(CONFIG_SOURCE_ANNOTATION, "file")],
    )]);
    cache.set_static_pods(vec![]);
    let PodChanges::Since { cursor, uids } = log(&cache, cursor) else {
        panic!("within the log");
    };
    let names: Vec<&str> = uids.iter().map(PodUid::as_str).collect();
    assert_eq!(names, ["uid-s", "uid-s"]);
    cache.apply(Event::Init);
    cache.apply(Event::InitApply(pod("b", "uid-b", &[])));
    cache.apply(Event::InitDone);
    assert!(matches!(log(&cache, cursor), PodChanges::All { .. }));
}

/// Issue 29: a pod decoded from text holds its lists with the room doubling left (four volume
/// mounts' room for one); the cache keeps each list at its length.
#[test]
fn a_cached_pod_keeps_no_spare_room_in_its_lists() {
    let decoded: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web"},
        "spec": {
            "containers": [{
                "name": "c",
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"containerPort": 80}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "more", "emptyDir": {}}, {"name": "last", "emptyDir": {}}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    let text = serde_json::to_string(&decoded).unwrap();
    let pod: Pod = serde_json::from_str(&text).unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .capacity()
            > 1
    );
    assert!(spec.volumes.as_ref().unwrap().capacity() > 3);
    let cache = PodCache::new();
    cache.apply(Event::Apply(pod));
    let cached = cache.pod_by_uid(&PodUid::new("uid-web")).unwrap();
    let spec = cached.spec.as_ref().unwrap();
    let container = &spec.containers[0];
    for (list, capacity) in [
        ("env", container.env.as_ref().unwrap().capacity()),
        ("ports", container.ports.as_ref().unwrap().capacity()),
        (
            "volumeMounts",
            container.volume_mounts.as_ref().unwrap().capacity(),
        ),
        ("volumes", spec.volumes.as_ref().unwrap().capacity() - 2),
        (
            "conditions",
            cached
                .status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .capacity(),
        ),
    ] {
        assert_eq!(capacity, 1, "{list}");
    }
    assert_eq!(*cached, {
        let mut original = decoded;
        original
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_SOURCE_ANNOTATION.into(), "api".into());
        original
    });
}
