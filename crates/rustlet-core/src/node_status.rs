//! The node's status as the kubelet sets it, pure: the setters of upstream
//! `pkg/kubelet/nodestatus/setters.go` (addresses, capacity and allocatable, `nodeInfo`, the
//! daemon endpoints, the pressure conditions and Ready), the pressure signals against the hard
//! eviction thresholds (upstream `pkg/kubelet/eviction`), the Ready errors from the runtime's
//! conditions (upstream `runtime.go`, `updateRuntimeUp`), `nodeStatusHasChanged`, and the
//! strategic merge patch of `nodes/<name>/status` (upstream `PatchNodeStatus`).
//!
//! The machine's figures and the runtime's answers come in as data ([`MachineFigures`],
//! [`RuntimeCondition`]); `now` is an argument. Spec: `shared/spec/kubelet-server.md` section 3.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeRuntimeHandler,
    NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

use crate::patch::{MergeKeys, PATCH_DIRECTIVE, apply_with_keys, diff_with_keys};

/// The node status lists that merge by key (the Node schema's `x-kubernetes-patch-merge-key`).
pub const NODE_STATUS_MERGE_KEYS: [(&str, &str); 2] =
    [("conditions", "type"), ("addresses", "type")];

/// A filesystem's size and use (statfs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsFigures {
    /// Size in bytes (blocks × block size).
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// One huge page size's pool (`/sys/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePages {
    /// The page size in bytes.
    pub page_size_bytes: u64,
    /// Pages reserved.
    pub pages: u64,
}

/// Process IDs: how many are in use and the most there may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PidFigures {
    /// Processes (and threads) now (upstream `NumOfRunningProcesses`).
    pub running: u64,
    /// `/proc/sys/kernel/pid_max` (upstream `MaxPID`).
    pub max: u64,
}

