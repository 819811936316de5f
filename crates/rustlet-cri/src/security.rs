//! The Linux security context of a pod's sandbox and of each of its containers, as upstream's
//! kubelet builds them (`kuberuntime/security_context.go` `determineEffectiveSecurityContext`,
//! `security_context_others.go` `verifyRunAsNonRoot`, `kuberuntime_sandbox.go`
//! `generatePodSandboxLinuxConfig`, `helpers.go` `getSeccompProfile`, and
//! `pkg/securitycontext`). Pure: the image's user comes in as [`ImageUser`].
//!
//! Container fields win over the pod's (`runAsUser`, `runAsGroup`, `runAsNonRoot`,
//! `seLinuxOptions`, `seccompProfile`); `fsGroup` and `supplementalGroups` are supplemental
//! groups; `allowPrivilegeEscalation: false` is `no_new_privs`; `procMount` picks the masked and
//! read-only paths.
//!
//! Not ported: AppArmor profiles, user namespaces (`hostUsers`), Windows options, the kubelet's
//! `seccompDefault` setting (off by default upstream: a container without a profile is
//! `Unconfined`, as there) and `GetExtraSupplementalGroupsForPod` (the GIDs of persistent
//! volumes, which this agent does not mount).

use std::collections::HashMap;
use std::path::{Component, Path};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile,
    SecurityContext,
};

/// The directory of `Localhost` seccomp profiles under the agent's root directory (upstream's
/// `<root-dir>/seccomp`).
pub const SECCOMP_PROFILE_DIR: &str = "seccomp";

/// Paths masked in a container's `/proc` and `/sys` unless `procMount: Unmasked` (upstream's
/// `defaultMaskedPaths`, kept in step with moby's).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths mounted read-only in a container's `/proc` unless `procMount: Unmasked` (upstream's
/// `defaultReadonlyPaths`).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The user an image runs as when the pod does not say (upstream `getImageUser`: exactly one of
/// a UID and a name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageUser {
    /// A numeric user (0, root, when the image names none).
    Uid(i64),
    /// A user name, resolved by the runtime inside the container.
    Name(String),
}

impl ImageUser {
    /// From the runtime's image status: the UID when numeric, else the user name, else root.
    pub fn of(image: Option<&cri::Image>) -> Self {
        match image {
            Some(cri::Image { uid: Some(uid), .. }) => Self::Uid(uid.value),
            Some(image) if !image.username.is_empty() => Self::Name(image.username.clone()),
            _ => Self::Uid(0),
        }
    }
}

/// Why a container's or a sandbox's security context cannot be built (upstream's messages; a
/// container shows `CreateContainerConfigError` with it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecurityContextError {
    /// `runAsNonRoot` with `runAsUser: 0`.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserIsRoot {
        /// `name_namespace(uid)` (upstream's `format.Pod`).
        pod: String,
        /// The spec container.
        container: String,
    },
    /// `runAsNonRoot` and an image whose user is a name.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    ImageUserNotNumeric {
        /// The image's user.
        user: String,
        /// `name_namespace(uid)`.
        pod: String,
        /// The spec container.
        container: String,
    },
    /// `runAsNonRoot` and an image that runs as root.
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRunsAsRoot {
        /// `name_namespace(uid)`.
        pod: String,
        /// The spec container.
        container: String,
    },
    /// `runAsNonRoot` and an image whose UID is out of range.
    #[error(
        "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({max})): must be between 0 and {max}, inclusive (pod: {pod:?}, container: {container})",
        max = i32::MAX
    )]
    ImageUserInvalid {
        /// The image's UID.
        uid: i64,
        /// `name_namespace(uid)`.
        pod: String,
        /// The spec container.
        container: String,
    },
    /// A `Localhost` seccomp profile without its file name.
    #[error("localhostProfile must be set if seccompProfile type is Localhost.")]
    LocalhostProfileMissing,
    /// A `Localhost` seccomp profile that is not a path beneath the profile directory.
    #[error("localhostProfile {0:?} must be a relative path without '..'")]
    LocalhostProfileNotDescending(String),
    /// A `supplementalGroupsPolicy` CRI does not know.
    #[error("unsupported supplementalGroupsPolicy: {0}")]
    SupplementalGroupsPolicy(String),
}

fn pod_security(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref()?.security_context.as_ref()
}

