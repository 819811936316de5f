//! The `rustlet` binary as a node of a real control plane: upstream's etcd, kube-apiserver
//! (Node and RBAC authorization, NodeRestriction and ServiceAccount admission),
//! kube-controller-manager and kube-scheduler, built from `tools/k8s/` and started per test by
//! xtask's `TestCluster`. The agent holds only its node certificate (`system:node:<name>` in
//! `system:nodes`); the API server's audit log shows every request it made and the answer.
//!
//! Skipped when the control plane is not built (`cargo xtask cluster build`); under
//! `RUSTLET_REQUIRE_CLUSTER=1` (as `.ci/run` sets) that fails instead. Tests that run
//! containers need root as the CRI tests do (`RUSTLET_REQUIRE_PRIVILEGED=1` makes a skip fail).

mod container_logs;
mod cri;
// The agent harness is shared with `tests/agent`; not every helper is used here.
#[allow(dead_code)]
#[path = "../agent/harness.rs"]
mod harness;
mod kubelet_auth;
mod kubelet_server;
mod kubelet_stats;
mod kubelet_streams;
mod multi;
mod node;
mod node_features;
mod static_pods;
mod support;
mod tokens;
mod workloads;
