//! Mainline busybox for the conformance images (issue 27): upstream's test image
//! `registry.k8s.io/e2e-test-images/busybox:1.37.0-2` is the official `busybox:1.37.0` image,
//! mainline busybox from its `defconfig`. Debian's `busybox-static` (1.35) differs where specs
//! look: its ash drops environment variables whose names are not shell names (Debian's
//! `revert-9c143ce52da11ec3d21a3491c3749841d3dc10f0.patch`), so `sh -c env` never prints an
//! `envFrom` key such as `data-1`, and it lacks the `nmeter` applet.
//!
//! [`build`] downloads Debian's copy of the pristine release tarball (the `.orig.tar.bz2` of
//! its source package: busybox.net's tarball, unpatched), refuses it unless its size and
//! SHA-256 are [`TARBALL_SIZE`] and [`TARBALL_SHA256`], builds it with `make defconfig` and
//! only the changes of [`CONFIG_CHANGES`] (`nice`, `make -j2`), and keeps the static binary in
//! a cache outside the repository keyed by the version, the tarball's hash and
//! [`BUILD_REVISION`] (`${XDG_CACHE_HOME:-~/.cache}/rustlet/busybox-<v>-<hash>-b<n>/bin/busybox`),
//! moved into place by one rename; a warm cache builds nothing. `cargo xtask conformance build`
//! (and `ci`, for the test of this module) builds it; the conformance runner finds it with
//! [`cached_binary`] and never builds. The CRI tests' own image keeps the machine's
//! `/bin/busybox`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// The busybox release of upstream's busybox test image.
pub const VERSION: &str = "1.37.0";

/// Debian's copy of the release tarball (`busybox_<v>.orig.tar.bz2`: busybox.net's
/// `busybox-<v>.tar.bz2`, which Debian's source package patches only in its own
/// `.debian.tar.xz`).
pub const TARBALL_URL: &str =
    "http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.37.0.orig.tar.bz2";

/// The tarball's SHA-256 (pinned: a download with another is refused).
pub const TARBALL_SHA256: &str = "3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4";

/// The tarball's size in bytes.
pub const TARBALL_SIZE: u64 = 2_565_764;

/// The options changed from `make defconfig`, with their new value (`None`: not set), and
/// nothing else. `CONFIG_STATIC`: the images have no C library. (With Debian 12's kernel
/// headers, 6.1, every other applet of `defconfig` builds, `tc` included; headers of 6.8 or
/// later lack the CBQ definitions `tc` needs, and `CONFIG_TC` would have to go.)
pub const CONFIG_CHANGES: &[(&str, Option<&str>)] = &[("CONFIG_STATIC", Some("y"))];

/// Raised when the build changes (options, flags) with the same tarball, so that a cached
/// binary of an older build is built anew.
pub const BUILD_REVISION: u32 = 1;

/// How long the download may take, all in all, and to connect.
const DOWNLOAD_MAX_SECONDS: &str = "300";
const CONNECT_MAX_SECONDS: &str = "30";

/// The cache of this build: `<cache root>/busybox-<v>-<first 12 hex digits of the hash>-b<n>`.
pub fn cache_dir() -> Result<PathBuf> {
    Ok(crate::cluster::cache_root()?.join(cache_name()))
}

fn cache_name() -> String {
    format!(
        "busybox-{VERSION}-{}-b{BUILD_REVISION}",
        &TARBALL_SHA256[..12]
    )
}

/// The cached binary when [`build`] has made it; `None` otherwise (a test never builds).
pub fn cached_binary() -> Result<Option<PathBuf>> {
    let busybox = cache_dir()?.join("bin/busybox");
    Ok(busybox.is_file().then_some(busybox))
}