/// The container's security context with the pod's fields it does not set (upstream
/// `securitycontext.DetermineEffectiveSecurityContext`): from the pod, `seLinuxOptions`,
/// `runAsUser`, `runAsGroup` and `runAsNonRoot`; every field the container sets wins.
pub fn effective_security_context(pod: &Pod, container: &Container) -> SecurityContext {
    let from_pod = pod_security(pod).map(|p| SecurityContext {
        se_linux_options: p.se_linux_options.clone(),
        run_as_user: p.run_as_user,
        run_as_group: p.run_as_group,
        run_as_non_root: p.run_as_non_root,
        ..Default::default()
    });
    let Some(own) = container.security_context.as_ref() else {
        return from_pod.unwrap_or_default();
    };
    let Some(mut effective) = from_pod else {
        return own.clone();
    };
    // Every field named, so that a new one is a decision (`seccompProfile` is read by
    // `seccomp_profile` from both contexts, as upstream's `getSeccompProfile` does).
    let SecurityContext {
        allow_privilege_escalation,
        app_armor_profile: _,
        capabilities,
        privileged,
        proc_mount,
        read_only_root_filesystem,
        run_as_group,
        run_as_non_root,
        run_as_user,
        se_linux_options,
        seccomp_profile: _,
        windows_options: _,
    } = own;
    fn or<T: Clone>(own: &Option<T>, pod: &mut Option<T>) {
        if own.is_some() {
            pod.clone_from(own);
        }
    }
    or(se_linux_options, &mut effective.se_linux_options);
    or(capabilities, &mut effective.capabilities);
    or(privileged, &mut effective.privileged);
    or(run_as_user, &mut effective.run_as_user);
    or(run_as_group, &mut effective.run_as_group);
    or(run_as_non_root, &mut effective.run_as_non_root);
    or(
        read_only_root_filesystem,
        &mut effective.read_only_root_filesystem,
    );
    or(
        allow_privilege_escalation,
        &mut effective.allow_privilege_escalation,
    );
    or(proc_mount, &mut effective.proc_mount);
    effective
}

/// Refuses a container that must not run as root and would (upstream `verifyRunAsNonRoot`):
/// its `runAsUser` is 0, or it has none and the image's user is root, a name (which cannot be
/// checked) or an invalid UID.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
) -> Result<(), SecurityContextError> {
    let effective = effective_security_context(pod, container);
    if effective.run_as_non_root != Some(true) {
        return Ok(());
    }
    let (pod, container) = (
        rustlet_pods::runtime::format_pod(pod),
        container.name.clone(),
    );
    match (effective.run_as_user, image_user) {
        (Some(0), _) => Err(SecurityContextError::RunAsUserIsRoot { pod, container }),
        (Some(_), _) => Ok(()),
        (None, ImageUser::Name(user)) => Err(SecurityContextError::ImageUserNotNumeric {
            user: user.clone(),
            pod,
            container,
        }),
        (None, ImageUser::Uid(0)) => Err(SecurityContextError::ImageRunsAsRoot { pod, container }),
        (None, ImageUser::Uid(uid)) if !(0..=i64::from(i32::MAX)).contains(uid) => {
            Err(SecurityContextError::ImageUserInvalid {
                uid: *uid,
                pod,
                container,
            })
        }
        (None, ImageUser::Uid(_)) => Ok(()),
    }
}

/// The namespaces of a pod's sandbox and containers (upstream `NamespacesForPod`).
pub fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.as_ref();
    let node_or = |on: Option<bool>, otherwise: cri::NamespaceMode| {
        if on.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: node_or(spec.and_then(|s| s.host_network), cri::NamespaceMode::Pod),
        pid: if spec.and_then(|s| s.host_pid).unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else if spec
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false)
        {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: node_or(spec.and_then(|s| s.host_ipc), cri::NamespaceMode::Pod),
        ..Default::default()
    }
}

fn selinux(options: &SELinuxOptions) -> cri::SeLinuxOption {
    cri::SeLinuxOption {
        user: options.user.clone().unwrap_or_default(),
        role: options.role.clone().unwrap_or_default(),
        r#type: options.type_.clone().unwrap_or_default(),
        level: options.level.clone().unwrap_or_default(),
    }
}

/// Upstream `convertToRuntimeCapabilities`.
fn capabilities(caps: &Capabilities) -> cri::Capability {
    cri::Capability {
        add_capabilities: caps.add.clone().unwrap_or_default(),
        drop_capabilities: caps.drop.clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn profile(
    kind: cri::security_profile::ProfileType,
    localhost_ref: String,
) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref,
    }
}

/// One seccomp profile field as CRI's (upstream `fieldSeccompProfile`, without the
/// `seccompDefault` fallback): none or `Unconfined` is unconfined, `RuntimeDefault` the
/// runtime's, `Localhost` the file beneath `profile_root`.
///
/// Deviation: a `localhostProfile` that is absolute or climbs with `..` is refused here; the
/// API server's validation refuses it upstream, and local manifests are not validated for it.
fn field_seccomp_profile(
    field: Option<&SeccompProfile>,
    profile_root: &Path,
) -> Result<cri::SecurityProfile, SecurityContextError> {
    use cri::security_profile::ProfileType;
    let Some(field) = field else {
        return Ok(profile(ProfileType::Unconfined, String::new()));
    };
    match field.type_.as_str() {
        "RuntimeDefault" => Ok(profile(ProfileType::RuntimeDefault, String::new())),
        "Localhost" => {
            let name = field
                .localhost_profile
                .as_deref()
                .filter(|n| !n.is_empty())
                .ok_or(SecurityContextError::LocalhostProfileMissing)?;
            let descending = Path::new(name)
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if !descending {
                return Err(SecurityContextError::LocalhostProfileNotDescending(
                    name.to_owned(),
                ));
            }
            Ok(profile(
                ProfileType::Localhost,
                profile_root.join(name).display().to_string(),
            ))
        }
        _ => Ok(profile(ProfileType::Unconfined, String::new())),
    }
}

