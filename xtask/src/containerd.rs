//! A newer containerd and runc than Debian's, built from their Go modules (`tools/containerd/`,
//! pinned by its `go.mod`) into a cache outside the repository keyed by both versions, for the
//! conformance specs that need a CRI feature containerd 1.6 lacks (issue 27, item 3: the
//! runtime handler features of the recursive read-only mount specs).
//! `cargo xtask containerd build` builds them and prints their directory;
//! `cargo xtask conformance --containerd pinned ...` runs a suite with that directory first on
//! the runner's `PATH` (the private containerd, its shim and runc are found there).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cluster::required_version as required;

const CONTAINERD: &str = "github.com/containerd/containerd/v2";
const RUNC: &str = "github.com/opencontainers/runc";

/// `cargo xtask containerd <build>`.
pub fn main(root: &Path, args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("build") => build(root).map(|bin| println!("{}", bin.display())),
        _ => bail!("usage: cargo xtask containerd build"),
    }
}

/// The pinned containerd and runc versions (`v2.4.2`, `v1.5.3`).
pub fn pinned_versions(root: &Path) -> Result<(String, String)> {
    let path = root.join("tools/containerd/go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((required(&text, CONTAINERD)?, required(&text, RUNC)?))
}

/// Builds containerd, its runc shim and runc into the cache unless they are there; returns
/// their directory.
pub fn build(root: &Path) -> Result<PathBuf> {
    let (containerd, runc) = pinned_versions(root)?;
    let dir = crate::cluster::cache_root()?
        .join(format!("containerd-{containerd}-runc-{runc}"))
        .join("bin");
    let programs = ["containerd", "containerd-shim-runc-v2", "runc"];
    if programs.iter().all(|p| dir.join(p).is_file()) {
        eprintln!("xtask: containerd: cached in {}", dir.display());
        return Ok(dir);
    }
    let parent = dir.parent().context("the cache dir has a parent")?;
    let staging = parent.join(format!("bin.tmp-{}", std::process::id()));
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    eprintln!(
        "xtask: containerd: building containerd {containerd} and runc {runc} into {} (cold: minutes)",
        dir.display()
    );
    let started = Instant::now();
    let version = format!("-s -w -X {CONTAINERD}/version.Version={containerd}");
    // containerd and its shim without cgo (no btrfs, devmapper or zfs snapshotters: the
    // private containerd uses overlayfs); runc with cgo (its nsenter is C), without the
    // seccomp tag (no libseccomp headers needed; the specs it serves set no profile).
    let builds: [(&str, String, &str, &str); 3] = [
        (
            "containerd",
            format!("{CONTAINERD}/cmd/containerd"),
            "0",
            &version,
        ),
        (
            "containerd-shim-runc-v2",
            format!("{CONTAINERD}/cmd/containerd-shim-runc-v2"),
            "0",
            &version,
        ),
        ("runc", RUNC.to_owned(), "1", "-s -w"),
    ];
    for (name, package, cgo, ldflags) in builds {
        let status = Command::new("nice")
            .args(["-n", "10"])
            .arg(crate::cluster::go_binary())
            .args(["build", "-p", "2", "-trimpath"])
            .args([
                "-tags",
                "no_btrfs no_devmapper no_zfs",
                "-ldflags",
                ldflags,
                "-o",
            ])
            .arg(staging.join(name))
            .arg(&package)
            .env("CGO_ENABLED", cgo)
            .current_dir(root.join("tools/containerd"))
            .status()
            .with_context(|| format!("starting go build of {name}"))?;
        if !status.success() {
            bail!("go build of {name} failed: {status}");
        }
    }
    crate::replace_dir(&staging, &dir)?;
    eprintln!(
        "xtask: containerd: built in {:.0?} into {}",
        started.elapsed(),
        dir.display()
    );
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pins are containerd v2.4.2 and runc v1.5.3 (served versions), read from their
    /// require lines, not from a dependency's line that only starts the same way.
    #[test]
    fn containerd_and_runc_are_pinned() {
        assert_eq!(
            pinned_versions(&crate::workspace_root()).unwrap(),
            ("v2.4.2".to_owned(), "v1.5.3".to_owned())
        );
        let go_mod = "require (\n\tgithub.com/containerd/containerd/v2/api v1.0.0\n\
                      \tgithub.com/containerd/containerd/v2 v2.4.2\n)\n";
        assert_eq!(required(go_mod, CONTAINERD).unwrap(), "v2.4.2");
        assert!(required(go_mod, RUNC).is_err());
    }
}