/// Builds busybox into the cache unless it is there; returns the binary.
pub fn build() -> Result<PathBuf> {
    if let Some(busybox) = cached_binary()? {
        eprintln!("xtask: busybox: cached in {}", busybox.display());
        return Ok(busybox);
    }
    let dir = cache_dir()?;
    let parent = dir.parent().context("the cache dir has a parent")?;
    let staging = parent.join(format!("{}.tmp-{}", cache_name(), std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    eprintln!(
        "xtask: busybox: building {VERSION} into {} (cold: a minute or two)",
        dir.display()
    );
    let started = Instant::now();
    let tarball = staging.join(format!("busybox_{VERSION}.orig.tar.bz2"));
    download(&tarball)?;
    verify(&tarball)?;
    run(
        Command::new("tar")
            .arg("-xjf")
            .arg(&tarball)
            .current_dir(&staging),
        "unpacking the tarball",
    )?;
    let src = staging.join(format!("busybox-{VERSION}"));
    let log = staging.join("build.log");
    make(&src, &["defconfig"], &log)?;
    configure(&src.join(".config"))?;
    // Any option the changes made appear or vanish is settled by kconfig's defaults.
    make(&src, &["oldconfig"], &log)?;
    check_config(&fs::read_to_string(src.join(".config")).context("reading .config")?)?;
    // The lowest priority and two compiles at a time: the machine's cores are shared.
    let status = Command::new("nice")
        .args(["-n", "19", "make", "-j2"])
        .current_dir(&src)
        .stdin(Stdio::null())
        .stdout(log_file(&log)?)
        .stderr(log_file(&log)?)
        .status()
        .context("starting make")?;
    if !status.success() {
        bail!(
            "building busybox failed ({status}): see {} (kept with the source)",
            log.display()
        );
    }
    // What goes into the cache: the binary and the configuration it was built with.
    let out = staging.join("out");
    fs::create_dir_all(out.join("bin"))?;
    fs::copy(src.join("busybox"), out.join("bin/busybox")).context("copying the binary")?;
    fs::copy(src.join(".config"), out.join("config")).context("copying .config")?;
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&out, &dir)
        .with_context(|| format!("moving {} to {}", out.display(), dir.display()))?;
    fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    let busybox = dir.join("bin/busybox");
    eprintln!(
        "xtask: busybox: built in {:.0?} into {}",
        started.elapsed(),
        busybox.display()
    );
    Ok(busybox)
}

/// Downloads [`TARBALL_URL`] to `to`, within [`DOWNLOAD_MAX_SECONDS`].
fn download(to: &Path) -> Result<()> {
    run(
        Command::new("curl")
            .args(["--fail", "--silent", "--show-error", "--location"])
            .args(["--connect-timeout", CONNECT_MAX_SECONDS])
            .args(["--max-time", DOWNLOAD_MAX_SECONDS])
            .args(["--retry", "2"])
            .arg("--output")
            .arg(to)
            .arg(TARBALL_URL),
        &format!("downloading {TARBALL_URL}"),
    )
}

/// Refuses the tarball unless its size and SHA-256 are the pinned ones.
fn verify(tarball: &Path) -> Result<()> {
    let size = fs::metadata(tarball)
        .with_context(|| format!("reading {}", tarball.display()))?
        .len();
    if size != TARBALL_SIZE {
        bail!("{TARBALL_URL}: {size} bytes, not the {TARBALL_SIZE} of busybox {VERSION}'s tarball");
    }
    let out = Command::new("sha256sum")
        .arg(tarball)
        .output()
        .context("starting sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {}: {}", tarball.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let hash = text.split_whitespace().next().unwrap_or_default();
    if hash != TARBALL_SHA256 {
        bail!("{TARBALL_URL}: SHA-256 {hash}, not busybox {VERSION}'s {TARBALL_SHA256}");
    }
    Ok(())
}

/// `make <args>` in `src`, its output appended to `log`.
fn make(src: &Path, args: &[&str], log: &Path) -> Result<()> {
    run(
        Command::new("make")
            .args(args)
            .current_dir(src)
            .stdin(Stdio::null())
            .stdout(log_file(log)?)
            .stderr(log_file(log)?),
        &format!("make {} (see {})", args.join(" "), log.display()),
    )
}

fn log_file(log: &Path) -> Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: starting"))?;
    if !status.success() {
        bail!("{what}: {status}");
    }
    Ok(())
}

/// Applies [`CONFIG_CHANGES`] to the `.config` at `path`.
fn configure(path: &Path) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let changed = apply_config_changes(&text)?;
    fs::write(path, changed).with_context(|| format!("writing {}", path.display()))
}

