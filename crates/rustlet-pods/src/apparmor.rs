//! The AppArmor admit handler (upstream `appArmorAdmitHandler` in
//! `pkg/kubelet/lifecycle/handlers.go`, `pkg/security/apparmor`): a pending pod asking for an
//! AppArmor profile other than `Unconfined` (in the pod's or a container's
//! `securityContext.appArmorProfile`, or the deprecated annotation
//! `container.apparmor.security.beta.kubernetes.io/<container>`) on a host without AppArmor is
//! rejected `AppArmor`, as is a `Localhost` profile without a name anywhere. Pure, but for
//! [`AppArmorHost::detect`], which the binary calls once at start (upstream's `NewValidator`
//! checks the host once: enabling AppArmor takes a restart).
//!
//! Deviations: upstream's `isRequired` looks at the pod's annotations in Go's random map order
//! and answers for the first AppArmor one it meets; here a pod is taken to require AppArmor when
//! any of them names a profile other than `unconfined`. Upstream prints an empty `Localhost`
//! profile with `%q` of a pointer (the address of its name); here its name is quoted. The
//! profile itself is not handed to the runtime (`rustlet-cri` does not port AppArmor).

use std::path::Path;

use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod};

use crate::admission::Rejection;

/// The reason of a pod rejected for AppArmor (upstream `AppArmorNotAdmittedReason`).
pub const NOT_ADMITTED_REASON: &str = "AppArmor";

/// Upstream `v1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix`.
pub const CONTAINER_ANNOTATION_KEY_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
/// Upstream `v1.DeprecatedAppArmorBetaProfileRuntimeDefault`.
pub const PROFILE_RUNTIME_DEFAULT: &str = "runtime/default";
/// Upstream `v1.DeprecatedAppArmorBetaProfileNamePrefix`.
pub const PROFILE_NAME_PREFIX: &str = "localhost/";
/// Upstream `v1.DeprecatedAppArmorBetaProfileNameUnconfined`.
pub const PROFILE_NAME_UNCONFINED: &str = "unconfined";

const TYPE_UNCONFINED: &str = "Unconfined";
const TYPE_RUNTIME_DEFAULT: &str = "RuntimeDefault";
const TYPE_LOCALHOST: &str = "Localhost";

/// Whether the host can enforce AppArmor profiles (upstream `validator.validateHostErr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppArmorHost {
    /// AppArmor is enabled in the kernel.
    Enabled,
    /// It is not: upstream's host error, the rejection's message after "Cannot enforce
    /// AppArmor: ".
    Disabled(&'static str),
}

/// Upstream `validateHost`'s error on a kernel without AppArmor.
pub const NOT_ENABLED: &str = "AppArmor is not enabled on the host";
/// Upstream `validateHost`'s error in a build for another OS.
pub const NOT_LINUX: &str = "binary not compiled for linux";

impl AppArmorHost {
    /// Upstream `validateHost` (libcontainer's `apparmor.IsEnabled`): enabled when
    /// `/sys/kernel/security/apparmor` exists and `/sys/module/apparmor/parameters/enabled`
    /// starts with `Y` (and holds more than that one byte).
    pub fn detect() -> Self {
        if !cfg!(target_os = "linux") {
            return Self::Disabled(NOT_LINUX);
        }
        let securityfs = Path::new("/sys/kernel/security/apparmor").exists();
        let enabled = std::fs::read("/sys/module/apparmor/parameters/enabled").ok();
        Self::from_sysfs(securityfs, enabled.as_deref())
    }

    /// [`Self::detect`] on what it read: whether AppArmor's securityfs directory exists, and
    /// the module's `enabled` parameter if it could be read.
    pub fn from_sysfs(securityfs: bool, enabled: Option<&[u8]>) -> Self {
        match enabled {
            Some(buf) if securityfs && buf.len() > 1 && buf[0] == b'Y' => Self::Enabled,
            _ => Self::Disabled(NOT_ENABLED),
        }
    }
}

