//! Pure translations of a pod into CRI requests (upstream `kuberuntime_sandbox.go`'s
//! `generatePodSandboxConfig` and `kuberuntime_container.go`'s `generateContainerConfig`), the
//! container's environment (`makeEnvironmentVariables` for what a pod carries itself), the
//! pod's host name (`GeneratePodHostNameAndDomain`) and hosts file (`ensureHostsFile`) and the
//! image pull policy. No I/O: everything here is unit-tested.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use rustlet_pods::runtime::ContainerKind;
use rustlet_volume::env_files::{EnvFiles, FileKey};
use rustlet_volume::plugins::downward::{NodeAllocatable, resource_field_value};
use rustlet_volume::subpath::{ContainerMount, MountPropagation};

use crate::resources::{NodeResources, linux_container_resources};
use crate::security::{
    ContainerSecurityInputs, SecurityContextError, container_security_context,
    sandbox_linux_config, verify_run_as_non_root,
};

/// The label carrying the pod's UID on every sandbox and container (upstream's), by which the
/// runtime's objects are matched to pods, also after an agent restart.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// The pod's name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// The pod's namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// The spec container's name.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// Whether a container is an init container (`init`) or a regular one (`regular`).
pub const CONTAINER_KIND_ANNOTATION: &str = "rustlet.io/container-kind";
/// The restart count of a container instance (upstream's annotation).
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// The hash of the spec a container was made from (upstream's annotation; C11, C19).
pub const CONTAINER_HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
/// The annotation with the container's `terminationMessagePath` (upstream's key): where the
/// termination message is read back from when it exited.
pub const TERMINATION_MESSAGE_PATH_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePath";
/// The annotation with the container's `terminationMessagePolicy` (upstream's key).
pub const TERMINATION_MESSAGE_POLICY_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePolicy";

fn meta(pod: &Pod) -> (&str, &str, &str) {
    let m = &pod.metadata;
    (
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or("default"),
        m.uid.as_deref().unwrap_or_default(),
    )
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Why a pod's sandbox config cannot be made (upstream: `generatePodSandboxConfig`'s errors).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SandboxConfigError {
    /// The pod's security context.
    #[error(transparent)]
    SecurityContext(#[from] SecurityContextError),
    /// The pod's host name.
    #[error(transparent)]
    Hostname(#[from] HostnameError),
}

/// The pod's sandbox (`attempt`: how many sandboxes it had before). `log_directory` is the
/// pod's log directory (absolute); `cluster_domain` the cluster's DNS domain (upstream
/// `clusterDomain`). Its Linux config is [`sandbox_linux_config`]'s; its host name
/// [`pod_hostname_and_domain`]'s through [`kernel_hostname`], none on the host's network.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    log_directory: &Path,
    cluster_domain: &str,
) -> Result<cri::PodSandboxConfig, SandboxConfigError> {
    let (name, namespace, uid) = meta(pod);
    let spec = pod.spec.as_ref();
    // A host-network sandbox shares the node's UTS namespace: containerd refuses a hostname.
    let hostname = if host_network(pod) {
        String::new()
    } else {
        let fqdn = spec.and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
        kernel_hostname(&pod_hostname_and_domain(pod, cluster_domain)?, fqdn)?
    };
    let dns_config = spec
        .and_then(|s| s.dns_config.as_ref())
        .map(|d| cri::DnsConfig {
            servers: d.nameservers.clone().unwrap_or_default(),
            searches: d.searches.clone().unwrap_or_default(),
            options: d
                .options
                .iter()
                .flatten()
                .filter_map(|o| {
                    let name = o.name.as_deref()?;
                    Some(match o.value.as_deref() {
                        Some(v) => format!("{name}:{v}"),
                        None => name.to_owned(),
                    })
                })
                .collect(),
        });
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(POD_NAME_LABEL.into(), name.into());
    labels.insert(POD_NAMESPACE_LABEL.into(), namespace.into());
    labels.insert(POD_UID_LABEL.into(), uid.into());
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt,
        }),
        hostname,
        log_directory: log_directory.display().to_string(),
        dns_config,
        labels,
        annotations: pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(sandbox_linux_config(pod)?),
        ..Default::default()
    })
}

/// A pod's host name and domain (upstream `GeneratePodHostNameAndDomain`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHostname {
    /// The host name: `spec.hostnameOverride`, else `spec.hostname`, else the pod's name; cut
    /// to 63 characters without a trailing `-` or `.`.
    pub hostname: String,
    /// `<subdomain>.<namespace>.svc.<cluster domain>` for a pod with `spec.subdomain` (never
    /// with `hostnameOverride`).
    pub domain: Option<String>,
}

/// Why a pod's host name cannot be made (upstream's messages; the API server refuses such a
/// pod, a manifest may still carry one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostnameError {
    /// `spec.hostnameOverride` is not an RFC 1123 subdomain.
    #[error("pod HostnameOverride {value:?} is not a valid DNS subdomain: {problems}")]
    Override {
        /// The value.
        value: String,
        /// Upstream's validation messages, `;`-separated.
        problems: String,
    },
    /// `spec.hostname` is not an RFC 1123 label.
    #[error("pod Hostname {value:?} is not a valid DNS label: {problems}")]
    Hostname {
        /// The value.
        value: String,
        /// Upstream's validation messages, `;`-separated.
        problems: String,
    },
    /// `spec.subdomain` is not an RFC 1123 label.
    #[error("pod Subdomain {value:?} is not a valid DNS label: {problems}")]
    Subdomain {
        /// The value.
        value: String,
        /// Upstream's validation messages, `;`-separated.
        problems: String,
    },
    /// Nothing is left of the name once cut to 63 characters without a trailing `-` or `.`.
    #[error("hostname for pod {pod:?} was invalid: {hostname:?}")]
    Truncated {
        /// The pod's name.
        pod: String,
        /// The name before it was cut.
        hostname: String,
    },
    /// `setHostnameAsFQDN` and a host name with its domain longer than the kernel's 64.
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
        fqdn.len()
    )]
    FqdnTooLong {
        /// `<host name>.<domain>`.
        fqdn: String,
    },
}

/// Upstream `truncatePodHostnameIfNeeded`: at most 63 characters, then no trailing `-` or `.`.
fn truncate_hostname(pod: &str, hostname: &str) -> Result<String, HostnameError> {
    const HOSTNAME_MAX: usize = 63;
    if hostname.chars().count() <= HOSTNAME_MAX {
        return Ok(hostname.to_owned());
    }
    let cut: String = hostname.chars().take(HOSTNAME_MAX).collect();
    let cut = cut.trim_end_matches(['-', '.']);
    if cut.is_empty() {
        return Err(HostnameError::Truncated {
            pod: pod.to_owned(),
            hostname: hostname.to_owned(),
        });
    }
    Ok(cut.to_owned())
}

/// The pod's host name and domain (upstream `GeneratePodHostNameAndDomain`): with
/// `spec.hostnameOverride`, that (an RFC 1123 subdomain) and no domain, whatever `hostname` and
/// `subdomain` say; else `spec.hostname` (an RFC 1123 label) or the pod's name, and with
/// `spec.subdomain` (a label) the domain `<subdomain>.<namespace>.svc.<cluster_domain>`. The
/// API server validated them; a manifest may not have been.
pub fn pod_hostname_and_domain(
    pod: &Pod,
    cluster_domain: &str,
) -> Result<PodHostname, HostnameError> {
    use rustlet_core::names::{dns1123_label_problems, dns1123_subdomain_problems};

    let (name, namespace, _) = meta(pod);
    let spec = pod.spec.as_ref();
    if let Some(hostname) = spec.and_then(|s| s.hostname_override.as_deref()) {
        let problems = dns1123_subdomain_problems(hostname);
        if !problems.is_empty() {
            return Err(HostnameError::Override {
                value: hostname.to_owned(),
                problems: problems.join(";"),
            });
        }
        return Ok(PodHostname {
            hostname: truncate_hostname(name, hostname)?,
            domain: None,
        });
    }
    let hostname = match spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
    {
        Some(hostname) => {
            let problems = dns1123_label_problems(hostname);
            if !problems.is_empty() {
                return Err(HostnameError::Hostname {
                    value: hostname.to_owned(),
                    problems: problems.join(";"),
                });
            }
            hostname
        }
        None => name,
    };
    let hostname = truncate_hostname(name, hostname)?;
    let domain = match spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some(subdomain) => {
            let problems = dns1123_label_problems(subdomain);
            if !problems.is_empty() {
                return Err(HostnameError::Subdomain {
                    value: subdomain.to_owned(),
                    problems: problems.join(";"),
                });
            }
            Some(format!("{subdomain}.{namespace}.svc.{cluster_domain}"))
        }
        None => None,
    };
    Ok(PodHostname { hostname, domain })
}

