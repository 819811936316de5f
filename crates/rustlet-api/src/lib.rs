//! rustlet-api: adapters that make the managers' seams real. Not built yet (issue 6): this
//! crate holds only its contract so far.
//!
//! A kube-rs adapter for a real cluster (pod status client, pod watch, ConfigMap and Secret
//! sources, Node and Lease), and a local store that serves the same traits from a directory of
//! manifests when there is no cluster.
//!
//! It depends on `rustlet-core`, `rustlet-status` and `rustlet-volume` (whose traits it
//! implements) and must never be imported by them.
