//! rustlet-e2e: cross-crate end-to-end tests. So far: local mode (a manifest directory, the
//! local store, the pod cache fed from it, and the status manager writing back to it). The
//! test API server tests join when it exists (issue 6).
//!
//! It has no library code; everything here is `#[cfg(test)]`, in one test binary.

#[cfg(test)]
mod local_mode;