/// The host name the sandbox's kernel gets (upstream `GetNodenameForKernel`): the host name,
/// or with `setHostnameAsFQDN` and a domain, `<host name>.<domain>` (at most 64 characters).
pub fn kernel_hostname(
    name: &PodHostname,
    set_hostname_as_fqdn: bool,
) -> Result<String, HostnameError> {
    const FQDN_MAX: usize = 64;
    match &name.domain {
        Some(domain) if set_hostname_as_fqdn => {
            let fqdn = format!("{}.{domain}", name.hostname);
            if fqdn.len() > FQDN_MAX {
                return Err(HostnameError::FqdnTooLong { fqdn });
            }
            Ok(fqdn)
        }
        _ => Ok(name.hostname.clone()),
    }
}

/// Where the kubelet's hosts file is bound in a container, and where the node's is.
pub const ETC_HOSTS_PATH: &str = "/etc/hosts";

/// Whether `container` gets the kubelet's hosts file (upstream: `shouldMountHostsFile` and
/// `makeMounts`): when the pod has an IP or uses the host's network, and the container mounts
/// nothing of its own at `/etc/hosts`.
pub fn mounts_hosts_file(pod: &Pod, container: &Container, pod_ip: Option<&str>) -> bool {
    let has_ip = pod_ip.is_some_and(|ip| !ip.is_empty());
    (has_ip || host_network(pod))
        && !container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == ETC_HOSTS_PATH)
}

/// What the kubelet's hosts file of a pod is made from.
#[derive(Clone, Copy, Debug)]
pub enum HostsSource<'a> {
    /// A pod on the pod network: its IPs and its host name ([`pod_hostname_and_domain`]).
    PodNetwork {
        /// The pod's IPs.
        pod_ips: &'a [&'a str],
        /// The pod's host name and domain.
        name: &'a PodHostname,
    },
    /// A pod on the host's network: the node's hosts file, as read.
    HostNetwork {
        /// The node's `/etc/hosts`.
        node_hosts: &'a [u8],
    },
}

/// The pod's hosts file (upstream: `ensureHostsFile`, `managedHostsFileContent`,
/// `nodeHostsFileContent`, `hostsEntriesFromHostAliases`): upstream's header, then localhost
/// and the IPv6 names and the pod's IPs with its host name (and its FQDN first when it has a
/// domain), or the node's file for a host-network pod; then the `hostAliases`, one line per IP.
pub fn hosts_file_content(pod: &Pod, source: HostsSource<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match source {
        HostsSource::HostNetwork { node_hosts } => {
            out.extend_from_slice(b"# Kubernetes-managed hosts file (host network).\n");
            out.extend_from_slice(node_hosts);
        }
        HostsSource::PodNetwork { pod_ips, name } => {
            out.extend_from_slice(
                b"# Kubernetes-managed hosts file.\n\
                  127.0.0.1\tlocalhost\n\
                  ::1\tlocalhost ip6-localhost ip6-loopback\n\
                  fe00::0\tip6-localnet\n\
                  fe00::0\tip6-mcastprefix\n\
                  fe00::1\tip6-allnodes\n\
                  fe00::2\tip6-allrouters\n",
            );
            let hostname = &name.hostname;
            for ip in pod_ips {
                let line = match &name.domain {
                    Some(domain) => format!("{ip}\t{hostname}.{domain}\t{hostname}\n"),
                    None => format!("{ip}\t{hostname}\n"),
                };
                out.extend_from_slice(line.as_bytes());
            }
        }
    }
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_deref());
    if let Some(aliases) = aliases.filter(|a| !a.is_empty()) {
        out.extend_from_slice(b"\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            out.extend_from_slice(format!("{}\t{names}\n", alias.ip).as_bytes());
        }
    }
    out
}

/// What a container's config is made of, besides the pod and the spec container.
#[derive(Clone, Debug)]
pub struct ContainerInputs<'a> {
    /// Init or regular.
    pub kind: ContainerKind,
    /// 0 for the first instance of the name, one more per restart.
    pub attempt: u32,
    /// The image as resolved by the runtime (its ID).
    pub image_ref: &'a str,
    /// The volume manager's mounts for this container.
    pub mounts: &'a [ContainerMount],
    /// The environment, resolved.
    pub env: &'a [(String, String)],
    /// The image's user and the node's seccomp profiles, for the security context.
    pub security: ContainerSecurityInputs<'a>,
    /// The new file bound at the container's `terminationMessagePath` (upstream `makeMounts`;
    /// [`crate::termination::create_termination_log`]); `None`: the container names none.
    pub termination_log: Option<&'a Path>,
    /// The node's memory and cgroup mode, for the container's resources
    /// ([`crate::resources::linux_container_resources`]).
    pub node: NodeResources,
}

/// The container's CRI config: command and args with `$(VAR)` expanded from `env`, the
/// volume mounts, the labels by which it is found again, the security context
/// ([`container_security_context`]) and the resources ([`linux_container_resources`]). A container that must not run as root and would is
/// refused first (upstream `generateContainerConfig` calls `verifyRunAsNonRoot` before it
/// builds anything).
pub fn container_config(
    pod: &Pod,
    container: &Container,
    inputs: &ContainerInputs<'_>,
) -> Result<cri::ContainerConfig, SecurityContextError> {
    verify_run_as_non_root(pod, container, inputs.security.image_user)?;
    let security_context = container_security_context(pod, container, inputs.security)?;
    let (name, namespace, uid) = meta(pod);
    let vars: HashMap<&str, &str> = inputs
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter().flatten().map(|s| expand(s, &vars)).collect()
    };
    let labels = HashMap::from([
        (POD_NAME_LABEL.to_owned(), name.to_owned()),
        (POD_NAMESPACE_LABEL.to_owned(), namespace.to_owned()),
        (POD_UID_LABEL.to_owned(), uid.to_owned()),
        (CONTAINER_NAME_LABEL.to_owned(), container.name.clone()),
    ]);
    let annotations = HashMap::from([
        (
            CONTAINER_KIND_ANNOTATION.to_owned(),
            match inputs.kind {
                ContainerKind::Init => "init",
                ContainerKind::Regular => "regular",
                ContainerKind::Ephemeral => "ephemeral",
            }
            .to_owned(),
        ),
        (
            RESTART_COUNT_ANNOTATION.to_owned(),
            inputs.attempt.to_string(),
        ),
        (
            CONTAINER_HASH_ANNOTATION.to_owned(),
            rustlet_pods::runtime::container_hash(container),
        ),
        (
            TERMINATION_MESSAGE_PATH_ANNOTATION.to_owned(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_default(),
        ),
        (
            TERMINATION_MESSAGE_POLICY_ANNOTATION.to_owned(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_default(),
        ),
    ]);
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: inputs.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: inputs.image_ref.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: inputs
            .env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: inputs
            .mounts
            .iter()
            .map(|m| cri::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.display().to_string(),
                readonly: m.read_only,
                recursive_read_only: m.recursive_read_only,
                propagation: cri_propagation(m.propagation) as i32,
                ..Default::default()
            })
            .chain(
                container
                    .termination_message_path
                    .as_ref()
                    .filter(|p| !p.is_empty())
                    .zip(inputs.termination_log)
                    .map(|(container_path, host_path)| cri::Mount {
                        container_path: container_path.clone(),
                        host_path: host_path.display().to_string(),
                        ..Default::default()
                    }),
            )
            .collect(),
        labels,
        annotations,
        log_path: format!("{}/{}.log", container.name, inputs.attempt),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_container_resources(pod, container, inputs.node)),
            security_context: Some(security_context),
        }),
        ..Default::default()
    })
}

