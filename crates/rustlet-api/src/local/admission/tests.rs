//! Admission: typed decoding with field paths, defaults, stringData, and the validation that
//! keeps hostile names, keys and paths out of the store.

use serde_json::{Value, json};

use super::super::store::{Kind, ObjectRef, Store, StoreError};
use super::{Operation, admit, admit_status, image_pull_policy};

fn invalid(result: Result<Value, StoreError>) -> String {
    match result {
        Err(StoreError::Invalid(message)) => message,
        other => panic!("expected a 422, got {other:?}"),
    }
}

fn pod(spec: Value) -> Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"ns"},"spec":spec})
}

fn admit_pod(spec: Value) -> Result<Value, StoreError> {
    admit(
        &ObjectRef::new(Kind::Pod, "ns", "web"),
        pod(spec),
        Operation::Create,
    )
}

#[test]
fn a_malformed_document_names_the_field() {
    let message = invalid(admit_pod(json!({"containers": [{"name": "c", "ports": [
        {"containerPort": "eighty"}]}]})));
    assert!(
        message.starts_with("Pod \"web\" is invalid: spec.containers[0].ports[0].containerPort: "),
        "{message}"
    );
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn a_malformed_status_names_the_field_and_a_good_one_is_admitted() {
    let reference = ObjectRef::new(Kind::Pod, "ns", "web");
    let old = json!({"phase": "Pending"});
    let mut object = pod(json!({"containers": [{"name": "c", "image": "busybox"}]}));
    object["status"] = json!({"phase": "Running", "containerStatuses": [
        {"name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": "x"}]});
    let message = invalid(admit_status(&reference, Some(&old), &mut object).map(|()| Value::Null));
    assert!(
        message.starts_with(
            "Pod \"web\" is invalid: status.containerStatuses[0].restartCount: invalid type"
        ),
        "{message}"
    );
    object["status"]["containerStatuses"][0]["restartCount"] = json!(0);
    admit_status(&reference, Some(&old), &mut object).unwrap();
}

#[test]
fn pod_defaults_are_the_api_servers() {
    let pod = admit_pod(json!({
        "containers": [
            {"name": "latest", "image": "nginx"},
            {"name": "pinned", "image": "registry:5000/app:1.2"},
            {"name": "digest", "image": "app@sha256:abc", "ports": [{"containerPort": 80}]}
        ],
        "volumes": [
            {"name": "conf", "configMap": {"name": "c"}},
            {"name": "creds", "secret": {"secretName": "s", "defaultMode": 256}},
            {"name": "meta", "downwardAPI": {"items": [{"path": "labels",
                "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
            {"name": "host", "hostPath": {"path": "/var/log"}},
            {"name": "scratch"}
        ]
    }))
    .unwrap();
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    assert_eq!(spec["schedulerName"], "default-scheduler");
    assert_eq!(spec["enableServiceLinks"], true);
    let containers = &spec["containers"];
    assert_eq!(containers[0]["imagePullPolicy"], "Always");
    assert_eq!(containers[1]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(containers[2]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        containers[0]["terminationMessagePath"],
        "/dev/termination-log"
    );
    assert_eq!(containers[0]["terminationMessagePolicy"], "File");
    assert_eq!(containers[2]["ports"][0]["protocol"], "TCP");
    let volumes = &spec["volumes"];
    assert_eq!(volumes[0]["configMap"]["defaultMode"], 0o644);
    assert_eq!(
        volumes[1]["secret"]["defaultMode"], 256,
        "a given mode is kept"
    );
    assert_eq!(volumes[2]["downwardAPI"]["defaultMode"], 0o644);
    assert_eq!(
        volumes[2]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
        "v1"
    );
    assert_eq!(volumes[3]["projected"]["defaultMode"], 0o644);
    assert_eq!(
        volumes[3]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
        3600
    );
    assert_eq!(volumes[4]["hostPath"]["type"], "");
    assert_eq!(volumes[5]["emptyDir"], json!({}));
    assert_eq!(pod["status"]["phase"], "Pending");
}

#[test]
fn image_pull_policy_follows_the_tag() {
    assert_eq!(image_pull_policy("nginx"), "Always");
    assert_eq!(image_pull_policy("nginx:latest"), "Always");
    assert_eq!(image_pull_policy("nginx:1.27"), "IfNotPresent");
    assert_eq!(image_pull_policy("localhost:5000/nginx"), "Always");
    assert_eq!(image_pull_policy("localhost:5000/nginx:1"), "IfNotPresent");
    assert_eq!(image_pull_policy("nginx@sha256:0123"), "IfNotPresent");
}

#[test]
fn hostile_paths_in_a_pod_are_refused() {
    let message = invalid(admit_pod(json!({
        "containers": [{"name": "c", "volumeMounts": [
            {"name": "conf", "mountPath": "/etc/c", "subPath": "../../etc"},
            {"name": "missing", "mountPath": "/x"}
        ]}],
        "volumes": [
            {"name": "conf", "configMap": {"name": "c", "items": [
                {"key": "a", "path": "../escape"},
                {"key": "b", "path": "/etc/passwd"},
                {"key": "c", "path": "ok", "mode": 4096}
            ]}},
            {"name": "host", "hostPath": {"path": "/var/../etc"}},
            {"name": "conf", "emptyDir": {}},
            {"name": "Bad_Name", "emptyDir": {}}
        ]
    })));
    for expected in [
        "spec.volumes[0].configMap.items[0].path: Invalid value: \"../escape\": must not contain '..'",
        "spec.volumes[0].configMap.items[1].path: Invalid value: \"/etc/passwd\": must be a relative path",
        "spec.volumes[0].configMap.items[2].mode: Invalid value: 4096",
        "spec.volumes[1].hostPath.path: Invalid value: \"/var/../etc\": must not contain '..'",
        "spec.volumes[2].name: Duplicate value: \"conf\"",
        "spec.volumes[3].name: Invalid value: \"Bad_Name\"",
        "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../../etc\"",
        "spec.containers[0].volumeMounts[1].name: Not found: \"missing\"",
    ] {
        assert!(
            message.contains(expected),
            "missing {expected:?} in {message}"
        );
    }
}

/// Issue 27 (node features), upstream `validateMountPropagation` and
/// `validateMountRecursiveReadOnly` ("[sig-node] Mount recursive read-only [LinuxOnly] ...
/// should reject invalid recursive read-only mounts" reads the API server's message): a pod
/// from a file is refused as the API server refuses it, so that an unprivileged container
/// never propagates a mount to the host.
#[test]
fn mount_propagation_and_recursive_read_only_are_validated_as_upstream_does() {
    let message = invalid(admit_pod(json!({
        "containers": [
            {"name": "c", "image": "busybox", "volumeMounts": [
                {"name": "mnt", "mountPath": "/a", "recursiveReadOnly": "Enabled"},
                {"name": "mnt", "mountPath": "/b", "mountPropagation": "Bidirectional"},
                {"name": "mnt", "mountPath": "/c", "mountPropagation": "Sideways"},
                {"name": "mnt", "mountPath": "/d", "readOnly": true,
                 "recursiveReadOnly": "IfPossible", "mountPropagation": "HostToContainer"},
                {"name": "mnt", "mountPath": "/e", "readOnly": true, "recursiveReadOnly": "Always"}
            ]},
            {"name": "p", "image": "busybox", "securityContext": {"privileged": true},
             "volumeMounts": [
                {"name": "mnt", "mountPath": "/mnt", "mountPropagation": "Bidirectional"},
                {"name": "mnt", "mountPath": "/ro", "readOnly": true, "recursiveReadOnly": "Enabled"}
            ]}
        ],
        "volumes": [{"name": "mnt", "emptyDir": {}}]
    })));
    for expected in [
        "spec.containers[0].volumeMounts.recursiveReadOnly: Forbidden: may only be specified when readOnly is true",
        "spec.containers[0].volumeMounts.mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers",
        "spec.containers[0].volumeMounts.mountPropagation: Unsupported value: \"Sideways\": supported values: \"Bidirectional\", \"HostToContainer\", \"None\"",
        "spec.containers[0].volumeMounts.recursiveReadOnly: Forbidden: may only be specified when mountPropagation is None or not specified",
        "spec.containers[0].volumeMounts.recursiveReadOnly: Unsupported value: \"Always\": supported values: \"Disabled\", \"Enabled\", \"IfPossible\"",
    ] {
        assert!(
            message.contains(expected),
            "missing {expected:?} in {message}"
        );
    }
    assert!(!message.contains("spec.containers[1]"), "{message}");
}

#[test]
fn config_map_and_secret_keys_are_checked_as_upstream_does() {
    let reference = ObjectRef::new(Kind::ConfigMap, "ns", "c");
    let config_map = |data: Value| {
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"ns"},
            "data": data})
    };
    for good in ["a", "a.b", "A-b_c", ".hidden", "a..b"] {
        admit(
            &reference,
            config_map(json!({good: "v"})),
            Operation::Create,
        )
        .unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
    for bad in ["..", ".", "..data", "a/b", "../x", "a b", ""] {
        let message = invalid(admit(
            &reference,
            config_map(json!({bad: "v"})),
            Operation::Create,
        ));
        assert!(
            message.contains(&format!("data[{bad}]")),
            "{bad:?}: {message}"
        );
    }
    let both = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"ns"},
        "data":{"k":"v"},"binaryData":{"k":"dg=="}});
    let message = invalid(admit(&reference, both, Operation::Create));
    assert!(
        message.contains("binaryData[k]: Invalid value: duplicate"),
        "{message}"
    );
    // Upstream counts the values only: exactly 1 MiB of values is fine, one byte more is not.
    let exact = "x".repeat(super::MAX_PAYLOAD_BYTES - 1);
    admit(
        &reference,
        config_map(json!({"k": exact, "some-long-key-name": "y"})),
        Operation::Create,
    )
    .unwrap();
    let big = "x".repeat(super::MAX_PAYLOAD_BYTES + 1);
    let result = admit(&reference, config_map(json!({"k": big})), Operation::Create);
    let message = invalid(result);
    assert!(
        message.contains("data: Too long"),
        "{}",
        &message[..200.min(message.len())]
    );
}

#[test]
fn secret_string_data_is_folded_into_data_and_wins() {
    let reference = ObjectRef::new(Kind::Secret, "ns", "s");
    let secret = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns"},
        "data": {"kept": "a2VwdA==", "both": "b2xk"},
        "stringData": {"both": "new", "plain": "text"}});
    let admitted = admit(&reference, secret, Operation::Create).unwrap();
    assert_eq!(admitted["data"]["kept"], "a2VwdA==");
    assert_eq!(admitted["data"]["both"], "bmV3");
    assert_eq!(admitted["data"]["plain"], "dGV4dA==");
    assert!(admitted.get("stringData").is_none());
    assert_eq!(admitted["type"], "Opaque");
    let hostile = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns"},
        "stringData": {"../../root/.ssh/authorized_keys": "key"}});
    let message = invalid(admit(&reference, hostile, Operation::Create));
    assert!(
        message.contains("must consist of alphanumeric"),
        "{message}"
    );
}