fn requires(profile: Option<&AppArmorProfile>) -> bool {
    profile.is_some_and(|p| p.type_ != TYPE_UNCONFINED)
}

/// Every container of the pod, init and ephemeral ones included (upstream `VisitContainers`
/// with `AllContainers`), as `(name, its AppArmor profile field)`.
fn containers(pod: &Pod) -> impl Iterator<Item = (&str, Option<&AppArmorProfile>)> {
    let spec = pod.spec.as_ref();
    let regular = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c: &Container| {
            let profile = c
                .security_context
                .as_ref()
                .and_then(|sc| sc.app_armor_profile.as_ref());
            (c.name.as_str(), profile)
        });
    let ephemeral = spec
        .into_iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| {
            let profile = c
                .security_context
                .as_ref()
                .and_then(|sc| sc.app_armor_profile.as_ref());
            (c.name.as_str(), profile)
        });
    regular.chain(ephemeral)
}

/// Upstream `isRequired`: whether the pod asks for an AppArmor profile other than
/// `Unconfined` (see the module's deviation for the annotations).
pub fn is_required(pod: &Pod) -> bool {
    let pod_profile = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.app_armor_profile.as_ref());
    if requires(pod_profile) || containers(pod).any(|(_, profile)| requires(profile)) {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(key, value)| {
            key.starts_with(CONTAINER_ANNOTATION_KEY_PREFIX) && value != PROFILE_NAME_UNCONFINED
        })
}

/// Upstream `getProfileFromPodAnnotations`: the profile the deprecated annotation gives this
/// container (`None` without one, or for a value that is none of upstream's).
fn profile_from_annotations(pod: &Pod, container: &str) -> Option<AppArmorProfile> {
    let key = format!("{CONTAINER_ANNOTATION_KEY_PREFIX}{container}");
    let value = pod.metadata.annotations.as_ref()?.get(&key)?;
    let profile = |type_: &str, localhost_profile: Option<String>| AppArmorProfile {
        type_: type_.to_owned(),
        localhost_profile,
    };
    if value == PROFILE_RUNTIME_DEFAULT {
        Some(profile(TYPE_RUNTIME_DEFAULT, None))
    } else if value == PROFILE_NAME_UNCONFINED {
        Some(profile(TYPE_UNCONFINED, None))
    } else {
        let name = value.strip_prefix(PROFILE_NAME_PREFIX)?;
        Some(profile(TYPE_LOCALHOST, Some(name.to_owned())))
    }
}

/// Upstream `GetProfile`: the container's field, else the annotation (a static pod's may not
/// have been copied into the fields), else the pod's field.
pub fn get_profile(
    pod: &Pod,
    container: &str,
    container_profile: Option<&AppArmorProfile>,
) -> Option<AppArmorProfile> {
    if let Some(profile) = container_profile {
        return Some(profile.clone());
    }
    if let Some(profile) = profile_from_annotations(pod, container) {
        return Some(profile);
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.app_armor_profile.clone())
}

/// Upstream `validator.Validate`: a pod requiring AppArmor needs a host that enforces it, and
/// each container's `Localhost` profile a name. The error is the message after "Cannot enforce
/// AppArmor: ".
pub fn validate(pod: &Pod, host: AppArmorHost) -> Result<(), String> {
    if !is_required(pod) {
        return Ok(());
    }
    if let AppArmorHost::Disabled(why) = host {
        return Err(why.to_owned());
    }
    for (name, field) in containers(pod) {
        let Some(profile) = get_profile(pod, name, field) else {
            continue;
        };
        if profile.type_ == TYPE_LOCALHOST {
            let localhost = profile.localhost_profile.as_deref().unwrap_or_default();
            if localhost.trim().is_empty() {
                return Err(format!(
                    "invalid empty AppArmor profile name: &{{{:?} {localhost:?}}}",
                    profile.type_
                ));
            }
        }
    }
    Ok(())
}

