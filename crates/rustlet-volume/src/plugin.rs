//! Volume plugins and the plugin manager (upstream `volume.VolumePlugin`,
//! `VolumePluginMgr.FindPluginBySpec`).
//!
//! This part is what the caches need: which plugin serves a spec, whether it is attachable or
//! device-mountable (which decides whether pods share a volume entry), and whether it needs a
//! periodic remount. SetUp and TearDown come with the reconciler.

use std::sync::Arc;

use rustlet_core::{UniquePodName, UniqueVolumeName};

use crate::spec::VolumeSpec;

/// Why no single plugin serves a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// Upstream: `no volume plugin matched`.
    #[error("no volume plugin matched name: {0}")]
    NoPlugin(String),
    /// Upstream: `multiple volume plugins matched`.
    #[error("multiple volume plugins matched: {0}")]
    MultiplePlugins(String),
    /// The plugin could not name the volume.
    #[error("failed to get volume name of {volume} from plugin {plugin}: {reason}")]
    VolumeName {
        /// The spec name.
        volume: String,
        /// The plugin.
        plugin: String,
        /// Why.
        reason: String,
    },
}

/// A volume plugin, as the caches see it.
pub trait VolumePlugin: Send + Sync {
    /// The plugin name, e.g. `kubernetes.io/empty-dir`.
    fn name(&self) -> &str;
    /// Whether this plugin serves the spec.
    fn can_support(&self, spec: &VolumeSpec) -> bool;
    /// Attachable plugins attach the volume to the node first; pods then share one entry.
    fn is_attachable(&self) -> bool {
        false
    }
    /// Device-mountable plugins mount a global (staging) path first; pods then share one entry.
    fn is_device_mountable(&self) -> bool {
        false
    }
    /// Whether SetUp must run again periodically (configMap, secret, projected, downwardAPI).
    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        false
    }
    /// The volume's name within the plugin, shared by every pod (upstream `GetVolumeName`).
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String, PluginError> {
        Ok(spec.name().to_owned())
    }
}

/// The registered plugins.
#[derive(Clone, Default)]
pub struct PluginManager {
    plugins: Vec<Arc<dyn VolumePlugin>>,
}

impl std::fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|p| p.name()))
            .finish()
    }
}

impl PluginManager {
    /// A manager over these plugins.
    pub fn new(plugins: Vec<Arc<dyn VolumePlugin>>) -> Self {
        Self { plugins }
    }

    /// The one plugin that serves `spec` (upstream `FindPluginBySpec`).
    pub fn find_by_spec(&self, spec: &VolumeSpec) -> Result<Arc<dyn VolumePlugin>, PluginError> {
        let mut matches = self.plugins.iter().filter(|p| p.can_support(spec));
        let first = matches
            .next()
            .ok_or_else(|| PluginError::NoPlugin(spec.name().to_owned()))?;
        let rest: Vec<&str> = matches.map(|p| p.name()).collect();
        if !rest.is_empty() {
            let mut names = vec![first.name()];
            names.extend(rest);
            return Err(PluginError::MultiplePlugins(names.join(",")));
        }
        Ok(first.clone())
    }

    /// A plugin by name.
    pub fn find_by_name(&self, name: &str) -> Option<Arc<dyn VolumePlugin>> {
        self.plugins.iter().find(|p| p.name() == name).cloned()
    }
}

/// The unique name of a volume for a pod (section 2.1): shared (`<plugin>/<volume name>`) for
/// attachable or device-mountable plugins, per pod (`<plugin>/<pod uid>-<spec name>`) otherwise.
pub fn unique_volume_name(
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    pod: &UniquePodName,
) -> Result<UniqueVolumeName, PluginError> {
    if plugin.is_attachable() || plugin.is_device_mountable() {
        Ok(UniqueVolumeName::for_plugin(
            plugin.name(),
            &plugin.volume_name(spec)?,
        ))
    } else {
        Ok(UniqueVolumeName::for_pod(plugin.name(), pod, spec.name()))
    }
}

/// Upstream `EscapeQualifiedName`: `/` becomes `~`, for directory names.
pub fn escape_plugin_name(name: &str) -> String {
    name.replace('/', "~")
}

/// Upstream `UnescapeQualifiedName`.
pub fn unescape_plugin_name(name: &str) -> String {
    name.replace('~', "/")
}
