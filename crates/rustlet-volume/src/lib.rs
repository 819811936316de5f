//! rustlet-volume: the volume manager. For every pod bound to the node it makes the pod's
//! volumes exist and be mounted before its containers start, keeps them right while it runs,
//! and takes them down after.
//!
//! Mirrors upstream `pkg/kubelet/volumemanager` (`cache/`, and in later work `populator/`,
//! `reconciler/`) and `pkg/volume/util/nestedpendingoperations`. Rule numbers (V1-V122) refer to
//! `shared/spec/volume-manager.md`.
//!
//! # State
//!
//! * [`cache::DesiredStateOfWorld`]: (volume, pod) pairs that should be mounted, keyed by
//!   [`rustlet_core::UniqueVolumeName`]: shared by pods for attachable or device-mountable
//!   plugins, per pod otherwise.
//! * [`cache::ActualStateOfWorld`]: what the operations report. Per pod and volume a
//!   [`cache::VolumeMountState`] (mounted / uncertain / not mounted), per volume a
//!   [`cache::DeviceMountState`] (globally mounted / uncertain / not mounted), with the
//!   transitions of the spec's section 2.3. An uncertain mount counts as possibly mounted:
//!   it is mounted again before use and torn down before removal, never forgotten.
//! * [`operations::NestedPendingOperations`]: one operation per key at a time, per-key
//!   exponential backoff (500 ms doubling to 2 min 2 s).
//!
//! # Boundaries
//!
//! Owns the [`mounter::Mounter`] trait and implements it for `rustlet_mount::LinuxMounter`
//! (and, behind `test-util`, the `FakeMounter`). Its other seams: [`populator::PodSource`],
//! [`populator::PodStateProvider`], [`node::NodeStatus`] and [`events::EventRecorder`], which
//! `rustlet-api` and the binary implement. Depends on `rustlet-core` and `rustlet-mount`; never
//! on kube or a crate above it.
//!
//! # Flow
//!
//! The [`populator::Populator`] turns pods into desired pairs; the [`reconciler::Reconciler`]
//! compares the two caches and starts operations through the [`executor::OperationExecutor`]
//! (unmount what is no longer desired; wait for attach, MountDevice and SetUp what is; then
//! UnmountDevice and drop volumes nobody uses); [`reconstruct`] rebuilds the actual state from
//! the pod directories after a restart. [`manager::VolumeManager`] runs it all, event-driven.
//! Passes are O(changed): each cache write declares the volumes it touches
//! (`cache::Touch`, collected in [`cache::Touched`]), and the reconciler looks at those; the populator's event passes look at
//! the pods its seams' change logs name. Whole scans remain the rare consistency check; the
//! outcome of a pass is the one a whole scan would reach.
//!
//! Plugins: emptyDir and hostPath ([`plugins::builtin_plugins`]); with an objects seam
//! ([`objects::VolumeObjects`] in [`manager::VolumeManagerDeps::objects`]) also configMap, secret, downwardAPI and projected
//! ([`plugins::content`]: written by `rustlet_mount::atomic_writer`, never on disk except a
//! configMap) and local PersistentVolumes reached through their claims ([`claims`],
//! [`plugins::local`]). [`subpath`] prepares containers' subPaths safely; fsGroup ownership
//! comes from `rustlet_mount::ownership`. [`usage`] measures a mounted volume for
//! `/stats/summary`. [`env_files`] reads containers' `fileKeyRef` variables from the mounted
//! volumes.

pub mod cache;
pub mod claims;
pub mod env_files;
pub mod events;
pub mod executor;
pub mod manager;
pub mod metrics;
pub mod mounter;
pub mod node;
pub mod objects;
pub mod operations;
pub mod plugin;
pub mod plugins;
pub mod populator;
pub mod reconciler;
pub mod reconstruct;
pub mod spec;
pub mod subpath;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod usage;

#[cfg(test)]
mod tests;

pub use mounter::Mounter;
pub use plugin::{PluginError, PluginManager, VolumePlugin};
pub use spec::VolumeSpec;

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
