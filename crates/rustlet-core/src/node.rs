//! This node's well-known labels (upstream `kubelet_node_status.go`), shared by the Node the
//! agent registers and by the node-affinity check of PersistentVolumes, so both see one node;
//! which labels a kubelet may set on its own Node (upstream `IsKubeletLabel`, what the
//! NodeRestriction admission plugin allows); and the reconciliation of an already registered
//! Node's labels and annotation (upstream `updateDefaultLabels`,
//! `reconcileCMADAnnotationWithExistingNode`).

use std::collections::BTreeMap;

/// Go's name of this machine's architecture (`GOARCH`).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `kubernetes.io/hostname` (lowercased, as upstream), `kubernetes.io/os`, `kubernetes.io/arch`.
pub fn well_known_labels(node_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "kubernetes.io/hostname".to_owned(),
            node_name.to_lowercase(),
        ),
        (
            "kubernetes.io/os".to_owned(),
            std::env::consts::OS.to_owned(),
        ),
        ("kubernetes.io/arch".to_owned(), go_arch().to_owned()),
    ])
}

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// `beta.kubernetes.io/os` (deprecated, still set by upstream).
pub const LABEL_BETA_OS: &str = "beta.kubernetes.io/os";
/// `beta.kubernetes.io/arch` (deprecated, still set by upstream).
pub const LABEL_BETA_ARCH: &str = "beta.kubernetes.io/arch";
/// The annotation that hands attach and detach of this node's volumes to the controller.
pub const CONTROLLER_MANAGED_ATTACH_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The labels of a Node a kubelet registers (upstream `initialNode`): the well-known ones and
/// the deprecated `beta.kubernetes.io/{os,arch}`.
pub fn registration_labels(node_name: &str) -> BTreeMap<String, String> {
    let mut labels = well_known_labels(node_name);
    labels.insert(LABEL_BETA_OS.into(), std::env::consts::OS.to_owned());
    labels.insert(LABEL_BETA_ARCH.into(), go_arch().to_owned());
    labels
}

/// The labels a kubelet may set on its own Node in the `kubernetes.io` and `k8s.io` namespaces
/// (upstream `kubeletLabels`).
pub const KUBELET_LABELS: [&str; 11] = [
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// The label namespaces (and their subdomains) a kubelet may set (upstream
/// `kubeletLabelNamespaces`).
pub const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

fn label_namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

fn in_namespace(namespace: &str, allowed: &str) -> bool {
    namespace == allowed || namespace.ends_with(&format!(".{allowed}"))
}

/// upstream `isKubernetesLabel`: the key is in the `kubernetes.io` or `k8s.io` namespace (or a
/// subdomain of either).
pub fn is_kubernetes_label(key: &str) -> bool {
    let namespace = label_namespace(key);
    in_namespace(namespace, "kubernetes.io") || in_namespace(namespace, "k8s.io")
}

/// upstream `IsKubeletLabel`: a label a kubelet may set on its own Node.
pub fn is_kubelet_label(key: &str) -> bool {
    let namespace = label_namespace(key);
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES
            .iter()
            .any(|allowed| in_namespace(namespace, allowed))
}

/// The `--node-labels` that the NodeRestriction admission plugin would refuse (a `kubernetes.io`
/// or `k8s.io` label that is not a kubelet label; `node-restriction.kubernetes.io/` is one),
/// sorted; and upstream's startup error naming them (`ValidateKubeletFlags`), `None` when all
/// may be set. Deviation: one line (upstream breaks it after the list), as every startup
/// error of the agent.
pub fn forbidden_node_labels<'a>(keys: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut unknown: Vec<&str> = keys
        .into_iter()
        .filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    unknown.sort_unstable();
    unknown.dedup();
    let mut namespaces = KUBELET_LABEL_NAMESPACES.to_vec();
    namespaces.sort_unstable();
    Some(format!(
        "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]; \
         --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix ({}) \
         or be in the specifically allowed set ({})",
        unknown.join(" "),
        namespaces.join(", "),
        KUBELET_LABELS.join(", ")
    ))
}

