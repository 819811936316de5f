//! rustlet-mount: a careful Linux mount library. Not built yet (issue 4): this crate holds only
//! its contract so far.
//!
//! It will offer mount, bind, read-only bind, tmpfs and unmount through sys-mount and nix,
//! mountinfo parsing, mount-point checks, path operations that never follow a symlink out of a
//! root, and a removal that never crosses a mount point.
//!
//! It is usable alone: no Kubernetes types in its API, and it depends on no other workspace
//! crate (`rustlet-volume` depends on it and adapts it to its `Mounter` trait).
