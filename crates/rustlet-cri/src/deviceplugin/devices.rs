//! The device manager's bookkeeping, pure (`now` is an argument): upstream's `ManagerImpl`
//! maps `endpoints`, `healthyDevices`, `unhealthyDevices`, `allocatedDevices` and
//! `podDevices`, and what `GetCapacity`, `PluginConnected`, `PluginDisconnected`,
//! `genericDeviceUpdateCallback` and `devicesToAllocate` do with them.
//!
//! A resource's state:
//!
//! ```text
//!  (absent) --connected--> Connected, NotListed --listed--> Connected, Listed
//!  Connected --disconnected--> Stopped(since), every device unhealthy
//!  Stopped --connected--> Connected (the devices kept until the new plugin lists)
//!  Stopped for more than ENDPOINT_STOP_GRACE_PERIOD --capacity--> (absent), reported removed
//! ```
//!
//! A resource is in the node's capacity once its plugin listed its devices or stopped; before
//! that it is not (upstream: no `healthyDevices` entry yet).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rustlet_core::node_status::DevicePluginResources;
use tokio::time::Instant;

/// How long a stopped plugin's resource stays in the node's capacity (upstream
/// `endpointStopGracePeriod`, 5 min), its devices unhealthy, before it goes to 0.
pub const ENDPOINT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Which plugin serves a resource, as an enum (upstream: an `endpoint` with a zero or set
/// `stopTime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointState {
    /// A plugin is connected; `generation` tells its connection from a later one's.
    Connected {
        /// The connection's number (a re-registration gets a new one).
        generation: u64,
    },
    /// The plugin's ListAndWatch ended at `since`; nothing is allocated from it.
    Stopped {
        /// When it ended.
        since: Instant,
    },
}

/// The devices a plugin listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceSets {
    /// Nothing listed yet: the resource is not in the node's capacity.
    #[default]
    NotListed,
    /// The last list, by health.
    Listed {
        /// The IDs listed `Healthy`.
        healthy: BTreeSet<String>,
        /// The others.
        unhealthy: BTreeSet<String>,
    },
}

/// One resource name's plugin and devices.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Resource {
    endpoint: EndpointState,
    devices: DeviceSets,
}

/// Why devices could not be allocated (upstream `devicesToAllocate`'s errors, its words).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// No plugin ever registered the resource (or it is gone).
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    /// Every device of the resource is unhealthy.
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthyDevices(String),
    /// The container had devices that are now unhealthy.
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {0}"
    )]
    PreviouslyAllocatedUnhealthy(String),
    /// Fewer free healthy devices than asked.
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        /// The resource.
        resource: String,
        /// How many were asked.
        requested: usize,
        /// How many were free.
        available: usize,
    },
    /// The container asked another number than it was given before.
    #[error(
        "pod {pod:?} container {container:?} changed request for resource {resource:?} from {had} to {asked}"
    )]
    ChangedRequest {
        /// The pod's UID.
        pod: String,
        /// The container.
        container: String,
        /// The resource.
        resource: String,
        /// How many it has.
        had: usize,
        /// How many it asks now.
        asked: usize,
    },
}

/// What allocating for one container and resource comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// The container has its devices already (a restart): nothing to ask the plugin.
    Existing,
    /// These devices are reserved for it now; the plugin's `Allocate` is to be asked for them
    /// (and [`Devices::unreserve`] called if it fails).
    New(Vec<String>),
}

/// A container: its pod's UID and its name.
pub type ContainerKey = (String, String);

/// The bookkeeping of every resource.
#[derive(Clone, Debug, Default)]
pub struct Devices {
    resources: BTreeMap<String, Resource>,
    next_generation: u64,
    /// Devices given to each container, by resource (upstream `podDevices`).
    allocated: BTreeMap<ContainerKey, BTreeMap<String, BTreeSet<String>>>,
}

impl Devices {
    /// Nothing registered.
    pub fn new() -> Self {
        Self::default()
    }

    /// A plugin for `resource` connected (upstream `PluginConnected`): it replaces whatever
    /// served the resource before, whose devices stay until it lists its own. Returns the
    /// connection's generation.
    pub fn connected(&mut self, resource: &str) -> u64 {
        self.next_generation += 1;
        let generation = self.next_generation;
        let endpoint = EndpointState::Connected { generation };
        self.resources
            .entry(resource.to_owned())
            .and_modify(|r| r.endpoint = endpoint)
            .or_insert(Resource {
                endpoint,
                devices: DeviceSets::NotListed,
            });
        generation
    }

