//! The watch-based ConfigMap/Secret sources: reference counting, the watch's HTTP shape,
//! change announcements, immutable objects, and the errors of `get`.

use std::time::Duration;

use futures::pin_mut;
use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse, pair};

use rustlet_core::refs::ObjectKind;
use rustlet_volume::objects::{FetchFailure, ObjectChange};

use super::{ObjectKey, ObjectSource, ObjectSourceConfig};
use crate::backend::Backend;

type Mock = Handle<Request<Body>, Response<Body>>;

fn source<K: super::ContentObject>() -> (ObjectSource<K>, Mock) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    let source = ObjectSource::new(
        Backend::Cluster(kube::Client::new(service, "default")),
        ObjectSourceConfig::default(),
    );
    (source, handle)
}

fn pod(uid: &str, config_maps: &[&str]) -> Pod {
    let volumes: Vec<Value> = config_maps
        .iter()
        .map(|n| json!({"name": format!("v-{n}"), "configMap": {"name": n}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name":"c","image":"busybox"}], "volumes": volumes}
    }))
    .unwrap()
}

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn change(name: &str) -> ObjectChange {
    ObjectChange {
        kind: ObjectKind::ConfigMap,
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn config_map(name: &str, rv: &str, data: &str, immutable: bool) -> Value {
    json!({"apiVersion":"v1","kind":"ConfigMap",
        "metadata":{"name":name,"namespace":"ns","resourceVersion":rv},
        "immutable": immutable, "data":{"k":data}})
}

/// Answer the watcher's initial list of `name` with `items`, checking its shape.
async fn answer_list(
    handle: &mut std::pin::Pin<&mut Mock>,
    resource: &str,
    name: &str,
    items: Vec<Value>,
) {
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(req.method(), Method::GET);
    assert_eq!(
        req.uri().path(),
        format!("/api/v1/namespaces/ns/{resource}")
    );
    let query = req.uri().query().unwrap_or_default().to_owned();
    assert!(
        query.contains(&format!("fieldSelector=metadata.name%3D{name}")),
        "{query}"
    );
    assert!(!query.contains("watch=true"), "{query}");
    let list =
        json!({"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"100"},"items":items});
    send.send_response(Response::new(Body::from(
        serde_json::to_vec(&list).unwrap(),
    )));
}

/// Take the watch request that follows a list.
async fn next_watch(
    handle: &mut std::pin::Pin<&mut Mock>,
    name: &str,
) -> SendResponse<Response<Body>> {
    let (req, send) = handle.next_request().await.unwrap();
    let query = req.uri().query().unwrap_or_default().to_owned();
    assert!(
        query.contains("watch=true")
            && query.contains(&format!("fieldSelector=metadata.name%3D{name}")),
        "{query}"
    );
    send
}

fn watch_events(events: &[(&str, Value)]) -> Response<Body> {
    let mut body = Vec::new();
    for (type_, object) in events {
        serde_json::to_writer(&mut body, &json!({"type": type_, "object": object})).unwrap();
        body.push(b'\n');
    }
    Response::new(Body::from(body))
}

#[tokio::test(start_paused = true)]
async fn a_referenced_config_map_is_watched_by_name_and_its_changes_announced() {
    let (source, handle) = source::<ConfigMap>();
    pin_mut!(handle);
    let mut changes = source.subscribe();
    source.register_pod(&pod("p1", &["cm1"]));
    assert_eq!(source.watched(), [key("cm1")].into());

    answer_list(
        &mut handle,
        "configmaps",
        "cm1",
        vec![config_map("cm1", "5", "one", false)],
    )
    .await;
    let got = source.get("ns", "cm1").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "one");

    let watch = next_watch(&mut handle, "cm1").await;
    watch.send_response(watch_events(&[(
        "MODIFIED",
        config_map("cm1", "6", "two", false),
    )]));
    assert_eq!(changes.recv().await.unwrap(), change("cm1"));
    let got = source.get("ns", "cm1").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "two");

    // The stream ended: the watcher watches again from the last resourceVersion; a deletion
    // is a change too, and `get` then says not found.
    let watch = next_watch(&mut handle, "cm1").await;
    watch.send_response(watch_events(&[(
        "DELETED",
        config_map("cm1", "7", "two", false),
    )]));
    assert_eq!(changes.recv().await.unwrap(), change("cm1"));
    let err = source.get("ns", "cm1").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn watches_are_reference_counted_by_pod() {
    // The mock stays open (no answers): the watches only wait for their lists.
    let (source, _handle) = source::<ConfigMap>();
    source.register_pod(&pod("p1", &["shared", "only-p1"]));
    source.register_pod(&pod("p2", &["shared"]));
    assert_eq!(source.watched(), [key("only-p1"), key("shared")].into());

    // p1 changes its spec: the new reference is added, the dropped one stops.
    source.register_pod(&pod("p1", &["shared", "new"]));
    assert_eq!(source.watched(), [key("new"), key("shared")].into());

    source.unregister_pod(&pod("p1", &[]));
    assert_eq!(source.watched(), [key("shared")].into());
    source.unregister_pod(&pod("p2", &[]));
    assert!(source.watched().is_empty());
    let err = source.get("ns", "shared").await.unwrap_err();
    assert!(*err.reason() == FetchFailure::NotRegistered, "{err}");
    assert_eq!(
        err.to_string(),
        "get configmap ns/shared: not registered by any pod"
    );
}

#[tokio::test(start_paused = true)]
async fn get_before_the_first_list_waits_one_second_then_fails() {
    let (source, handle) = source::<ConfigMap>();
    pin_mut!(handle);
    source.register_pod(&pod("p1", &["slow"]));
    let err = source.get("ns", "slow").await.unwrap_err();
    assert!(
        *err.reason() == FetchFailure::NotSynced(Duration::from_secs(1)),
        "{err}"
    );
    // The list that answers late still fills the cache.
    answer_list(
        &mut handle,
        "configmaps",
        "slow",
        vec![config_map("slow", "1", "x", false)],
    )
    .await;
    assert!(source.get("ns", "slow").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_absent_object_is_not_found_and_its_creation_is_announced() {
    let (source, handle) = source::<ConfigMap>();
    pin_mut!(handle);
    let mut changes = source.subscribe();
    source.register_pod(&pod("p1", &["later"]));
    answer_list(&mut handle, "configmaps", "later", vec![]).await;
    assert!(source.get("ns", "later").await.unwrap_err().is_not_found());
    let watch = next_watch(&mut handle, "later").await;
    watch.send_response(watch_events(&[(
        "ADDED",
        config_map("later", "3", "now", false),
    )]));
    assert_eq!(changes.recv().await.unwrap(), change("later"));
    assert_eq!(
        source
            .get("ns", "later")
            .await
            .unwrap()
            .data
            .as_ref()
            .unwrap()["k"],
        "now"
    );
}

#[tokio::test(start_paused = true)]
async fn an_immutable_secret_is_kept_without_a_watch() {
    let (source, handle) = source::<Secret>();
    pin_mut!(handle);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "p"},
        "spec": {"containers": [{"name":"c","image":"busybox"}], "imagePullSecrets": [{"name": "pull"}]}
    }))
    .unwrap();
    source.register_pod(&pod);
    let secret = json!({"apiVersion":"v1","kind":"Secret","immutable":true,
        "metadata":{"name":"pull","namespace":"ns","resourceVersion":"1"},
        "data":{"k":"dmFsdWU="}});
    answer_list(&mut handle, "secrets", "pull", vec![secret]).await;
    let got = source.get("ns", "pull").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"].0, b"value");
    // No watch request follows the list of an immutable object.
    let next = tokio::time::timeout(Duration::from_secs(600), handle.next_request()).await;
    assert!(next.is_err(), "an immutable secret is watched");
    assert_eq!(source.watched(), [key("pull")].into());
}
