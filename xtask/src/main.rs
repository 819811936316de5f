//! `cargo xtask`: the project's dev tasks, in Rust so they run wherever cargo does.
//!
//! * `cargo xtask ci`: rustfmt check, clippy with `-D warnings`, tidy, rustdoc with `-D warnings`,
//!   the test build, then `test` with upstream's conformance subset beside it, then `examples`;
//!   `tooling` runs in the background from the start. This is the README's test command and
//!   what `.ci/run` calls.
//! * `cargo xtask tooling`: builds (once per pinned version, cached outside the repository)
//!   what the tests run besides the workspace: the control plane, metrics-server, mainline
//!   busybox and, as root, the conformance suites.
//! * `cargo xtask examples`: runs every example program of the library crates
//!   (`crates/<crate>/examples/`); one that needs root says so and exits with success.
//! * `cargo xtask test`: every test of the workspace. As root it runs the whole `cargo test`
//!   inside `unshare -m --propagation private`, a private mount namespace whose mounts never
//!   reach the host, and tells the privileged tests so through `RUSTLET_PRIVATE_MOUNT_NS=1`.
//! * `cargo xtask tidy`: the repository conventions (also run as tests of this crate), then the
//!   API docs and the public-API records of the library crates (`public_api`).
//! * `cargo xtask public-api`: writes those records (`crates/<crate>/public-api.txt`).
//! * `cargo xtask bench`: the benchmarks of `docs/BENCHMARKS.md` (as root, in a private mount
//!   namespace).
//! * `cargo xtask cluster build|up|down|env|smoke`: a real control plane (upstream's etcd,
//!   kube-apiserver, kube-controller-manager, kube-scheduler, built from `tools/k8s/`) on
//!   loopback for tests; see the `cluster` module. `ci` builds it (cached) before the tests,
//!   whose `cluster` test binary starts one per test.
//! * `cargo xtask metrics-server build`: metrics-server built from `tools/metrics-server/`
//!   (cached per version outside the repository) for the `kubectl top` test; `ci` builds it
//!   too.
//! * `cargo xtask conformance [build|images] [--suite node|cluster] [--focus REGEX] [--dry-run]`:
//!   upstream's node conformance specs against Rustlet (issue 27); see the `conformance` module.
//!   `ci` runs its fixed subset (`cargo xtask conformance ci`) beside the tests, as root, and
//!   builds the images' mainline busybox (`xtask::busybox`, about a minute cold, cached) for
//!   its tests.
//! * `cargo xtask fuzz [TARGET] [--seconds N]`: the cargo-fuzz targets of `fuzz/` (nightly and
//!   `cargo-fuzz` needed), each for N seconds (default [`FUZZ_SECONDS`]), all in turn by default.
//!
//! xtask may use anyhow; it never depends on a workspace crate.

mod public_api;
mod tidy;

use xtask::{busybox, cluster, conformance, containerd, metrics_server, workspace_root};

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    let root = workspace_root();
    match task.as_str() {
        "ci" => ci(&root),
        "tooling" => tooling(&root),
        "test" => test(&root, Conformance::Skip),
        "tidy" => tidy_report(&root).and_then(|()| public_api_report(&root)),
        "public-api" => write_public_api(&root),
        "examples" => examples(&root),
        "bench" => bench(&root),
        "cluster" => cluster::main(&root, &args[1..]),
        "metrics-server" => metrics_server::main(&root, &args[1..]),
        "containerd" => containerd::main(&root, &args[1..]),
        "conformance" => conformance::main(&root, &args[1..]),
        "fuzz" => fuzz(&root, &std::env::args().skip(2).collect::<Vec<_>>()),
        _ => {
            eprintln!(
                "usage: cargo xtask <ci|test|tidy|public-api|examples|bench|cluster|metrics-server|conformance|fuzz [TARGET] [--seconds N]>"
            );
            bail!("unknown task {task:?}")
        }
    }
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
    // The test tooling (Go builds and busybox, tens of minutes on a clean machine, nothing on
    // a warm one) is built in the background from the start: the checks and the test build
    // below leave cores idle (a serial crate, a link) that the Go build fills.
    let xtask = std::env::current_exe().context("the xtask binary")?;
    let xtask = xtask
        .to_str()
        .context("the xtask binary's path is not UTF-8")?
        .to_owned();
    std::fs::create_dir_all(target_dir(root))
        .with_context(|| format!("creating {}", target_dir(root).display()))?;
    let tooling = Background::start(
        root,
        "the test tooling's build",
        &[&xtask, "tooling"],
        "xtask-tooling.log",
    )?;
    if let Err(e) = checks_and_test_build(root) {
        tooling.abort();
        return Err(e);
    }
    tooling.finish()?;
    let conformance = if is_root() {
        Conformance::Subset
    } else if std::env::var("RUSTLET_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        bail!("the conformance subset needs root (RUSTLET_REQUIRE_PRIVILEGED=1)");
    } else {
        eprintln!("xtask: not root: the conformance subset is skipped");
        Conformance::Skip
    };
    test(root, conformance)?;
    examples(root)
}

