//! rustlet-e2e: cross-crate end-to-end tests. So far: local mode (a manifest directory, the
//! local store, the pod cache fed from it, the status manager writing back to it, and the
//! volume objects seam following ConfigMap manifests). The adapters' tests against the test
//! API server live in `rustlet-api` (`test_server`).
//!
//! It has no library code; everything here is `#[cfg(test)]`, in one test binary.

#[cfg(test)]
mod local_mode;