/// The machine's figures the node status is made of (upstream: cAdvisor's `MachineInfo`,
/// `VersionInfo` and the eviction manager's summary). A figure that could not be read is
/// `None` (or empty text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineFigures {
    /// Logical CPUs.
    pub cpus: u32,
    /// `MemTotal`, in bytes.
    pub memory_bytes: u64,
    /// Huge page pools by size.
    pub hugepages: Vec<HugePages>,
    /// The memory available (upstream's `memory.available` signal: capacity minus the working
    /// set).
    pub memory_available_bytes: Option<u64>,
    /// The filesystem of the agent's root directory (`nodefs`).
    pub root_fs: Option<FsFigures>,
    /// Process IDs.
    pub pids: Option<PidFigures>,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/sys/class/dmi/id/product_uuid`.
    pub system_uuid: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
}

/// A hard eviction threshold's value: the signal must stay at or above it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    /// An amount (bytes, inodes, pids).
    Quantity(u64),
    /// A fraction (0-1) of the capacity.
    Percentage(f64),
}

impl Threshold {
    /// The amount it stands for against `capacity` (upstream `GetThresholdQuantity`: a
    /// percentage is truncated).
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

/// The hard eviction thresholds (upstream `evictionHard`, operator `LessThan`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvictionThresholds {
    /// `memory.available`.
    pub memory_available: Option<Threshold>,
    /// `nodefs.available`.
    pub nodefs_available: Option<Threshold>,
    /// `nodefs.inodesFree`.
    pub nodefs_inodes_free: Option<Threshold>,
    /// `pid.available`.
    pub pid_available: Option<Threshold>,
}

impl Default for EvictionThresholds {
    /// Upstream's Linux defaults (`eviction/defaults_linux.go`): `memory.available<100Mi`,
    /// `nodefs.available<10%`, `nodefs.inodesFree<5%`, and no `pid.available` threshold.
    /// Deviation: the `imagefs.*` thresholds are left out (the image filesystem is the
    /// runtime's; on one filesystem upstream folds them into nodefs).
    fn default() -> Self {
        Self {
            memory_available: Some(Threshold::Quantity(100 << 20)),
            nodefs_available: Some(Threshold::Percentage(0.10)),
            nodefs_inodes_free: Some(Threshold::Percentage(0.05)),
            pid_available: None,
        }
    }
}

/// Which pressure conditions hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    /// `memory.available` under its threshold.
    pub memory: bool,
    /// `nodefs.available` or `nodefs.inodesFree` under its threshold.
    pub disk: bool,
    /// `pid.available` under its threshold.
    pub pid: bool,
}

fn below(threshold: Option<Threshold>, capacity: u64, available: Option<u64>) -> bool {
    match (threshold, available) {
        (Some(t), Some(available)) => available < t.amount(capacity),
        _ => false,
    }
}

/// The pressure signals the machine's figures meet (upstream `thresholdsMet` over the
/// `makeSignalObservations` of the summary: memory, nodefs bytes and inodes, pids).
pub fn pressure(machine: &MachineFigures, thresholds: &EvictionThresholds) -> Pressure {
    let fs = machine.root_fs;
    Pressure {
        memory: below(
            thresholds.memory_available,
            machine.memory_bytes,
            machine.memory_available_bytes,
        ),
        disk: below(
            thresholds.nodefs_available,
            fs.map_or(0, |f| f.capacity_bytes),
            fs.map(|f| f.available_bytes),
        ) || below(
            thresholds.nodefs_inodes_free,
            fs.map_or(0, |f| f.inodes),
            fs.map(|f| f.inodes_free),
        ),
        pid: below(
            thresholds.pid_available,
            machine.pids.map_or(0, |p| p.max),
            machine.pids.map(|p| p.max.saturating_sub(p.running)),
        ),
    }
}

/// One condition of the runtime's CRI `Status` (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCondition {
    /// `RuntimeReady`, `NetworkReady`.
    pub type_: String,
    /// Whether it holds.
    pub status: bool,
    /// Why (CamelCase).
    pub reason: String,
    /// Details.
    pub message: String,
}

/// CRI `RuntimeReady`.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// CRI `NetworkReady`.
pub const NETWORK_READY: &str = "NetworkReady";

impl RuntimeCondition {
    /// A condition that holds.
    pub fn ready(type_: &str) -> Self {
        Self {
            type_: type_.to_owned(),
            status: true,
            reason: String::new(),
            message: String::new(),
        }
    }
}

impl std::fmt::Display for RuntimeCondition {
    /// Upstream `RuntimeCondition.String`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={} reason:{} message:{}",
            self.type_, self.status, self.reason, self.message
        )
    }
}

/// What the runtime's conditions say is wrong (upstream `updateRuntimeUp`): the runtime error
/// and the network error, each `None` when the condition holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeReadiness {
    /// `container runtime not ready: ...`.
    pub runtime_error: Option<String>,
    /// `container runtime network not ready: ...`.
    pub network_error: Option<String>,
}

/// upstream: `updateRuntimeUp`, from the conditions of one successful CRI `Status`.
pub fn runtime_readiness(conditions: &[RuntimeCondition]) -> RuntimeReadiness {
    let check = |type_: &str, what: &str| match conditions.iter().find(|c| c.type_ == type_) {
        Some(c) if c.status => None,
        Some(c) => Some(format!("{what} not ready: {c}")),
        None => Some(format!("{what} not ready: <nil>")),
    };
    RuntimeReadiness {
        runtime_error: check(RUNTIME_READY, "container runtime"),
        network_error: check(NETWORK_READY, "container runtime network"),
    }
}

/// Upstream's network error before the first runtime status (`ErrNetworkUnknown`).
pub const NETWORK_UNKNOWN: &str = "network state unknown";

/// upstream: `runtimeState.runtimeErrors`: no successful runtime status yet, or none within
/// `threshold` (`last_sync_age` is the time since the last one), then the runtime's own error.
pub fn runtime_errors(
    last_sync_age: Option<Duration>,
    threshold: Duration,
    runtime_error: Option<&str>,
) -> Vec<String> {
    let mut errors = Vec::new();
    match last_sync_age {
        None => {
            errors.push("container runtime status check may not have completed yet".to_owned());
        }
        Some(age) if age >= threshold => errors.push("container runtime is down".to_owned()),
        Some(_) => {}
    }
    errors.extend(runtime_error.map(str::to_owned));
    errors
}

/// Upstream's `utilerrors.NewAggregate(...).Error()`: `None` without errors, one error as is,
/// several (repeats dropped) in brackets, comma-separated.
pub fn aggregate(errors: &[String]) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => None,
        [one] => Some((*one).to_owned()),
        many => Some(format!("[{}]", many.join(", "))),
    }
}

/// Go's canonical text of an integer `resource.Quantity` in `DecimalSI`: the largest of `k`,
/// `M`, `G`, `T`, `P`, `E` that divides it, else the plain number.
pub fn decimal_si(value: u64) -> String {
    const SUFFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    if value == 0 {
        return "0".into();
    }
    let (mut mantissa, mut exponent) = (value, 0usize);
    while exponent < SUFFIXES.len() && mantissa.is_multiple_of(1000) {
        mantissa /= 1000;
        exponent += 1;
    }
    match exponent {
        0 => mantissa.to_string(),
        e => format!("{mantissa}{}", SUFFIXES[e - 1]),
    }
}

/// Go's canonical text of an integer `resource.Quantity` in `BinarySI`: the largest of `Ki` ..
/// `Ei` that divides it; under 1024, or not a whole number of `Ki`, in `DecimalSI` (upstream
/// `CanonicalizeBytes`).
pub fn binary_si(value: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if value < 1024 || !value.is_multiple_of(1024) {
        return decimal_si(value);
    }
    let (mut mantissa, mut exponent) = (value, 0usize);
    while exponent < SUFFIXES.len() && mantissa.is_multiple_of(1024) {
        mantissa /= 1024;
        exponent += 1;
    }
    format!("{mantissa}{}", SUFFIXES[exponent - 1])
}

/// The resource name of a huge page size (upstream `HugePageResourceName`): `hugepages-2Mi`.
pub fn hugepages_resource(page_size_bytes: u64) -> String {
    format!("hugepages-{}", binary_si(page_size_bytes))
}

/// The device plugins' resources, as upstream's device manager's `GetCapacity` returns them:
/// each registered resource's devices (capacity) and healthy devices (allocatable), and the
/// resources whose plugin stopped more than the grace period ago (set to 0 in the capacity,
/// never removed: upstream keeps them at 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevicePluginResources {
    /// Resource name → all its devices.
    pub capacity: BTreeMap<String, u64>,
    /// Resource name → its healthy devices. A resource in `capacity` and not here (its plugin
    /// stopped before it listed any device) gets its capacity as allocatable.
    pub allocatable: BTreeMap<String, u64>,
    /// The resources gone since the last call.
    pub removed: Vec<String>,
}

/// Everything the setters read besides the node itself.
#[derive(Clone, Debug)]
pub struct StatusInputs<'a> {
    /// The time of this run: every condition's heartbeat, and a transition's time.
    pub now: Timestamp,
    /// The `Hostname` address.
    pub hostname: &'a str,
    /// The `InternalIP` address (upstream `--node-ip`).
    pub node_ip: Option<&'a str>,
    /// The machine.
    pub machine: &'a MachineFigures,
    /// `capacity.pods` (upstream `maxPods`).
    pub max_pods: u32,
    /// The hard eviction thresholds, reserved out of allocatable.
    pub eviction: &'a EvictionThresholds,
    /// The pressure conditions that hold now.
    pub pressure: Pressure,
    /// `<runtime name>://<version>` (`<name>://Unknown` when unknown).
    pub container_runtime_version: &'a str,
    /// `nodeInfo.kubeletVersion`.
    pub kubelet_version: &'a str,
    /// `daemonEndpoints.kubeletEndpoint.port`.
    pub kubelet_port: i32,
    /// What keeps the node from being Ready besides missing capacity (runtime errors, then
    /// network errors), in upstream's order.
    pub ready_errors: &'a [String],
    /// The runtime's handlers and their features, as its CRI `Status` last said (upstream
    /// `runtimeState.runtimeHandlers`); none from a runtime that does not tell (containerd 1.6).
    pub runtime_handlers: &'a [NodeRuntimeHandler],
    /// The device plugins' resources (upstream's `devicePluginResourceCapacityFunc`).
    pub device_plugins: &'a DevicePluginResources,
}