/// `ci`'s checks (format, clippy, tidy, API docs and records), then the test binaries' build.
fn checks_and_test_build(root: &Path) -> Result<()> {
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
    public_api_report(root)?;
    let cargo_test = ["test", "--workspace", "--all-features", "--no-run"];
    run(root, "cargo", &cargo_test)?;
    // The conformance runner is a test target of its own (`test = false`).
    run(
        root,
        "cargo",
        &[&cargo_test[..], &["--test", "conformance"]].concat(),
    )
}

/// `cargo xtask tooling`: what the tests run besides the workspace, each built once per pinned
/// version into a cache outside the repository (a warm machine builds nothing).
fn tooling(root: &Path) -> Result<()> {
    // The real control plane of the `cluster` tests (tests/cluster).
    let bin = cluster::build(root)?;
    eprintln!("xtask: the control plane's binaries: {}", bin.display());
    // metrics-server for the `kubectl top` test.
    let metrics_server = metrics_server::build(root)?;
    eprintln!("xtask: metrics-server: {}", metrics_server.display());
    // Mainline busybox of the conformance images, whose own tests run with xtask's.
    let busybox = busybox::build()?;
    eprintln!("xtask: busybox: {}", busybox.display());
    // Upstream's node conformance subset (issue 27): the test binaries. It runs as root only (a
    // private containerd and mount namespace).
    if is_root() {
        let bin = conformance::build(root)?;
        eprintln!("xtask: the conformance suites: {}", bin.display());
    }
    Ok(())
}

