//! `/stats/summary` (upstream: `pkg/kubelet/server/stats`): the [`summary`] document and the
//! node's, the system containers', the pods' and the containers' figures read from the cgroup
//! tree and procfs ([`cgroup`]). The binary assembles the document
//! from these, the runtime's CRI stats and the volumes ([`crate::routes::NodeApi::summary`]).

pub mod cgroup;
pub mod summary;
