//! This node's well-known labels (upstream `kubelet_node_status.go`), shared by the Node the
//! agent registers and by the node-affinity check of PersistentVolumes, so both see one node.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hostname_label_is_lowercased() {
        let labels = well_known_labels("Node-A");
        assert_eq!(labels["kubernetes.io/hostname"], "node-a");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert!(!labels["kubernetes.io/arch"].is_empty());
    }
}
