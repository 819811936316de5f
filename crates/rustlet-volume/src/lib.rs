//! rustlet-volume: the volume manager. Not built yet (issue 5): this crate holds only its
//! contract so far.
//!
//! Mirrors upstream `pkg/kubelet/volumemanager`: desired and actual state caches, a populator
//! that turns pods into desired volumes, a reconciler that mounts and unmounts until the two
//! agree, an operation executor with per-volume backoff, the volume plugins, and reconstruction
//! of the actual state from disk after a restart.
//!
//! It owns the `Mounter` trait (its seam to the kernel) and depends on `rustlet-core` and
//! `rustlet-mount` (which it adapts to that trait); it must never import kube or any crate above
//! it.
