//! The `rustlet` binary end to end, as a process: local mode from a manifest directory,
//! restarts (SIGTERM and `kill -9`), refusals, bad input, and kube mode against the test API
//! server.
//!
//! A separate process has no virtual time: these tests poll for a state with a generous
//! deadline (a missed deadline fails with what was last seen), and assert states, never
//! durations.

mod cri_mode;
mod harness;
mod interfaces;
mod kube_mode;
mod kubelet_server;
mod local_mode;
mod stats;