/// `config` (a kconfig `.config`) with each option of [`CONFIG_CHANGES`] set as it says; an
/// option `config` does not name is an error (the release renamed it).
fn apply_config_changes(config: &str) -> Result<String> {
    let mut lines: Vec<String> = config.lines().map(str::to_owned).collect();
    for (option, value) in CONFIG_CHANGES {
        let line = lines
            .iter_mut()
            .find(|l| config_option(l).is_some_and(|(name, _)| name == *option))
            .with_context(|| format!("make defconfig wrote no {option}"))?;
        *line = match value {
            Some(v) => format!("{option}={v}"),
            None => format!("# {option} is not set"),
        };
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

/// Fails unless `config` has every option of [`CONFIG_CHANGES`] as it says (after
/// `make oldconfig`).
fn check_config(config: &str) -> Result<()> {
    for (option, value) in CONFIG_CHANGES {
        let found = config
            .lines()
            .filter_map(config_option)
            .find(|(name, _)| name == option)
            .map(|(_, v)| v);
        if found != Some(*value) {
            bail!("busybox's .config has {option} {found:?}, not {value:?}");
        }
    }
    Ok(())
}

/// The option a `.config` line sets: `CONFIG_X=v` is `(CONFIG_X, Some(v))`, `# CONFIG_X is
/// not set` is `(CONFIG_X, None)`.
fn config_option(line: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = line.strip_prefix("# ") {
        let name = rest.strip_suffix(" is not set")?;
        return name.starts_with("CONFIG_").then_some((name, None));
    }
    let (name, value) = line.split_once('=')?;
    name.starts_with("CONFIG_").then_some((name, Some(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The busybox [`build`] made; `None` (the test is skipped, saying so) when it has not
    /// been built, and a failure under `RUSTLET_REQUIRE_CLUSTER=1`, with which `.ci/run`
    /// runs the tests after `cargo xtask ci` built it.
    fn built_busybox(test: &str) -> Option<PathBuf> {
        let busybox = cached_binary().unwrap();
        if busybox.is_none() {
            if std::env::var("RUSTLET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
                panic!("{test}: busybox is not built and RUSTLET_REQUIRE_CLUSTER=1");
            }
            eprintln!("{test}: skipped: busybox is not built (cargo xtask conformance build)");
        }
        busybox
    }

    /// upstream's `[sig-node] ConfigMap should be consumable via the environment` (and the
    /// Secrets twin): the container runs `sh -c env` with `envFrom` keys such as `data-1`
    /// and `p-data-1`, and the spec reads `data-1=value-1` in its output. Mainline ash passes
    /// such variables on to `env`; Debian's patched ash drops them.
    #[test]
    fn mainline_sh_keeps_environment_names_that_are_not_shell_names() {
        let Some(busybox) =
            built_busybox("mainline_sh_keeps_environment_names_that_are_not_shell_names")
        else {
            return;
        };
        let out = Command::new(&busybox)
            .args(["sh", "-c", "env"])
            .env_clear()
            .env("data-1", "value-1")
            .env("p-data-1", "value-1")
            .env("DATA_2", "value-2")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let env = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = env.lines().collect();
        for expected in ["data-1=value-1", "p-data-1=value-1", "DATA_2=value-2"] {
            assert!(lines.contains(&expected), "{expected} missing from: {env}");
        }
    }

    /// The e2e_node Containers Lifecycle specs stamp their containers' log lines with
    /// ``date -u +%FT$(nmeter -d0 '%3t' | head -n1)Z``: the applet prints the time of day
    /// with milliseconds.
    #[test]
    fn mainline_busybox_has_nmeter_for_the_lifecycle_specs_timestamps() {
        let Some(busybox) =
            built_busybox("mainline_busybox_has_nmeter_for_the_lifecycle_specs_timestamps")
        else {
            return;
        };
        // As in an image: the applets are links to busybox on PATH.
        let bin = tempfile::tempdir().unwrap();
        for applet in ["sh", "nmeter", "head"] {
            std::os::unix::fs::symlink(&busybox, bin.path().join(applet)).unwrap();
        }
        let out = Command::new(bin.path().join("sh"))
            .args(["-c", "nmeter -d0 '%3t' | head -n1"])
            .env_clear()
            .env("PATH", bin.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        // HH:MM:SS.mmm
        let bytes = line.as_bytes();
        assert_eq!(bytes.len(), 12, "{line:?}");
        for (i, b) in bytes.iter().enumerate() {
            match i {
                2 | 5 => assert_eq!(*b, b':', "{line:?}"),
                8 => assert_eq!(*b, b'.', "{line:?}"),
                _ => assert!(b.is_ascii_digit(), "{line:?}"),
            }
        }
    }

    /// The cache is keyed by the version, the tarball's hash and the build's revision.
    #[test]
    fn the_busybox_cache_is_keyed_by_version_and_hash() {
        assert_eq!(cache_name(), "busybox-1.37.0-3311dff32e74-b1");
        assert!(
            cache_dir()
                .unwrap()
                .ends_with("rustlet/busybox-1.37.0-3311dff32e74-b1")
        );
    }

    /// `make defconfig`'s `# CONFIG_STATIC is not set` becomes `CONFIG_STATIC=y`, nothing
    /// else changes, and the check refuses a configuration without it.
    #[test]
    fn only_the_listed_options_change_from_defconfig() {
        let defconfig = "#\n# Build Options\n#\n# CONFIG_STATIC is not set\n\
                         CONFIG_STATIC_LIBGCC=y\nCONFIG_TC=y\nCONFIG_NMETER=y\n";
        let changed = apply_config_changes(defconfig).unwrap();
        assert_eq!(
            changed,
            "#\n# Build Options\n#\nCONFIG_STATIC=y\n\
             CONFIG_STATIC_LIBGCC=y\nCONFIG_TC=y\nCONFIG_NMETER=y\n"
        );
        check_config(&changed).unwrap();
        assert!(check_config(defconfig).is_err());
        assert!(apply_config_changes("CONFIG_TC=y\n").is_err());
        assert_eq!(
            config_option("# CONFIG_TC is not set"),
            Some(("CONFIG_TC", None))
        );
        assert_eq!(config_option("CONFIG_TC=y"), Some(("CONFIG_TC", Some("y"))));
        assert_eq!(config_option("# Build Options"), None);
    }
}
