//! `/stats/summary` (upstream: `pkg/kubelet/server/stats`): the [`summary`] document and the
//! node's figures read from the cgroup tree ([`cgroup`]). The binary assembles the document
//! from these, the runtime's CRI stats and the volumes ([`crate::routes::NodeApi::summary`]).

pub mod cgroup;
pub mod summary;
