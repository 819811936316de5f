//! rustlet-e2e: cross-crate end-to-end tests against the in-tree test API server. Empty until
//! the crates it joins exist (issues 3-6).