/// Go's `GOARCH` and `GOOS` of this build.
pub fn go_os_arch() -> (&'static str, &'static str) {
    (std::env::consts::OS, crate::node::go_arch())
}

/// A condition whose status changed in this run (upstream records an event of this reason).
pub type NodeEvent = &'static str;

/// Runs upstream's default setters on `status`, in upstream's order (`defaultNodeStatusFuncs`):
/// addresses, machine info (capacity, allocatable, IDs), version info, daemon endpoints, OS and
/// architecture, then MemoryPressure, DiskPressure, PIDPressure and Ready (last). Returns the
/// events of the conditions that changed (`NodeHasSufficientMemory`, `NodeReady`, ...).
///
/// `runtimeHandlers` is upstream's `RuntimeHandlers` setter's: the runtime's handlers, none
/// (upstream's empty list, which it omits) from a runtime that does not tell.
///
/// Deviations: no `images` or `features` (the runtime is not asked for them); without a node IP the addresses are the hostname alone (upstream resolves one by DNS
/// or the default route); a loopback node IP is accepted (upstream's `validateNodeIP` refuses
/// it; the test clusters run on loopback).
pub fn set_node_status(status: &mut NodeStatus, inputs: &StatusInputs<'_>) -> Vec<NodeEvent> {
    set_addresses(status, inputs);
    set_machine_info(status, inputs);
    set_version_info(status, inputs);
    status.runtime_handlers =
        (!inputs.runtime_handlers.is_empty()).then(|| inputs.runtime_handlers.to_vec());
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: inputs.kubelet_port,
        }),
    });
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    let (os, arch) = go_os_arch();
    info.operating_system = os.to_owned();
    info.architecture = arch.to_owned();
    let mut events = Vec::new();
    let now = Time(inputs.now);
    for (
        type_,
        under,
        (reason_true, message_true, event_true),
        (reason_false, message_false, event_false),
    ) in PRESSURE_CONDITIONS
    {
        let holds = under(inputs.pressure);
        let event = set_pressure_condition(
            status,
            &now,
            type_,
            if holds {
                (reason_true, message_true, event_true, "True")
            } else {
                (reason_false, message_false, event_false, "False")
            },
        );
        events.extend(event);
    }
    events.extend(set_ready_condition(status, &now, inputs.ready_errors));
    events
}

