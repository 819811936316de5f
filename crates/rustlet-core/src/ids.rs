//! Identifier newtypes with upstream precedent (`types.UID`, `UniquePodName`, `UniqueVolumeName`).
//!
//! A newtype keeps a pod UID from being passed where a volume name is expected. Each holds its
//! text once, shared (`Arc<str>`): the volume manager's caches, its pending operations and its
//! events key on these names, and a clone is a count, not a copy of the text.

use std::fmt;
use std::sync::Arc;

macro_rules! string_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// The identifier with this text: one allocation, whatever string type holds it
            /// (a `String` given by value would be copied once anyway into the shared text).
            pub fn new(value: impl AsRef<str>) -> Self {
                Self(Arc::from(value.as_ref()))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// True for the empty identifier (upstream's `""`, e.g. "no mirror pod yet").
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// The identifier as an owned string (a copy of the text).
            pub fn into_string(self) -> String {
                String::from(&*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(Arc::from(value))
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(Arc::from(value))
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

string_newtype!(
    /// A pod's `metadata.uid`. For a static pod this is the UID the agent computed from its
    /// manifest; its mirror pod in the API has a different one.
    PodUid
);

string_newtype!(
    /// The unique name of a pod inside the volume manager (upstream: `types.UniquePodName`,
    /// which is the pod UID).
    UniquePodName
);

string_newtype!(
    /// The unique name of a volume (upstream: `v1.UniqueVolumeName`): `<plugin>/<pod uid>-<volume>`
    /// for per-pod volumes, `<plugin>/<volume id>` for attachable ones.
    UniqueVolumeName
);

impl PodUid {
    /// A pod's `metadata.uid` (empty when it has none).
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        Self::from(pod.metadata.uid.as_deref().unwrap_or(""))
    }

    /// The UID as the name of its pod's directories (`<root>/pods/<uid>`, the pod's log
    /// directory), checked by [`path_component`].
    pub fn as_path_component(&self) -> Result<&str, UnsafePathComponent> {
        path_component("pod UID", &self.0)
    }
}

/// Why a string was refused as one component of a path: it would name no directory of its
/// own, or another one (`..` is the parent: a pod with that UID would have `<root>/pods` as its
/// directory and remove it with its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeReason {
    /// The empty string: the component would be the parent itself.
    #[error("is empty")]
    Empty,
    /// `.` or `..`: the directory itself or its parent.
    #[error("is `.` or `..`")]
    Dots,
    /// A `/`: more than one component.
    #[error("contains `/`")]
    Slash,
    /// A NUL byte: no path can hold one, and a C string ends there.
    #[error("contains a NUL byte")]
    Nul,
}

/// A pod UID, pod name or volume name that cannot be used as a path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} cannot be a path component: it {reason}")]
pub struct UnsafePathComponent {
    /// What the value is (`pod UID`, `volume name`, ...).
    pub what: &'static str,
    /// The value refused.
    pub value: String,
    /// Why.
    pub reason: UnsafeReason,
}

/// `value` if it is exactly one component of a path: not empty, `.` or `..`, with no `/` and
/// no NUL. Every path the agent builds from a pod UID, a pod name or a volume name takes the
/// name through here, whatever intake already checked: those names come from manifests and
/// from the API, and a pod's content is hostile input.
pub fn path_component<'a>(
    what: &'static str,
    value: &'a str,
) -> Result<&'a str, UnsafePathComponent> {
    let reason = if value.is_empty() {
        UnsafeReason::Empty
    } else if value == "." || value == ".." {
        UnsafeReason::Dots
    } else if value.contains('/') {
        UnsafeReason::Slash
    } else if value.contains('\0') {
        UnsafeReason::Nul
    } else {
        return Ok(value);
    };
    Err(UnsafePathComponent {
        what,
        value: value.to_owned(),
        reason,
    })
}

impl From<PodUid> for UniquePodName {
    fn from(uid: PodUid) -> Self {
        UniquePodName(uid.0)
    }
}