/// The container's seccomp profile (upstream `getSeccompProfile`): the container's field, else
/// the pod's.
pub fn seccomp_profile(
    pod: &Pod,
    container: &Container,
    profile_root: &Path,
) -> Result<cri::SecurityProfile, SecurityContextError> {
    let field = container
        .security_context
        .as_ref()
        .and_then(|c| c.seccomp_profile.as_ref())
        .or_else(|| pod_security(pod).and_then(|p| p.seccomp_profile.as_ref()));
    field_seccomp_profile(field, profile_root)
}

/// Whether the process gets `no_new_privs` (upstream `AddNoNewPrivileges`): only when
/// `allowPrivilegeEscalation` is `false`.
pub fn add_no_new_privileges(effective: &SecurityContext) -> bool {
    effective.allow_privilege_escalation == Some(false)
}

fn unmasked(proc_mount: Option<&str>) -> bool {
    proc_mount == Some("Unmasked")
}

/// The masked paths for a `procMount` (upstream `ConvertToRuntimeMaskedPaths`): none when
/// `Unmasked`, the defaults otherwise.
pub fn masked_paths(proc_mount: Option<&str>) -> Vec<String> {
    if unmasked(proc_mount) {
        return Vec::new();
    }
    DEFAULT_MASKED_PATHS
        .iter()
        .map(|p| (*p).to_owned())
        .collect()
}

/// The read-only paths for a `procMount` (upstream `ConvertToRuntimeReadonlyPaths`).
pub fn readonly_paths(proc_mount: Option<&str>) -> Vec<String> {
    if unmasked(proc_mount) {
        return Vec::new();
    }
    DEFAULT_READONLY_PATHS
        .iter()
        .map(|p| (*p).to_owned())
        .collect()
}

/// CRI's value of a `supplementalGroupsPolicy`.
fn supplemental_groups_policy(policy: &str) -> Result<i32, SecurityContextError> {
    cri::SupplementalGroupsPolicy::from_str_name(policy)
        .map(|p| p as i32)
        .ok_or_else(|| SecurityContextError::SupplementalGroupsPolicy(policy.to_owned()))
}

/// A container's namespaces: the pod's, and for an ephemeral container with a target the
/// target's process namespace when the pod's containers each have their own (upstream
/// `determineEffectiveSecurityContext`: `NamespaceMode_TARGET` only over `CONTAINER`; a pod that
/// shares one process namespace, or the node's, keeps it).
fn container_namespaces(pod: &Pod, target: Option<&str>) -> cri::NamespaceOption {
    let mut namespaces = namespace_options(pod);
    if let Some(target) = target
        && namespaces.pid == cri::NamespaceMode::Container as i32
    {
        namespaces.pid = cri::NamespaceMode::Target as i32;
        target.clone_into(&mut namespaces.target_id);
    }
    namespaces
}

/// What a container's security context is built from besides the pod and the spec container.
#[derive(Clone, Copy, Debug)]
pub struct ContainerSecurityInputs<'a> {
    /// The image's user, for a container without `runAsUser`.
    pub image_user: &'a ImageUser,
    /// Where `Localhost` seccomp profiles are (`<root-dir>/seccomp`).
    pub seccomp_profile_root: &'a Path,
    /// The CRI ID of the container whose process namespace an ephemeral container joins (its
    /// `targetContainerName`'s instance); `None` for every other container.
    pub namespace_target: Option<&'a str>,
}

/// The container's Linux security context (upstream `determineEffectiveSecurityContext` with
/// `convertToRuntimeSecurityContext`): the effective user, group, SELinux options,
/// capabilities, `privileged` and `readOnlyRootFilesystem`; the image's user when none is set;
/// the pod's namespaces; `fsGroup` then `supplementalGroups` as supplemental groups and the
/// policy; the seccomp profile; `no_new_privs`; the masked and read-only paths.
pub fn container_security_context(
    pod: &Pod,
    container: &Container,
    inputs: ContainerSecurityInputs<'_>,
) -> Result<cri::LinuxContainerSecurityContext, SecurityContextError> {
    let effective = effective_security_context(pod, container);
    let mut sc = cri::LinuxContainerSecurityContext {
        capabilities: effective.capabilities.as_ref().map(capabilities),
        selinux_options: effective.se_linux_options.as_ref().map(selinux),
        run_as_user: effective.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: effective
            .run_as_group
            .map(|value| cri::Int64Value { value }),
        privileged: effective.privileged.unwrap_or(false),
        readonly_rootfs: effective.read_only_root_filesystem.unwrap_or(false),
        seccomp: Some(seccomp_profile(
            pod,
            container,
            inputs.seccomp_profile_root,
        )?),
        namespace_options: Some(container_namespaces(pod, inputs.namespace_target)),
        no_new_privs: add_no_new_privileges(&effective),
        masked_paths: masked_paths(effective.proc_mount.as_deref()),
        readonly_paths: readonly_paths(effective.proc_mount.as_deref()),
        ..Default::default()
    };
    if sc.run_as_user.is_none() {
        match inputs.image_user {
            ImageUser::Uid(value) => sc.run_as_user = Some(cri::Int64Value { value: *value }),
            ImageUser::Name(name) => sc.run_as_username.clone_from(name),
        }
    }
    if let Some(p) = pod_security(pod) {
        sc.supplemental_groups.extend(p.fs_group);
        sc.supplemental_groups
            .extend(p.supplemental_groups.iter().flatten());
        if let Some(policy) = &p.supplemental_groups_policy {
            sc.supplemental_groups_policy = supplemental_groups_policy(policy)?;
        }
    }
    Ok(sc)
}