type ConditionText = (&'static str, &'static str, NodeEvent);

/// A pressure condition: its type, the signal, its reason, message and event when it holds,
/// and when it does not.
type PressureCondition = (
    &'static str,
    fn(Pressure) -> bool,
    ConditionText,
    ConditionText,
);

/// upstream: `MemoryPressureCondition`, `DiskPressureCondition`, `PIDPressureCondition`.
const PRESSURE_CONDITIONS: [PressureCondition; 3] = [
    (
        "MemoryPressure",
        |p| p.memory,
        (
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
            "NodeHasInsufficientMemory",
        ),
        (
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            "NodeHasSufficientMemory",
        ),
    ),
    (
        "DiskPressure",
        |p| p.disk,
        (
            "KubeletHasDiskPressure",
            "kubelet has disk pressure",
            "NodeHasDiskPressure",
        ),
        (
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
            "NodeHasNoDiskPressure",
        ),
    ),
    (
        "PIDPressure",
        |p| p.pid,
        (
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
            "NodeHasInsufficientPID",
        ),
        (
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            "NodeHasSufficientPID",
        ),
    ),
];

/// upstream: `NodeAddress` with a node IP: `[InternalIP, Hostname]`.
fn set_addresses(status: &mut NodeStatus, inputs: &StatusInputs<'_>) {
    let mut addresses = Vec::new();
    if let Some(ip) = inputs.node_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_owned(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: inputs.hostname.to_owned(),
    });
    status.addresses = Some(addresses);
}

