//! `cargo xtask`: the project's dev tasks, in Rust so they run wherever cargo does.
//!
//! * `cargo xtask ci`: rustfmt check, clippy with `-D warnings`, tidy, rustdoc with `-D warnings`,
//!   then `test`. This is the README's test command and what `.ci/run` calls.
//! * `cargo xtask test`: every test of the workspace. As root it runs the whole `cargo test`
//!   inside `unshare -m --propagation private`, a private mount namespace whose mounts never
//!   reach the host, and tells the privileged tests so through `RUSTLET_PRIVATE_MOUNT_NS=1`.
//! * `cargo xtask tidy`: the repository conventions (also run as tests of this crate).
//! * `cargo xtask bench`: the benchmarks of `docs/BENCHMARKS.md` (as root, in a private mount
//!   namespace).
//! * `cargo xtask cluster build|up|down|env|smoke`: a real control plane (upstream's etcd,
//!   kube-apiserver, kube-controller-manager, kube-scheduler, built from `tools/k8s/`) on
//!   loopback for tests; see the `cluster` module. Not part of `ci`.
//!
//! xtask may use anyhow; it never depends on a workspace crate.

mod cluster;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    let root = workspace_root();
    match task.as_str() {
        "ci" => ci(&root),
        "test" => test(&root),
        "tidy" => tidy_report(&root),
        "bench" => bench(&root),
        "cluster" => cluster::main(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <ci|test|tidy|bench|cluster>");
            bail!("unknown task {task:?}")
        }
    }
}

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn run(root: &Path, program: &str, args: &[&str]) -> Result<()> {
    run_with_env(root, &[], program, args)
}

fn run_with_env(root: &Path, env: &[(&str, &str)], program: &str, args: &[&str]) -> Result<()> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v:?} ")).collect();
    eprintln!("xtask: {}{program} {}", shown.concat(), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .with_context(|| format!("starting {program}"))?;
    if !status.success() {
        bail!("{program} {} failed: {status}", args.join(" "));
    }
    Ok(())
}

fn ci(root: &Path) -> Result<()> {
    run(root, "cargo", &["fmt", "--all", "--", "--check"])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    tidy_report(root)?;
    doc(root)?;
    test(root)
}

/// The API docs of the workspace, with rustdoc warnings (a broken intra-doc link) as errors.
fn doc(root: &Path) -> Result<()> {
    run_with_env(
        root,
        &[("RUSTDOCFLAGS", "-D warnings")],
        "cargo",
        &[
            "doc",
            "--workspace",
            "--all-features",
            "--no-deps",
            "--quiet",
        ],
    )
}

fn tidy_report(root: &Path) -> Result<()> {
    let problems = tidy::check_all(root)?;
    if problems.is_empty() {
        eprintln!("xtask: tidy: ok");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("tidy found {} problem(s)", problems.len())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn test(root: &Path) -> Result<()> {
    let cargo_test = [
        "cargo",
        "test",
        "--workspace",
        "--all-features",
        "--no-fail-fast",
    ];
    if is_root() {
        // Mounts made by tests live and die in this namespace; `/` is made rprivate so nothing
        // propagates back to the host even where `/` is shared (systemd).
        let mut args = vec![
            "-m",
            "--propagation",
            "private",
            "env",
            "RUSTLET_PRIVATE_MOUNT_NS=1",
        ];
        args.extend(cargo_test);
        run(root, "unshare", &args)
    } else {
        eprintln!("xtask: not root: privileged tests will report \"skipped: needs CAP_SYS_ADMIN\"");
        run(root, cargo_test[0], &cargo_test[1..])
    }
}

/// Every benchmark recorded in `docs/BENCHMARKS.md`, each printing its figures beside the
/// baseline measured in the same run: the mount pairs (vs the raw syscalls), the status manager
/// (vs upstream's shape), the volume manager (vs the polling shape and raw mounts), the agent
/// as a process (vs upstream's request count, and the targets).
/// `(package, bench, needs the package's test-util feature)`.
const BENCHES: &[(&str, &str, bool)] = &[
    ("rustlet-mount", "mount_pairs", true),
    ("rustlet-status", "status", true),
    ("rustlet-volume", "volume", true),
    ("rustlet-volume", "content", true),
    ("rustlet", "agent", false),
    ("rustlet", "cri", false),
];

fn bench(root: &Path) -> Result<()> {
    if !is_root() {
        bail!("the mount benchmarks need root (they mount in a private mount namespace)");
    }
    for (package, bench, test_util) in BENCHES {
        let mut args = vec![
            "-m",
            "--propagation",
            "private",
            "env",
            "RUSTLET_PRIVATE_MOUNT_NS=1",
            "cargo",
            "bench",
            "-p",
            package,
            "--bench",
            bench,
        ];
        if *test_util {
            args.extend(["--features", "test-util"]);
        }
        run(root, "unshare", &args)?;
    }
    Ok(())
}
