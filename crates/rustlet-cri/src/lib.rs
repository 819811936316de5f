//! rustlet-cri: the pod workers' [`rustlet_pods::Runtime`] over a CRI v1 container runtime
//! (containerd) on a unix socket, so that the volumes the volume manager mounts reach real
//! processes.
//!
//! * [`cgroups`]: the pods' cgroups under a configured cgroup root (upstream's `cgroupfs`
//!   driver with `cgroupsPerQOS`, cgroup v1), each sandbox's cgroup parent; off by default;
//!   `kubepods` limited to the node's allocatable; a process moved into a named cgroup
//!   (`kubeletCgroups`).
//! * [`client`]: the CRI client (k8s-cri's tonic bindings); every call has a deadline.
//! * [`config`]: a pod and its containers as CRI requests, their environment, the image pull
//!   policy; pure.
//! * [`security`]: the Linux security context of a sandbox and of each container from the pod's
//!   and the container's `securityContext` (container fields win), `runAsNonRoot` refused
//!   against the image's user; pure.
//! * [`resources`]: a container's CPU shares, CFS quota, memory limit and OOM score
//!   adjustment from its requests, limits and the pod's QoS class, as upstream's kubelet sends
//!   them; pure.
//! * [`logs`]: the kubelet's log layout: `<podLogsDir>/<namespace>_<name>_<uid>/<container>/
//!   <n>.log` and the `/var/log/containers`-style symlinks; hostile names refused.
//! * [`grpc_probe`]: [`GrpcHealthProber`], the gRPC health check of `grpc` probes (upstream
//!   `pkg/probe/grpc`) over tonic, the pod workers' `GrpcProber`.
//! * [`runtime`]: [`CriRuntime`], the `Runtime` over CRI with a relisted cache (upstream's
//!   generic PLEG), image pulls with back-off, adoption and orphan removal by pod UID label;
//!   a pod's sidecars stop after its regular containers, in reverse order (upstream's
//!   termination ordering).
//!
//! # Invariants
//!
//! * Every CRI call has a deadline.
//! * Sandboxes and containers carry the pod UID label; nothing without it is ever touched.
//! * What an action did is in the cache before the action returns, and no relist that began
//!   earlier overwrites it: a container is never started twice for one sync.
//! * An agent restart stops nothing: what runs for a known pod is adopted.
//!
//! # Boundaries
//!
//! The only crate that names tonic or the CRI bindings; depends on `rustlet-core`,
//! `rustlet-volume` and `rustlet-pods`, never on kube, `rustlet-api` or the binary.

pub mod cgroups;
pub mod client;
pub mod config;
pub mod deviceplugin;
pub mod grpc_probe;
pub mod logs;
mod ordering;
pub mod resources;
pub mod runtime;
pub mod security;
pub mod stats;
pub mod termination;
#[cfg(feature = "test-util")]
pub mod testing;

pub use client::{CriClient, CriError};
pub use grpc_probe::GrpcHealthProber;
pub use runtime::{CriConfig, CriRuntime, ServiceSource};

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