/// upstream: `MachineInfo` (with `CapacityFromMachineInfo`, the container manager's
/// `GetCapacity` for ephemeral-storage and `GetNodeAllocatableReservation`): capacity set over
/// what the node had (other resources kept), the device plugins' capacity over it and their
/// removed resources at 0, allocatable = capacity − the hard eviction reservation (clamped at
/// 0), every huge page pool out of allocatable memory, and the device plugins' allocatable
/// over it.
fn set_machine_info(status: &mut NodeStatus, inputs: &StatusInputs<'_>) {
    let machine = inputs.machine;
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    info.machine_id.clone_from(&machine.machine_id);
    info.system_uuid.clone_from(&machine.system_uuid);
    info.boot_id.clone_from(&machine.boot_id);

    // Integer capacities, and whether each is binary (bytes) or decimal.
    let mut ours: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    ours.insert("cpu".into(), (u64::from(machine.cpus), false));
    ours.insert("memory".into(), (machine.memory_bytes, true));
    for pool in &machine.hugepages {
        ours.insert(
            hugepages_resource(pool.page_size_bytes),
            (pool.page_size_bytes.saturating_mul(pool.pages), true),
        );
    }
    ours.insert("pods".into(), (u64::from(inputs.max_pods), false));
    if let Some(fs) = machine.root_fs {
        ours.insert("ephemeral-storage".into(), (fs.capacity_bytes, true));
    }
    let text = |(value, binary): (u64, bool)| {
        Quantity(if binary {
            binary_si(value)
        } else {
            decimal_si(value)
        })
    };
    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    for (name, value) in &ours {
        capacity.insert(name.clone(), text(*value));
    }
    let devices = inputs.device_plugins;
    for (name, count) in &devices.capacity {
        capacity.insert(name.clone(), Quantity(decimal_si(*count)));
    }
    for name in &devices.removed {
        capacity.insert(name.clone(), Quantity(decimal_si(0)));
    }
    let eviction = inputs.eviction;
    let reservation = |name: &str, capacity: u64| match name {
        "memory" => eviction.memory_available.map_or(0, |t| t.amount(capacity)),
        "ephemeral-storage" => eviction.nodefs_available.map_or(0, |t| t.amount(capacity)),
        _ => 0,
    };
    let hugepages: u64 = machine
        .hugepages
        .iter()
        .map(|p| p.page_size_bytes.saturating_mul(p.pages))
        .sum();
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    for (name, value) in capacity.iter() {
        match ours.get(name) {
            Some(&(amount, binary)) => {
                let mut left = amount.saturating_sub(reservation(name, amount));
                if name == "memory" {
                    left = left.saturating_sub(hugepages);
                }
                allocatable.insert(name.clone(), text((left, binary)));
            }
            None => {
                allocatable.insert(name.clone(), value.clone());
            }
        }
    }
    for (name, count) in &devices.allocatable {
        allocatable.insert(name.clone(), Quantity(decimal_si(*count)));
    }
}

/// upstream: `VersionInfo`: kernel, OS image, `<runtime>://<version>`, the kubelet's version;
/// `kubeProxyVersion` cleared (`DisableNodeKubeProxyVersion`, on by default).
fn set_version_info(status: &mut NodeStatus, inputs: &StatusInputs<'_>) {
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    info.kernel_version
        .clone_from(&inputs.machine.kernel_version);
    info.os_image.clone_from(&inputs.machine.os_image);
    inputs
        .container_runtime_version
        .clone_into(&mut info.container_runtime_version);
    inputs.kubelet_version.clone_into(&mut info.kubelet_version);
    info.kube_proxy_version.clear();
}

/// upstream: the pressure setters: the condition picked up (or a new one, `Unknown`, appended),
/// its heartbeat set, and on a change of status the reason, message and transition time.
fn set_pressure_condition(
    status: &mut NodeStatus,
    now: &Time,
    type_: &str,
    (reason, message, event, value): (&str, &str, NodeEvent, &str),
) -> Option<NodeEvent> {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let index = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(NodeCondition {
                type_: type_.to_owned(),
                status: "Unknown".into(),
                ..NodeCondition::default()
            });
            conditions.len() - 1
        }
    };
    let condition = &mut conditions[index];
    condition.last_heartbeat_time = Some(now.clone());
    if condition.status == value {
        return None;
    }
    condition.status = value.to_owned();
    condition.reason = Some(reason.to_owned());
    condition.message = Some(message.to_owned());
    condition.last_transition_time = Some(now.clone());
    Some(event)
}

/// The capacities a Ready node must report (upstream: with `localStorageCapacityIsolation`,
/// on by default, ephemeral-storage too).
const REQUIRED_CAPACITIES: [&str; 4] = ["cpu", "memory", "pods", "ephemeral-storage"];

