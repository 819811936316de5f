//! The ConfigMaps and Secrets a pod references, as upstream's `VisitPodConfigmapNames` and
//! `VisitPodSecretNames` find them: volumes (and projected sources), every container's `env`
//! and `envFrom` (init and ephemeral containers too), and for Secrets also
//! `imagePullSecrets` and the `secretRef`s of volume sources that carry credentials.
//! Empty names are skipped.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, Pod, PodSpec};

/// Which kind of object a reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

fn container_env(spec: &PodSpec) -> impl Iterator<Item = (&[EnvVar], &[EnvFromSource])> {
    let plain = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| (c.env.as_deref(), c.env_from.as_deref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| (c.env.as_deref(), c.env_from.as_deref()));
    plain
        .chain(ephemeral)
        .map(|(env, from)| (env.unwrap_or_default(), from.unwrap_or_default()))
}

/// The names of the objects of `kind` that `pod` references, in its own namespace.
pub fn referenced_names(pod: &Pod, kind: ObjectKind) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(spec) = &pod.spec else {
        return names;
    };
    let mut add = |name: Option<&String>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            names.insert(name.clone());
        }
    };
    for volume in spec.volumes.iter().flatten() {
        match kind {
            ObjectKind::ConfigMap => add(volume.config_map.as_ref().map(|c| &c.name)),
            ObjectKind::Secret => {
                add(volume.secret.as_ref().and_then(|s| s.secret_name.as_ref()));
                add(volume.azure_file.as_ref().map(|a| &a.secret_name));
                let refs = [
                    volume.cephfs.as_ref().and_then(|v| v.secret_ref.as_ref()),
                    volume.cinder.as_ref().and_then(|v| v.secret_ref.as_ref()),
                    volume
                        .flex_volume
                        .as_ref()
                        .and_then(|v| v.secret_ref.as_ref()),
                    volume.rbd.as_ref().and_then(|v| v.secret_ref.as_ref()),
                    volume.iscsi.as_ref().and_then(|v| v.secret_ref.as_ref()),
                    volume
                        .storageos
                        .as_ref()
                        .and_then(|v| v.secret_ref.as_ref()),
                    volume
                        .csi
                        .as_ref()
                        .and_then(|v| v.node_publish_secret_ref.as_ref()),
                ];
                for r in refs.into_iter().flatten() {
                    add(Some(&r.name));
                }
                if let Some(scale_io) = &volume.scale_io {
                    add(Some(&scale_io.secret_ref.name));
                }
            }
        }
        let projections = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten());
        for source in projections {
            match kind {
                ObjectKind::ConfigMap => add(source.config_map.as_ref().map(|c| &c.name)),
                ObjectKind::Secret => add(source.secret.as_ref().map(|s| &s.name)),
            }
        }
    }
    for (env, env_from) in container_env(spec) {
        for var in env {
            let from = var.value_from.as_ref();
            match kind {
                ObjectKind::ConfigMap => add(from
                    .and_then(|f| f.config_map_key_ref.as_ref())
                    .map(|r| &r.name)),
                ObjectKind::Secret => add(from
                    .and_then(|f| f.secret_key_ref.as_ref())
                    .map(|r| &r.name)),
            }
        }
        for source in env_from {
            match kind {
                ObjectKind::ConfigMap => add(source.config_map_ref.as_ref().map(|r| &r.name)),
                ObjectKind::Secret => add(source.secret_ref.as_ref().map(|r| &r.name)),
            }
        }
    }
    if kind == ObjectKind::Secret {
        for pull in spec.image_pull_secrets.iter().flatten() {
            add(Some(&pull.name));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "sec-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "cm-proj"}},
                        {"secret": {"name": "sec-proj"}},
                        {"serviceAccountToken": {"path": "token"}}
                    ]}},
                    {"name": "d", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "sec-csi"}}},
                    {"name": "e", "emptyDir": {}},
                    {"name": "f", "configMap": {"name": ""}}
                ],
                "containers": [{
                    "name": "c",
                    "env": [
                        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec-env", "key": "k"}}},
                        {"name": "C", "value": "plain"}
                    ],
                    "envFrom": [{"configMapRef": {"name": "cm-from"}}, {"secretRef": {"name": "sec-from"}}]
                }],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-init"}}]}],
                "ephemeralContainers": [{"name": "e", "envFrom": [{"secretRef": {"name": "sec-debug"}}]}]
            }
        }))
        .unwrap()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn visit_pod_configmap_names_covers_volumes_projections_and_every_container() {
        assert_eq!(
            referenced_names(&pod(), ObjectKind::ConfigMap),
            set(&["cm-env", "cm-from", "cm-init", "cm-proj", "cm-vol"])
        );
    }

    #[test]
    fn visit_pod_secret_names_adds_pull_secrets_and_credential_refs() {
        assert_eq!(
            referenced_names(&pod(), ObjectKind::Secret),
            set(&[
                "pull",
                "sec-csi",
                "sec-debug",
                "sec-env",
                "sec-from",
                "sec-proj",
                "sec-vol"
            ])
        );
    }

    #[test]
    fn a_pod_without_spec_references_nothing() {
        assert!(referenced_names(&Pod::default(), ObjectKind::Secret).is_empty());
    }
}
