//! The local store (and so the test API server) takes and refuses the pod status writes the
//! real API server takes and refuses; the messages are the ones v1.37's kube-apiserver gave.

use serde_json::{Value, json};

use crate::local::store::{Kind, ObjectRef, Store, StoreError};

fn reference(name: &str) -> ObjectRef {
    ObjectRef::new(Kind::Pod, "default", name)
}

/// A store holding pod `name` with this spec (containers `main`, and `init` when `init`).
fn store_with(name: &str, restart_policy: &str, init: bool) -> Store {
    let store = Store::default();
    let mut spec = json!({
        "nodeName": "node-a",
        "restartPolicy": restart_policy,
        "containers": [{"name": "main", "image": "busybox"}],
    });
    if init {
        spec["initContainers"] = json!([{"name": "init", "image": "busybox"}]);
    }
    store
        .create(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }))
        .unwrap();
    store
}

fn write(store: &Store, name: &str, status: Value) -> Result<Value, StoreError> {
    store.patch_status(&reference(name), &json!({ "status": status }))
}

fn refused(store: &Store, name: &str, status: Value) -> String {
    match write(store, name, status) {
        Err(StoreError::Invalid(message)) => message,
        other => panic!("expected a 422, got {other:?}"),
    }
}

fn container(name: &str, state: Value) -> Value {
    json!({"name": name, "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": state})
}

fn running() -> Value {
    json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
}

fn terminated(exit_code: i32) -> Value {
    json!({"terminated": {"exitCode": exit_code}})
}

fn main_in(state: Value) -> Value {
    json!({"containerStatuses": [container("main", state)]})
}

#[test]
fn validate_container_state_transition_a_never_pods_terminated_container_may_not_come_back() {
    let store = store_with("never", "Never", false);
    write(&store, "never", main_in(terminated(3))).unwrap();
    assert_eq!(
        refused(&store, "never", main_in(running())),
        "Pod \"never\" is invalid: status.containerStatuses[0].state: Forbidden: may not be \
         transitioned to non-terminated state"
    );
    // Waiting is not terminated either.
    refused(
        &store,
        "never",
        main_in(json!({"waiting": {"reason": "x"}})),
    );
}

#[test]
fn validate_container_state_transition_on_failure_restarts_failures_only() {
    let store = store_with("completed", "OnFailure", false);
    write(&store, "completed", main_in(terminated(0))).unwrap();
    refused(&store, "completed", main_in(running()));

    let store = store_with("failed", "OnFailure", false);
    write(&store, "failed", main_in(terminated(1))).unwrap();
    write(&store, "failed", main_in(running())).unwrap();

    let store = store_with("always", "Always", false);
    write(&store, "always", main_in(terminated(0))).unwrap();
    write(&store, "always", main_in(running())).unwrap();
}

#[test]
fn validate_container_state_transition_follows_the_containers_own_policy_and_rules() {
    // A container's own restart policy and its rules come before the pod's.
    let store = Store::default();
    store
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "rules", "namespace": "default"},
            "spec": {"nodeName": "node-a", "restartPolicy": "Never", "containers": [
                {"name": "main", "image": "busybox", "restartPolicy": "Never",
                 "restartPolicyRules": [{"action": "Restart",
                     "exitCodes": {"operator": "In", "values": [42]}}]},
            ]},
        }))
        .unwrap();
    write(&store, "rules", main_in(terminated(42))).unwrap();
    write(&store, "rules", main_in(running())).unwrap();
    write(&store, "rules", main_in(terminated(1))).unwrap();
    refused(&store, "rules", main_in(running()));
}