/// The example programs of the library crates, `(package, example)`, in name order.
fn library_examples(root: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for package in tidy::LIBRARIES {
        let dir = root.join("crates").join(package).join("examples");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rs")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                out.push(((*package).to_owned(), stem.to_owned()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Runs every example of the library crates (built with the features the tests use, so the
/// test step's build is reused). An example that needs root or a runtime it cannot find says
/// so and exits with success; a failing one fails the task.
fn examples(root: &Path) -> Result<()> {
    let examples = library_examples(root)?;
    for (package, example) in &examples {
        eprintln!("xtask: example {package}/{example}");
        run(
            root,
            "cargo",
            &[
                "run",
                "--quiet",
                "--all-features",
                "-p",
                package,
                "--example",
                example,
            ],
        )?;
    }
    eprintln!("xtask: {} examples ran", examples.len());
    Ok(())
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

/// The API docs (as `doc`), then each library crate's public API against its record.
fn public_api_report(root: &Path) -> Result<()> {
    doc(root)?;
    let doc_dir = target_dir(root).join("doc");
    let mut problems = Vec::new();
    for krate in tidy::LIBRARIES {
        let current = public_api::render(&doc_dir, krate)?;
        let recorded =
            std::fs::read_to_string(public_api::record_path(root, krate)).unwrap_or_default();
        problems.extend(public_api::difference(krate, &recorded, &current));
    }
    if problems.is_empty() {
        eprintln!("xtask: public API: as recorded");
        return Ok(());
    }
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    bail!("the public API of {} crate(s) changed", problems.len())
}

/// `cargo xtask public-api`: writes every library crate's public-API record.
fn write_public_api(root: &Path) -> Result<()> {
    doc(root)?;
    let doc_dir = target_dir(root).join("doc");
    for krate in tidy::LIBRARIES {
        let path = public_api::record_path(root, krate);
        std::fs::write(&path, public_api::render(&doc_dir, krate)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: wrote {}", path.display());
    }
    Ok(())
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, or `target` under the root).
fn target_dir(root: &Path) -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .map(|d| if d.is_absolute() { d } else { root.join(d) })
        .unwrap_or_else(|| root.join("target"))
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

/// The one slow test: about nine minutes, nearly all of it waiting for the API server's clock
/// (a token's lifetime cannot be under the API server's 10-minute minimum, and the agent
/// refreshes it after 80 % of it). [`test`] runs it beside the rest of the suite instead of
/// after it, so the suite's wall time is the longer of the two, not their sum.
const SLOW_TEST: &str =
    "tokens::cri_a_projected_token_is_refreshed_after_80_percent_of_its_lifetime";

/// The words before `cargo` in each test command: as root, a private mount namespace.
fn test_prefix() -> Vec<&'static str> {
    if is_root() {
        // Mounts made by tests live and die in this namespace; `/` is made rprivate so nothing
        // propagates back to the host even where `/` is shared (systemd).
        vec![
            "unshare",
            "-m",
            "--propagation",
            "private",
            "env",
            "RUSTLET_PRIVATE_MOUNT_NS=1",
        ]
    } else {
        eprintln!("xtask: not root: privileged tests will report \"skipped: needs CAP_SYS_ADMIN\"");
        Vec::new()
    }
}

/// Every test of the workspace: one build, then [`SLOW_TEST`] started in the background (its
/// output kept in a file and shown at the end) while the rest run with it skipped. With
/// `Conformance::Subset`, `cargo xtask conformance ci` (upstream's specs against the agent,
/// mostly waiting on pods) runs in the background too.
fn test(root: &Path, conformance: Conformance) -> Result<()> {
    let cargo_test = ["cargo", "test", "--workspace", "--all-features"];
    run(root, "cargo", &[&cargo_test[1..], &["--no-run"]].concat())?;
    let prefix = test_prefix();
    let slow: Vec<&str> = [
        &prefix[..],
        &cargo_test,
        &["--test", "cluster", "--", "--exact", SLOW_TEST],
    ]
    .concat();
    let mut background = vec![Background::start(
        root,
        "the slow test",
        &slow,
        "xtask-slow-test.log",
    )?];
    if conformance == Conformance::Subset {
        // The runner is a test target of its own (`test = false`): built here, with the
        // workspace's features, before the tests compete for the cores.
        run(
            root,
            "cargo",
            &[&cargo_test[1..], &["--test", "conformance", "--no-run"]].concat(),
        )?;
        let xtask = std::env::current_exe().context("the xtask binary")?;
        let xtask = xtask
            .to_str()
            .context("the xtask binary's path is not UTF-8")?;
        background.push(Background::start(
            root,
            "the conformance subset",
            &[xtask, "conformance", "ci"],
            "xtask-conformance-ci.log",
        )?);
    }
    let rest: Vec<&str> = [
        &prefix[..],
        &cargo_test,
        &["--no-fail-fast", "--", "--skip", SLOW_TEST],
    ]
    .concat();
    let rest = run(root, rest[0], &rest[1..]);
    let mut failed = Vec::new();
    for job in background {
        if let Err(e) = job.finish() {
            failed.push(format!("{e:#}"));
        }
    }
    rest?;
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// Whether [`test`] runs upstream's conformance subset beside the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conformance {
    /// Only the workspace's tests (`cargo xtask test`).
    Skip,
    /// `cargo xtask conformance ci` too (`cargo xtask ci`).
    Subset,
}

/// A command of [`test`] run in the background, its output in a file of the target dir that is
/// shown when it ends.
struct Background {
    name: &'static str,
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Background {
    fn start(root: &Path, name: &'static str, argv: &[&str], log: &str) -> Result<Self> {
        let log = target_dir(root).join(log);
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        eprintln!(
            "xtask: {name} in the background, output in {}: {}",
            log.display(),
            argv.join(" ")
        );
        // A group of its own, so `abort` reaches its children too.
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .process_group(0)
            .current_dir(root)
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", argv[0]))?;
        Ok(Background { name, child, log })
    }

    /// Stops the command and everything it started (its process group), and shows its last
    /// lines.
    fn abort(mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        // The command itself in any case.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprintln!(
            "xtask: {} stopped; its output ({}):\n{}",
            self.name,
            self.log.display(),
            shown_output(&output, false)
        );
    }

    /// Waits for the command and shows its output: all of it when it failed or is short,
    /// otherwise its summary lines (ginkgo's progress of a hundred specs is megabytes).
    fn finish(mut self) -> Result<()> {
        let status = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))?;
        let output = std::fs::read_to_string(&self.log).unwrap_or_default();
        let shown = shown_output(&output, status.success());
        eprintln!(
            "xtask: {}'s output ({}):\n{shown}",
            self.name,
            self.log.display()
        );
        if !status.success() {
            bail!("{} failed: {status}", self.name);
        }
        Ok(())
    }
}

/// What [`Background::finish`] shows of a command's `output`: every line when it is short,
/// else the lines that summarize (xtask's own, the libtest and conformance results, failed and
/// skipped specs) and, when the command failed, its last lines.
fn shown_output(output: &str, succeeded: bool) -> String {
    const WHOLE: usize = 400;
    const TAIL: usize = 200;
    let lines: Vec<&str> = output.lines().collect();
    if lines.len() <= WHOLE {
        return output.to_owned();
    }
    let summary = lines.iter().filter(|l| {
        l.starts_with("xtask:")
            || l.starts_with("test result:")
            || l.starts_with("FAILED")
            || l.starts_with("SKIPPED")
            || l.contains(" passed, ")
    });
    let mut shown: Vec<&str> = summary.copied().collect();
    if !succeeded {
        shown.push("... the last lines:");
        shown.extend(&lines[lines.len() - TAIL..]);
    }
    shown.join("\n")
}

/// Every benchmark recorded in `docs/BENCHMARKS.md`, each printing its figures beside the
/// baseline measured in the same run: the mount pairs (vs the raw syscalls), the status manager
/// (vs upstream's shape), the volume manager (vs the polling shape and raw mounts), the agent
/// as a process (vs upstream's request count, and the issue's targets), the agent on containerd
/// (vs the raw CRI floor) and as a node of the real control plane (vs the raw CRI floor and
/// upstream's request cadence).
/// `(package, bench, needs the package's test-util feature)`.
const BENCHES: &[(&str, &str, bool)] = &[
    ("rustlet-mount", "mount_pairs", true),
    ("rustlet-status", "status", true),
    ("rustlet-volume", "volume", true),
    ("rustlet-volume", "content", true),
    ("rustlet", "agent", false),
    ("rustlet", "cri", false),
    ("rustlet", "cluster", false),
    ("rustlet", "kubelet_server", false),
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

/// The cargo-fuzz targets of `fuzz/` (`fuzz/README.md`), in the order `cargo xtask fuzz` runs them.
const FUZZ_TARGETS: &[&str] = &["manifest", "mountinfo", "atomic_writer", "strategic_merge"];

/// How long `cargo xtask fuzz` runs each target unless told (`--seconds N`).
const FUZZ_SECONDS: u64 = 300;

/// What `cargo xtask fuzz` was asked to run.
#[derive(Debug, PartialEq, Eq)]
struct FuzzRequest {
    targets: Vec<&'static str>,
    seconds: u64,
}

fn parse_fuzz_args(args: &[String]) -> Result<FuzzRequest> {
    let mut targets = Vec::new();
    let mut seconds = FUZZ_SECONDS;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--seconds" {
            let value = args.next().context("--seconds needs a number")?;
            seconds = value
                .parse()
                .with_context(|| format!("--seconds {value:?} is not a number of seconds"))?;
        } else if let Some(target) = FUZZ_TARGETS.iter().find(|t| *t == arg) {
            targets.push(*target);
        } else {
            bail!(
                "unknown fuzz target {arg:?}: the targets are {}",
                FUZZ_TARGETS.join(", ")
            );
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.to_vec();
    }
    Ok(FuzzRequest { targets, seconds })
}

/// Whether `cargo <args>` runs and succeeds (its output is not shown).
fn cargo_succeeds(root: &Path, args: &[&str]) -> bool {
    Command::new("cargo")
        .args(args)
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The variables `cargo run` sets for xtask itself. They are removed from the fuzz build's
/// environment: a build script that watches one (ring's reads `CARGO_MANIFEST_DIR`) would
/// otherwise run again, and with it every crate above it, each time `cargo xtask fuzz` and a
/// plain `cargo fuzz` take turns.
fn cargo_run_variables() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| {
            k.starts_with("CARGO_PKG_")
                || matches!(
                    k.as_str(),
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                )
        })
        .collect()
}