#[test]
fn names_must_be_dns_subdomains() {
    let store = Store::default();
    let err = store
        .create(json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"../etc","namespace":"ns"}}))
        .unwrap_err();
    assert_eq!(err.code(), 422);
    assert!(err.to_string().contains("metadata.name"), "{err}");
    let err = store
        .create(json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"ok","namespace":"Bad NS"}}))
        .unwrap_err();
    assert!(err.to_string().contains("metadata.namespace"), "{err}");
}

#[test]
fn the_same_manifest_admitted_twice_is_the_same_object() {
    let store = Store::default();
    let body = pod(json!({"containers": [{"name": "c", "image": "nginx"}],
        "volumes": [{"name": "v", "configMap": {"name": "c"}}]}));
    let created = store.create(body.clone()).unwrap();
    let again = store.update(body).unwrap();
    assert_eq!(
        created["metadata"]["resourceVersion"], again["metadata"]["resourceVersion"],
        "an unchanged manifest is not a write"
    );
}

#[test]
fn a_status_patch_that_breaks_the_type_is_refused() {
    let store = Store::default();
    store
        .create(pod(
            json!({"containers": [{"name": "c", "image": "nginx"}]}),
        ))
        .unwrap();
    let err = store
        .patch_status(
            &ObjectRef::new(Kind::Pod, "ns", "web"),
            &json!({"status": {"startTime": "yesterday"}}),
        )
        .unwrap_err();
    assert_eq!(err.code(), 422, "{err}");
    assert!(err.to_string().contains("status.startTime"), "{err}");
}
