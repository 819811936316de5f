//! The node-status seams: which volumes the attach/detach controller has attached to this node
//! (`node.status.volumesAttached`), read from the agent's node watch, and the writer of
//! `node.status.volumesInUse`.

use async_trait::async_trait;
use rustlet_core::UniqueVolumeName;

/// One entry of `node.status.volumesAttached`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedToNode {
    /// The unique volume name.
    pub name: UniqueVolumeName,
    /// The device path the attacher reported.
    pub device_path: String,
}

/// The node's view of attached volumes.
pub trait NodeStatus: Send + Sync {
    /// `status.volumesAttached` of the node, as last seen (empty when never seen).
    fn volumes_attached(&self) -> Vec<AttachedToNode>;

    /// `status.volumesAttached`, or `None` while the node has not been read yet (upstream: the
    /// GET of the Node failed, try again on the next pass). Reconstruction waits for this before
    /// anything is unmounted (V74). A node agent with no API server reads an empty list at once.
    fn observed_volumes_attached(&self) -> Option<Vec<AttachedToNode>> {
        Some(self.volumes_attached())
    }
}

/// A node with nothing attached (an agent with no attach/detach controller).
#[derive(Clone, Copy, Debug, Default)]
pub struct NothingAttached;

impl NodeStatus for NothingAttached {
    fn volumes_attached(&self) -> Vec<AttachedToNode> {
        Vec::new()
    }
}

/// The error of a [`VolumesInUseWriter`] (the API client's, boxed).
pub type WriteError = Box<dyn std::error::Error + Send + Sync>;

/// Writes `node.status.volumesInUse` (upstream: the node status setter `VolumesInUse` and the
/// status patch after it). [`crate::manager::VolumeManager::report_volumes_in_use`] drives it.
#[async_trait]
pub trait VolumesInUseWriter: Send + Sync {
    /// Replaces the node's `status.volumesInUse` with `volumes`.
    async fn write_volumes_in_use(&self, volumes: &[String]) -> Result<(), WriteError>;
}
