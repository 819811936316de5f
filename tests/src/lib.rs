//! rustlet-e2e: cross-crate end-to-end tests. So far: local mode (a manifest directory, the
//! local store, the pod cache fed from it, the status manager writing back to it, and the
//! volume objects seam following ConfigMap manifests) and cluster mode (the status and volume
//! managers wired to the kube adapters over the test API server, from a pod's creation to its
//! UID-preconditioned deletion once its volumes are reclaimed). The adapters' own tests against
//! the test API server live in `rustlet-api` (`test_server`).
//!
//! It has no library code; everything here is `#[cfg(test)]`, in one test binary.

#[cfg(test)]
mod cluster_mode;
#[cfg(test)]
mod local_mode;