    /// Whether `generation` is the connection serving `resource` now.
    pub fn is_current(&self, resource: &str, generation: u64) -> bool {
        self.resources
            .get(resource)
            .is_some_and(|r| r.endpoint == EndpointState::Connected { generation })
    }

    /// The connection `generation` of `resource` listed these devices (ID, healthy)
    /// (upstream `genericDeviceUpdateCallback`). Ignored (false) when another connection
    /// serves the resource now.
    pub fn listed(
        &mut self,
        resource: &str,
        generation: u64,
        devices: impl IntoIterator<Item = (String, bool)>,
    ) -> bool {
        if !self.is_current(resource, generation) {
            return false;
        }
        let (mut healthy, mut unhealthy) = (BTreeSet::new(), BTreeSet::new());
        for (id, is_healthy) in devices {
            if is_healthy {
                unhealthy.remove(&id);
                healthy.insert(id);
            } else {
                healthy.remove(&id);
                unhealthy.insert(id);
            }
        }
        if let Some(r) = self.resources.get_mut(resource) {
            r.devices = DeviceSets::Listed { healthy, unhealthy };
        }
        true
    }

    /// The connection `generation` of `resource` ended at `now` (upstream
    /// `PluginDisconnected` and `markResourceUnhealthy`): every device unhealthy, the grace
    /// period starts. Ignored (false) when another connection serves the resource now.
    pub fn disconnected(&mut self, resource: &str, generation: u64, now: Instant) -> bool {
        if !self.is_current(resource, generation) {
            return false;
        }
        if let Some(r) = self.resources.get_mut(resource) {
            r.endpoint = EndpointState::Stopped { since: now };
            let (healthy, unhealthy) = match std::mem::take(&mut r.devices) {
                DeviceSets::NotListed => (BTreeSet::new(), BTreeSet::new()),
                DeviceSets::Listed {
                    healthy,
                    mut unhealthy,
                } => {
                    unhealthy.extend(healthy);
                    (BTreeSet::new(), unhealthy)
                }
            };
            r.devices = DeviceSets::Listed { healthy, unhealthy };
        }
        true
    }

    /// The endpoint state of `resource`, if registered.
    pub fn endpoint(&self, resource: &str) -> Option<EndpointState> {
        self.resources.get(resource).map(|r| r.endpoint)
    }