/// Whether any container of the pod (init and ephemeral ones included) is privileged
/// (upstream `HasPrivilegedContainer`): its sandbox must be privileged too.
pub fn has_privileged_container(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let privileged = |sc: Option<&SecurityContext>| sc.and_then(|s| s.privileged) == Some(true);
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| privileged(c.security_context.as_ref()))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| privileged(c.security_context.as_ref()))
}

/// The sandbox's Linux config without a cgroup parent (upstream
/// `generatePodSandboxLinuxConfig`): privileged when a container is, the runtime's default
/// seccomp profile (so that pods may use the least privileged ones), the pod's sysctls (with
/// dots as separators, `kernel/shm_rmid_forced` as `kernel.shm_rmid_forced`), and
/// from the pod's security context its user, group, `fsGroup` then `supplementalGroups`, the
/// policy and its SELinux options.
///
/// Deviations: the namespaces are set also for a pod without a security context (the API server
/// always gives one; a local manifest may lack it); `runAsGroup` only with `runAsUser` (see
/// below).
pub fn sandbox_linux_config(pod: &Pod) -> Result<cri::LinuxPodSandboxConfig, SecurityContextError> {
    let mut sc = cri::LinuxSandboxSecurityContext {
        privileged: has_privileged_container(pod),
        seccomp: Some(profile(
            cri::security_profile::ProfileType::RuntimeDefault,
            String::new(),
        )),
        namespace_options: Some(namespace_options(pod)),
        ..Default::default()
    };
    let mut sysctls = HashMap::new();
    if let Some(p) = pod_security(pod) {
        // upstream `ConvertPodSysctlsVariableToDotsSeparator` before the sandbox: runc checks
        // a sysctl's namespace by its dotted name.
        for s in p.sysctls.iter().flatten() {
            sysctls.insert(
                rustlet_pods::sysctl::normalize_name(&s.name),
                s.value.clone(),
            );
        }
        sc.run_as_user = p.run_as_user.map(|value| cri::Int64Value { value });
        // Deviation: the group only with a user. containerd (1.6 at least) refuses a sandbox
        // whose group is "specified without user", so upstream's kubelet cannot run a pod
        // with `runAsGroup` alone there; the sandbox's own process needs no group, and the
        // containers get theirs with the image's user.
        sc.run_as_group = p
            .run_as_user
            .and(p.run_as_group)
            .map(|value| cri::Int64Value { value });
        sc.supplemental_groups.extend(p.fs_group);
        sc.supplemental_groups
            .extend(p.supplemental_groups.iter().flatten());
        if let Some(policy) = &p.supplemental_groups_policy {
            sc.supplemental_groups_policy = supplemental_groups_policy(policy)?;
        }
        sc.selinux_options = p.se_linux_options.as_ref().map(selinux);
    }
    Ok(cri::LinuxPodSandboxConfig {
        security_context: Some(sc),
        sysctls,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::security_profile::ProfileType;

    fn fixture(security: serde_json::Value, container: serde_json::Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bar", "namespace": "new", "uid": "12345678"},
            "spec": {
                "securityContext": security,
                "containers": [{"name": "foo", "image": "busybox", "securityContext": container}]
            }
        }))
        .unwrap();
        let container = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, container)
    }

    const ROOT: &str = "/var/lib/rustlet/seccomp";

    fn inputs(user: &ImageUser) -> ContainerSecurityInputs<'_> {
        ContainerSecurityInputs {
            image_user: user,
            seccomp_profile_root: Path::new(ROOT),
            namespace_target: None,
        }
    }

    /// upstream `determineEffectiveSecurityContext`'s namespace target (and
    /// `TestGenerateContainerConfigNamespaces` "Target Namespace"): an ephemeral container with
    /// a target joins the target's process namespace when the pod's containers each have their
    /// own; with `shareProcessNamespace` or `hostPID` the pod's stays.
    #[test]
    fn an_ephemeral_containers_target_is_its_process_namespace() {
        let (mut pod, container) = fixture(serde_json::json!({}), serde_json::json!({}));
        let root = ImageUser::Uid(0);
        let targeted = ContainerSecurityInputs {
            namespace_target: Some("abc123"),
            ..inputs(&root)
        };
        let sc = container_security_context(&pod, &container, targeted).unwrap();
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.pid, cri::NamespaceMode::Target as i32);
        assert_eq!(ns.target_id, "abc123");
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        let plain = container_security_context(&pod, &container, inputs(&root)).unwrap();
        let ns = plain.namespace_options.unwrap();
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
        assert_eq!(ns.target_id, "");
        for (field, mode) in [
            ("share_process_namespace", cri::NamespaceMode::Pod),
            ("host_pid", cri::NamespaceMode::Node),
        ] {
            let spec = pod.spec.as_mut().unwrap();
            (spec.share_process_namespace, spec.host_pid) = (None, None);
            match field {
                "share_process_namespace" => spec.share_process_namespace = Some(true),
                _ => spec.host_pid = Some(true),
            }
            let sc = container_security_context(&pod, &container, targeted).unwrap();
            let ns = sc.namespace_options.unwrap();
            assert_eq!(
                (ns.pid, ns.target_id.as_str()),
                (mode as i32, ""),
                "{field}"
            );
        }
    }

    /// upstream: TestVerifyRunAsNonRoot (security_context_others_test.go), every case by its
    /// description, and the messages of the refusals.
    #[test]
    fn test_verify_run_as_non_root() {
        let root = ImageUser::Uid(0);
        let any = ImageUser::Uid(1000);
        let named = ImageUser::Name("test".into());
        let cases: &[(&str, serde_json::Value, &ImageUser, bool)] = &[
            (
                "Pass if SecurityContext is not set",
                serde_json::Value::Null,
                &root,
                false,
            ),
            (
                "Pass if RunAsUser is non-root and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true, "runAsUser": 1000}),
                &root,
                false,
            ),
            (
                "Pass if RunAsNonRoot is not set",
                serde_json::json!({"runAsUser": 0}),
                &root,
                false,
            ),
            (
                "Pass if RunAsNonRoot is false (image user is root)",
                serde_json::json!({"runAsNonRoot": false}),
                &root,
                false,
            ),
            (
                "Pass if RunAsNonRoot is false (RunAsUser is root)",
                serde_json::json!({"runAsNonRoot": false, "runAsUser": 0}),
                &root,
                false,
            ),
            (
                "Fail if container's RunAsUser is root and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true, "runAsUser": 0}),
                &root,
                true,
            ),
            (
                "Fail if image's user is root and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &root,
                true,
            ),
            (
                "Fail if image's username is set and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &named,
                true,
            ),
            (
                "Pass if image's user is non-root and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &any,
                false,
            ),
            (
                "Fail if image's user is invalid and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &ImageUser::Uid(2_147_483_648),
                true,
            ),
            (
                "Fail if image's user is negative and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &ImageUser::Uid(-1000),
                true,
            ),
            (
                "Pass if image's user is math.MaxInt32 and RunAsNonRoot is true",
                serde_json::json!({"runAsNonRoot": true}),
                &ImageUser::Uid(i64::from(i32::MAX)),
                false,
            ),
        ];
        for (desc, sc, user, fail) in cases {
            let (pod, container) = fixture(serde_json::Value::Null, sc.clone());
            let result = verify_run_as_non_root(&pod, &container, user);
            assert_eq!(result.is_err(), *fail, "{desc}: {result:?}");
        }
        // "Pass if container's user and image's user aren't set": upstream's nil UID and empty
        // name; the image's user is then root (`getImageUser`), which `ImageUser::of` says.
        assert_eq!(ImageUser::of(None), ImageUser::Uid(0));
        let image = |uid: Option<i64>, username: &str| cri::Image {
            uid: uid.map(|value| cri::Int64Value { value }),
            username: username.into(),
            ..Default::default()
        };
        assert_eq!(ImageUser::of(Some(&image(None, ""))), ImageUser::Uid(0));
        assert_eq!(
            ImageUser::of(Some(&image(None, "testUser"))),
            ImageUser::Name("testUser".into())
        );
        assert_eq!(
            ImageUser::of(Some(&image(Some(2), "whatever"))),
            ImageUser::Uid(2)
        );

        // Upstream's messages, the pod as `format.Pod` writes it.
        let message = |pod_sc: serde_json::Value, sc: serde_json::Value, user: &ImageUser| {
            let (pod, container) = fixture(pod_sc, sc);
            verify_run_as_non_root(&pod, &container, user)
                .unwrap_err()
                .to_string()
        };
        let non_root = serde_json::json!({"runAsNonRoot": true});
        assert_eq!(
            message(non_root.clone(), serde_json::Value::Null, &root),
            "container has runAsNonRoot and image will run as root (pod: \"bar_new(12345678)\", container: foo)"
        );
        assert_eq!(
            message(
                serde_json::Value::Null,
                serde_json::json!({"runAsNonRoot": true, "runAsUser": 0}),
                &any
            ),
            "container's runAsUser breaks non-root policy (pod: \"bar_new(12345678)\", container: foo)"
        );
        assert_eq!(
            message(non_root.clone(), serde_json::Value::Null, &named),
            "container has runAsNonRoot and image has non-numeric user (test), cannot verify user is non-root (pod: \"bar_new(12345678)\", container: foo)"
        );
        assert_eq!(
            message(non_root, serde_json::Value::Null, &ImageUser::Uid(-1)),
            "container has runAsNonRoot and image has an invalid user id (-1). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive (pod: \"bar_new(12345678)\", container: foo)"
        );
        // The pod's runAsNonRoot with the container's non-root user passes; the container's
        // `runAsNonRoot: false` lifts the pod's.
        let (pod_ok, c) = fixture(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({"runAsUser": 1000}),
        );
        verify_run_as_non_root(&pod_ok, &c, &root).unwrap();
        let (pod_ok, c) = fixture(
            serde_json::json!({"runAsNonRoot": true}),
            serde_json::json!({"runAsNonRoot": false}),
        );
        verify_run_as_non_root(&pod_ok, &c, &root).unwrap();
    }

    /// upstream: TestGetSeccompProfile (helpers_test.go, `seccompDefault` off), every case.
    #[test]
    fn test_get_seccomp_profile() {
        let unconfined = profile(ProfileType::Unconfined, String::new());
        let runtime_default = profile(ProfileType::RuntimeDefault, String::new());
        let localhost = |name: &str| profile(ProfileType::Localhost, format!("{ROOT}/{name}"));
        let seccomp = |t: &str, name: Option<&str>| match name {
            Some(n) => serde_json::json!({"seccompProfile": {"type": t, "localhostProfile": n}}),
            None => serde_json::json!({"seccompProfile": {"type": t}}),
        };
        let none = serde_json::Value::Null;
        let missing = Err(SecurityContextError::LocalhostProfileMissing);
        let cases = [
            (
                "no seccomp should return unconfined",
                none.clone(),
                none.clone(),
                Ok(unconfined.clone()),
            ),
            (
                "pod seccomp profile set to unconfined returns unconfined",
                seccomp("Unconfined", None),
                none.clone(),
                Ok(unconfined.clone()),
            ),
            (
                "container seccomp profile set to unconfined returns unconfined",
                none.clone(),
                seccomp("Unconfined", None),
                Ok(unconfined.clone()),
            ),
            (
                "pod seccomp profile set to SeccompProfileTypeRuntimeDefault returns runtime/default",
                seccomp("RuntimeDefault", None),
                none.clone(),
                Ok(runtime_default.clone()),
            ),
            (
                "container seccomp profile set to SeccompProfileTypeRuntimeDefault returns runtime/default",
                none.clone(),
                seccomp("RuntimeDefault", None),
                Ok(runtime_default.clone()),
            ),
            (
                "pod seccomp profile set to SeccompProfileTypeLocalhost returns 'localhost/' + LocalhostProfile",
                seccomp("Localhost", Some("filename")),
                none.clone(),
                Ok(localhost("filename")),
            ),
            (
                "pod seccomp profile set to SeccompProfileTypeLocalhost with empty LocalhostProfile returns error",
                seccomp("Localhost", None),
                none.clone(),
                missing.clone(),
            ),
            (
                "container seccomp profile set to SeccompProfileTypeLocalhost with empty LocalhostProfile returns error",
                none.clone(),
                seccomp("Localhost", None),
                missing,
            ),
            (
                "container seccomp profile set to SeccompProfileTypeLocalhost returns 'localhost/' + LocalhostProfile",
                none.clone(),
                seccomp("Localhost", Some("filename2")),
                Ok(localhost("filename2")),
            ),
            (
                "prioritise container field over pod field",
                seccomp("Unconfined", None),
                seccomp("RuntimeDefault", None),
                Ok(runtime_default),
            ),
            (
                "prioritise container field over pod field",
                seccomp("Localhost", Some("field-pod-profile.json")),
                seccomp("Localhost", Some("field-cont-profile.json")),
                Ok(localhost("field-cont-profile.json")),
            ),
            // Deviation (written at `field_seccomp_profile`): what the API server's validation
            // refuses is refused here too.
            (
                "a profile outside the profile directory is refused",
                seccomp("Localhost", Some("../../etc/evil.json")),
                none.clone(),
                Err(SecurityContextError::LocalhostProfileNotDescending(
                    "../../etc/evil.json".into(),
                )),
            ),
            (
                "an absolute profile is refused",
                none,
                seccomp("Localhost", Some("/etc/evil.json")),
                Err(SecurityContextError::LocalhostProfileNotDescending(
                    "/etc/evil.json".into(),
                )),
            ),
        ];
        for (desc, pod_sc, container_sc, want) in cases {
            let (pod, container) = fixture(pod_sc, container_sc);
            assert_eq!(
                seccomp_profile(&pod, &container, Path::new(ROOT)),
                want,
                "{desc}"
            );
        }
        assert_eq!(
            SecurityContextError::LocalhostProfileMissing.to_string(),
            "localhostProfile must be set if seccompProfile type is Localhost."
        );
    }

    /// upstream: TestAddNoNewPrivileges (pkg/securitycontext/util_test.go).
    #[test]
    fn test_add_no_new_privileges() {
        let with = |allow: Option<bool>| SecurityContext {
            allow_privilege_escalation: allow,
            ..Default::default()
        };
        assert!(
            !add_no_new_privileges(&SecurityContext::default()),
            "allowPrivilegeEscalation nil"
        );
        assert!(
            !add_no_new_privileges(&with(Some(true))),
            "allowPrivilegeEscalation true"
        );
        assert!(
            add_no_new_privileges(&with(Some(false))),
            "allowPrivilegeEscalation false"
        );
    }

    /// upstream: ConvertToRuntimeMaskedPaths and ConvertToRuntimeReadonlyPaths: the defaults
    /// unless `Unmasked`.
    #[test]
    fn test_convert_to_runtime_masked_and_readonly_paths() {
        for proc_mount in [None, Some("Default")] {
            assert_eq!(masked_paths(proc_mount), DEFAULT_MASKED_PATHS);
            assert_eq!(readonly_paths(proc_mount), DEFAULT_READONLY_PATHS);
        }
        assert!(masked_paths(Some("Unmasked")).is_empty());
        assert!(readonly_paths(Some("Unmasked")).is_empty());
    }

    /// upstream: DetermineEffectiveSecurityContext and determineEffectiveSecurityContext (item
    /// 24.2): the pod's runAsUser, runAsGroup, runAsNonRoot and seLinuxOptions apply to a
    /// container that does not set them, every field the container sets wins, and the pod's
    /// groups, policy and namespaces are added.
    #[test]
    fn container_fields_win_over_the_pods() {
        let (pod, container) = fixture(
            serde_json::json!({
                "runAsUser": 1000, "runAsGroup": 3000, "runAsNonRoot": true,
                "fsGroup": 2000, "supplementalGroups": [4000, 5000],
                "supplementalGroupsPolicy": "Strict",
                "seLinuxOptions": {"level": "s0:c1,c2"},
                "seccompProfile": {"type": "RuntimeDefault"},
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}]
            }),
            serde_json::Value::Null,
        );
        let image_user = ImageUser::Uid(0);
        let sc = container_security_context(&pod, &container, inputs(&image_user)).unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3000 }));
        assert_eq!(sc.run_as_username, "");
        assert_eq!(sc.supplemental_groups, [2000, 4000, 5000]);
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        assert_eq!(sc.selinux_options.as_ref().unwrap().level, "s0:c1,c2");
        assert_eq!(
            sc.seccomp,
            Some(profile(ProfileType::RuntimeDefault, String::new()))
        );
        assert!(!sc.privileged && !sc.readonly_rootfs && !sc.no_new_privs);
        assert_eq!(sc.capabilities, None);
        assert_eq!(sc.masked_paths, DEFAULT_MASKED_PATHS);
        assert_eq!(sc.readonly_paths, DEFAULT_READONLY_PATHS);
        assert_eq!(sc.namespace_options, Some(namespace_options(&pod)));

        let (pod, container) = fixture(
            serde_json::json!({
                "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                "seLinuxOptions": {"level": "s0:c1,c2"},
                "seccompProfile": {"type": "RuntimeDefault"}
            }),
            serde_json::json!({
                "runAsUser": 1001, "runAsGroup": 3001,
                "seLinuxOptions": {"type": "spc_t"},
                "seccompProfile": {"type": "Unconfined"},
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                "privileged": true, "readOnlyRootFilesystem": true,
                "allowPrivilegeEscalation": false, "procMount": "Unmasked"
            }),
        );
        let sc = container_security_context(&pod, &container, inputs(&image_user)).unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1001 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3001 }));
        let selinux = sc.selinux_options.as_ref().unwrap();
        assert_eq!(
            (selinux.r#type.as_str(), selinux.level.as_str()),
            ("spc_t", "")
        );
        assert_eq!(
            sc.seccomp,
            Some(profile(ProfileType::Unconfined, String::new()))
        );
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(
            (&caps.add_capabilities[..], &caps.drop_capabilities[..]),
            (&["NET_ADMIN".to_owned()][..], &["ALL".to_owned()][..])
        );
        assert!(sc.privileged && sc.readonly_rootfs && sc.no_new_privs);
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
        // fsGroup is the pod's: a supplemental group of every container.
        assert_eq!(sc.supplemental_groups, [2000]);
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Merge as i32
        );
    }

    /// upstream: determineEffectiveSecurityContext's "set RunAsUser": without a runAsUser the
    /// image's user, by UID or by name (only one of them).
    #[test]
    fn without_run_as_user_the_images_user_is_used() {
        let (pod, container) = fixture(serde_json::Value::Null, serde_json::Value::Null);
        let by_uid = ImageUser::Uid(42);
        let sc = container_security_context(&pod, &container, inputs(&by_uid)).unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_username.as_str()),
            (Some(cri::Int64Value { value: 42 }), "")
        );
        let by_name = ImageUser::Name("nobody".into());
        let sc = container_security_context(&pod, &container, inputs(&by_name)).unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_username.as_str()),
            (None, "nobody")
        );
        assert_eq!(
            sc.seccomp,
            Some(profile(ProfileType::Unconfined, String::new()))
        );
        assert!(sc.supplemental_groups.is_empty());
    }

    /// upstream: TestGenerateLinuxConfigSupplementalGroupsPolicy and
    /// TestGeneratePodSandboxLinuxConfigSupplementalGroupsPolicy: nil and Merge are Merge,
    /// Strict is Strict, anything else is refused with upstream's message.
    #[test]
    fn test_generate_linux_config_supplemental_groups_policy() {
        let image_user = ImageUser::Uid(0);
        for (policy, want) in [
            (None, Ok(cri::SupplementalGroupsPolicy::Merge as i32)),
            (
                Some("Merge"),
                Ok(cri::SupplementalGroupsPolicy::Merge as i32),
            ),
            (
                Some("Strict"),
                Ok(cri::SupplementalGroupsPolicy::Strict as i32),
            ),
            (
                Some("UnSupported"),
                Err("unsupported supplementalGroupsPolicy: UnSupported".to_owned()),
            ),
        ] {
            let (pod, container) = fixture(
                serde_json::json!({"supplementalGroupsPolicy": policy}),
                serde_json::Value::Null,
            );
            let container_policy =
                container_security_context(&pod, &container, inputs(&image_user))
                    .map(|sc| sc.supplemental_groups_policy)
                    .map_err(|e| e.to_string());
            assert_eq!(container_policy, want, "container, {policy:?}");
            let sandbox_policy = sandbox_linux_config(&pod)
                .map(|l| l.security_context.unwrap().supplemental_groups_policy)
                .map_err(|e| e.to_string());
            assert_eq!(sandbox_policy, want, "sandbox, {policy:?}");
        }
    }

    /// upstream: TestGeneratePodSandboxLinuxConfigSeccomp: the sandbox always runs with the
    /// runtime's default profile, whatever the pod or its containers say.
    #[test]
    fn test_generate_pod_sandbox_linux_config_seccomp() {
        for (pod_sc, container_sc) in [
            (serde_json::Value::Null, serde_json::Value::Null),
            (
                serde_json::json!({"seccompProfile": {"type": "Unconfined"}}),
                serde_json::Value::Null,
            ),
            (
                serde_json::Value::Null,
                serde_json::json!({"seccompProfile": {"type": "Unconfined"}}),
            ),
        ] {
            let (pod, _) = fixture(pod_sc, container_sc);
            let sc = sandbox_linux_config(&pod)
                .unwrap()
                .security_context
                .unwrap();
            assert_eq!(
                sc.seccomp,
                Some(profile(ProfileType::RuntimeDefault, String::new()))
            );
        }
    }

    /// upstream: TestGeneratePodSandboxConfigWithLinuxSecurityContext and
    /// generatePodSandboxLinuxConfig: the pod's user, group, SELinux options, fsGroup then
    /// supplementalGroups and sysctls; privileged when any container (init ones too) is.
    #[test]
    fn the_sandbox_carries_the_pods_security_context_and_sysctls() {
        let (mut pod, _) = fixture(
            serde_json::json!({
                "runAsUser": 1000, "runAsGroup": 10, "fsGroup": 2000,
                "supplementalGroups": [4000],
                "seLinuxOptions": {"user": "qux"},
                "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"},
                            {"name": "net/ipv4/conf/eno2.100/rp_filter", "value": "2"}]
            }),
            serde_json::Value::Null,
        );
        let linux = sandbox_linux_config(&pod).unwrap();
        // upstream `ConvertPodSysctlsVariableToDotsSeparator`.
        assert_eq!(linux.sysctls["net.ipv4.conf.eno2/100.rp_filter"], "2");
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 10 }));
        assert_eq!(sc.selinux_options.unwrap().user, "qux");
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        assert!(!sc.privileged);
        assert_eq!(sc.namespace_options, Some(namespace_options(&pod)));
        assert_eq!(linux.sysctls["kernel.shm_rmid_forced"], "1");

        let spec = pod.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![Container {
            name: "init".into(),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(has_privileged_container(&pod));
        let sc = sandbox_linux_config(&pod)
            .unwrap()
            .security_context
            .unwrap();
        assert!(sc.privileged);

        // runAsGroup without runAsUser: not on the sandbox (deviation, for containerd).
        let (group_only, _) = fixture(
            serde_json::json!({"runAsGroup": 10}),
            serde_json::Value::Null,
        );
        let sc = sandbox_linux_config(&group_only)
            .unwrap()
            .security_context
            .unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_group), (None, None));

        // No security context at all: the namespaces still, nothing else.
        let (mut bare, _) = pod_without_security();
        bare.spec.as_mut().unwrap().host_network = Some(true);
        let linux = sandbox_linux_config(&bare).unwrap();
        let sc = linux.security_context.unwrap();
        assert_eq!(
            sc.namespace_options.unwrap().network,
            cri::NamespaceMode::Node as i32
        );
        assert_eq!((sc.run_as_user, linux.sysctls.len()), (None, 0));
    }

    fn pod_without_security() -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bar", "namespace": "new", "uid": "12345678"},
            "spec": {"containers": [{"name": "foo", "image": "busybox"}]}
        }))
        .unwrap();
        let container = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, container)
    }
}
