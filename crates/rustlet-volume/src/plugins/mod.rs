//! The built-in volume plugins.

pub mod empty_dir;
pub mod host_path;

use std::sync::Arc;

use crate::plugin::PluginManager;

/// emptyDir and hostPath.
pub fn builtin_plugins() -> PluginManager {
    PluginManager::new(vec![
        Arc::new(empty_dir::EmptyDirPlugin),
        Arc::new(host_path::HostPathPlugin),
    ])
}