/// Adds what the device plugins' `Allocate` answers give a container to its config (upstream
/// `GenerateRunContainerOptions` with the device manager's `DeviceRunContainerOptions`): their
/// environment variables before the container's own (so the container's win), their mounts
/// before the volumes', their device nodes, and their annotations where the kubelet's own do
/// not already say. Deviation: a command's `$(VAR)` does not see the devices' variables.
pub fn add_devices(
    config: &mut cri::ContainerConfig,
    devices: &crate::deviceplugin::ContainerDevices,
) {
    if devices.is_empty() {
        return;
    }
    let envs = devices.envs.iter().map(|(key, value)| cri::KeyValue {
        key: key.clone(),
        value: value.clone(),
    });
    config.envs.splice(0..0, envs);
    let mounts = devices.mounts.iter().map(|m| cri::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.read_only,
        ..Default::default()
    });
    config.mounts.splice(0..0, mounts);
    config
        .devices
        .extend(devices.devices.iter().map(|d| cri::Device {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        }));
    for (key, value) in &devices.annotations {
        config
            .annotations
            .entry(key.clone())
            .or_insert_with(|| value.clone());
    }
}

/// Upstream `translateMountPropagation`: `None` is private, `HostToContainer` rslave,
/// `Bidirectional` rshared.
fn cri_propagation(propagation: MountPropagation) -> cri::MountPropagation {
    match propagation {
        MountPropagation::Private => cri::MountPropagation::PropagationPrivate,
        MountPropagation::HostToContainer => cri::MountPropagation::PropagationHostToContainer,
        MountPropagation::Bidirectional => cri::MountPropagation::PropagationBidirectional,
    }
}

/// Upstream's `expansion.Expand`: `$(NAME)` becomes NAME's value when defined (left as it is
/// otherwise), `$$` becomes `$`.
pub fn expand(input: &str, vars: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Where a pod's IPs come from, for `status.podIP` and `status.hostIP` references.
#[derive(Clone, Copy, Debug)]
pub struct PodAddresses<'a> {
    /// The pod's IP.
    pub pod_ip: &'a str,
    /// The node's IP.
    pub host_ip: &'a str,
}

/// An env var the runtime cannot resolve from the pod alone.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("env var {name}: {message}")]
pub struct EnvError {
    /// The variable.
    pub name: String,
    /// Why.
    pub message: String,
}

/// The ConfigMaps and Secrets a container's environment names, as read (`None`: absent), the
/// Services' variables ([`service_env`]), and what the node offers where a `resourceFieldRef`
/// names a limit the container does not set.
#[derive(Clone, Debug, Default)]
pub struct EnvSources {
    /// By name, in the pod's namespace.
    pub config_maps: HashMap<String, Option<Arc<ConfigMap>>>,
    /// By name, in the pod's namespace.
    pub secrets: HashMap<String, Option<Arc<Secret>>>,
    /// The Services' variables (upstream's `serviceEnv`), by name.
    pub services: BTreeMap<String, String>,
    /// The node's allocatable CPU and memory (upstream: `MergeContainerResourceLimits` with
    /// the container manager's node allocatable).
    pub allocatable: NodeAllocatable,
    /// The values of the container's `fileKeyRef` variables (EnvFiles), read from the pod's
    /// volumes by the volume manager; an optional key that was absent has none.
    pub files: EnvFiles,
}

/// upstream: `masterServices`: the `default` namespace's Services every pod gets variables of.
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// upstream: `makeEnvVariableName`.
fn env_variable_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// The Services' environment of a pod in `namespace` (upstream: `getServiceEnvVarMap` and
/// `envvars.FromServices`): the `kubernetes` Service of `default` always, every Service of the
/// pod's namespace with `enableServiceLinks` (that namespace's wins a name both have); a
/// Service without a cluster IP (`None` or empty) has none. Per Service `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORT NAME>` for named ports,
/// and the Docker link variables (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>` and its `_PROTO`,
/// `_PORT`, `_ADDR`).
pub fn service_env(
    services: &[Arc<Service>],
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services {
        let Some(spec) = &service.spec else { continue };
        let ip = spec.cluster_ip.as_deref().unwrap_or_default();
        if ip.is_empty() || ip == "None" || spec.ports.as_ref().is_none_or(Vec::is_empty) {
            continue;
        }
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let in_namespace = service.metadata.namespace.as_deref().unwrap_or_default();
        if in_namespace == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(service);
        } else if in_namespace == namespace && enable_service_links {
            chosen.insert(name, service);
        }
    }
    let mut env = BTreeMap::new();
    for (name, service) in chosen {
        let spec = service.spec.as_ref().expect("filtered above");
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let ports = spec.ports.as_deref().unwrap_or_default();
        let prefix = env_variable_name(name);
        env.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        env.insert(format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string());
        for port in ports {
            if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
                env.insert(
                    format!("{prefix}_SERVICE_PORT_{}", env_variable_name(port_name)),
                    port.port.to_string(),
                );
            }
        }
        // upstream: makeLinkVariables.
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.clone()
        };
        for (i, port) in ports.iter().enumerate() {
            let protocol = port.protocol.as_deref().unwrap_or("TCP");
            let lower = protocol.to_lowercase();
            let url = format!("{lower}://{host}:{}", port.port);
            if i == 0 {
                env.insert(format!("{prefix}_PORT"), url.clone());
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
            env.insert(format!("{port_prefix}_PROTO"), lower);
            env.insert(format!("{port_prefix}_PORT"), port.port.to_string());
            env.insert(format!("{port_prefix}_ADDR"), ip.clone());
            env.insert(port_prefix, url);
        }
    }
    env
}

impl EnvSources {
    /// The ConfigMap and Secret names `container`'s `env` and `envFrom` reference.
    pub fn names(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut maps, mut secrets) = (BTreeSet::new(), BTreeSet::new());
        for from in container.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
        for var in container.env.iter().flatten() {
            let from = var.value_from.as_ref();
            if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                maps.insert(r.name.clone());
            }
            if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                secrets.insert(r.name.clone());
            }
        }
        (maps, secrets)
    }
}

/// A container's resolved environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerEnv {
    /// Name and value, in order.
    pub vars: Vec<(String, String)>,
    /// `envFrom` keys skipped because they are not valid variable names (with their prefix).
    pub invalid: Vec<String>,
}

