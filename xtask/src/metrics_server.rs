//! metrics-server for the `kubectl top` end-to-end test, built from its Go module
//! (`tools/metrics-server/`, pinned at the version its `go.mod` requires) into a cache outside
//! the repository keyed by that version, as [`crate::cluster::build`] builds the control plane.
//! `cargo xtask metrics-server build` builds it (`ci` too, before the tests); the test finds it
//! with [`cached_binary`] and never builds.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

const MODULE: &str = "sigs.k8s.io/metrics-server";

/// `cargo xtask metrics-server <build>`.
pub fn main(root: &Path, args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("build") => build(root).map(|bin| println!("{}", bin.display())),
        _ => bail!("usage: cargo xtask metrics-server build"),
    }
}

/// The version `tools/metrics-server/go.mod` requires (`v0.8.0`).
pub fn pinned_version(root: &Path) -> Result<String> {
    let path = root.join("tools/metrics-server/go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_version(&text).with_context(|| format!("parsing {}", path.display()))
}

fn parse_version(go_mod: &str) -> Result<String> {
    crate::cluster::required_version(go_mod, MODULE)
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/rustlet/metrics-server-<v>/bin/metrics-server`.
fn binary_path(version: &str) -> Result<PathBuf> {
    Ok(crate::cluster::cache_root()?
        .join(format!("metrics-server-{version}"))
        .join("bin")
        .join("metrics-server"))
}

/// The cached binary of the pinned version when [`build`] has made it; `None` otherwise (a
/// test never starts a Go build).
pub fn cached_binary(root: &Path) -> Result<Option<PathBuf>> {
    let bin = binary_path(&pinned_version(root)?)?;
    Ok(bin.is_file().then_some(bin))
}

/// Builds metrics-server into the cache unless it is there; returns the binary.
pub fn build(root: &Path) -> Result<PathBuf> {
    let version = pinned_version(root)?;
    let bin = binary_path(&version)?;
    if bin.is_file() {
        eprintln!("xtask: metrics-server: cached in {}", bin.display());
        return Ok(bin);
    }
    let dir = bin.parent().context("the binary has a directory")?;
    let parent = dir.parent().context("the cache dir has a parent")?;
    let staging = parent.join(format!("bin.tmp-{}", std::process::id()));
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    eprintln!(
        "xtask: metrics-server: building {version} into {} (cold: minutes)",
        bin.display()
    );
    let started = Instant::now();
    // At a lowered priority (the machine's cores are shared), two compiles at once as the
    // control plane's build: a clean machine's CI builds both.
    let status = Command::new("nice")
        .args(["-n", "10"])
        .arg(crate::cluster::go_binary())
        .args(["build", "-p", "2", "-trimpath", "-ldflags", "-s -w", "-o"])
        .arg(staging.join("metrics-server"))
        .arg(format!("{MODULE}/cmd/metrics-server"))
        .env("CGO_ENABLED", "0")
        .current_dir(root.join("tools/metrics-server"))
        .status()
        .context("starting go build of metrics-server")?;
    if !status.success() {
        bail!("go build of metrics-server failed: {status}");
    }
    crate::replace_dir(&staging, dir)?;
    eprintln!(
        "xtask: metrics-server: built in {:.0?} into {}",
        started.elapsed(),
        bin.display()
    );
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pin is v0.8.0 (the approved version), read from the require line.
    #[test]
    fn metrics_server_is_pinned_at_v0_8_0() {
        assert_eq!(pinned_version(&crate::workspace_root()).unwrap(), "v0.8.0");
        assert_eq!(
            parse_version("require (\n\tsigs.k8s.io/metrics-server v0.8.0 // indirect\n)").unwrap(),
            "v0.8.0"
        );
    }
}