/// `cargo +nightly fuzz run` of one target for `seconds`, in the environment of a plain shell:
/// new inputs go to `fuzz/corpus/<target>` (not kept in git), the seeds kept in git are read
/// from `fuzz/seeds/<target>`.
fn fuzz_command(root: &Path, target: &str, seconds: u64) -> Command {
    let corpus = root.join("fuzz/corpus").join(target);
    let seeds = root.join("fuzz/seeds").join(target);
    let mut command = Command::new("cargo");
    command.args(["+nightly", "fuzz", "run"]);
    command.args(["--sanitizer", "none", "--debug-assertions", target]);
    command.args([&corpus, &seeds]);
    command.args([
        "--",
        &format!("-max_total_time={seconds}"),
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
    ]);
    for variable in cargo_run_variables() {
        command.env_remove(variable);
    }
    command
}

fn shown_args(command: &Command) -> String {
    let args: Vec<String> = command
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    args.join(" ")
}

/// Runs the fuzz targets, each for the time asked, from their seeds `fuzz/seeds/<target>` and
/// corpus `fuzz/corpus/<target>` (new inputs are added there; a crash is written to
/// `fuzz/artifacts/<target>/`). No sanitizer:
/// the fuzzed crates deny `unsafe_code`, so AddressSanitizer would find nothing and halve the
/// speed; debug assertions are on, so an arithmetic overflow is a crash.
fn fuzz(root: &Path, args: &[String]) -> Result<()> {
    let request = parse_fuzz_args(args)?;
    if !cargo_succeeds(root, &["+nightly", "--version"]) {
        bail!("the fuzz targets need a nightly toolchain: rustup toolchain install nightly");
    }
    if !cargo_succeeds(root, &["+nightly", "fuzz", "--version"]) {
        bail!("the fuzz targets need cargo-fuzz: cargo install cargo-fuzz --locked");
    }
    for target in &request.targets {
        let corpus = root.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let mut command = fuzz_command(root, target, request.seconds);
        eprintln!("xtask: cargo {}", shown_args(&command));
        let status = command
            .current_dir(root)
            .status()
            .context("starting cargo fuzz")?;
        if !status.success() {
            bail!("cargo fuzz run {target} failed: {status}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod fuzz_tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn xtask_fuzz_runs_every_target_by_default_for_the_default_time() {
        let request = parse_fuzz_args(&[]).unwrap();
        assert_eq!(request.targets, FUZZ_TARGETS);
        assert_eq!(request.seconds, FUZZ_SECONDS);
    }

    #[test]
    fn xtask_fuzz_takes_a_target_and_seconds() {
        let request = parse_fuzz_args(&args(&["mountinfo", "--seconds", "60"])).unwrap();
        assert_eq!(
            request,
            FuzzRequest {
                targets: vec!["mountinfo"],
                seconds: 60
            }
        );
        assert!(parse_fuzz_args(&args(&["nope"])).is_err());
        assert!(parse_fuzz_args(&args(&["--seconds"])).is_err());
        assert!(parse_fuzz_args(&args(&["--seconds", "x"])).is_err());
    }

    /// Run by cargo (`cargo test`, as `cargo xtask` runs under `cargo run`), the environment has
    /// `CARGO_MANIFEST_DIR`; the fuzz build must not see it, or ring's build script runs again.
    #[test]
    fn xtask_fuzz_builds_without_the_variables_cargo_run_set() {
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let command = fuzz_command(Path::new("/r"), "mountinfo", 60);
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert!(
            removed.iter().any(|k| k == "CARGO_MANIFEST_DIR"),
            "{removed:?}"
        );
        assert!(removed.iter().any(|k| k == "CARGO_PKG_NAME"), "{removed:?}");
        assert!(!removed.iter().any(|k| k == "CARGO_HOME"), "{removed:?}");
        assert!(shown_args(&command).contains(
            "mountinfo /r/fuzz/corpus/mountinfo /r/fuzz/seeds/mountinfo -- -max_total_time=60"
        ));
    }

    /// Every target `cargo xtask fuzz` knows is a `[[bin]]` of `fuzz/Cargo.toml` with seeds.
    #[test]
    fn xtask_fuzz_targets_are_the_fuzz_crates_targets() {
        let fuzz = workspace_root().join("fuzz");
        let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "rustlet-fuzz")
            .collect();
        assert_eq!(bins, FUZZ_TARGETS);
        for target in FUZZ_TARGETS {
            let seeds = fuzz.join("seeds").join(target);
            assert!(
                std::fs::read_dir(&seeds).is_ok_and(|mut d| d.next().is_some()),
                "{} has no seeds",
                seeds.display()
            );
        }
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn library_examples_cover_the_library_crates() {
        let examples = library_examples(&workspace_root()).unwrap();
        for package in tidy::LIBRARIES {
            assert!(
                examples.iter().any(|(p, _)| p == package),
                "{package} has no example in {examples:?}"
            );
        }
    }
}

#[cfg(test)]
mod slow_test_tests {
    use super::*;

    /// `SLOW_TEST` must name a test of `tests/cluster`: a renamed test would otherwise run
    /// twice (its old name skips nothing) and the background run would match no test.
    #[test]
    fn a_long_output_is_shown_by_its_summary_and_a_failed_ones_tail() {
        let mut log = vec!["xtask: conformance: starting".to_owned()];
        log.extend((0..1000).map(|i| format!("ginkgo progress {i}")));
        log.push("FAILED  [sig-node] Pods should be updated".to_owned());
        log.push("112 passed, 1 failed, 0 skipped (junit.xml)".to_owned());
        let log = log.join("\n");
        let passed = shown_output(&log, true);
        assert_eq!(
            passed.lines().collect::<Vec<_>>(),
            [
                "xtask: conformance: starting",
                "FAILED  [sig-node] Pods should be updated",
                "112 passed, 1 failed, 0 skipped (junit.xml)",
            ]
        );
        let failed = shown_output(&log, false);
        assert!(failed.contains("ginkgo progress 999"), "{failed}");
        assert!(!failed.contains("ginkgo progress 700\n"), "{failed}");
        let short = "test result: ok. 3 passed\nother line";
        assert_eq!(shown_output(short, true), short);
    }

    #[test]
    fn the_slow_test_names_a_cluster_test() {
        let (module, name) = SLOW_TEST.split_once("::").unwrap();
        let path = workspace_root().join(format!("tests/cluster/{module}.rs"));
        let source = std::fs::read_to_string(&path).unwrap();
        assert!(
            source.contains(&format!("#[test]\nfn {name}()")),
            "{} has no test {name}",
            path.display()
        );
    }
}

#[cfg(test)]
mod background_tests {
    use super::*;

    /// `ci` stops the tooling's build when a check fails: the command and what it started go
    /// (a Go build is a grandchild of `xtask tooling`).
    #[test]
    fn an_aborted_background_command_takes_its_children_with_it() {
        let dir = tempfile::tempdir().unwrap();
        // The marker names this test's own sleep only.
        let marker = format!("{}", 4000 + std::process::id() % 1000);
        let script = format!("sleep {marker} & wait");
        // The log goes to the target dir (`<root>/target` unless CARGO_TARGET_DIR says).
        std::fs::create_dir_all(target_dir(dir.path())).unwrap();
        let log = format!("xtask-test-background-{marker}.log");
        let job = Background::start(dir.path(), "a sleeper", &["sh", "-c", &script], &log).unwrap();
        let running = || {
            Command::new("pgrep")
                .args(["-f", &format!("^sleep {marker}$")])
                .status()
                .unwrap()
                .success()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !running() {
            assert!(std::time::Instant::now() < deadline, "the sleep started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        job.abort();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the grandchild is gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
