//! The library half of `cargo xtask`: what the binary's tasks and the end-to-end tests share.
//! Today that is [`cluster`], the real control plane on loopback, which `cargo xtask cluster`
//! drives from the command line and the real-cluster tests (`tests/cluster`) start per test
//! through [`cluster::TestCluster`]; [`metrics_server`], metrics-server built from its Go
//! module for the `kubectl top` test; [`conformance`], upstream's node conformance suites
//! (their test binaries, the ginkgo command line, the JUnit summary), which `cargo xtask
//! conformance` and the runner `tests/conformance` share; and [`busybox`], mainline busybox
//! built from its release tarball for the conformance test images.
//!
//! Test tooling only: nothing here is linked into Rustlet's product crates, and it never
//! depends on a workspace crate.

pub mod busybox;
pub mod cluster;
pub mod conformance;
pub mod containerd;
pub mod metrics_server;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Puts a finished build's `staging` directory in the place of `dir` (the cached one, if any,
/// goes first): a cache directory is whole or absent, never half built.
pub(crate) fn replace_dir(staging: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(staging, dir)
        .with_context(|| format!("moving {} to {}", staging.display(), dir.display()))
}