#[test]
fn validate_init_container_state_transition_a_never_pods_init_container_may_not_come_back() {
    let store = store_with("never-init", "Never", true);
    let init = |state| json!({"initContainerStatuses": [container("init", state)]});
    write(&store, "never-init", init(terminated(0))).unwrap();
    assert_eq!(
        refused(&store, "never-init", init(running())),
        "Pod \"never-init\" is invalid: status.initContainerStatuses[0].state: Forbidden: may \
         not be transitioned to non-terminated state"
    );

    // An Always pod's init container may run again (a new sandbox runs them again).
    let store = store_with("always-init", "Always", true);
    write(&store, "always-init", init(terminated(0))).unwrap();
    write(&store, "always-init", init(running())).unwrap();
}

#[test]
fn validate_host_ips_the_host_ip_is_the_first_and_each_is_an_address() {
    let store = store_with("host-ips", "Always", false);
    assert_eq!(
        refused(
            &store,
            "host-ips",
            json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.2"}]})
        ),
        "Pod \"host-ips\" is invalid: status.hostIPs[0].ip: Invalid value: \"10.0.0.2\": must \
         be equal to `hostIP`"
    );
    assert_eq!(
        refused(
            &store,
            "host-ips",
            json!({"hostIP": "10.0.0.256", "hostIPs": [{"ip": "10.0.0.256"}]})
        ),
        "Pod \"host-ips\" is invalid: status.hostIPs[0]: Invalid value: \"10.0.0.256\": must \
         be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
    );
    let message = refused(
        &store,
        "host-ips",
        json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}),
    );
    assert!(
        message.ends_with("may specify no more than one IP for each IP family"),
        "{message}"
    );
    write(
        &store,
        "host-ips",
        json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}),
    )
    .unwrap();
}

#[test]
fn validate_pod_ips_one_address_of_each_family_in_strict_form() {
    let store = store_with("pod-ips", "Always", false);
    let ips = |list: &[&str]| {
        let items: Vec<Value> = list.iter().map(|ip| json!({ "ip": ip })).collect();
        json!({"podIP": list[0], "podIPs": items})
    };
    assert_eq!(
        refused(&store, "pod-ips", ips(&["10.0.0.1", "10.0.0.2"])),
        "Pod \"pod-ips\" is invalid: status.podIPs: Invalid value: \
         [{\"IP\":\"10.0.0.1\"},{\"IP\":\"10.0.0.2\"}]: may specify no more than one IP for \
         each IP family"
    );
    let message = refused(&store, "pod-ips", ips(&["010.0.0.1"]));
    assert!(message.ends_with("must not have leading 0s"), "{message}");
    let message = refused(&store, "pod-ips", ips(&["::ffff:10.0.0.1"]));
    assert!(
        message.ends_with("must not be an IPv4-mapped IPv6 address"),
        "{message}"
    );
    refused(&store, "pod-ips", ips(&["10.0.0.1", "fd00::1", "fd00::2"]));
    write(&store, "pod-ips", ips(&["10.0.0.1", "fd00::1"])).unwrap();
}

#[test]
fn set_defaults_pod_status_keeps_pod_ip_and_pod_ips_in_step() {
    let store = store_with("defaults", "Always", false);
    let stored = write(&store, "defaults", json!({"podIP": "10.0.0.1"})).unwrap();
    assert_eq!(stored["status"]["podIPs"], json!([{"ip": "10.0.0.1"}]));
    // On a mismatch the singular field wins.
    let stored = write(
        &store,
        "defaults",
        json!({"podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.3"}]}),
    )
    .unwrap();
    assert_eq!(stored["status"]["podIP"], "10.0.0.2");
    assert_eq!(stored["status"]["podIPs"], json!([{"ip": "10.0.0.2"}]));
}

#[test]
fn the_qos_class_is_immutable_and_a_blank_one_is_backfilled() {
    let store = Store::default();
    store
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "qos", "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox"}]},
            "status": {"qosClass": "BestEffort"},
        }))
        .unwrap();
    assert_eq!(
        refused(&store, "qos", json!({"qosClass": "Guaranteed"})),
        "Pod \"qos\" is invalid: status.qosClass: Invalid value: \"Guaranteed\": field is \
         immutable"
    );
    let mut pod = store.get(&reference("qos")).unwrap();
    pod["status"]["qosClass"] = json!("");
    pod["status"]["phase"] = json!("Running");
    let stored = store.update_status(pod).unwrap();
    assert_eq!(stored["status"]["qosClass"], "BestEffort");
    assert_eq!(stored["status"]["phase"], "Running");
}