/// Upstream's `IsEnvVarName`: a C identifier-ish name (letters, digits, `_`, `-`, `.`, not
/// starting with a digit).
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The container's environment in order (upstream `makeEnvironmentVariables`): `envFrom`
/// first (each key with its prefix; keys that are not valid names are skipped and reported in
/// the second value), then `env` (later definitions of a name win), literal values with
/// `$(VAR)` expanded from what is defined before them; values from ConfigMap and Secret keys
/// and the downward API's field references. A missing object or key that is not optional is
/// an error, as upstream's `CreateContainerConfigError`.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    addresses: PodAddresses<'_>,
    sources: &EnvSources,
) -> Result<ContainerEnv, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut invalid = Vec::new();
    let define = |out: &mut Vec<(String, String)>, name: String, value: String| {
        out.retain(|(k, _)| *k != name);
        out.push((name, value));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let pairs: Vec<(String, String)> = if let Some(r) = &from.config_map_ref {
            match sources.config_maps.get(&r.name).cloned().flatten() {
                Some(cm) => cm
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                None if r.optional == Some(true) => Vec::new(),
                None => {
                    return Err(EnvError {
                        name: "envFrom".into(),
                        message: format!("configmap {:?} not found", r.name),
                    });
                }
            }
        } else if let Some(r) = &from.secret_ref {
            match sources.secrets.get(&r.name).cloned().flatten() {
                Some(secret) => secret
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                    .collect(),
                None if r.optional == Some(true) => Vec::new(),
                None => {
                    return Err(EnvError {
                        name: "envFrom".into(),
                        message: format!("secret {:?} not found", r.name),
                    });
                }
            }
        } else {
            Vec::new()
        };
        for (key, value) in pairs {
            let name = format!("{prefix}{key}");
            if is_env_var_name(&name) {
                define(&mut out, name, value);
            } else {
                invalid.push(name);
            }
        }
    }
    for var in container.env.iter().flatten() {
        let missing = |what: String| EnvError {
            name: var.name.clone(),
            message: what,
        };
        let value = match (&var.value, &var.value_from) {
            (_, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    field_value(pod, &field.field_path, addresses).ok_or_else(|| {
                        missing(format!("unsupported fieldRef {:?}", field.field_path))
                    })?
                } else if let Some(r) = &from.config_map_key_ref {
                    let cm = sources.config_maps.get(&r.name).cloned().flatten();
                    match cm.as_ref().and_then(|cm| cm.data.as_ref()?.get(&r.key)) {
                        Some(v) => v.clone(),
                        None if r.optional == Some(true) => continue,
                        None if cm.is_none() => {
                            return Err(missing(format!("configmap {:?} not found", r.name)));
                        }
                        None => {
                            return Err(missing(format!(
                                "couldn't find key {} in ConfigMap {namespace}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let secret = sources.secrets.get(&r.name).cloned().flatten();
                    match secret.as_ref().and_then(|s| s.data.as_ref()?.get(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                        None if r.optional == Some(true) => continue,
                        None if secret.is_none() => {
                            return Err(missing(format!("secret {:?} not found", r.name)));
                        }
                        None => {
                            return Err(missing(format!(
                                "couldn't find key {} in Secret {namespace}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else if let Some(r) = &from.file_key_ref {
                    // upstream: the `FileKeyRef` case, resolved before the container is made
                    // (`rustlet_volume::env_files`): an absent value is an optional key the
                    // file did not have.
                    match sources.files.get(&FileKey::of(r)) {
                        Some(v) => v.clone(),
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(missing(format!(
                                "environment variable key {:?} not found in file {:?}",
                                r.key, r.path
                            )));
                        }
                    }
                } else if let Some(r) = &from.resource_field_ref {
                    // upstream `containerResourceRuntimeValue`: the container itself unless
                    // one is named; an unset limit is the node's allocatable.
                    let mut selector = r.clone();
                    if selector
                        .container_name
                        .as_deref()
                        .unwrap_or_default()
                        .is_empty()
                    {
                        selector.container_name = Some(container.name.clone());
                    }
                    resource_field_value(pod, &selector, sources.allocatable).map_err(missing)?
                } else {
                    return Err(missing("the env var's valueFrom has no source".into()));
                }
            }
            (Some(value), None) => {
                // upstream: `MappingFuncFor(tmpEnv, serviceEnv)`: the container's own first.
                let mut vars: HashMap<&str, &str> = sources
                    .services
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                vars.extend(out.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                expand(value, &vars)
            }
            (None, None) => String::new(),
        };
        define(&mut out, var.name.clone(), value);
    }
    // upstream: the Services' variables after the container's own, none it defines itself.
    for (name, value) in &sources.services {
        if !out.iter().any(|(k, _)| k == name) {
            out.push((name.clone(), value.clone()));
        }
    }
    Ok(ContainerEnv { vars: out, invalid })
}

/// A downward API field of the pod (`metadata.name`, `status.podIP`, ...).
fn field_value(pod: &Pod, path: &str, addresses: PodAddresses<'_>) -> Option<String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: Option<&std::collections::BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    Some(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => addresses.pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => addresses.host_ip.to_owned(),
        _ => {
            return keyed("metadata.labels['", m.labels.as_ref())
                .or_else(|| keyed("metadata.annotations['", m.annotations.as_ref()));
        }
    })
}

/// When an image is pulled (upstream `shouldPullImage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Every time a container starts.
    Always,
    /// Only when absent.
    IfNotPresent,
    /// Never: an absent image is an error.
    Never,
}

impl PullPolicy {
    /// The container's policy; the API's default when unset: `Always` for an image without a
    /// tag or with `:latest` (and no digest), else `IfNotPresent`.
    pub fn of(container: &Container) -> Self {
        match container.image_pull_policy.as_deref() {
            Some("Always") => Self::Always,
            Some("Never") => Self::Never,
            Some("IfNotPresent") => Self::IfNotPresent,
            _ => {
                let image = container.image.as_deref().unwrap_or_default();
                if image.contains('@') {
                    return Self::IfNotPresent;
                }
                let last = image.rsplit('/').next().unwrap_or(image);
                match last.split_once(':') {
                    Some((_, "latest")) | None => Self::Always,
                    Some(_) => Self::IfNotPresent,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::ImageUser;
    use k8s_openapi::api::core::v1::{
        EnvVar, EnvVarSource, ObjectFieldSelector, PodSecurityContext, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::path::PathBuf;

    fn pod(host_network: bool) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns1".into()),
                uid: Some("uid-1".into()),
                labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                host_network: Some(host_network),
                node_name: Some("node-a".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The inputs of a regular container's first attempt as root, with nothing mounted, on a
    /// cgroup v1 node of 1 GiB; a test changes what it is about.
    fn test_inputs() -> ContainerInputs<'static> {
        static ROOT: ImageUser = ImageUser::Uid(0);
        ContainerInputs {
            kind: ContainerKind::Regular,
            attempt: 0,
            image_ref: "sha256:abc",
            mounts: &[],
            env: &[],
            security: ContainerSecurityInputs {
                image_user: &ROOT,
                seccomp_profile_root: Path::new("/r/seccomp"),
                namespace_target: None,
            },
            termination_log: None,
            node: crate::resources::NodeResources {
                memory_capacity: 1 << 30,
                cgroup_v2_unified: false,
            },
        }
    }

    /// upstream `GenerateRunContainerOptions` with `DeviceRunContainerOptions`: the devices'
    /// variables before the container's (which win), their mounts before the volumes', their
    /// device nodes, their annotations under the kubelet's own.
    #[test]
    fn the_device_plugins_answers_go_into_the_container_config() {
        use crate::deviceplugin::{ContainerDevices, pb};
        let container = Container {
            name: "c".into(),
            ..Default::default()
        };
        let env = [("A".to_owned(), "container".to_owned())];
        let mut config = container_config(
            &pod(false),
            &container,
            &ContainerInputs {
                env: &env,
                ..test_inputs()
            },
        )
        .unwrap();
        let devices = ContainerDevices {
            envs: [
                ("A".to_owned(), "device".to_owned()),
                ("B".to_owned(), "device".to_owned()),
            ]
            .into(),
            mounts: vec![pb::Mount {
                container_path: "/dev-data".into(),
                host_path: "/tmp/dev-data".into(),
                read_only: true,
            }],
            devices: vec![pb::DeviceSpec {
                container_path: "/dev/gpu0".into(),
                host_path: "/dev/nvidia0".into(),
                permissions: "rw".into(),
            }],
            annotations: [
                ("example.com/device".to_owned(), "gpu0".to_owned()),
                (CONTAINER_KIND_ANNOTATION.to_owned(), "hijacked".to_owned()),
            ]
            .into(),
        };
        add_devices(&mut config, &devices);
        let envs: Vec<(&str, &str)> = config
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(envs, [("A", "device"), ("B", "device"), ("A", "container")]);
        assert_eq!(config.mounts[0].container_path, "/dev-data");
        assert_eq!(config.mounts[0].host_path, "/tmp/dev-data");
        assert!(config.mounts[0].readonly);
        assert_eq!(config.devices.len(), 1);
        assert_eq!(config.devices[0].host_path, "/dev/nvidia0");
        assert_eq!(config.devices[0].permissions, "rw");
        assert_eq!(config.annotations["example.com/device"], "gpu0");
        assert_eq!(config.annotations[CONTAINER_KIND_ANNOTATION], "regular");
    }

    #[test]
    fn a_sandbox_carries_the_pod_uid_and_a_host_network_one_no_hostname() {
        let config =
            sandbox_config(&pod(true), 2, Path::new("/r/logs/uid-1"), "cluster.local").unwrap();
        assert_eq!(config.labels[POD_UID_LABEL], "uid-1");
        assert_eq!(config.labels["app"], "web");
        assert_eq!(config.metadata.as_ref().unwrap().attempt, 2);
        assert_eq!(config.hostname, "");
        assert_eq!(config.log_directory, "/r/logs/uid-1");
        let ns = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);

        let config = sandbox_config(&pod(false), 0, Path::new("/r"), "cluster.local").unwrap();
        assert_eq!(config.hostname, "web");
        let ns = config
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    }

    #[test]
    fn a_container_config_has_its_mounts_labels_and_expanded_command() {
        let container = Container {
            name: "app".into(),
            image: Some("localhost/busybox:1".into()),
            command: Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $(GREETING) $$(X)".into(),
            ]),
            ..Default::default()
        };
        let mounts = [ContainerMount {
            name: "data".into(),
            container_path: "/data".into(),
            host_path: PathBuf::from("/r/pods/uid-1/volumes/x/data"),
            read_only: true,
            recursive_read_only: false,
            propagation: MountPropagation::Private,
        }];
        let env = [("GREETING".to_owned(), "hi".to_owned())];
        let config = container_config(
            &pod(false),
            &container,
            &ContainerInputs {
                kind: ContainerKind::Init,
                attempt: 3,
                mounts: &mounts,
                env: &env,
                ..test_inputs()
            },
        )
        .unwrap();
        assert_eq!(config.command[2], "echo hi $(X)");
        assert_eq!(config.image.as_ref().unwrap().image, "sha256:abc");
        assert_eq!(config.mounts[0].container_path, "/data");
        assert!(config.mounts[0].readonly);
        assert_eq!(config.labels[POD_UID_LABEL], "uid-1");
        assert_eq!(config.labels[CONTAINER_NAME_LABEL], "app");
        assert_eq!(config.annotations[CONTAINER_KIND_ANNOTATION], "init");
        assert_eq!(config.log_path, "app/3.log");
        assert_eq!(config.envs[0].key, "GREETING");
        // Without runAsUser anywhere: the image's user.
        let security = config.linux.unwrap().security_context.unwrap();
        assert_eq!(security.run_as_user, Some(cri::Int64Value { value: 0 }));
    }

    /// Issue 27 (node features), upstream `translateMountPropagation` and
    /// `makeMountsFromVolumes` ("[sig-node] Mount recursive read-only [LinuxOnly]"): each CRI
    /// mount carries its propagation (`Bidirectional` rshared, `HostToContainer` rslave, else
    /// private) and whether it is recursively read-only.
    #[test]
    fn translate_mount_propagation_and_recursive_read_only_reach_the_cri_mounts() {
        let container = Container {
            name: "mount".into(),
            ..Default::default()
        };
        let mount = |path: &str, propagation, recursive_read_only| ContainerMount {
            name: "mnt".into(),
            container_path: path.into(),
            host_path: PathBuf::from("/r/pods/uid-1/volumes/kubernetes.io~empty-dir/mnt"),
            read_only: recursive_read_only,
            recursive_read_only,
            propagation,
        };
        let mounts = [
            mount("/shared", MountPropagation::Bidirectional, false),
            mount("/slave", MountPropagation::HostToContainer, false),
            mount("/private", MountPropagation::Private, false),
            mount("/rro", MountPropagation::Private, true),
        ];
        let config = container_config(
            &pod(false),
            &container,
            &ContainerInputs {
                kind: ContainerKind::Init,
                mounts: &mounts,
                ..test_inputs()
            },
        )
        .unwrap();
        let got: Vec<_> = config
            .mounts
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    cri::MountPropagation::try_from(m.propagation).unwrap(),
                    m.readonly,
                    m.recursive_read_only,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/shared",
                    cri::MountPropagation::PropagationBidirectional,
                    false,
                    false
                ),
                (
                    "/slave",
                    cri::MountPropagation::PropagationHostToContainer,
                    false,
                    false
                ),
                (
                    "/private",
                    cri::MountPropagation::PropagationPrivate,
                    false,
                    false
                ),
                (
                    "/rro",
                    cri::MountPropagation::PropagationPrivate,
                    true,
                    true
                ),
            ]
        );
    }

    /// Issue 27 (node features), upstream `makeMounts` and `newContainerAnnotations`: the
    /// termination-log file is bound at `terminationMessagePath`, and the path and the policy
    /// are annotations (read back when the container exited); no path, no mount.
    #[test]
    fn the_termination_log_is_bound_at_the_termination_message_path() {
        let mut container = Container {
            name: "app".into(),
            termination_message_path: Some("/dev/termination-custom-log".into()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        };
        let log = Path::new("/r/pods/uid-1/containers/app/0a1b2c3d");
        let config = |container: &Container| {
            container_config(
                &pod(false),
                container,
                &ContainerInputs {
                    termination_log: Some(log),
                    ..test_inputs()
                },
            )
            .unwrap()
        };
        let with = config(&container);
        assert_eq!(with.mounts.len(), 1);
        assert_eq!(
            (
                with.mounts[0].container_path.as_str(),
                with.mounts[0].host_path.as_str(),
                with.mounts[0].readonly
            ),
            (
                "/dev/termination-custom-log",
                "/r/pods/uid-1/containers/app/0a1b2c3d",
                false
            )
        );
        assert_eq!(
            with.annotations[TERMINATION_MESSAGE_PATH_ANNOTATION],
            "/dev/termination-custom-log"
        );
        assert_eq!(
            with.annotations[TERMINATION_MESSAGE_POLICY_ANNOTATION],
            "FallbackToLogsOnError"
        );
        container.termination_message_path = None;
        assert!(config(&container).mounts.is_empty());
    }

    /// upstream: TestManagedHostsFileContent: the header, localhost and the IPv6 names, each
    /// pod IP with the host name (the subdomain's FQDN first), then the `hostAliases`.
    #[test]
    fn test_managed_hosts_file_content() {
        let mut p = pod(false);
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("hostname".into());
        spec.host_aliases = Some(vec![
            k8s_openapi::api::core::v1::HostAlias {
                ip: "123.45.67.89".into(),
                hostnames: Some(vec!["foo".into(), "bar".into(), "baz".into()]),
            },
            k8s_openapi::api::core::v1::HostAlias {
                ip: "456.78.90.123".into(),
                hostnames: Some(vec!["park".into(), "doo".into(), "boo".into()]),
            },
        ]);
        let content = |p: &Pod| {
            String::from_utf8(hosts_file_content(
                p,
                HostsSource::PodNetwork {
                    pod_ips: &["203.0.113.1", "fd00::6"],
                    name: &pod_hostname_and_domain(p, "cluster.local").unwrap(),
                },
            ))
            .unwrap()
        };
        assert_eq!(
            content(&p),
            "# Kubernetes-managed hosts file.\n\
             127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\n\
             fe00::0\tip6-mcastprefix\n\
             fe00::1\tip6-allnodes\n\
             fe00::2\tip6-allrouters\n\
             203.0.113.1\thostname\n\
             fd00::6\thostname\n\
             \n\
             # Entries added by HostAliases.\n\
             123.45.67.89\tfoo\tbar\tbaz\n\
             456.78.90.123\tpark\tdoo\tboo\n"
        );
        let spec = p.spec.as_mut().unwrap();
        spec.subdomain = Some("sub".into());
        spec.host_aliases = None;
        assert!(
            content(&p).ends_with(
                "fe00::2\tip6-allrouters\n\
                 203.0.113.1\thostname.sub.ns1.svc.cluster.local\thostname\n\
                 fd00::6\thostname.sub.ns1.svc.cluster.local\thostname\n"
            ),
            "{}",
            content(&p)
        );
    }

    /// upstream: TestGeneratePodHostNameAndDomain, case by case.
    #[test]
    fn test_generate_pod_host_name_and_domain() {
        struct Case {
            name: &'static str,
            pod_name: String,
            hostname: String,
            subdomain: &'static str,
            hostname_override: Option<&'static str>,
            expected: Result<(String, Option<&'static str>), &'static str>,
        }
        let case = |name, hostname: &str, subdomain, hostname_override, expected| Case {
            name,
            pod_name: "test-pod".into(),
            hostname: hostname.into(),
            subdomain,
            hostname_override,
            expected,
        };
        let ok = |hostname: &str, domain| Ok((hostname.to_owned(), domain));
        let cases = [
            case(
                "Default behavior - pod name as hostname",
                "",
                "",
                None,
                ok("test-pod", None),
            ),
            case(
                "Custom Hostname - uses pod.Spec.Hostname",
                "custom-hostname",
                "",
                None,
                ok("custom-hostname", None),
            ),
            case(
                "Custom Subdomain - constructs FQDN",
                "",
                "my-subdomain",
                None,
                ok("test-pod", Some("my-subdomain.default.svc.cluster.local")),
            ),
            case(
                "Custom Hostname and Subdomain - uses both",
                "custom-hostname",
                "my-subdomain",
                None,
                ok(
                    "custom-hostname",
                    Some("my-subdomain.default.svc.cluster.local"),
                ),
            ),
            case(
                "HostnameOverride - overrides all",
                "custom-hostname",
                "my-subdomain",
                Some("override-hostname"),
                ok("override-hostname", None),
            ),
            case(
                "HostnameOverride - overrides all - invalid hostname",
                "custom-hostname",
                "my-subdomain",
                Some("Invalid-Hostname-!"),
                Err("pod HostnameOverride \"Invalid-Hostname-!\" is not a valid DNS subdomain"),
            ),
            case(
                "HostnameOverride - overrides all - valid DNS hostname",
                "",
                "",
                Some("valid.hostname"),
                ok("valid.hostname", None),
            ),
            Case {
                pod_name: "a".repeat(65),
                ..case(
                    "Hostname Truncation - pod name is too long",
                    "",
                    "",
                    None,
                    ok(&"a".repeat(63), None),
                )
            },
            case(
                "Validation - invalid hostname",
                "Invalid-Hostname-!",
                "",
                None,
                Err("pod Hostname \"Invalid-Hostname-!\" is not a valid DNS label"),
            ),
            case(
                "Validation - invalid subdomain",
                "",
                "invalid_subdomain",
                None,
                Err("pod Subdomain \"invalid_subdomain\" is not a valid DNS label"),
            ),
            case(
                "Validation - too long hostname",
                &"a".repeat(64),
                "",
                None,
                Err("must be no more than 63 characters"),
            ),
        ];
        for c in cases {
            let p = Pod {
                metadata: ObjectMeta {
                    name: Some(c.pod_name.clone()),
                    namespace: Some("default".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    hostname: Some(c.hostname.clone()),
                    subdomain: Some(c.subdomain.into()),
                    hostname_override: c.hostname_override.map(str::to_owned),
                    ..Default::default()
                }),
                ..Default::default()
            };
            match (pod_hostname_and_domain(&p, "cluster.local"), c.expected) {
                (Ok(got), Ok((hostname, domain))) => {
                    assert_eq!(got.hostname, hostname, "{}", c.name);
                    assert_eq!(got.domain.as_deref(), domain, "{}", c.name);
                }
                (Err(e), Err(contains)) => {
                    assert!(e.to_string().contains(contains), "{}: {e}", c.name);
                }
                (got, expected) => panic!("{}: {got:?}, expected {expected:?}", c.name),
            }
        }
    }

    /// upstream: TestTruncatePodHostname.
    #[test]
    fn test_truncate_pod_hostname() {
        for (input, output) in [
            ("test.pod.hostname", "test.pod.hostname"),
            (
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.1234567.1234567.",
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.1234567",
            ),
            (
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.123456.1234567.",
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.123456",
            ),
            (
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.123456-1234567.",
                "1234567.1234567.1234567.1234567.1234567.1234567.1234567.123456",
            ),
        ] {
            assert_eq!(truncate_hostname("test-pod", input).unwrap(), output);
        }
    }

    /// upstream: TestGetNodenameForKernel.
    #[test]
    fn test_get_nodename_for_kernel() {
        let name = |hostname: &str, domain: &str| PodHostname {
            hostname: hostname.into(),
            domain: (!domain.is_empty()).then(|| domain.to_owned()),
        };
        let long_domain = "1234567.1234567.1234567.1234567.1234567.1234567.1234567";
        for (description, n, fqdn, expected) in [
            (
                "no hostDomain, setHostnameAsFQDN false",
                name("test.pod.hostname", ""),
                false,
                Some("test.pod.hostname"),
            ),
            (
                "no hostDomain, setHostnameAsFQDN true",
                name("test.pod.hostname", ""),
                true,
                Some("test.pod.hostname"),
            ),
            (
                "valid hostDomain, setHostnameAsFQDN false",
                name("test.pod.hostname", "svc.subdomain.local"),
                false,
                Some("test.pod.hostname"),
            ),
            (
                "valid hostDomain, setHostnameAsFQDN true",
                name("test.pod.hostname", "svc.subdomain.local"),
                true,
                Some("test.pod.hostname.svc.subdomain.local"),
            ),
            (
                "FQDN is too long, setHostnameAsFQDN false",
                name("1234567.1234567", long_domain),
                false,
                Some("1234567.1234567"),
            ),
            (
                "FQDN is too long, setHostnameAsFQDN true",
                name("1234567.1234567", long_domain),
                true,
                None,
            ),
        ] {
            assert_eq!(
                kernel_hostname(&n, fqdn).ok().as_deref(),
                expected,
                "{description}"
            );
        }
    }

    /// Upstream e2e "Override hostname of Pod" (`GeneratePodHostNameAndDomain`,
    /// `managedHostsFileContent`): with `hostnameOverride`, the sandbox's host name and the
    /// hosts file's line for the pod IP are the override alone, whatever `hostname` and
    /// `subdomain` say; without it, `setHostnameAsFQDN` makes the kernel's host name the FQDN.
    #[test]
    fn hostname_override_is_the_sandboxs_host_name_and_its_hosts_entry() {
        let mut p = pod(false);
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("custom-host".into());
        spec.subdomain = Some("t".into());
        spec.hostname_override = Some("override.example.host".into());
        let config = sandbox_config(&p, 0, Path::new("/r"), "cluster.local").unwrap();
        assert_eq!(config.hostname, "override.example.host");
        let name = pod_hostname_and_domain(&p, "cluster.local").unwrap();
        let hosts = String::from_utf8(hosts_file_content(
            &p,
            HostsSource::PodNetwork {
                pod_ips: &["203.0.113.1"],
                name: &name,
            },
        ))
        .unwrap();
        assert!(
            hosts.ends_with("fe00::2\tip6-allrouters\n203.0.113.1\toverride.example.host\n"),
            "{hosts}"
        );

        let spec = p.spec.as_mut().unwrap();
        spec.hostname_override = None;
        spec.set_hostname_as_fqdn = Some(true);
        let config = sandbox_config(&p, 0, Path::new("/r"), "cluster.local").unwrap();
        assert_eq!(config.hostname, "custom-host.t.ns1.svc.cluster.local");

        // A manifest the API server did not see: a clear error, no sandbox.
        p.spec.as_mut().unwrap().hostname_override = Some("Not-RFC1123".into());
        let err = sandbox_config(&p, 0, Path::new("/r"), "cluster.local").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pod HostnameOverride \"Not-RFC1123\" is not a valid DNS subdomain: "),
            "{err}"
        );
    }

    /// upstream: TestNodeHostsFileContent: a host-network pod's file is the node's, under its
    /// own header, with the `hostAliases` after it.
    #[test]
    fn test_node_hosts_file_content() {
        let mut p = pod(true);
        p.spec.as_mut().unwrap().host_aliases = Some(vec![k8s_openapi::api::core::v1::HostAlias {
            ip: "123.45.67.89".into(),
            hostnames: Some(vec!["foo".into(), "bar".into()]),
        }]);
        let node = b"127.0.0.1\tlocalhost\n10.0.0.1\tnode-a\n";
        assert_eq!(
            String::from_utf8(hosts_file_content(
                &p,
                HostsSource::HostNetwork { node_hosts: node }
            ))
            .unwrap(),
            "# Kubernetes-managed hosts file (host network).\n\
             127.0.0.1\tlocalhost\n\
             10.0.0.1\tnode-a\n\
             \n\
             # Entries added by HostAliases.\n\
             123.45.67.89\tfoo\tbar\n"
        );
    }

    /// upstream: TestMakeMounts' hosts cases, `shouldMountHostsFile`: the file is bound when
    /// the pod has an IP or the host's network, never over a container's own `/etc/hosts`.
    #[test]
    fn the_hosts_file_is_mounted_unless_the_container_mounts_its_own() {
        let mut container = Container {
            name: "app".into(),
            ..Default::default()
        };
        assert!(mounts_hosts_file(
            &pod(false),
            &container,
            Some("10.88.0.2")
        ));
        assert!(!mounts_hosts_file(&pod(false), &container, None));
        assert!(!mounts_hosts_file(&pod(false), &container, Some("")));
        assert!(mounts_hosts_file(&pod(true), &container, None));
        container.volume_mounts = Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: "own".into(),
            mount_path: "/etc/hosts".into(),
            ..Default::default()
        }]);
        assert!(!mounts_hosts_file(
            &pod(false),
            &container,
            Some("10.88.0.2")
        ));
        assert!(!mounts_hosts_file(&pod(true), &container, None));
    }

    fn service(
        namespace: &str,
        name: &str,
        ip: &str,
        ports: &[(Option<&str>, i32, &str)],
    ) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterIP": ip, "ports": ports.iter().map(|(n, p, proto)| serde_json::json!({
                    "name": n, "port": p, "protocol": proto
                })).collect::<Vec<_>>()}
            }))
            .unwrap(),
        )
    }

    /// upstream: TestMakeEnvironmentVariables' service cases, `envvars` TestFromServices:
    /// `default/kubernetes` always; the pod's namespace's Services with `enableServiceLinks`
    /// (its own `kubernetes` wins); none without a cluster IP; the host, the ports and the
    /// Docker link variables.
    #[test]
    fn test_service_env_follows_get_service_env_var_map() {
        let services = [
            service(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, "TCP")],
            ),
            service("default", "other", "10.0.0.2", &[(None, 80, "TCP")]),
            service(
                "ns1",
                "test-service",
                "1.2.3.4",
                &[(None, 8083, "TCP"), (Some("dns-udp"), 53, "UDP")],
            ),
            service("ns1", "headless", "None", &[(None, 80, "TCP")]),
            service("ns2", "elsewhere", "10.9.9.9", &[(None, 80, "TCP")]),
        ];
        let env = service_env(&services, "ns1", true);
        let expected: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.0.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.0.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.0.0.1"),
            ("TEST_SERVICE_SERVICE_HOST", "1.2.3.4"),
            ("TEST_SERVICE_SERVICE_PORT", "8083"),
            ("TEST_SERVICE_SERVICE_PORT_DNS_UDP", "53"),
            ("TEST_SERVICE_PORT", "tcp://1.2.3.4:8083"),
            ("TEST_SERVICE_PORT_8083_TCP", "tcp://1.2.3.4:8083"),
            ("TEST_SERVICE_PORT_8083_TCP_PROTO", "tcp"),
            ("TEST_SERVICE_PORT_8083_TCP_PORT", "8083"),
            ("TEST_SERVICE_PORT_8083_TCP_ADDR", "1.2.3.4"),
            ("TEST_SERVICE_PORT_53_UDP", "udp://1.2.3.4:53"),
            ("TEST_SERVICE_PORT_53_UDP_PROTO", "udp"),
            ("TEST_SERVICE_PORT_53_UDP_PORT", "53"),
            ("TEST_SERVICE_PORT_53_UDP_ADDR", "1.2.3.4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, expected);
        // enableServiceLinks: false: only the master service.
        let env = service_env(&services, "ns1", false);
        assert_eq!(
            env.keys().filter(|k| k.starts_with("TEST_SERVICE")).count(),
            0
        );
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.0.0.1");
        // A `kubernetes` Service in the pod's namespace wins over default's.
        let mut with_own = services.to_vec();
        with_own.push(service(
            "ns1",
            "kubernetes",
            "10.1.1.1",
            &[(None, 443, "TCP")],
        ));
        assert_eq!(
            service_env(&with_own, "ns1", true)["KUBERNETES_SERVICE_HOST"],
            "10.1.1.1"
        );
        // In the default namespace `other` comes with links.
        assert_eq!(
            service_env(&services, "default", true)["OTHER_SERVICE_HOST"],
            "10.0.0.2"
        );
    }

    /// upstream `makeEnvironmentVariables`: a container's own variable wins over a Service's
    /// of the same name, `$(VAR)` expands from both, the Services' come after the container's.
    #[test]
    fn service_env_comes_after_the_containers_own_and_expands() {
        let p = pod(false);
        let container = Container {
            name: "app".into(),
            env: Some(vec![
                k8s_openapi::api::core::v1::EnvVar {
                    name: "KUBERNETES_SERVICE_PORT".into(),
                    value: Some("mine".into()),
                    ..Default::default()
                },
                k8s_openapi::api::core::v1::EnvVar {
                    name: "API".into(),
                    value: Some("$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let sources = EnvSources {
            services: service_env(
                &[service(
                    "default",
                    "kubernetes",
                    "10.0.0.1",
                    &[(None, 443, "TCP")],
                )],
                "ns1",
                true,
            ),
            ..EnvSources::default()
        };
        let env = container_env(
            &p,
            &container,
            PodAddresses {
                pod_ip: "10.88.0.2",
                host_ip: "10.0.0.9",
            },
            &sources,
        )
        .unwrap();
        let names: Vec<&str> = env.vars.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(&names[..2], ["KUBERNETES_SERVICE_PORT", "API"]);
        assert_eq!(env.vars[0].1, "mine");
        assert_eq!(env.vars[1].1, "10.0.0.1:mine");
        assert_eq!(
            env.vars
                .iter()
                .filter(|(k, _)| k == "KUBERNETES_SERVICE_PORT")
                .count(),
            1
        );
        assert!(
            env.vars
                .contains(&("KUBERNETES_SERVICE_HOST".to_owned(), "10.0.0.1".to_owned()))
        );
    }

    /// Item 24.2 (upstream `generateContainerConfig`): a container that must not run as root
    /// and would gets no config, with upstream's message; the pod's user makes it pass.
    #[test]
    fn a_container_that_must_not_run_as_root_and_would_gets_no_config() {
        let mut pod = pod(false);
        pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_non_root: Some(true),
            ..Default::default()
        });
        let container = Container {
            name: "app".into(),
            ..Default::default()
        };
        let inputs = |user| ContainerInputs {
            security: ContainerSecurityInputs {
                image_user: user,
                ..test_inputs().security
            },
            ..test_inputs()
        };
        let err = container_config(&pod, &container, &inputs(&ImageUser::Uid(0))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"web_ns1(uid-1)\", container: app)"
        );
        let config = container_config(&pod, &container, &inputs(&ImageUser::Uid(1000))).unwrap();
        let security = config.linux.unwrap().security_context.unwrap();
        assert_eq!(security.run_as_user, Some(cri::Int64Value { value: 1000 }));
    }

    /// Upstream `generateContainerConfig` sets `Linux.Resources` from
    /// `generateLinuxContainerResources`: the container's limits reach its CRI config.
    #[test]
    fn a_container_config_carries_its_linux_resources() {
        let mut pod = pod(false);
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "app",
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
        }))
        .unwrap();
        pod.spec.as_mut().unwrap().containers = vec![container.clone()];
        let config =
            container_config(&pod, &container, &ContainerInputs { ..test_inputs() }).unwrap();
        let resources = config.linux.unwrap().resources.unwrap();
        assert_eq!(resources.cpu_shares, 512);
        assert_eq!(resources.cpu_quota, 50_000);
        assert_eq!(resources.cpu_period, 100_000);
        assert_eq!(resources.memory_limit_in_bytes, 64 << 20);
        // A limit alone, no request: burstable (the API server would have defaulted the
        // requests; this pod was not defaulted), no memory request: 999.
        assert_eq!(resources.oom_score_adj, 999);
    }

    #[test]
    fn expansion_follows_upstream() {
        let vars = HashMap::from([("A", "1"), ("B", "two")]);
        assert_eq!(expand("$(A)-$(B)", &vars), "1-two");
        assert_eq!(expand("$(C) stays", &vars), "$(C) stays");
        assert_eq!(expand("$$(A) escaped", &vars), "$(A) escaped");
        assert_eq!(expand("$ alone, $(unclosed", &vars), "$ alone, $(unclosed");
        assert_eq!(expand("", &vars), "");
    }

    #[test]
    fn env_resolves_values_and_field_refs_in_order() {
        let field = |path: &str| {
            Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let container = Container {
            name: "app".into(),
            env: Some(vec![
                EnvVar {
                    name: "NAME".into(),
                    value_from: field("metadata.name"),
                    ..Default::default()
                },
                EnvVar {
                    name: "IP".into(),
                    value_from: field("status.podIP"),
                    ..Default::default()
                },
                EnvVar {
                    name: "APP".into(),
                    value_from: field("metadata.labels['app']"),
                    ..Default::default()
                },
                EnvVar {
                    name: "GREETING".into(),
                    value: Some("hello $(NAME) at $(IP)".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let env = container_env(
            &pod(false),
            &container,
            PodAddresses {
                pod_ip: "10.88.0.2",
                host_ip: "192.0.2.1",
            },
            &EnvSources::default(),
        )
        .unwrap()
        .vars;
        assert_eq!(
            env,
            [
                ("NAME".to_owned(), "web".to_owned()),
                ("IP".to_owned(), "10.88.0.2".to_owned()),
                ("APP".to_owned(), "web".to_owned()),
                ("GREETING".to_owned(), "hello web at 10.88.0.2".to_owned()),
            ]
        );
        let bad = Container {
            name: "app".into(),
            env: Some(vec![EnvVar {
                name: "X".into(),
                value_from: field("spec.nope"),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let err = container_env(
            &pod(false),
            &bad,
            PodAddresses {
                pod_ip: "",
                host_ip: "",
            },
            &EnvSources::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("spec.nope"), "{err}");
    }

    /// upstream's specs `Downward API should provide container's limits.cpu/memory and
    /// requests.cpu/memory as env vars` and `... default limits.cpu/memory from node
    /// allocatable`: a `resourceFieldRef` names the container itself unless told, rounds up in
    /// units of its divisor, and an unset limit is the node's allocatable.
    #[test]
    fn env_resource_field_refs_are_the_containers_resources_or_the_nodes_allocatable() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "dapi-container",
            "resources": {"limits": {"cpu": "1250m"}, "requests": {"cpu": "250m", "memory": "32Mi"}},
            "env": [
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_REQUEST_M", "valueFrom": {"resourceFieldRef": {
                    "containerName": "", "resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "MEMORY_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "0"}}},
                {"name": "MEMORY_REQUEST", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}}
            ]
        }))
        .unwrap();
        let mut pod = pod(false);
        pod.spec.as_mut().unwrap().containers = vec![container.clone()];
        let sources = EnvSources {
            allocatable: NodeAllocatable {
                cpu_milli: Some(2000),
                memory: Some(8 << 30),
                ephemeral_storage: None,
            },
            ..EnvSources::default()
        };
        let addresses = PodAddresses {
            pod_ip: "",
            host_ip: "",
        };
        let env = container_env(&pod, &container, addresses, &sources)
            .unwrap()
            .vars;
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("CPU_LIMIT"),
            Some("2"),
            "1250m rounded up to whole CPUs"
        );
        assert_eq!(get("CPU_REQUEST_M"), Some("250"));
        assert_eq!(
            get("MEMORY_LIMIT"),
            Some("8589934592"),
            "the node's allocatable"
        );
        assert_eq!(get("MEMORY_REQUEST"), Some("32"));
        // A limit the node cannot tell is an error the pod shows, not a made-up value.
        let unknown = EnvSources::default();
        let err = container_env(&pod, &container, addresses, &unknown).unwrap_err();
        assert_eq!(err.name, "MEMORY_LIMIT");
    }

    #[test]
    fn env_from_config_maps_and_secrets_with_prefixes_optionals_and_overrides() {
        let json = serde_json::json!({
            "name": "app",
            "envFrom": [
                {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
                {"secretRef": {"name": "absent", "optional": true}},
                {"secretRef": {"name": "sec"}}
            ],
            "env": [
                {"name": "CM_a", "value": "overridden"},
                {"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "b"}}},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": true}}},
                {"name": "BOTH", "value": "$(KEY)/$(PASS)"}
            ]
        });
        let container: Container = serde_json::from_value(json).unwrap();
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cm"},
            "data": {"a": "1", "b": "2", "bad key": "x"}
        }))
        .unwrap();
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sec"},
            "data": {"password": "czNjcjN0"}
        }))
        .unwrap();
        let mut sources = EnvSources::default();
        sources.config_maps.insert("cm".into(), Some(Arc::new(cm)));
        sources.secrets.insert("sec".into(), Some(Arc::new(secret)));
        sources.secrets.insert("absent".into(), None);
        let addresses = PodAddresses {
            pod_ip: "",
            host_ip: "",
        };
        let ContainerEnv { vars: env, invalid } =
            container_env(&pod(false), &container, addresses, &sources).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CM_a"), Some("overridden"));
        assert_eq!(get("CM_b"), Some("2"));
        assert_eq!(get("password"), Some("s3cr3t"));
        assert_eq!(get("KEY"), Some("2"));
        assert_eq!(get("PASS"), Some("s3cr3t"));
        assert_eq!(get("OPT"), None);
        assert_eq!(get("BOTH"), Some("2/s3cr3t"));
        assert_eq!(invalid, ["CM_bad key"]);
        assert_eq!(
            EnvSources::names(&container),
            (
                ["cm".to_owned()].into(),
                ["absent".to_owned(), "sec".to_owned()].into()
            )
        );

        // Not optional and absent: the container cannot be configured.
        sources.secrets.insert("sec".into(), None);
        let err = container_env(&pod(false), &container, addresses, &sources).unwrap_err();
        assert!(
            err.to_string().contains("secret \"sec\" not found"),
            "{err}"
        );
        let missing_key: Container = serde_json::from_value(serde_json::json!({
            "name": "app",
            "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "zz"}}}]
        }))
        .unwrap();
        let err = container_env(&pod(false), &missing_key, addresses, &sources).unwrap_err();
        assert!(
            err.to_string()
                .contains("couldn't find key zz in ConfigMap ns1/cm"),
            "{err}"
        );
    }

    /// Upstream "MirrorPod with EnvFiles ... should be able to consume variables from a file"
    /// (the `FileKeyRef` case of `makeEnvironmentVariables`): the values read from the
    /// volume's file are the variables' values as they are (never `$(VAR)`-expanded), an
    /// optional key the file lacks is no variable, and a later `$(VAR)` sees them.
    #[test]
    fn env_file_key_refs_are_the_values_read_from_the_volume() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "use-envfile",
            "env": [
                {"name": "CONFIG_1", "valueFrom": {"fileKeyRef":
                    {"volumeName": "config", "path": "config.env", "key": "CONFIG_1"}}},
                {"name": "RAW", "valueFrom": {"fileKeyRef":
                    {"volumeName": "config", "path": "config.env", "key": "RAW"}}},
                {"name": "OPT", "valueFrom": {"fileKeyRef":
                    {"volumeName": "config", "path": "config.env", "key": "OPT", "optional": true}}},
                {"name": "BOTH", "value": "$(CONFIG_1)+$(OPT)"}
            ]
        }))
        .unwrap();
        let key = |k: &str| FileKey {
            volume: "config".into(),
            path: "config.env".into(),
            key: k.into(),
        };
        let sources = EnvSources {
            files: [
                (key("CONFIG_1"), "value1".to_owned()),
                (key("RAW"), "$(CONFIG_1)".to_owned()),
            ]
            .into(),
            ..EnvSources::default()
        };
        let addresses = PodAddresses {
            pod_ip: "",
            host_ip: "",
        };
        let env = container_env(&pod(false), &container, addresses, &sources)
            .unwrap()
            .vars;
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CONFIG_1"), Some("value1"));
        assert_eq!(get("RAW"), Some("$(CONFIG_1)"), "not expanded");
        assert_eq!(get("OPT"), None);
        assert_eq!(get("BOTH"), Some("value1+$(OPT)"));
        let err =
            container_env(&pod(false), &container, addresses, &EnvSources::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("environment variable key \"CONFIG_1\" not found"),
            "{err}"
        );
    }

    #[test]
    fn pull_policy_defaults_as_the_api_server_does() {
        let with = |image: &str, policy: Option<&str>| Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(PullPolicy::of(&with("busybox", None)), PullPolicy::Always);
        assert_eq!(
            PullPolicy::of(&with("busybox:latest", None)),
            PullPolicy::Always
        );
        assert_eq!(
            PullPolicy::of(&with("localhost:5000/busybox", None)),
            PullPolicy::Always
        );
        assert_eq!(
            PullPolicy::of(&with("localhost/busybox:1", None)),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::of(&with("busybox@sha256:abc", None)),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::of(&with("busybox:1", Some("Never"))),
            PullPolicy::Never
        );
        assert_eq!(
            PullPolicy::of(&with("busybox:1", Some("Always"))),
            PullPolicy::Always
        );
    }
}