/// A pod's unique name is its UID (upstream `GetUniquePodName`): the UID shares the name's
/// text (no allocation).
impl From<&UniquePodName> for PodUid {
    fn from(name: &UniquePodName) -> Self {
        PodUid(name.0.clone())
    }
}

impl UniqueVolumeName {
    /// Upstream `GetUniqueVolumeName(pluginName, volumeName)`: `<plugin>/<volume>`.
    pub fn for_plugin(plugin: &str, volume: &str) -> Self {
        Self(Arc::from(format!("{plugin}/{volume}")))
    }

    /// Upstream `GetUniqueVolumeNameFromSpecWithPod`: `<plugin>/<pod uid>-<volume>`, the name
    /// of a volume that is not shared between pods (emptyDir, configMap, ...).
    pub fn for_pod(plugin: &str, pod: &UniquePodName, volume: &str) -> Self {
        Self(Arc::from(format!("{plugin}/{pod}-{volume}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_volume_names_follow_upstream_shapes() {
        let pod = UniquePodName::from(PodUid::new("uid-1"));
        assert_eq!(
            UniqueVolumeName::for_pod("kubernetes.io/empty-dir", &pod, "cache").as_str(),
            "kubernetes.io/empty-dir/uid-1-cache"
        );
        assert_eq!(
            UniqueVolumeName::for_plugin("kubernetes.io/fake", "disk-1").as_str(),
            "kubernetes.io/fake/disk-1"
        );
    }

    #[test]
    fn a_clone_shares_the_text_instead_of_copying_it() {
        let volume = UniqueVolumeName::for_pod("kubernetes.io/empty-dir", &"uid-1".into(), "v");
        let copy = volume.clone();
        assert_eq!(copy, volume);
        assert_eq!(copy.as_str().as_ptr(), volume.as_str().as_ptr());
        let pod = UniquePodName::from(PodUid::new("uid-2"));
        assert_eq!(pod.clone().as_str().as_ptr(), pod.as_str().as_ptr());
        let uid = PodUid::from(&pod);
        assert_eq!(
            (uid.as_str(), uid.as_str().as_ptr()),
            ("uid-2", pod.as_str().as_ptr())
        );
        assert_eq!(pod.into_string(), "uid-2");
    }

    #[test]
    fn newtypes_borrow_as_str_for_map_lookups() {
        let mut map = std::collections::HashMap::new();
        map.insert(PodUid::new("a"), 1);
        assert_eq!(map.get("a"), Some(&1));
        assert!(PodUid::default().is_empty());
    }

    #[test]
    fn path_components_refuse_empty_dots_slash_and_nul() {
        for (value, reason) in [
            ("", UnsafeReason::Empty),
            (".", UnsafeReason::Dots),
            ("..", UnsafeReason::Dots),
            ("a/b", UnsafeReason::Slash),
            ("/", UnsafeReason::Slash),
            ("../x", UnsafeReason::Slash),
            ("a\0b", UnsafeReason::Nul),
        ] {
            let err = path_component("pod UID", value).unwrap_err();
            assert_eq!(err.reason, reason, "{value:?}");
            assert_eq!(err.value, value);
        }
        for value in [
            "...",
            "a..b",
            ".hidden",
            "9f4c1e2a-0b6d-4a8e-9c3f-1d2e3f4a5b6c",
            "ü",
        ] {
            assert_eq!(path_component("pod UID", value), Ok(value));
        }
        assert_eq!(
            PodUid::new("..")
                .as_path_component()
                .unwrap_err()
                .to_string(),
            "pod UID \"..\" cannot be a path component: it is `.` or `..`"
        );
    }

    #[test]
    fn pod_uid_of_a_pod_is_its_metadata_uid_or_empty() {
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        assert!(PodUid::of(&pod).is_empty());
        pod.metadata.uid = Some("u-1".into());
        assert_eq!(PodUid::of(&pod), PodUid::new("u-1"));
    }
}
