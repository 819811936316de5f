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

/// emptyDir, hostPath, the content volumes (configMap, secret, downwardAPI, projected) over
/// `objects`, and local PersistentVolumes (their claims read through `objects`).
pub fn plugins_with_objects(objects: Arc<dyn VolumeObjects>) -> PluginManager {
    let mut plugins = builtin_plugins();
    plugins.register(Arc::new(content::ContentPlugin::new(
        content::ContentKind::ConfigMap,
        objects.clone(),
    )));
    plugins.register(Arc::new(local::LocalVolumePlugin));
    for kind in [
        content::ContentKind::Secret,
        content::ContentKind::DownwardApi,
        content::ContentKind::Projected,
    ] {
        plugins.register(Arc::new(content::ContentPlugin::new(kind, objects.clone())));
    }
    plugins
}