    /// Whether `resource` is a device plugin's (upstream `isDevicePluginResource`: registered,
    /// or allocated to a container).
    pub fn is_device_plugin_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
            || self
                .allocated
                .values()
                .any(|by_resource| by_resource.contains_key(resource))
    }

    /// The node status' view at `now` (upstream `GetCapacity`): capacity = every device,
    /// allocatable = the healthy ones; a resource stopped for longer than
    /// [`ENDPOINT_STOP_GRACE_PERIOD`] is forgotten and reported removed, once.
    pub fn capacity(&mut self, now: Instant) -> DevicePluginResources {
        let mut out = DevicePluginResources::default();
        let expired: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, r)| {
                matches!(r.endpoint, EndpointState::Stopped { since }
                    if now.saturating_duration_since(since) > ENDPOINT_STOP_GRACE_PERIOD)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            self.resources.remove(&name);
            out.removed.push(name);
        }
        for (name, r) in &self.resources {
            if let DeviceSets::Listed { healthy, unhealthy } = &r.devices {
                let count = |set: &BTreeSet<String>| u64::try_from(set.len()).unwrap_or(u64::MAX);
                out.capacity
                    .insert(name.clone(), count(healthy) + count(unhealthy));
                out.allocatable.insert(name.clone(), count(healthy));
            }
        }
        out
    }

    /// Forgets the containers of pods not in `active` (upstream `UpdateAllocatedDevices`):
    /// their devices are free again.
    pub fn release_inactive(&mut self, active: &BTreeSet<String>) {
        self.allocated.retain(|(pod, _), _| active.contains(pod));
    }

    /// The devices of `resource` given to containers.
    fn in_use(&self, resource: &str) -> BTreeSet<&String> {
        self.allocated
            .values()
            .filter_map(|by_resource| by_resource.get(resource))
            .flatten()
            .collect()
    }

    /// The devices `container` has of each resource.
    pub fn container_devices(&self, container: &ContainerKey) -> BTreeMap<String, Vec<String>> {
        self.allocated
            .get(container)
            .map(|by_resource| {
                by_resource
                    .iter()
                    .map(|(r, ids)| (r.clone(), ids.iter().cloned().collect()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Reserves `needed` devices of `resource` for `container` (upstream `devicesToAllocate`,
    /// without NUMA alignment or a preferred allocation: the free healthy devices in ID
    /// order).
    pub fn reserve(
        &mut self,
        container: &ContainerKey,
        resource: &str,
        needed: usize,
    ) -> Result<Allocation, AllocateError> {
        let had = self
            .allocated
            .get(container)
            .and_then(|by_resource| by_resource.get(resource))
            .cloned();
        if let Some(had) = &had
            && had.len() != needed
        {
            return Err(AllocateError::ChangedRequest {
                pod: container.0.clone(),
                container: container.1.clone(),
                resource: resource.to_owned(),
                had: had.len(),
                asked: needed,
            });
        }
        let Some(r) = self.resources.get(resource) else {
            return Err(AllocateError::Unregistered(resource.to_owned()));
        };
        let healthy = match (&r.endpoint, &r.devices) {
            (EndpointState::Connected { .. }, DeviceSets::Listed { healthy, .. }) => healthy,
            _ => &BTreeSet::new(),
        };
        if healthy.is_empty() {
            return Err(AllocateError::NoHealthyDevices(resource.to_owned()));
        }
        if let Some(had) = &had {
            if !had.is_subset(healthy) {
                return Err(AllocateError::PreviouslyAllocatedUnhealthy(
                    resource.to_owned(),
                ));
            }
            return Ok(Allocation::Existing);
        }
        let in_use = self.in_use(resource);
        let free: Vec<String> = healthy
            .iter()
            .filter(|id| !in_use.contains(id))
            .cloned()
            .collect();
        if free.len() < needed {
            return Err(AllocateError::Unavailable {
                resource: resource.to_owned(),
                requested: needed,
                available: free.len(),
            });
        }
        let chosen: Vec<String> = free.into_iter().take(needed).collect();
        self.allocated
            .entry(container.clone())
            .or_default()
            .insert(resource.to_owned(), chosen.iter().cloned().collect());
        Ok(Allocation::New(chosen))
    }

    /// Gives back what [`Devices::reserve`] reserved for `container` of `resource` (its
    /// plugin's `Allocate` failed).
    pub fn unreserve(&mut self, container: &ContainerKey, resource: &str) {
        if let Some(by_resource) = self.allocated.get_mut(container) {
            by_resource.remove(resource);
            if by_resource.is_empty() {
                self.allocated.remove(container);
            }
        }
    }
}

/// upstream `v1helper.IsExtendedResourceName`: a name with a domain other than
/// `kubernetes.io`, not `requests.`-prefixed, that is a qualified name once prefixed so.
pub fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    if native || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// upstream `validation.IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain,
/// the name at most 63 characters of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => return false,
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return false;
    }
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// upstream `IsDNS1123Subdomain`: at most 253 characters, dot-separated labels of lowercase
/// alphanumerics and `-`, each starting and ending alphanumeric.
fn is_dns1123_subdomain(value: &str) -> bool {
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
            && b.iter().all(|c| alnum(c) || *c == b'-')
    };
    !value.is_empty() && value.len() <= 253 && value.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(list: &[(&str, bool)]) -> Vec<(String, bool)> {
        list.iter().map(|(id, h)| ((*id).to_owned(), *h)).collect()
    }

    fn counts(d: &mut Devices, now: Instant, name: &str) -> (Option<u64>, Option<u64>) {
        let r = d.capacity(now);
        (
            r.allocatable.get(name).copied(),
            r.capacity.get(name).copied(),
        )
    }

    const R: &str = "test.device/r";

    /// upstream `TestUpdateCapacityAllocatable`: capacity counts every device, allocatable
    /// the healthy ones; a resource is absent until its plugin lists.
    #[test]
    fn capacity_counts_every_device_and_allocatable_the_healthy_ones() {
        let now = Instant::now();
        let mut d = Devices::new();
        let g = d.connected(R);
        assert_eq!(counts(&mut d, now, R), (None, None), "not listed yet");
        d.listed(
            R,
            g,
            devices(&[("0", true), ("1", true), ("2", true), ("3", true)]),
        );
        assert_eq!(counts(&mut d, now, R), (Some(4), Some(4)));
        d.listed(
            R,
            g,
            devices(&[("0", true), ("1", false), ("2", true), ("3", false)]),
        );
        assert_eq!(counts(&mut d, now, R), (Some(2), Some(4)));
        d.listed(
            R,
            g,
            devices(&[("0", true), ("1", true), ("2", true), ("3", true)]),
        );
        assert_eq!(counts(&mut d, now, R), (Some(4), Some(4)));
    }

    /// upstream `TestUpdateCapacityAllocatable` (the stopped endpoint): after the plugin stops
    /// every device is unhealthy; the resource stays for the grace period, then is reported
    /// removed once and forgotten; a plugin that stopped before listing leaves 0.
    #[test]
    fn a_stopped_plugins_resource_stays_for_the_grace_period_then_is_removed() {
        let t0 = Instant::now();
        let mut d = Devices::new();
        let g = d.connected(R);
        d.listed(R, g, devices(&[("0", true), ("1", false)]));
        assert!(d.disconnected(R, g, t0));
        assert_eq!(counts(&mut d, t0, R), (Some(0), Some(2)));
        let end = t0 + ENDPOINT_STOP_GRACE_PERIOD;
        assert_eq!(counts(&mut d, end, R), (Some(0), Some(2)));
        let after = end + Duration::from_millis(1);
        assert_eq!(d.capacity(after).removed, [R]);
        assert_eq!(d.capacity(after), DevicePluginResources::default());
        assert_eq!(d.endpoint(R), None);

        let g = d.connected(R);
        assert!(d.disconnected(R, g, after));
        assert_eq!(counts(&mut d, after, R), (Some(0), Some(0)));
        // A new connection takes the resource back before the grace period ends.
        let g2 = d.connected(R);
        assert!(
            !d.disconnected(R, g, after),
            "an old connection's end is ignored"
        );
        assert!(d.listed(R, g2, devices(&[("0", true)])));
        assert_eq!(
            counts(&mut d, after + ENDPOINT_STOP_GRACE_PERIOD * 2, R),
            (Some(1), Some(1))
        );
    }

    /// upstream `TestDevicesToAllocate`-like: free healthy devices in ID order, a container
    /// keeps its devices, a changed request and unhealthy devices are refused in upstream's
    /// words, inactive pods give theirs back.
    #[test]
    fn reserve_gives_free_healthy_devices_and_keeps_a_containers_own() {
        let mut d = Devices::new();
        let a: ContainerKey = ("pod-a".into(), "c".into());
        let b: ContainerKey = ("pod-b".into(), "c".into());
        assert_eq!(
            d.reserve(&a, R, 1),
            Err(AllocateError::Unregistered(R.into()))
        );
        let g = d.connected(R);
        d.listed(R, g, devices(&[("2", true), ("0", true), ("1", false)]));
        assert_eq!(d.reserve(&a, R, 1), Ok(Allocation::New(vec!["0".into()])));
        assert_eq!(d.reserve(&a, R, 1), Ok(Allocation::Existing));
        assert!(matches!(
            d.reserve(&a, R, 2),
            Err(AllocateError::ChangedRequest {
                had: 1,
                asked: 2,
                ..
            })
        ));
        assert_eq!(
            d.reserve(&b, R, 2),
            Err(AllocateError::Unavailable {
                resource: R.into(),
                requested: 2,
                available: 1
            })
        );
        d.listed(R, g, devices(&[("2", true), ("0", false), ("1", false)]));
        assert_eq!(
            d.reserve(&a, R, 1),
            Err(AllocateError::PreviouslyAllocatedUnhealthy(R.into()))
        );
        d.release_inactive(&BTreeSet::from(["pod-b".to_owned()]));
        assert!(d.container_devices(&a).is_empty());
        assert_eq!(d.reserve(&b, R, 1), Ok(Allocation::New(vec!["2".into()])));
        d.unreserve(&b, R);
        assert!(d.container_devices(&b).is_empty());
        assert!(d.disconnected(R, g, Instant::now()));
        assert_eq!(
            d.reserve(&b, R, 1),
            Err(AllocateError::NoHealthyDevices(R.into()))
        );
    }

    /// upstream `IsExtendedResourceName`.
    #[test]
    fn extended_resource_names_are_upstreams() {
        for ok in ["example.com/gpu", "test.device/e2e-abc", "a.b/c_d.e"] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "gpu",
            "cpu",
            "kubernetes.io/gpu",
            "foo.kubernetes.io/gpu",
            "requests.example.com/gpu",
            "Example.com/gpu",
            "example.com/",
            "example.com/-gpu",
            "example.com/a/b",
            "/gpu",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
        let long = format!("example.com/{}", "a".repeat(64));
        assert!(!is_extended_resource_name(&long));
    }
}