/// upstream: `ReadyCondition`: `KubeletReady` or `KubeletNotReady` with the aggregated errors
/// (and the missing capacities); the transition time kept unless the status changed; appended
/// last when new.
fn set_ready_condition(
    status: &mut NodeStatus,
    now: &Time,
    errors: &[String],
) -> Option<NodeEvent> {
    let capacity = status.capacity.clone().unwrap_or_default();
    let missing: Vec<&str> = REQUIRED_CAPACITIES
        .into_iter()
        .filter(|r| !capacity.contains_key(*r))
        .collect();
    let mut errors = errors.to_vec();
    if !missing.is_empty() {
        errors.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    let mut ready = match aggregate(&errors) {
        None => NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            message: Some("kubelet is posting ready status".into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: None,
        },
        Some(message) => NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("KubeletNotReady".into()),
            message: Some(message),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: None,
        },
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(existing) => {
            let changed = existing.status != ready.status;
            ready.last_transition_time = if changed {
                Some(now.clone())
            } else {
                existing.last_transition_time.clone()
            };
            let event = (ready.status == "True").then_some("NodeReady");
            *existing = ready;
            changed.then(|| event.unwrap_or("NodeNotReady"))
        }
        None => {
            ready.last_transition_time = Some(now.clone());
            conditions.push(ready);
            None
        }
    }
}

/// upstream: `reconcileHugePageResource` with `updateDefaultResources`, at the registration
/// of a Node that already exists: a missing capacity or allocatable taken from the new Node,
/// each huge page size set as the new Node has it, sizes it no longer has removed. Returns
/// whether anything changed. (Upstream's `reconcileExtendedResource` zeroes device plugin
/// resources; this agent has no device plugins.)
pub fn reconcile_node_resources(initial: &NodeStatus, existing: &mut NodeStatus) -> bool {
    let mut changed = false;
    let is_hugepages = |name: &str| name.starts_with("hugepages-");
    let initial_capacity = initial.capacity.clone().unwrap_or_default();
    let initial_allocatable = initial.allocatable.clone().unwrap_or_default();
    if existing.capacity.is_none() && initial.capacity.is_some() {
        existing.capacity = initial.capacity.clone();
        changed = true;
    }
    if existing.allocatable.is_none() && initial.allocatable.is_some() {
        existing.allocatable = initial.allocatable.clone();
        changed = true;
    }
    let capacity = existing.capacity.get_or_insert_with(BTreeMap::new);
    let allocatable = existing.allocatable.get_or_insert_with(BTreeMap::new);
    let same =
        |a: Option<&Quantity>, b: &Quantity| a.is_some_and(|a| crate::quantity::quantity_eq(a, b));
    for (name, wanted) in initial_capacity.iter().filter(|(n, _)| is_hugepages(n)) {
        let supported = capacity.contains_key(name);
        if !supported || !same(capacity.get(name), wanted) {
            capacity.insert(name.clone(), wanted.clone());
            changed = true;
        }
        let wanted = initial_allocatable
            .get(name)
            .cloned()
            .unwrap_or_else(|| Quantity("0".into()));
        if !supported || !same(allocatable.get(name), &wanted) {
            allocatable.insert(name.clone(), wanted);
            changed = true;
        }
    }
    let gone: Vec<String> = capacity
        .keys()
        .filter(|n| is_hugepages(n) && !initial_capacity.contains_key(*n))
        .cloned()
        .collect();
    for name in gone {
        capacity.remove(&name);
        allocatable.remove(&name);
        changed = true;
    }
    changed
}

/// upstream: `nodeStatusHasChanged`: whether anything but the conditions' heartbeat times
/// differs (conditions compared in type order; quantities by value).
pub fn node_status_has_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let NodeStatus {
        addresses,
        allocatable,
        capacity,
        conditions,
        config,
        daemon_endpoints,
        declared_features,
        features,
        images,
        node_info,
        phase,
        runtime_handlers,
        volumes_attached,
        volumes_in_use,
    } = new;
    conditions_changed(old.conditions.as_deref(), conditions.as_deref())
        || resources_changed(old.allocatable.as_ref(), allocatable.as_ref())
        || resources_changed(old.capacity.as_ref(), capacity.as_ref())
        || old.addresses != *addresses
        || old.config != *config
        || old.daemon_endpoints != *daemon_endpoints
        || old.declared_features != *declared_features
        || old.features != *features
        || old.images != *images
        || old.node_info != *node_info
        || old.phase != *phase
        || old.runtime_handlers != *runtime_handlers
        || old.volumes_attached != *volumes_attached
        || old.volumes_in_use != *volumes_in_use
}