#[test]
fn validate_pod_conditions_types_are_qualified_names_and_generations_not_negative() {
    let store = store_with("conditions", "Always", false);
    let message = refused(
        &store,
        "conditions",
        json!({"conditions": [{"type": "not qualified!", "status": "True"}]}),
    );
    assert!(
        message.starts_with(
            "Pod \"conditions\" is invalid: status.conditions[0].Type: Invalid value: \
             \"not qualified!\": name part must consist of alphanumeric characters"
        ),
        "{message}"
    );
    write(
        &store,
        "conditions",
        json!({"conditions": [{"type": "example.com/gate", "status": "True"},
            {"type": "Ready", "status": "False"}]}),
    )
    .unwrap();
    assert_eq!(
        refused(&store, "conditions", json!({"observedGeneration": -1})),
        "Pod \"conditions\" is invalid: status.observedGeneration: Invalid value: -1: must be \
         a non-negative integer"
    );
    refused(
        &store,
        "conditions",
        json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": -1}]}),
    );
}

/// The QoS class the store gives pod `name` created with these containers (and pod-level
/// resources), and the stored pod.
fn created_qos(containers: Value, init: Value, pod_resources: Option<Value>) -> (String, Value) {
    let store = Store::default();
    let mut spec = json!({"containers": containers, "initContainers": init});
    if let Some(resources) = pod_resources {
        spec["resources"] = resources;
    }
    let stored = store
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "qos", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap();
    let qos = stored["status"]["qosClass"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (qos, stored)
}

fn with(name: &str, resources: Value) -> Value {
    json!({"name": name, "image": "busybox", "resources": resources})
}

#[test]
fn compute_pod_qos_on_create_as_the_api_server() {
    let none = json!([]);
    let limits = json!({"limits": {"cpu": "100m", "memory": "64Mi"}});
    let (qos, stored) = created_qos(json!([with("main", limits.clone())]), none.clone(), None);
    // upstream `SetDefaults_Pod`: the requests are the limits, so the pod is Guaranteed.
    assert_eq!(qos, "Guaranteed");
    assert_eq!(
        stored["spec"]["containers"][0]["resources"]["requests"],
        json!({"cpu": "100m", "memory": "64Mi"})
    );
    let (qos, _) = created_qos(json!([with("main", json!({}))]), none.clone(), None);
    assert_eq!(qos, "BestEffort");
    let requests = json!({"requests": {"cpu": "10m"}});
    let (qos, _) = created_qos(json!([with("main", requests)]), none.clone(), None);
    assert_eq!(qos, "Burstable");
    // A Guaranteed and a BestEffort container make a Burstable pod; init containers count.
    let (qos, _) = created_qos(
        json!([with("main", limits.clone()), with("other", json!({}))]),
        none.clone(),
        None,
    );
    assert_eq!(qos, "Burstable");
    let (qos, _) = created_qos(
        json!([with("main", limits.clone())]),
        json!([with("init", json!({}))]),
        None,
    );
    assert_eq!(qos, "Burstable");
    // Equal quantities in other spellings are equal.
    let spelled = json!({"requests": {"cpu": "0.1", "memory": "67108864"},
        "limits": {"cpu": "100m", "memory": "64Mi"}});
    let (qos, _) = created_qos(json!([with("main", spelled)]), none.clone(), None);
    assert_eq!(qos, "Guaranteed");
    // Pod-level resources decide when they name CPU or memory.
    let (qos, _) = created_qos(
        json!([with("main", json!({}))]),
        none,
        Some(
            json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}),
        ),
    );
    assert_eq!(qos, "Guaranteed");
}
