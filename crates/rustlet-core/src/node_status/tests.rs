//! The node status setters, the pressure signals, `nodeStatusHasChanged` and the node status
//! patch, against upstream's tests (`setters_test.go`, `kubelet_node_status_test.go`).

use super::*;
use k8s_openapi::api::core::v1::NodeStatus;
use serde_json::json;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).unwrap()
}

fn machine() -> MachineFigures {
    MachineFigures {
        cpus: 2,
        memory_bytes: 10 << 30,
        hugepages: vec![HugePages {
            page_size_bytes: 2 << 20,
            pages: 512,
        }],
        memory_available_bytes: Some(4 << 30),
        root_fs: Some(FsFigures {
            capacity_bytes: 5000 << 20,
            available_bytes: 3000 << 20,
            inodes: 1000,
            inodes_free: 500,
        }),
        pids: Some(PidFigures {
            running: 100,
            max: 4_194_304,
        }),
        machine_id: "machine".into(),
        system_uuid: "uuid".into(),
        boot_id: "boot".into(),
        kernel_version: "6.1.0".into(),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
    }
}

struct Run {
    now: Timestamp,
    pressure: Pressure,
    errors: Vec<String>,
    handlers: Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler>,
    devices: DevicePluginResources,
}

fn run(status: &mut NodeStatus, r: &Run) -> Vec<NodeEvent> {
    let m = machine();
    let eviction = EvictionThresholds::default();
    set_node_status(
        status,
        &StatusInputs {
            now: r.now,
            hostname: "node-a",
            node_ip: Some("10.0.0.1"),
            machine: &m,
            max_pods: 110,
            eviction: &eviction,
            pressure: r.pressure,
            container_runtime_version: "containerd://2.0.0",
            kubelet_version: "v1.37.2",
            kubelet_port: 10250,
            ready_errors: &r.errors,
            runtime_handlers: &r.handlers,
            device_plugins: &r.devices,
        },
    )
}

fn ok_at(second: i64) -> Run {
    Run {
        now: at(second),
        pressure: Pressure::default(),
        errors: Vec::new(),
        handlers: Vec::new(),
        devices: DevicePluginResources::default(),
    }
}

fn condition<'a>(status: &'a NodeStatus, type_: &str) -> &'a NodeCondition {
    status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap()
}

#[test]
fn quantities_are_written_as_go_canonicalizes_them() {
    for (value, binary, decimal) in [
        (0, "0", "0"),
        (512, "512", "512"),
        (1000, "1k", "1k"),
        (1024, "1Ki", "1024"),
        (1536, "1536", "1536"),
        (2 << 20, "2Mi", "2097152"),
        (10 << 30, "10Gi", "10737418240"),
        (4_039_636 * 1024, "4039636Ki", "4136587264"),
        (9_391_196_145, "9391196145", "9391196145"),
        (2_000_000, "2M", "2M"),
    ] {
        assert_eq!(binary_si(value), binary, "{value}");
        assert_eq!(decimal_si(value), decimal, "{value}");
    }
    assert_eq!(hugepages_resource(2 << 20), "hugepages-2Mi");
    assert_eq!(hugepages_resource(1 << 30), "hugepages-1Gi");
}