/// Upstream `appArmorAdmitHandler.Admit`: only a pending pod is checked (a running or
/// terminated one was admitted before).
pub fn admit(pod: &Pod, host: AppArmorHost) -> Option<Rejection> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Pending") {
        return None;
    }
    validate(pod, host).err().map(|e| Rejection {
        reason: NOT_ADMITTED_REASON,
        message: format!("Cannot enforce AppArmor: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with_profile(profile: &str) -> Pod {
        let annotations = if profile.is_empty() {
            serde_json::json!({"foo": "bar"})
        } else {
            serde_json::json!({ format!("{CONTAINER_ANNOTATION_KEY_PREFIX}test"): profile })
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "test"}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    /// Upstream `TestValidateBadHost`: on a host without AppArmor only a pod asking for no
    /// profile is valid; the others get the host's error.
    #[test]
    fn test_validate_bad_host() {
        let host = AppArmorHost::Disabled("expected host error");
        assert_eq!(validate(&pod_with_profile(""), host), Ok(()));
        for profile in [PROFILE_RUNTIME_DEFAULT, "localhost/docker-default"] {
            assert_eq!(
                validate(&pod_with_profile(profile), host),
                Err("expected host error".to_owned()),
                "{profile}"
            );
        }
        assert_eq!(
            validate(&pod_with_profile(PROFILE_NAME_UNCONFINED), host),
            Ok(())
        );
    }

    /// Upstream `TestValidateValidHost`: on a host with AppArmor every profile is valid but an
    /// empty `localhost/` one; a pod whose containers use several is too.
    #[test]
    fn test_validate_valid_host() {
        let host = AppArmorHost::Enabled;
        for profile in [
            "",
            PROFILE_RUNTIME_DEFAULT,
            "localhost/docker-default",
            "localhost/foo-container",
            "localhost//usr/sbin/ntpd",
        ] {
            assert_eq!(
                validate(&pod_with_profile(profile), host),
                Ok(()),
                "{profile}"
            );
        }
        for profile in ["localhost/", "localhost/ "] {
            assert!(
                validate(&pod_with_profile(profile), host).is_err(),
                "{profile:?}"
            );
        }
        let multi: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {
                format!("{CONTAINER_ANNOTATION_KEY_PREFIX}init"): "localhost/foo-container",
                format!("{CONTAINER_ANNOTATION_KEY_PREFIX}test1"): PROFILE_RUNTIME_DEFAULT,
                format!("{CONTAINER_ANNOTATION_KEY_PREFIX}test2"): "localhost/docker-default",
            }},
            "spec": {"initContainers": [{"name": "init"}],
                     "containers": [{"name": "test1"}, {"name": "test2"}, {"name": "no-profile"}]}
        }))
        .unwrap();
        assert_eq!(validate(&multi, host), Ok(()));
    }

    /// Upstream `TestGetProfile`: the container's field first, then the annotation (an
    /// invalid one is none), then the pod's field.
    #[test]
    fn test_get_profile() {
        let runtime_default = || AppArmorProfile {
            type_: TYPE_RUNTIME_DEFAULT.into(),
            localhost_profile: None,
        };
        let unconfined = || AppArmorProfile {
            type_: TYPE_UNCONFINED.into(),
            localhost_profile: None,
        };
        let localhost = || AppArmorProfile {
            type_: TYPE_LOCALHOST.into(),
            localhost_profile: Some("test".into()),
        };
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<AppArmorProfile>,
            Option<AppArmorProfile>,
            Option<AppArmorProfile>,
        );
        // (name, annotation, container field, pod field, expected)
        let cases: Vec<Case> = vec![
            ("no appArmor", None, None, None, None),
            (
                "pod profile",
                None,
                None,
                Some(runtime_default()),
                Some(runtime_default()),
            ),
            (
                "container profile",
                None,
                Some(unconfined()),
                None,
                Some(unconfined()),
            ),
            (
                "annotation profile",
                Some("localhost/test"),
                None,
                None,
                Some(localhost()),
            ),
            ("invalid annotation", Some("invalid"), None, None, None),
            (
                "invalid annotation with pod field",
                Some("invalid"),
                None,
                Some(runtime_default()),
                Some(runtime_default()),
            ),
            (
                "container field before annotation",
                Some(PROFILE_NAME_UNCONFINED),
                Some(runtime_default()),
                None,
                Some(runtime_default()),
            ),
            (
                "container field before pod field",
                None,
                Some(runtime_default()),
                Some(unconfined()),
                Some(runtime_default()),
            ),
            (
                "annotation before pod field",
                Some(PROFILE_NAME_UNCONFINED),
                None,
                Some(runtime_default()),
                Some(unconfined()),
            ),
            (
                "all profiles",
                Some(PROFILE_RUNTIME_DEFAULT),
                Some(localhost()),
                Some(unconfined()),
                Some(localhost()),
            ),
        ];
        for (name, annotation, container, pod_field, expected) in cases {
            let mut annotations = serde_json::json!({
                "unrelated": "baz",
                format!("{CONTAINER_ANNOTATION_KEY_PREFIX}other"): PROFILE_RUNTIME_DEFAULT,
            });
            if let Some(value) = annotation {
                annotations[format!("{CONTAINER_ANNOTATION_KEY_PREFIX}foo")] = value.into();
            }
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "bar", "annotations": annotations},
                "spec": {"containers": [{"name": "foo"}],
                         "securityContext": {"appArmorProfile": pod_field}}
            }))
            .unwrap();
            assert_eq!(
                get_profile(&pod, "foo", container.as_ref()),
                expected,
                "{name}"
            );
        }
    }

    /// Upstream e2e_node "AppArmor when running without AppArmor should reject a pod with an
    /// AppArmor profile in annotation" and "... in field": a pending pod asking for
    /// `runtime/default` either way is rejected `AppArmor` with upstream's message; one that is
    /// already running is not checked again.
    #[test]
    fn when_running_without_apparmor_should_reject_a_pod_with_an_apparmor_profile() {
        let host = AppArmorHost::from_sysfs(false, None);
        assert_eq!(host, AppArmorHost::Disabled(NOT_ENABLED));
        let in_annotation = pod_with_profile(PROFILE_RUNTIME_DEFAULT);
        let in_field: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "test-apparmor-runtime-default"},
            "spec": {"containers": [{"name": "test", "securityContext":
                                     {"appArmorProfile": {"type": "RuntimeDefault"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let expected = Some(Rejection {
            reason: "AppArmor",
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".to_owned(),
        });
        assert_eq!(admit(&in_annotation, host), expected);
        assert_eq!(admit(&in_field, host), expected);
        assert_eq!(admit(&in_field, AppArmorHost::Enabled), None);
        let mut running = in_field.clone();
        running.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(admit(&running, host), None);
        // The pod's own field, and an unconfined container, too.
        let pod_field: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"securityContext": {"appArmorProfile": {"type": "Localhost",
                                                             "localhostProfile": "p"}},
                     "containers": [{"name": "test", "securityContext":
                                     {"appArmorProfile": {"type": "Unconfined"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        assert_eq!(admit(&pod_field, host), expected);
    }

    /// libcontainer's `IsEnabled`: the securityfs directory and a `Y` parameter are both needed.
    #[test]
    fn apparmor_is_enabled_with_its_securityfs_and_a_y_parameter() {
        assert_eq!(
            AppArmorHost::from_sysfs(true, Some(b"Y\n")),
            AppArmorHost::Enabled
        );
        for (fs, param) in [
            (false, Some(&b"Y\n"[..])),
            (true, Some(&b"N\n"[..])),
            (true, Some(&b"Y"[..])),
            (true, None),
        ] {
            assert_eq!(
                AppArmorHost::from_sysfs(fs, param),
                AppArmorHost::Disabled(NOT_ENABLED),
                "{fs} {param:?}"
            );
        }
    }
}