fn resources_changed(
    old: Option<&BTreeMap<String, Quantity>>,
    new: Option<&BTreeMap<String, Quantity>>,
) -> bool {
    let (old, new) = (
        old.cloned().unwrap_or_default(),
        new.cloned().unwrap_or_default(),
    );
    old.len() != new.len()
        || old.iter().any(|(name, q)| {
            new.get(name)
                .is_none_or(|n| !crate::quantity::quantity_eq(q, n))
        })
}

fn conditions_changed(old: Option<&[NodeCondition]>, new: Option<&[NodeCondition]>) -> bool {
    let without_heartbeat = |conditions: Option<&[NodeCondition]>| {
        let mut list: Vec<NodeCondition> = conditions
            .unwrap_or_default()
            .iter()
            .map(|c| NodeCondition {
                last_heartbeat_time: None,
                ..c.clone()
            })
            .collect();
        list.sort_by(|a, b| a.type_.cmp(&b.type_));
        list
    };
    without_heartbeat(old) != without_heartbeat(new)
}

/// The body of `PATCH nodes/<name>/status` (`application/strategic-merge-patch+json`) that
/// takes `old` to `new` (upstream `PatchNodeStatus`): the two-way strategic merge patch of
/// `metadata` (labels and annotations) and `status` (the spec never), conditions merging by
/// `type`; changed addresses are replaced whole (`{"$patch": "replace"}`, upstream's fix-up,
/// since their merge key `type` is not unique). `None` when nothing differs.
pub fn node_status_patch(old: &Node, new: &Node) -> Option<Value> {
    let mut patch = Map::new();
    let meta = |node: &Node| {
        let mut map = Map::new();
        if let Some(labels) = &node.metadata.labels {
            map.insert("labels".into(), serde_json::json!(labels));
        }
        if let Some(annotations) = &node.metadata.annotations {
            map.insert("annotations".into(), serde_json::json!(annotations));
        }
        map
    };
    let metadata = diff_with_keys(&meta(old), meta(new), &[]);
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    let to_map = |status: Option<&NodeStatus>| match status.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    };
    let (old_status, mut new_status) = (to_map(old.status.as_ref()), to_map(new.status.as_ref()));
    let old_addresses = old_status.get("addresses").cloned();
    let replace_addresses = old_addresses
        .as_ref()
        .is_some_and(|a| a.as_array().is_some_and(|a| !a.is_empty()))
        && old_addresses.as_ref() != new_status.get("addresses");
    let new_addresses = new_status.get("addresses").cloned();
    if replace_addresses {
        match &old_addresses {
            Some(a) => new_status.insert("addresses".into(), a.clone()),
            None => new_status.remove("addresses"),
        };
    }
    let mut status = diff_with_keys(&old_status, new_status, &NODE_STATUS_MERGE_KEYS);
    if replace_addresses {
        let mut items = match new_addresses {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        items.push(serde_json::json!({ PATCH_DIRECTIVE: "replace" }));
        status.insert("addresses".into(), Value::Array(items));
    }
    if !status.is_empty() {
        patch.insert("status".into(), Value::Object(status));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// What the API server does with [`node_status_patch`]'s body on `nodes/<name>/status`: the
/// labels and annotations merged into `metadata`, the status merged with the node's merge keys.
pub fn apply_node_status_patch(node: &mut Value, patch: &Value) {
    const NONE: &MergeKeys = &[];
    if let (Some(object), Some(meta_patch)) = (node.as_object_mut(), patch.get("metadata")) {
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        for field in ["labels", "annotations"] {
            if let Some(p) = meta_patch.get(field) {
                let slot = metadata
                    .as_object_mut()
                    .map(|m| m.entry(field).or_insert(Value::Null));
                if let Some(slot) = slot {
                    apply_with_keys(slot, p, NONE);
                }
            }
        }
    }
    if let (Some(object), Some(status_patch)) = (node.as_object_mut(), patch.get("status")) {
        let status = object
            .entry("status")
            .or_insert_with(|| Value::Object(Map::new()));
        apply_with_keys(status, status_patch, &NODE_STATUS_MERGE_KEYS);
    }
}

#[cfg(test)]
mod tests;