/// upstream: `TestUpdateNewNodeStatus` (the setters on a new node): every field, conditions
/// in upstream's order with Ready last, allocatable = capacity − the hard eviction thresholds,
/// huge pages out of allocatable memory.
#[test]
fn test_update_new_node_status() {
    let mut status = NodeStatus::default();
    let events = run(&mut status, &ok_at(0));
    let value = serde_json::to_value(&status).unwrap();
    assert_eq!(
        value["capacity"],
        json!({"cpu":"2","memory":"10Gi","pods":"110","ephemeral-storage":"5000Mi",
               "hugepages-2Mi":"1Gi"})
    );
    // memory: 10Gi − 100Mi − 1Gi of huge pages; ephemeral-storage: 5000Mi − 10% = 4500Mi.
    assert_eq!(
        value["allocatable"],
        json!({"cpu":"2","memory":"9116Mi","pods":"110","ephemeral-storage":"4500Mi",
               "hugepages-2Mi":"1Gi"})
    );
    assert_eq!(
        value["addresses"],
        json!([{"type":"InternalIP","address":"10.0.0.1"},{"type":"Hostname","address":"node-a"}])
    );
    assert_eq!(
        value["daemonEndpoints"],
        json!({"kubeletEndpoint":{"Port":10250}})
    );
    assert_eq!(
        value["nodeInfo"],
        json!({"machineID":"machine","systemUUID":"uuid","bootID":"boot",
               "kernelVersion":"6.1.0","osImage":"Debian GNU/Linux 12 (bookworm)",
               "containerRuntimeVersion":"containerd://2.0.0","kubeletVersion":"v1.37.2",
               "kubeProxyVersion":"","operatingSystem":"linux",
               "architecture":crate::node::go_arch()})
    );
    let types: Vec<&str> = status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        types,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    for (type_, reason, message) in [
        (
            "MemoryPressure",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        (
            "DiskPressure",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        (
            "PIDPressure",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        ("Ready", "KubeletReady", "kubelet is posting ready status"),
    ] {
        let c = condition(&status, type_);
        let expected_status = if type_ == "Ready" { "True" } else { "False" };
        assert_eq!(c.status, expected_status, "{type_}");
        assert_eq!(c.reason.as_deref(), Some(reason));
        assert_eq!(c.message.as_deref(), Some(message));
        assert_eq!(c.last_heartbeat_time, Some(Time(at(0))));
        assert_eq!(c.last_transition_time, Some(Time(at(0))));
    }
    assert_eq!(
        events,
        [
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID"
        ]
    );
}

/// upstream: `TestUpdateExistingNodeStatus` (pure part): a second run moves every heartbeat and
/// no transition time; the status has not changed but for the heartbeats.
#[test]
fn test_update_existing_node_status() {
    let mut status = NodeStatus::default();
    run(&mut status, &ok_at(0));
    let before = status.clone();
    let events = run(&mut status, &ok_at(10));
    assert!(events.is_empty());
    for c in status.conditions.as_ref().unwrap() {
        assert_eq!(c.last_heartbeat_time, Some(Time(at(10))), "{}", c.type_);
        assert_eq!(c.last_transition_time, Some(Time(at(0))), "{}", c.type_);
    }
    assert!(!node_status_has_changed(&before, &status));
}

/// upstream: `TestReadyCondition`: the runtime's and network's errors aggregated into
/// `KubeletNotReady`; a transition moves lastTransitionTime, the same status keeps it.
#[test]
fn test_ready_condition() {
    let mut status = NodeStatus::default();
    run(&mut status, &ok_at(0));
    let errors = vec![
        "container runtime not ready: RuntimeReady=false reason:Down message:gone".to_owned(),
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni plugin not initialized".to_owned(),
    ];
    let events = run(
        &mut status,
        &Run {
            now: at(10),
            pressure: Pressure::default(),
            errors: errors.clone(),
            handlers: Vec::new(),
            devices: DevicePluginResources::default(),
        },
    );
    assert_eq!(events, ["NodeNotReady"]);
    let ready = condition(&status, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some(format!("[{}, {}]", errors[0], errors[1]).as_str())
    );
    assert_eq!(ready.last_transition_time, Some(Time(at(10))));
    run(
        &mut status,
        &Run {
            now: at(20),
            pressure: Pressure::default(),
            errors: errors[..1].to_vec(),
            handlers: Vec::new(),
            devices: DevicePluginResources::default(),
        },
    );
    let ready = condition(&status, "Ready");
    assert_eq!(ready.message.as_deref(), Some(errors[0].as_str()));
    assert_eq!(ready.last_transition_time, Some(Time(at(10))));
    assert_eq!(ready.last_heartbeat_time, Some(Time(at(20))));
    assert_eq!(run(&mut status, &ok_at(30)), ["NodeReady"]);
    assert_eq!(
        condition(&status, "Ready").last_transition_time,
        Some(Time(at(30)))
    );
}

/// upstream: `TestReadyCondition`'s "missing capacity" cases: a node without a required
/// capacity is not Ready.
#[test]
fn a_missing_capacity_makes_the_node_not_ready() {
    let mut status = NodeStatus::default();
    let m = MachineFigures {
        root_fs: None,
        ..machine()
    };
    let eviction = EvictionThresholds::default();
    set_node_status(
        &mut status,
        &StatusInputs {
            now: at(0),
            hostname: "node-a",
            node_ip: None,
            machine: &m,
            max_pods: 110,
            eviction: &eviction,
            pressure: Pressure::default(),
            container_runtime_version: "simulated://0.1.0",
            kubelet_version: "v1.37.2",
            kubelet_port: 10250,
            ready_errors: &[],
            runtime_handlers: &[],
            device_plugins: &DevicePluginResources::default(),
        },
    );
    let ready = condition(&status, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(
        ready.message.as_deref(),
        Some("missing node capacity for resources: ephemeral-storage")
    );
    assert_eq!(
        serde_json::to_value(&status.addresses).unwrap(),
        json!([{"type":"Hostname","address":"node-a"}])
    );
}

/// upstream: `TestMemoryPressureCondition`, `TestDiskPressureCondition`,
/// `TestPIDPressureCondition`: a transition sets the reason and the transition time and records
/// an event; staying keeps them.
/// upstream `setters_test.go` `TestMachineInfo` ("device plugin resources are reflected in
/// capacity and allocatable", "inactive device plugin resources should have their capacity set
/// to 0"): the device plugins' capacity and allocatable over the machine's, a resource whose
/// plugin listed no device before stopping at its capacity, a removed one kept at 0.
#[test]
fn device_plugin_resources_are_reflected_in_capacity_and_allocatable() {
    let mut status = NodeStatus::default();
    let mut r = ok_at(0);
    r.devices = DevicePluginResources {
        capacity: BTreeMap::from([
            ("example.com/gpu".to_owned(), 4),
            ("example.com/empty".to_owned(), 0),
            ("example.com/thousand".to_owned(), 1000),
        ]),
        allocatable: BTreeMap::from([
            ("example.com/gpu".to_owned(), 3),
            ("example.com/thousand".to_owned(), 1000),
        ]),
        removed: Vec::new(),
    };
    run(&mut status, &r);
    let capacity = status.capacity.clone().unwrap();
    let allocatable = status.allocatable.clone().unwrap();
    for (name, c, a) in [
        ("example.com/gpu", "4", "3"),
        ("example.com/empty", "0", "0"),
        ("example.com/thousand", "1k", "1k"),
    ] {
        assert_eq!(capacity[name].0, c, "capacity of {name}");
        assert_eq!(allocatable[name].0, a, "allocatable of {name}");
    }
    assert_eq!(capacity["cpu"].0, "2");

    // The plugin of example.com/gpu is gone past the grace period: 0, not removed; the next
    // run (which no longer names it) keeps it at 0.
    r.devices = DevicePluginResources {
        removed: vec!["example.com/gpu".to_owned()],
        ..DevicePluginResources::default()
    };
    run(&mut status, &r);
    r.devices = DevicePluginResources::default();
    run(&mut status, &r);
    let capacity = status.capacity.clone().unwrap();
    let allocatable = status.allocatable.clone().unwrap();
    assert_eq!(capacity["example.com/gpu"].0, "0");
    assert_eq!(allocatable["example.com/gpu"].0, "0");
    assert_eq!(capacity["example.com/empty"].0, "0");
}

#[test]
fn test_pressure_conditions() {
    let mut status = NodeStatus::default();
    run(&mut status, &ok_at(0));
    let all = Pressure {
        memory: true,
        disk: true,
        pid: true,
    };
    let events = run(
        &mut status,
        &Run {
            now: at(10),
            pressure: all,
            errors: Vec::new(),
            handlers: Vec::new(),
            devices: DevicePluginResources::default(),
        },
    );
    assert_eq!(
        events,
        [
            "NodeHasInsufficientMemory",
            "NodeHasDiskPressure",
            "NodeHasInsufficientPID"
        ]
    );
    for (type_, reason) in [
        ("MemoryPressure", "KubeletHasInsufficientMemory"),
        ("DiskPressure", "KubeletHasDiskPressure"),
        ("PIDPressure", "KubeletHasInsufficientPID"),
    ] {
        let c = condition(&status, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some(reason))
        );
        assert_eq!(c.last_transition_time, Some(Time(at(10))));
    }
    assert!(
        run(
            &mut status,
            &Run {
                now: at(20),
                pressure: all,
                errors: Vec::new(),
                handlers: Vec::new(),
                devices: DevicePluginResources::default(),
            },
        )
        .is_empty()
    );
    assert_eq!(
        condition(&status, "DiskPressure").last_transition_time,
        Some(Time(at(10)))
    );
    // Upstream keeps Ready True under pressure (the eviction manager acts, not Ready).
    assert_eq!(condition(&status, "Ready").status, "True");
}

/// The pressure signals against upstream's default hard eviction thresholds:
/// `memory.available<100Mi`, `nodefs.available<10%`, `nodefs.inodesFree<5%`; `pid.available`
/// only with a threshold.
#[test]
fn pressure_follows_the_hard_eviction_thresholds() {
    let defaults = EvictionThresholds::default();
    assert_eq!(pressure(&machine(), &defaults), Pressure::default());
    let low_memory = MachineFigures {
        memory_available_bytes: Some((100 << 20) - 1),
        ..machine()
    };
    assert!(pressure(&low_memory, &defaults).memory);
    let edge = MachineFigures {
        memory_available_bytes: Some(100 << 20),
        ..machine()
    };
    assert!(!pressure(&edge, &defaults).memory);
    let fs = machine().root_fs.unwrap();
    let low_disk = MachineFigures {
        root_fs: Some(FsFigures {
            available_bytes: 499 << 20,
            ..fs
        }),
        ..machine()
    };
    assert!(pressure(&low_disk, &defaults).disk);
    let few_inodes = MachineFigures {
        root_fs: Some(FsFigures {
            inodes_free: 49,
            ..fs
        }),
        ..machine()
    };
    assert!(pressure(&few_inodes, &defaults).disk);
    let few_pids = MachineFigures {
        pids: Some(PidFigures {
            running: 990,
            max: 1000,
        }),
        ..machine()
    };
    assert!(
        !pressure(&few_pids, &defaults).pid,
        "no default pid threshold"
    );
    let with_pid = EvictionThresholds {
        pid_available: Some(Threshold::Percentage(0.05)),
        ..defaults
    };
    assert!(pressure(&few_pids, &with_pid).pid);
    // Unknown figures are no pressure.
    let unknown = MachineFigures {
        memory_available_bytes: None,
        root_fs: None,
        pids: None,
        ..machine()
    };
    assert_eq!(pressure(&unknown, &with_pid), Pressure::default());
}

/// upstream: `updateRuntimeUp` and `runtimeState.runtimeErrors`, with the messages of
/// `RuntimeCondition.String`.
#[test]
fn runtime_errors_follow_the_runtime_conditions_and_the_last_sync() {
    let ready = [
        RuntimeCondition::ready(RUNTIME_READY),
        RuntimeCondition::ready(NETWORK_READY),
    ];
    assert_eq!(runtime_readiness(&ready), RuntimeReadiness::default());
    let no_network = [
        RuntimeCondition::ready(RUNTIME_READY),
        RuntimeCondition {
            type_: NETWORK_READY.into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        },
    ];
    assert_eq!(
        runtime_readiness(&no_network).network_error.as_deref(),
        Some(
            "container runtime network not ready: NetworkReady=false \
             reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not \
             initialized"
        )
    );
    assert_eq!(
        runtime_readiness(&[]).runtime_error.as_deref(),
        Some("container runtime not ready: <nil>")
    );
    let threshold = Duration::from_secs(30);
    assert_eq!(
        runtime_errors(None, threshold, None),
        ["container runtime status check may not have completed yet"]
    );
    assert!(runtime_errors(Some(Duration::from_secs(29)), threshold, None).is_empty());
    assert_eq!(
        runtime_errors(Some(threshold), threshold, Some("x")),
        ["container runtime is down", "x"]
    );
}

#[test]
fn aggregate_is_upstreams() {
    assert_eq!(aggregate(&[]), None);
    assert_eq!(aggregate(&["a".into()]).as_deref(), Some("a"));
    assert_eq!(aggregate(&["a".into(), "a".into()]).as_deref(), Some("a"));
    assert_eq!(
        aggregate(&["a".into(), "b".into(), "a".into()]).as_deref(),
        Some("[a, b]")
    );
}

fn ready(status: &str, heartbeat: i64, transition: i64) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some("r".into()),
        message: Some("m".into()),
        last_heartbeat_time: Some(Time(at(heartbeat))),
        last_transition_time: Some(Time(at(transition))),
    }
}

fn disk(status: &str, heartbeat: i64) -> NodeCondition {
    NodeCondition {
        type_: "DiskPressure".into(),
        ..ready(status, heartbeat, 0)
    }
}

/// upstream: `TestNodeStatusHasChanged` (its cases).
#[test]
fn test_node_status_has_changed() {
    let with = |conditions: Vec<NodeCondition>, phase: Option<&str>| NodeStatus {
        conditions: Some(conditions),
        phase: phase.map(str::to_owned),
        ..NodeStatus::default()
    };
    let cases = [
        (
            "Node status does not change with nil status",
            NodeStatus::default(),
            NodeStatus::default(),
            false,
        ),
        (
            "Node status does not change with default status",
            with(vec![ready("True", 0, 0)], None),
            with(vec![ready("True", 0, 0)], None),
            false,
        ),
        (
            "Node status changes with nil and default status",
            NodeStatus::default(),
            with(vec![ready("True", 0, 0)], None),
            true,
        ),
        (
            "Node status does not change with only heartbeat time change",
            with(vec![ready("True", 0, 0), disk("False", 0)], None),
            with(vec![ready("True", 10, 0), disk("False", 10)], None),
            false,
        ),
        (
            "Node status does not change with order changes",
            with(vec![ready("True", 0, 0), disk("False", 0)], None),
            with(vec![disk("False", 10), ready("True", 10, 0)], None),
            false,
        ),
        (
            "Node status changes with condition status change",
            with(vec![ready("True", 0, 0), disk("False", 0)], None),
            with(vec![ready("False", 10, 10), disk("False", 10)], None),
            true,
        ),
        (
            "Node status changes with new condition",
            with(vec![ready("True", 0, 0)], None),
            with(vec![ready("True", 10, 0), disk("False", 10)], None),
            true,
        ),
        (
            "Node status changes with removed condition",
            with(vec![ready("True", 0, 0), disk("False", 0)], None),
            with(vec![ready("True", 10, 0)], None),
            true,
        ),
        (
            "Node status changes with phase change",
            with(vec![ready("True", 0, 0)], Some("Running")),
            with(vec![ready("True", 0, 0)], Some("Terminated")),
            true,
        ),
    ];
    for (name, old, new, expected) in cases {
        assert_eq!(node_status_has_changed(&old, &new), expected, "{name}");
    }
    // Quantities compare by value.
    let capacity = |memory: &str| NodeStatus {
        capacity: Some(BTreeMap::from([("memory".into(), Quantity(memory.into()))])),
        ..NodeStatus::default()
    };
    assert!(!node_status_has_changed(
        &capacity("1Gi"),
        &capacity("1073741824")
    ));
    assert!(node_status_has_changed(&capacity("1Gi"), &capacity("2Gi")));
}

fn node(status: NodeStatus, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("node-a".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        status: Some(status),
        ..Node::default()
    }
}

/// upstream: `PatchNodeStatus` (`TestPatchNodeStatus`-like): the changed conditions merge by
/// type, a foreign condition and `volumesInUse` are never in the patch, changed addresses are
/// replaced whole, and applying the patch to the old node gives the new one.
#[test]
fn the_node_status_patch_merges_conditions_and_replaces_addresses() {
    let mut old_status = NodeStatus::default();
    run(&mut old_status, &ok_at(0));
    let foreign = NodeCondition {
        type_: "NetworkUnavailable".into(),
        ..disk("False", 0)
    };
    old_status.conditions.as_mut().unwrap().insert(0, foreign);
    old_status.volumes_in_use = Some(vec!["kubernetes.io/csi/d^v1".into()]);
    old_status.addresses = Some(vec![NodeAddress {
        type_: "Hostname".into(),
        address: "old".into(),
    }]);
    let old = node(old_status.clone(), &[("kubernetes.io/hostname", "node-a")]);
    let mut new_status = old_status;
    run(&mut new_status, &ok_at(10));
    let mut new = node(new_status, &[("kubernetes.io/hostname", "node-a")]);
    new.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/os".into(), "linux".into());
    let patch = node_status_patch(&old, &new).unwrap();
    assert_eq!(
        patch["metadata"],
        json!({"labels":{"kubernetes.io/os":"linux"}})
    );
    let status = &patch["status"];
    assert!(status.get("volumesInUse").is_none());
    assert!(status.get("capacity").is_none(), "{status}");
    let conditions = status["conditions"].as_array().unwrap();
    assert!(
        conditions.iter().all(|c| c["type"] != "NetworkUnavailable"),
        "{status}"
    );
    assert_eq!(conditions.len(), 4, "{status}");
    assert_eq!(
        status["addresses"],
        json!([{"type":"InternalIP","address":"10.0.0.1"},{"type":"Hostname","address":"node-a"},
               {"$patch":"replace"}])
    );
    let mut applied = serde_json::to_value(&old).unwrap();
    apply_node_status_patch(&mut applied, &patch);
    assert_eq!(applied, serde_json::to_value(&new).unwrap());
    // Nothing changed, nothing to send.
    assert_eq!(node_status_patch(&new, &new), None);
}

/// Issue 27 (node features), upstream `RuntimeHandlers` setter (read by "[sig-node] Mount
/// recursive read-only [LinuxOnly]"'s `supportsRRO`): the runtime's handlers with their
/// features; none when it names none (containerd 1.6), as upstream's empty list is omitted.
#[test]
fn runtime_handlers_are_the_runtimes_with_their_features() {
    use k8s_openapi::api::core::v1::{NodeRuntimeHandler, NodeRuntimeHandlerFeatures};
    let mut status = NodeStatus::default();
    run(&mut status, &ok_at(0));
    assert_eq!(status.runtime_handlers, None);
    let handler = NodeRuntimeHandler {
        name: Some(String::new()),
        features: Some(NodeRuntimeHandlerFeatures {
            recursive_read_only_mounts: Some(true),
            user_namespaces: Some(false),
        }),
    };
    let with = Run {
        handlers: vec![handler.clone()],
        devices: DevicePluginResources::default(),
        ..ok_at(10)
    };
    run(&mut status, &with);
    assert_eq!(status.runtime_handlers, Some(vec![handler]));
    run(&mut status, &ok_at(20));
    assert_eq!(
        status.runtime_handlers, None,
        "gone when the runtime names none"
    );
}
