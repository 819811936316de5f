//! Fault points for crash tests of the binary: with the `fault-injection` feature, a point
//! named in `RUSTLET_FAULT_ABORT_AT` aborts the process there (as `kill -9` would, at a chosen
//! moment). Without the feature a point is nothing.

/// Aborts the process when `RUSTLET_FAULT_ABORT_AT` names `name` (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub fn point(name: &str) {
    if std::env::var("RUSTLET_FAULT_ABORT_AT").as_deref() == Ok(name) {
        tracing::error!(point = name, "fault injection: aborting");
        std::process::abort();
    }
}

/// Nothing: the build has no fault points.
#[cfg(not(feature = "fault-injection"))]
pub fn point(_name: &str) {}
