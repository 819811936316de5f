//! rustlet-cri: the pod workers' [`rustlet_pods::Runtime`] over a CRI v1 container runtime
//! (containerd) on a unix socket, so that the volumes the volume manager mounts reach real
//! processes.
//!
//! * [`client`]: the CRI client (k8s-cri's tonic bindings); every call has a deadline.
//!
//! # Boundaries
//!
//! The only crate that names tonic or the CRI bindings; depends on `rustlet-core`,
//! `rustlet-volume` and `rustlet-pods`, never on kube, `rustlet-api` or the binary.

pub mod client;
#[cfg(feature = "test-util")]
pub mod testing;

pub use client::{CriClient, CriError};
