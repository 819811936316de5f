//! The built-in volume plugins.

pub mod content;
pub mod downward;
pub mod empty_dir;
pub mod host_path;
pub mod local;

use std::sync::Arc;

use crate::objects::VolumeObjects;
use crate::plugin::PluginManager;

/// emptyDir and hostPath.
pub fn builtin_plugins() -> PluginManager {
    PluginManager::new(vec![
        Arc::new(empty_dir::EmptyDirPlugin),
        Arc::new(host_path::HostPathPlugin),
    ])
}

/// Adds the plugins that read objects: the content volumes (configMap, secret, downwardAPI,
/// projected) over `objects`, and local PersistentVolumes (their claims are read through
/// `objects` by the populator). `VolumeManagerDeps::objects` calls it.
pub fn add_object_plugins(plugins: &mut PluginManager, objects: Arc<dyn VolumeObjects>) {
    plugins.register(Arc::new(local::LocalVolumePlugin));
    for kind in [
        content::ContentKind::ConfigMap,
        content::ContentKind::Secret,
        content::ContentKind::DownwardApi,
        content::ContentKind::Projected,
    ] {
        plugins.register(Arc::new(content::ContentPlugin::new(kind, objects.clone())));
    }
}