/// The labels upstream's `updateDefaultLabels` reconciles on an existing Node.
const DEFAULT_LABELS: [&str; 12] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/windows-build",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// upstream `updateDefaultLabels`: each default label the new Node has is set on the existing
/// one (an empty value removes it); returns whether anything changed. Other labels, `--node-labels`
/// among them, are left as they are (upstream sets those only at creation).
pub fn reconcile_default_labels(
    initial: &BTreeMap<String, String>,
    existing: &mut BTreeMap<String, String>,
) -> bool {
    let mut changed = false;
    for label in DEFAULT_LABELS {
        let Some(value) = initial.get(label) else {
            continue;
        };
        if existing.get(label) != Some(value) {
            existing.insert(label.to_owned(), value.clone());
            changed = true;
        }
        if existing.get(label).is_some_and(String::is_empty) {
            existing.remove(label);
        }
    }
    changed
}

/// upstream `reconcileCMADAnnotationWithExistingNode`: the controller-managed attach-detach
/// annotation made the same as the new Node's (set, or removed when the new Node has none);
/// returns whether anything changed.
pub fn reconcile_attach_detach_annotation(
    initial: &BTreeMap<String, String>,
    existing: &mut BTreeMap<String, String>,
) -> bool {
    let key = CONTROLLER_MANAGED_ATTACH_ANNOTATION;
    let (new, old) = (initial.get(key), existing.get(key));
    if new.map_or("", String::as_str) == old.map_or("", String::as_str) {
        return false;
    }
    match new {
        Some(value) => existing.insert(key.to_owned(), value.clone()),
        None => existing.remove(key),
    };
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_restriction_allows_kubelet_labels_and_refuses_other_kubernetes_labels() {
        for allowed in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/instance-type",
            "node.kubernetes.io/role",
            "kubelet.kubernetes.io/anything",
            "x.node.kubernetes.io/y",
            "example.com/role",
            "plain",
        ] {
            assert_eq!(forbidden_node_labels([allowed]), None, "{allowed}");
        }
        let err = forbidden_node_labels([
            "node-role.kubernetes.io/worker",
            "node-restriction.kubernetes.io/pool",
            "example.k8s.io/a",
            "ok.example.com/b",
        ])
        .unwrap();
        assert!(
            err.starts_with(
                "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: \
                 [example.k8s.io/a node-restriction.kubernetes.io/pool node-role.kubernetes.io/worker]"
            ),
            "{err}"
        );
        assert!(
            err.contains("(kubelet.kubernetes.io, node.kubernetes.io)"),
            "{err}"
        );
    }

    /// upstream: `TestUpdateDefaultLabels` (a subset of its cases).
    #[test]
    fn test_update_default_labels() {
        let initial = registration_labels("node-a");
        // Missing and wrong default labels are set; other labels stay.
        let mut existing = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "old".to_owned()),
            ("please-persist".to_owned(), "foo".to_owned()),
        ]);
        assert!(reconcile_default_labels(&initial, &mut existing));
        for (k, v) in &initial {
            assert_eq!(existing.get(k), Some(v), "{k}");
        }
        assert_eq!(existing["please-persist"], "foo");
        // Nothing to do the second time.
        assert!(!reconcile_default_labels(&initial, &mut existing));
        // An empty value in the new Node removes the label.
        let mut with_empty = initial.clone();
        with_empty.insert("kubernetes.io/hostname".into(), String::new());
        assert!(reconcile_default_labels(&with_empty, &mut existing));
        assert!(!existing.contains_key("kubernetes.io/hostname"));
    }

    /// upstream: `TestReconcileCMADAnnotationWithExistingNode` (its cases).
    #[test]
    fn test_reconcile_cmad_annotation_with_existing_node() {
        let on = BTreeMap::from([(
            CONTROLLER_MANAGED_ATTACH_ANNOTATION.to_owned(),
            "true".to_owned(),
        )]);
        let off = BTreeMap::new();
        for (initial, existing, changed) in [
            (&on, &on, false),
            (&off, &off, false),
            (&on, &off, true),
            (&off, &on, true),
        ] {
            let mut result = existing.clone();
            assert_eq!(
                reconcile_attach_detach_annotation(initial, &mut result),
                changed
            );
            assert_eq!(&result, initial);
        }
    }

    #[test]
    fn the_hostname_label_is_lowercased() {
        let labels = well_known_labels("Node-A");
        assert_eq!(labels["kubernetes.io/hostname"], "node-a");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert!(!labels["kubernetes.io/arch"].is_empty());
    }
}
