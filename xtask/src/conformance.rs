//! `cargo xtask conformance`: upstream's node conformance specs (issue 27) against Rustlet,
//! with the test binaries of the pinned release built from `tools/k8s/`.
//!
//! * `build`: builds `e2e.test` (`k8s.io/kubernetes/test/e2e`) and `e2e_node.test`
//!   (`test/e2e_node`) with `go test -c` as upstream's `hack/lib/golang.sh` does for its test
//!   targets, and `ginkgo` (the version `k8s.io/kubernetes` requires), `agnhost` and
//!   `nonewprivs` (`test/images/...`, for the test images) with `go build`, all from the
//!   release `tools/k8s/go.mod` pins, into a cache outside the repository keyed by the
//!   Kubernetes and ginkgo versions (`${XDG_CACHE_HOME:-~/.cache}/rustlet/k8s-<v>-e2e-ginkgo-<v>/bin/`);
//!   a warm cache builds nothing. With them, mainline busybox for the images
//!   ([`crate::busybox`], cached by its own version).
//! * `images`: the test images (`registry.k8s.io/e2e-test-images/busybox`, `agnhost`,
//!   `nonroot`, `nonewprivs`, an `nginx` stand-in, `registry.k8s.io/pause`) as OCI image
//!   tarballs under the release's names, built on that busybox without a registry by
//!   `rustlet_cri::testing` (through the `conformance` runner of `tests/conformance`) into
//!   `<cache>/images/`.
//! * `[--suite cluster|node] [--focus REGEX] [--skip REGEX] [--procs N] [--dry-run]`: runs
//!   ginkgo on the suite's binary with focus [`FOCUS`] and skip [`SKIP`] unless told, writes
//!   ginkgo's JUnit report into `target/conformance/<suite>/junit.xml` and prints
//!   `N passed, M failed, K skipped`. `--dry-run` lists the specs the focus selects without a
//!   node (ginkgo's dry run). A real run of `cluster` starts the control plane of
//!   `cargo xtask cluster` and Rustlet with the CRI runtime on a private containerd (the
//!   runner `tests/conformance`, as root in a private mount namespace); one of `node` runs
//!   `e2e_node.test --conformance=true --start-services=true` (the suite's own etcd and API
//!   server) in a private containerd's network namespace and starts Rustlet there once that
//!   API server answers (the same runner).
//!
//!   `--containerd pinned` runs it on the containerd, shim and runc of `tools/containerd`
//!   ([`crate::containerd`]) instead of the machine's: the recursive read-only mount specs
//!   that need a runtime with handler features (containerd 2).
//!
//! * `ci`: the fixed subset `.ci/run` runs (issue 27, "CI and the record"): every volume spec
//!   and one spec of each node feature of `e2e.test` ([`CI_CLUSTER_FOCUS`]), then the node-only
//!   features of `e2e_node.test` ([`CI_NODE_FOCUS`]); it fails when any spec did.
//!
//! Go is test tooling only: nothing here is linked into Rustlet.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cluster::{cache_root, go_binary, ldflags, pinned_versions, required_version};

/// The specs the suites run unless told: upstream's node conformance tag.
pub const FOCUS: &str = r"\[NodeConformance\]";
/// The specs never run unless told (issue 27): flaky, serial, slow, disruptive, alpha and
/// off-by-default features.
pub const SKIP: &str =
    r"\[Flaky\]|\[Serial\]|\[Slow\]|\[Disruptive\]|\[Alpha\]|\[Feature:OffByDefault\]";

/// The `e2e.test` specs of `cargo xtask conformance ci`: every `[sig-storage]` spec the default
/// focus selects (ConfigMap, Secret, Projected, Downward API, EmptyDir with its tmpfs modes and
/// ownership, HostPath), and one spec of each node feature issue 27 names. Each alternative
/// names one spec (or one tight group), so a renamed spec shows as a smaller count, which
/// [`check_ci_selection`] refuses.
pub const CI_CLUSTER_FOCUS: &str = concat!(
    r"(\[sig-storage\]",
    // Lifecycle hooks; the kubelet server's exec and logs.
    r"|Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly",
    r"|Lifecycle Sleep Hook when create a pod with lifecycle hook using sleep action valid prestop hook using sleep action",
    r"|Pods should support remote command execution over websockets",
    // (Its intermittent "bad status" was a log's last bytes sent with the body's end: see
    // `stream_body` in rustlet-server.)
    r"|Pods should support retrieving logs from the container over websockets",
    // Termination messages.
    r"|should report termination message from log output if TerminationMessagePolicy FallbackToLogsOnError is set",
    // Sidecars and init containers.
    r"|Restartable Init Container Lifecycle Hook when create a pod with lifecycle hook should execute prestop http hook properly",
    r"|InitContainer should invoke init containers on a RestartNever pod",
    // activeDeadlineSeconds; resources through the downward API.
    r"|Pods should allow activeDeadlineSeconds to be updated",
    r"|Downward API should provide container's limits.cpu/memory and requests.cpu/memory as env vars",
    // hostAliases and the kubelet-managed /etc/hosts with hostNetwork; hostnameOverride.
    r"|Kubelet when scheduling an agnhost Pod with hostAliases should write entries to /etc/hosts",
    r"|KubeletManagedEtcHosts should test kubelet managed /etc/hosts file",
    r"|Override hostname of Pod a pod with only hostnameOverride field will have hostnameOverride as hostname",
    // Security contexts and sysctls.
    r"|Sysctls \[LinuxOnly\] should support sysctls \[",
    r"|should run the container with readonly rootfs when readOnlyRootFilesystem=true",
    r"|runAsNonRoot should not run without a specified user ID",
    r"|should not allow privilege escalation when false",
    // Ephemeral containers, gRPC probes, container restart rules, OS admission.
    r"|Ephemeral Containers will start an ephemeral container in an existing pod",
    r"|Probing container should be restarted with a GRPC liveness probe",
    r"|Container Restart Rules should restart container on rule match",
    r"|PodOSRejection",
    r").*\[NodeConformance\]"
);

/// How many specs [`CI_CLUSTER_FOCUS`] selects in the pinned release (92 of them
/// `[sig-storage]`).
pub const CI_CLUSTER_SPECS: usize = 92 + 21;

/// The `e2e_node.test` specs of `cargo xtask conformance ci`: the node-only features issue 27
/// names (static pods as mirror pods, `status.observedGeneration`, the process namespace).
pub const CI_NODE_FOCUS: &str = concat!(
    r"(MirrorPod when create a mirror pod should be updated when static pod updated",
    r"|MirrorPod \(Pod Generation\) mirror pod updates mirror pod: update container image",
    r"|processes in containers sharing a pod namespace should be able to see each other",
    r").*\[NodeConformance\]"
);

/// How many specs [`CI_NODE_FOCUS`] selects in the pinned release.
pub const CI_NODE_SPECS: usize = 3;

/// ginkgo's `--procs` in `cargo xtask conformance ci`.
pub const CI_PROCS: u32 = 3;

/// The runs of `cargo xtask conformance ci`, with how many specs each must select.
pub fn ci_runs() -> Vec<(Options, usize)> {
    [
        (Suite::Cluster, CI_CLUSTER_FOCUS, CI_CLUSTER_SPECS),
        (Suite::Node, CI_NODE_FOCUS, CI_NODE_SPECS),
    ]
    .into_iter()
    .map(|(suite, focus, specs)| {
        let opts = Options {
            suite,
            focus: focus.to_owned(),
            procs: CI_PROCS,
            ..Options::default()
        };
        (opts, specs)
    })
    .collect()
}

/// Refuses a dry run of a CI subset that selected another number of specs than the release
/// has for it: a spec renamed upstream must not silently drop out of CI.
pub fn check_ci_selection(opts: &Options, selected: usize, expected: usize) -> Result<()> {
    if selected != expected {
        bail!(
            "the CI subset of the {} suite selects {selected} specs, not {expected}: a spec \
             was renamed or removed in this release (focus {:?})",
            opts.suite.name(),
            opts.focus
        );
    }
    Ok(())
}

/// A spec this machine cannot run, for a reason outside the node (issue 27: each skip is
/// listed with its reason): [`machine_skips`] finds them by trying the feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSkip {
    /// A regular expression on the spec's text (added to ginkgo's `--skip`).
    pub spec: &'static str,
    /// Why, as `docs/CONFORMANCE.md` lists it.
    pub reason: &'static str,
}

/// The specs that need a kernel feature this machine lacks, each found by trying the feature
/// (not by reading the kernel's version or config): a machine that has it runs the spec.
pub fn machine_skips() -> Vec<MachineSkip> {
    let mut skips = Vec::new();
    // `PrivilegedPod should enable privileged commands` runs `ip link add dummy1 type dummy` in
    // a privileged container: the kernel needs the dummy link type (CONFIG_DUMMY).
    let dummy = Command::new("unshare")
        .args(["-n", "ip", "link", "add", "probe0", "type", "dummy"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !dummy {
        skips.push(MachineSkip {
            spec: PRIVILEGED_POD_SPEC,
            reason: "the kernel has no dummy network device (CONFIG_DUMMY): `ip link add dummy1 \
                     type dummy` fails in any network namespace of this machine",
        });
    }
    // `ContainerMetrics when querying /metrics/cadvisor should report container metrics` wants
    // block I/O series (`container_fs_reads_bytes_total`, `container_blkio_device_usage_total`)
    // for its containers: the kernel must count block I/O per cgroup. On cgroup v1, a direct
    // write that leaves the root's counters at zero shows it does not.
    if !blkio_counted(Path::new(BLKIO_V1_ROOT_COUNTERS)) {
        skips.push(MachineSkip {
            spec: CADVISOR_METRICS_SPEC,
            reason: "the kernel counts no block I/O per cgroup (cgroup v1: a direct write leaves \
                     `blkio.throttle.io_service_bytes_recursive` of the root at `Total 0`), so no \
                     container has the block I/O series the spec requires",
        });
    }
    skips
}

/// ginkgo's skip expression of `PrivilegedPod should enable privileged commands`, matched
/// against the spec's full text.
const PRIVILEGED_POD_SPEC: &str = r"PrivilegedPod should enable privileged commands";

/// ginkgo's skip expression of the cadvisor spec: its full text has the describe's
/// `[LinuxOnly]` between its name and its context.
const CADVISOR_METRICS_SPEC: &str = r"ContainerMetrics \[LinuxOnly\] when querying /metrics/cadvisor should report container metrics";

/// The cgroup v1 root's block I/O byte counters.
const BLKIO_V1_ROOT_COUNTERS: &str =
    "/sys/fs/cgroup/blkio/blkio.throttle.io_service_bytes_recursive";

/// Whether the kernel counts block I/O in `counters` (a cgroup v1 `blkio` file): its `Total`
/// grows with a 4 MiB direct write (`dd ... oflag=direct` into `/var/tmp`). Without the file (cgroup v2, where the `io` controller counts), `true`.
fn blkio_counted(counters: &Path) -> bool {
    let total = || -> Option<u64> {
        let text = std::fs::read_to_string(counters).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("Total "))
            .and_then(|v| v.trim().parse().ok())
    };
    let Some(before) = total() else {
        return true;
    };
    // On disk (`/tmp` may be a tmpfs), removed after.
    let probe = PathBuf::from(format!(
        "/var/tmp/rustlet-blkio-probe-{}",
        std::process::id()
    ));
    let wrote = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", probe.display()))
        .args(["bs=1M", "count=4", "oflag=direct"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = fs::remove_file(&probe);
    // A machine where the probe cannot even write keeps the spec.
    !wrote || total().is_some_and(|after| after > before)
}

/// ginkgo's `--skip` with each of `machine`'s specs added.
pub fn skip_with(skip: &str, machine: &[MachineSkip]) -> String {
    machine
        .iter()
        .fold(skip.to_owned(), |acc, m| format!("{acc}|{}", m.spec))
}

/// [`skip_with`] the machine's skips, each printed with its reason.
fn skip_on_this_machine(skip: &str) -> String {
    let machine = machine_skips();
    for m in &machine {
        eprintln!(
            "xtask: conformance: skipped on this machine: {}: {}",
            m.spec, m.reason
        );
    }
    skip_with(skip, &machine)
}

/// Where the node suite's own API server listens (upstream: `test/e2e/framework`'s
/// `defaultHost`; `services/apiserver.go` binds the default secure port on 127.0.0.1) and the
/// node registers.
pub const NODE_SUITE_HOST: &str = "https://127.0.0.1:6443";

/// ginkgo's suite timeout: its default of 1 h is too short for a whole run on two cores.
const SUITE_TIMEOUT: &str = "6h";

/// The module that provides `ginkgo` (the version `k8s.io/kubernetes` requires).
const GINKGO_MODULE: &str = "github.com/onsi/ginkgo/v2";

/// How each cached binary is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BuildKind {
    /// `go build` of a `package main`.
    Program,
    /// `go test -c` of a test package (upstream's test targets: `hack/lib/golang.sh`).
    TestBinary,
}

/// The binaries of the cache: name, package, how it is built; in build order (the small
/// ones first, so that the images can be made while the test binaries link).
const BINARIES: &[(&str, &str, BuildKind)] = &[
    (
        "ginkgo",
        "github.com/onsi/ginkgo/v2/ginkgo",
        BuildKind::Program,
    ),
    (
        "agnhost",
        "k8s.io/kubernetes/test/images/agnhost",
        BuildKind::Program,
    ),
    (
        "nonewprivs",
        "k8s.io/kubernetes/test/images/nonewprivs",
        BuildKind::Program,
    ),
    (
        "e2e.test",
        "k8s.io/kubernetes/test/e2e",
        BuildKind::TestBinary,
    ),
    (
        "e2e_node.test",
        "k8s.io/kubernetes/test/e2e_node",
        BuildKind::TestBinary,
    ),
];

/// What a test image is made of (the runner builds it with `rustlet_cri::testing`, without a
/// registry): upstream's images by their Dockerfiles (`test/images/<name>/`), with mainline
/// busybox ([`crate::busybox`]) where upstream has Alpine or the busybox image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestImage {
    /// busybox with every applet; `Cmd ["sh"]`.
    Busybox,
    /// busybox and `/agnhost` (+ `/agnhost-2`, `/uploads`); `Entrypoint ["/agnhost"]`,
    /// `Cmd ["pause"]`, as upstream's Dockerfile; and a `curl` stand-in (upstream's image is
    /// Alpine with curl, which specs exec in it: a GET of the one URL among the arguments by
    /// busybox's `wget`, the options ignored).
    Agnhost,
    /// agnhost's `pause` (prints `Paused`, waits for SIGTERM or SIGINT) in place of
    /// upstream's C `pause`; `Entrypoint ["/agnhost", "pause"]`.
    Pause,
    /// busybox with `User 1234`.
    NonRoot,
    /// busybox and the setuid-root `/usr/local/bin/nnp` (upstream's `nnp.go`, which prints
    /// its effective UID); `Cmd ["nnp"]`.
    NonewPrivs,
    /// A stand-in for nginx where a spec needs only an HTTP server on port 80: busybox's
    /// `httpd` serving `/usr/share/nginx/html`.
    Nginx,
}

/// The test images of the pinned release (`test/utils/image/manifest.go`: the
/// `promoterE2eRegistry` and `gcRegistry` entries), under the names the specs use;
/// [`check_images_listed`] holds them to what `e2e.test --list-images` prints.
pub const TEST_IMAGES: &[(&str, TestImage)] = &[
    (
        "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
        TestImage::Busybox,
    ),
    (
        "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
        TestImage::Agnhost,
    ),
    // `AgnhostPrev`: the Pods lifecycle spec patches a pod's image to it.
    (
        "registry.k8s.io/e2e-test-images/agnhost:2.55",
        TestImage::Agnhost,
    ),
    (
        "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
        TestImage::Busybox,
    ),
    ("registry.k8s.io/pause:3.10.2", TestImage::Pause),
    (
        "registry.k8s.io/e2e-test-images/nonroot:1.5",
        TestImage::NonRoot,
    ),
    (
        "registry.k8s.io/e2e-test-images/nonewprivs:1.4",
        TestImage::NonewPrivs,
    ),
    (
        "registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
        TestImage::Nginx,
    ),
    (
        "registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
        TestImage::Nginx,
    ),
    // `GlibcDnsTesting`: the "Override hostname of Pod" specs run `sh -c "echo
    // $(hostname)';'$(hostname -f)';'"` in it; busybox's `hostname -f` reads the kubelet's
    // `/etc/hosts` as glibc's does.
    (
        "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
        TestImage::Busybox,
    ),
];

/// Fails unless every name of [`TEST_IMAGES`] is a line of `list` (the output of
/// `e2e.test --list-images`): a new release renames its images.
pub fn check_images_listed(list: &str) -> Result<()> {
    let listed: Vec<&str> = list.lines().map(str::trim).collect();
    let missing: Vec<&str> = TEST_IMAGES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !listed.contains(name))
        .collect();
    if !missing.is_empty() {
        bail!(
            "e2e.test --list-images does not list {missing:?}: update TEST_IMAGES to the \
             pinned release's test/utils/image/manifest.go"
        );
    }
    Ok(())
}

/// The PEM certificate and key of agnhost's image (`/localhost.crt`, `/localhost.key`, which
/// upstream's Dockerfile adds): a self-signed certificate for `localhost` made here, for the
/// specs that run `agnhost netexec --tls-cert-file /localhost.crt --tls-private-key-file
/// /localhost.key` (the HTTPS lifecycle hook specs' sidecar; the kubelet does not verify a
/// hook's or a probe's certificate).
pub fn agnhost_localhost_certificate() -> Result<(String, String)> {
    let key = rcgen::KeyPair::generate().context("generating agnhost's localhost key")?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .context("agnhost's localhost certificate")?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    let cert = params
        .self_signed(&key)
        .context("signing agnhost's localhost certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Which upstream suite runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    /// `e2e_node.test`: the binary starts its own etcd and API server
    /// (`--conformance=true --start-services=true`) and a running node registers with it.
    Node,
    /// `e2e.test` against the real control plane of `cargo xtask cluster`.
    Cluster,
}

impl Suite {
    /// The test binary of the suite.
    pub fn binary(self) -> &'static str {
        match self {
            Suite::Node => "e2e_node.test",
            Suite::Cluster => "e2e.test",
        }
    }

    /// The name on the command line (and of the report's directory).
    pub fn name(self) -> &'static str {
        match self {
            Suite::Node => "node",
            Suite::Cluster => "cluster",
        }
    }
}

/// Whether the specs run or are only listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The specs run against the node.
    Run,
    /// ginkgo's dry run: the specs the focus selects are listed (and reported as passed),
    /// nothing runs, no node is needed.
    DryRun,
}

/// The options of `cargo xtask conformance`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Which suite runs.
    pub suite: Suite,
    /// ginkgo's `--focus` (a regular expression on the spec's full text).
    pub focus: String,
    /// ginkgo's `--skip`.
    pub skip: String,
    /// Whether the specs run or are only listed.
    pub mode: Mode,
    /// ginkgo's `--procs`: specs run in parallel by this many processes.
    pub procs: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            suite: Suite::Cluster,
            focus: FOCUS.to_owned(),
            skip: SKIP.to_owned(),
            mode: Mode::Run,
            procs: 1,
        }
    }
}

impl Options {
    /// Parses `[--suite node|cluster] [--focus REGEX] [--skip REGEX] [--procs N] [--dry-run]`
    /// (`--flag value` or `--flag=value`).
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut opts = Options::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v.to_owned())),
                None => (arg.as_str(), None),
            };
            let mut value = || -> Result<String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .cloned()
                        .with_context(|| format!("{flag} needs a value")),
                }
            };
            match flag {
                "--suite" => {
                    opts.suite = match value()?.as_str() {
                        "node" => Suite::Node,
                        "cluster" => Suite::Cluster,
                        other => bail!("--suite {other:?}: expected node or cluster"),
                    }
                }
                "--focus" => opts.focus = value()?,
                "--skip" => opts.skip = value()?,
                "--procs" => {
                    opts.procs = value()?
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .context("--procs needs a positive number")?;
                }
                "--dry-run" => opts.mode = Mode::DryRun,
                other => bail!("unknown option {other:?}"),
            }
        }
        Ok(opts)
    }
}

/// Where a run finds what ginkgo's command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunContext {
    /// The cache's `bin` ([`build`]): `ginkgo` and the test binaries.
    pub bin: PathBuf,
    /// ginkgo's output dir: the JUnit report (`junit.xml`) and the suite's own reports.
    pub report_dir: PathBuf,
    /// What the suite is pointed at.
    pub target: Target,
}

/// What the suite under test talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nothing (a dry run of `e2e.test`, which only lists the specs).
    None,
    /// `e2e.test`: the cluster's admin kubeconfig and the `kubectl` beside its servers.
    Cluster {
        /// The admin kubeconfig.
        kubeconfig: PathBuf,
        /// The `kubectl` the specs run (of the same release).
        kubectl: PathBuf,
    },
    /// `e2e_node.test`: the token its own API server accepts, the node's name, its CRI
    /// endpoint and the system spec its validation checks. (It has no `--kubelet-root-dir`:
    /// its specs take `/var/lib/kubelet`, those that look there are `[Serial]`.)
    Node {
        /// The token of `known_tokens.csv` the suite's API server accepts (upstream: a random
        /// one unless given, which no node could know).
        bearer_token: String,
        /// The Node's name.
        node_name: String,
        /// The node's CRI socket (`unix://...`): some specs talk to the runtime directly.
        runtime_endpoint: String,
        /// The system spec of the suite's system validation (`--system-spec-file`); `None`:
        /// upstream's default spec.
        system_spec: Option<PathBuf>,
    },
}

/// The ginkgo command line of a run: ginkgo's own flags, the test binary, then `--` and the
/// binary's flags.
pub fn ginkgo_args(opts: &Options, ctx: &RunContext) -> Vec<String> {
    let report = ctx.report_dir.display();
    let mut args = vec![
        format!("--focus={}", opts.focus),
        format!("--skip={}", opts.skip),
        // ginkgo refuses a parallel dry run ("Ginkgo only performs -dryRun in serial mode").
        format!(
            "--procs={}",
            if opts.mode == Mode::DryRun {
                1
            } else {
                opts.procs
            }
        ),
        format!("--timeout={SUITE_TIMEOUT}"),
        "--no-color".to_owned(),
        "-v".to_owned(),
        format!("--output-dir={report}"),
        "--junit-report=junit.xml".to_owned(),
    ];
    if opts.mode == Mode::DryRun {
        args.push("--dry-run".to_owned());
    }
    args.push(ctx.bin.join(opts.suite.binary()).display().to_string());
    args.push("--".to_owned());
    args.push(format!("--report-dir={report}"));
    match opts.suite {
        Suite::Cluster => {
            // upstream: the skeleton provider is the one for a cluster no cloud made.
            args.push("--provider=skeleton".to_owned());
        }
        Suite::Node => {
            // upstream (test/e2e_node/conformance/build/Dockerfile): the framework starts
            // etcd and its API server, not the kubelet; no image is pulled beforehand.
            args.push("--conformance=true".to_owned());
            args.push("--start-services=true".to_owned());
            args.push("--prepull-images=false".to_owned());
        }
    }
    match &ctx.target {
        Target::None => {}
        Target::Cluster {
            kubeconfig,
            kubectl,
        } => {
            args.push(format!("--kubeconfig={}", kubeconfig.display()));
            args.push(format!("--kubectl-path={}", kubectl.display()));
        }
        Target::Node {
            bearer_token,
            node_name,
            runtime_endpoint,
            system_spec,
        } => {
            args.push(format!("--host={NODE_SUITE_HOST}"));
            args.push(format!("--bearer-token={bearer_token}"));
            args.push(format!("--node-name={node_name}"));
            args.push(format!("--container-runtime-endpoint={runtime_endpoint}"));
            if let Some(spec) = system_spec {
                args.push(format!("--system-spec-file={}", spec.display()));
            }
        }
    }
    args
}

/// The cache of one pinned release: `<cache root>/k8s-<v>-e2e-ginkgo-<v>`, with `bin/` and
/// `images/`.
pub fn cache_dir(root: &Path) -> Result<PathBuf> {
    let versions = pinned_versions(root)?;
    let path = root.join("tools/k8s/go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let ginkgo = required_version(&text, GINKGO_MODULE)
        .with_context(|| format!("parsing {}", path.display()))?;
    Ok(cache_root()?.join(format!("k8s-{}-e2e-ginkgo-{ginkgo}", versions.kubernetes)))
}

/// The cache's `bin` when every binary is there (nothing is built).
pub fn cached_binaries(root: &Path) -> Result<Option<PathBuf>> {
    let bin = cache_dir(root)?.join("bin");
    Ok(BINARIES
        .iter()
        .all(|(name, ..)| bin.join(name).is_file())
        .then_some(bin))
}

/// Builds the binaries into the cache unless all are there already, and the images' busybox
/// ([`crate::busybox::build`]) unless it is there; returns the cache's `bin`.
pub fn build(root: &Path) -> Result<PathBuf> {
    crate::busybox::build()?;
    build_binaries(root)
}

/// Builds the Go binaries into the cache unless all are there already; returns the cache's
/// `bin`.
fn build_binaries(root: &Path) -> Result<PathBuf> {
    if let Some(bin) = cached_binaries(root)? {
        eprintln!("xtask: conformance: binaries cached in {}", bin.display());
        return Ok(bin);
    }
    let versions = pinned_versions(root)?;
    let dir = cache_dir(root)?;
    let bin = dir.join("bin");
    let staging = dir.join(format!("bin.tmp-{}", std::process::id()));
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let go = go_binary();
    let ldflags = ldflags(&versions)?;
    eprintln!(
        "xtask: conformance: building the test binaries of Kubernetes {} into {} (cold: about \
         25 minutes on two busy cores)",
        versions.kubernetes,
        bin.display()
    );
    let started = Instant::now();
    for (name, package, kind) in BINARIES {
        let step = Instant::now();
        let out = staging.join(name);
        // The lowest priority (`ci` builds this beside its checks and the test build), two
        // compiles at a time as the control plane's.
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "19"]).arg(&go);
        match kind {
            BuildKind::Program => cmd.arg("build"),
            // vet checks the suite's own sources; building the binary needs none of it.
            BuildKind::TestBinary => cmd.args(["test", "-c", "-vet=off"]),
        };
        let status = cmd
            .args(["-p", "2", "-trimpath", "-ldflags"])
            .arg(&ldflags)
            .arg("-o")
            .arg(&out)
            .arg(package)
            .env("CGO_ENABLED", "0")
            .current_dir(root.join("tools/k8s"))
            .status()
            .with_context(|| format!("starting {} for {name}", go.display()))?;
        if !status.success() {
            bail!("building {name} ({package}) failed: {status}");
        }
        eprintln!("xtask: conformance: {name} built in {:.0?}", step.elapsed());
    }
    crate::replace_dir(&staging, &bin)?;
    eprintln!(
        "xtask: conformance: built in {:.0?} into {}",
        started.elapsed(),
        bin.display()
    );
    Ok(bin)
}

/// `cargo xtask conformance [build|images|OPTIONS]`.
pub fn main(root: &Path, args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("build") => build(root).map(|bin| println!("{}", bin.display())),
        Some("ci") => ci(root),
        Some("images") => {
            let bin = build(root)?;
            let busybox = crate::busybox::build()?;
            let images = cache_dir(root)?.join("images");
            runner(
                root,
                &[
                    "images".to_owned(),
                    bin.display().to_string(),
                    busybox.display().to_string(),
                    images.display().to_string(),
                ],
            )
        }
        _ => {
            let (runtime, args) = Containerd::take(args)?;
            let args = &args[..];
            let opts = Options::parse(args)?;
            let bin = build(root)?;
            let path_first = match runtime {
                Containerd::System => None,
                Containerd::Pinned => Some(crate::containerd::build(root)?),
            };
            match (opts.mode, opts.suite) {
                (Mode::DryRun, _) => dry_run(root, &opts, &bin).map(drop),
                (Mode::Run, suite) => {
                    // The node suite starts its own etcd and API server.
                    if suite == Suite::Cluster {
                        crate::cluster::build(root)?;
                    }
                    let mut forwarded = vec!["run".to_owned()];
                    forwarded.extend(args.iter().cloned());
                    // Unless told which specs to skip, also those this machine cannot run.
                    if opts.skip == SKIP {
                        forwarded.push(format!("--skip={}", skip_on_this_machine(SKIP)));
                    }
                    runner_with(root, &forwarded, path_first.as_deref())
                }
            }
        }
    }
}

/// `cargo xtask conformance ci`: each of [`ci_runs`], first checked by a dry run to select
/// the number of specs it should, then run; both suites run even when the first failed.
pub fn ci(root: &Path) -> Result<()> {
    let bin = build(root)?;
    crate::cluster::build(root)?;
    let mut failed = Vec::new();
    let skip = skip_on_this_machine(SKIP);
    for (mut opts, expected) in ci_runs() {
        opts.skip = skip.clone();
        let dry = Options {
            mode: Mode::DryRun,
            ..opts.clone()
        };
        let selected = dry_run(root, &dry, &bin)?;
        check_ci_selection(&opts, selected, expected)?;
        let started = Instant::now();
        let mut forwarded = vec![
            "run".to_owned(),
            format!("--suite={}", opts.suite.name()),
            // ginkgo refuses a parallel dry run ("Ginkgo only performs -dryRun in serial mode").
            format!(
                "--procs={}",
                if opts.mode == Mode::DryRun {
                    1
                } else {
                    opts.procs
                }
            ),
        ];
        forwarded.push(format!("--focus={}", opts.focus));
        forwarded.push(format!("--skip={}", opts.skip));
        let result = runner(root, &forwarded);
        eprintln!(
            "xtask: conformance ci: the {} suite's {selected} specs took {} s: {}",
            opts.suite.name(),
            started.elapsed().as_secs(),
            if result.is_ok() { "passed" } else { "FAILED" }
        );
        if let Err(e) = result {
            failed.push(format!("{}: {e:#}", opts.suite.name()));
        }
    }
    if !failed.is_empty() {
        bail!("the conformance CI subset failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Where a run of `suite` writes its reports: `target/conformance/<suite>[-dry-run]/`.
pub fn report_dir(root: &Path, opts: &Options) -> PathBuf {
    let name = match opts.mode {
        Mode::Run => opts.suite.name().to_owned(),
        Mode::DryRun => format!("{}-dry-run", opts.suite.name()),
    };
    root.join("target/conformance").join(name)
}

/// Runs ginkgo with `args` (from [`ginkgo_args`]) to its end (see [`ginkgo_command`]) and
/// reads the JUnit report it wrote into `report_dir`. ginkgo's own exit status is not an
/// error here: it fails whenever a spec did, and the summary says which.
pub fn run_ginkgo(
    bin: &Path,
    args: &[String],
    report_dir: &Path,
    netns: Option<&Path>,
) -> Result<Summary> {
    fresh_dir(report_dir)?;
    let status = ginkgo_command(bin, args, report_dir, netns)
        .status()
        .with_context(|| format!("starting {}", bin.join("ginkgo").display()))?;
    read_summary(report_dir, &status.to_string())
}

/// Empties (or makes) `dir`: a report dir holds one run's files only.
pub fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// ginkgo with `args`, through `nsenter --net=<netns>` when given (the suite then reaches a
/// cluster that listens in that namespace), in `report_dir`. (ginkgo runs a precompiled test
/// binary in the binary's own directory, whatever this command's.)
pub fn ginkgo_command(
    bin: &Path,
    args: &[String],
    report_dir: &Path,
    netns: Option<&Path>,
) -> Command {
    let ginkgo = bin.join("ginkgo");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(&ginkgo);
            c
        }
        None => Command::new(&ginkgo),
    };
    eprintln!(
        "xtask: conformance: {} {}",
        ginkgo.display(),
        args.join(" ")
    );
    cmd.args(args).current_dir(report_dir);
    cmd
}

/// The summary of the JUnit report ginkgo wrote into `report_dir`; `exited` (how ginkgo
/// ended) goes into the error when there is none.
pub fn read_summary(report_dir: &Path, exited: &str) -> Result<Summary> {
    let junit = report_dir.join("junit.xml");
    let xml = fs::read_to_string(&junit)
        .with_context(|| format!("reading {} (ginkgo exited: {exited})", junit.display()))?;
    Summary::from_junit(&xml).with_context(|| format!("parsing {}", junit.display()))
}

/// ginkgo's dry run: lists the specs the focus selects, runs none, needs no node.
fn dry_run(root: &Path, opts: &Options, bin: &Path) -> Result<usize> {
    let report_dir = report_dir(root, opts);
    let ctx = RunContext {
        bin: bin.to_owned(),
        report_dir: report_dir.clone(),
        target: Target::None,
    };
    let summary = run_ginkgo(bin, &ginkgo_args(opts, &ctx), &report_dir, None)?;
    let selected: Vec<&str> = summary
        .specs
        .iter()
        .filter(|(_, o)| *o != Outcome::NotSelected)
        .map(|(name, _)| name.as_str())
        .collect();
    for name in &selected {
        println!("{name}");
    }
    println!(
        "dry run: {} specs of {} selected by focus {:?} and skip {:?} ({})",
        selected.len(),
        summary.specs.len(),
        opts.focus,
        opts.skip,
        report_dir.join("junit.xml").display()
    );
    Ok(selected.len())
}

/// Runs the conformance runner (`tests/conformance`, the `rustlet` package's test target
/// `conformance`: it holds the private containerd, the images and the agent) with `args`, as
/// root in a private mount namespace, failing where a privileged part or the control plane
/// is missing instead of skipping.
/// Which containerd (with its shim and runc) a run's private containerd is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Containerd {
    /// The machine's, found on `PATH` (Debian's 1.6).
    System,
    /// The pinned one of `tools/containerd` ([`crate::containerd::build`]).
    Pinned,
}

impl Containerd {
    /// Takes `--containerd system|pinned` (`--flag value` or `--flag=value`) out of the
    /// arguments; the rest go to [`Options::parse`] and the runner.
    pub fn take(args: &[String]) -> Result<(Self, Vec<String>)> {
        let mut runtime = Containerd::System;
        let mut rest = Vec::with_capacity(args.len());
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let value = match arg.split_once('=') {
                Some(("--containerd", v)) => v.to_owned(),
                None if arg == "--containerd" => {
                    it.next().cloned().context("--containerd needs a value")?
                }
                _ => {
                    rest.push(arg.clone());
                    continue;
                }
            };
            runtime = match value.as_str() {
                "system" => Containerd::System,
                "pinned" => Containerd::Pinned,
                other => bail!("--containerd {other:?}: expected system or pinned"),
            };
        }
        Ok((runtime, rest))
    }
}

fn runner(root: &Path, args: &[String]) -> Result<()> {
    runner_with(root, args, None)
}

/// [`runner`] with `path_first` (a directory of programs) first on the runner's `PATH`.
fn runner_with(root: &Path, args: &[String], path_first: Option<&Path>) -> Result<()> {
    let mut cmd = Command::new("unshare");
    if let Some(dir) = path_first {
        let mut paths = vec![dir.to_path_buf()];
        paths.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        cmd.env("PATH", std::env::join_paths(paths).context("PATH")?);
    }
    cmd.args([
        "-m",
        "--propagation",
        "private",
        "env",
        "RUSTLET_PRIVATE_MOUNT_NS=1",
        "RUSTLET_REQUIRE_PRIVILEGED=1",
        "RUSTLET_REQUIRE_CLUSTER=1",
        "cargo",
        "test",
        // The workspace's test build of `cargo xtask test` (the same features, so nothing
        // but this target is built again).
        "--workspace",
        "--all-features",
        "--test",
        "conformance",
        "--",
    ])
    .args(args)
    .current_dir(root);
    eprintln!("xtask: conformance: {cmd:?}");
    let status = cmd.status().context("starting the conformance runner")?;
    if !status.success() {
        bail!("the conformance runner failed: {status}");
    }
    Ok(())
}

/// One spec's outcome in ginkgo's JUnit report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed (in a dry run: selected).
    Passed,
    /// Failed, timed out, panicked, interrupted or aborted.
    Failed,
    /// Skipped while it ran (`e2eskipper.Skipf`): the reason.
    Skipped(String),
    /// Not selected by the focus and skip expressions (or pending).
    NotSelected,
}

/// The specs (ginkgo's `[It]` nodes) of a JUnit report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Each spec's full text (without ginkgo's `[It] `) and outcome, in report order.
    pub specs: Vec<(String, Outcome)>,
    /// The suite's setup nodes that failed (`[SynchronizedBeforeSuite]`...): when one of
    /// the first does, ginkgo runs no spec at all, and the run failed though no spec did.
    pub setup_failures: Vec<String>,
}

impl Summary {
    /// Reads the report ginkgo writes with `--junit-report` (upstream: ginkgo's
    /// `reporters.GenerateJUnitReportWithConfig`): one `<testcase>` per spec, its `status`
    /// attribute the spec's state, a `<skipped message="skipped[ - reason]">` when skipped
    /// (no reason when a filter left it out).
    pub fn from_junit(xml: &str) -> Result<Self> {
        let mut specs = Vec::new();
        let mut setup_failures = Vec::new();
        for case in xml.split("<testcase ").skip(1) {
            let head = case.split('>').next().unwrap_or_default();
            let name = attribute(head, "name").context("a testcase without a name")?;
            let status = attribute(head, "status").context("a testcase without a status")?;
            let failed = matches!(
                status.as_str(),
                "failed" | "timedout" | "panicked" | "interrupted" | "aborted"
            );
            let Some(spec) = name.strip_prefix("[It] ") else {
                // The suite's setup nodes ([SynchronizedBeforeSuite], [ReportAfterSuite]...).
                if failed {
                    setup_failures.push(name);
                }
                continue;
            };
            let outcome = match status.as_str() {
                "passed" => Outcome::Passed,
                "skipped" => {
                    let message = case
                        .split("<skipped ")
                        .nth(1)
                        .and_then(|s| attribute(s.split('>').next().unwrap_or_default(), "message"))
                        .unwrap_or_default();
                    match message.strip_prefix("skipped - ") {
                        Some(reason) => Outcome::Skipped(reason.to_owned()),
                        None => Outcome::NotSelected,
                    }
                }
                "pending" => Outcome::NotSelected,
                _ if failed => Outcome::Failed,
                other => bail!("testcase {spec:?}: unknown status {other:?}"),
            };
            specs.push((spec.to_owned(), outcome));
        }
        Ok(Summary {
            specs,
            setup_failures,
        })
    }

    /// How many specs had `outcome`'s kind.
    pub fn count(&self, kind: fn(&Outcome) -> bool) -> usize {
        self.specs.iter().filter(|(_, o)| kind(o)).count()
    }

    /// The specs that passed.
    pub fn passed(&self) -> usize {
        self.count(|o| *o == Outcome::Passed)
    }

    /// The specs that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| *o == Outcome::Failed)
    }

    /// The specs skipped while they ran.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skipped(_)))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

/// The value of `name="..."` in an element's head, with XML's escapes undone.
fn attribute(head: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let start = format!(" {head}").find(&needle)? + needle.len() - 1;
    let rest = &head[start..];
    let value = &rest[..rest.find('"')?];
    Some(
        value
            .replace("&#34;", "\"")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&apos;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#xA;", "\n")
            .replace("&#x9;", "\t")
            .replace("&amp;", "&"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Issue 27 (harness 3): without options a run is the cluster suite with the issue's focus
    /// and skip; each option is read in both spellings.
    #[test]
    fn conformance_options_default_to_the_issues_focus_and_skip() {
        let opts = Options::parse(&[]).unwrap();
        assert_eq!(opts.suite, Suite::Cluster);
        assert_eq!(opts.focus, r"\[NodeConformance\]");
        assert_eq!(
            opts.skip,
            r"\[Flaky\]|\[Serial\]|\[Slow\]|\[Disruptive\]|\[Alpha\]|\[Feature:OffByDefault\]"
        );
        assert_eq!(opts.mode, Mode::Run);
        let opts = Options::parse(&strings(&[
            "--suite=node",
            "--focus",
            "Pods should get a host IP",
            "--procs=2",
            "--dry-run",
        ]))
        .unwrap();
        assert_eq!(opts.suite, Suite::Node);
        assert_eq!(opts.focus, "Pods should get a host IP");
        assert_eq!(opts.procs, 2);
        assert_eq!(opts.mode, Mode::DryRun);
        assert!(Options::parse(&strings(&["--suite", "both"])).is_err());
        assert!(Options::parse(&strings(&["--procs", "0"])).is_err());
        assert!(Options::parse(&strings(&["--focus"])).is_err());
        assert!(Options::parse(&strings(&["--fast"])).is_err());
    }

    /// Issue 27 (item 3): `--containerd` is taken out of the arguments in both spellings (the
    /// runner would refuse it), the machine's by default.
    #[test]
    fn the_containerd_option_is_taken_before_the_runner_sees_it() {
        let args = strings(&["--suite=node", "--containerd", "pinned", "--focus", "RRO"]);
        let (runtime, rest) = Containerd::take(&args).unwrap();
        assert_eq!(runtime, Containerd::Pinned);
        assert_eq!(rest, strings(&["--suite=node", "--focus", "RRO"]));
        let (runtime, rest) = Containerd::take(&strings(&["--containerd=system"])).unwrap();
        assert_eq!((runtime, rest.len()), (Containerd::System, 0));
        assert_eq!(
            Containerd::take(&strings(&["--procs=2"])).unwrap().0,
            Containerd::System
        );
        assert!(Containerd::take(&strings(&["--containerd", "1.7"])).is_err());
        assert!(Containerd::take(&strings(&["--containerd"])).is_err());
    }

    /// Issue 27 (harness 3): a dry run is ginkgo's `--dry-run` on `e2e.test` with the focus
    /// and skip, the JUnit report in the report dir, and nothing to reach.
    #[test]
    fn the_ci_subset_runs_both_suites_with_the_default_skip() {
        let runs = ci_runs();
        let suites: Vec<Suite> = runs.iter().map(|(o, _)| o.suite).collect();
        assert_eq!(suites, [Suite::Cluster, Suite::Node]);
        for (opts, expected) in &runs {
            assert_eq!(opts.skip, SKIP);
            assert_eq!(opts.mode, Mode::Run);
            assert_eq!(opts.procs, CI_PROCS);
            assert!(
                opts.focus.ends_with(r".*\[NodeConformance\]"),
                "{}",
                opts.focus
            );
            assert!(*expected > 0);
        }
        assert!(runs[0].0.focus.starts_with(r"(\[sig-storage\]|"));
    }

    #[test]
    fn a_machine_skip_is_added_to_the_skip_expression() {
        let machine = [MachineSkip {
            spec: "PrivilegedPod should enable privileged commands",
            reason: "no dummy links",
        }];
        assert_eq!(skip_with(SKIP, &[]), SKIP);
        assert_eq!(
            skip_with(SKIP, &machine),
            format!("{SKIP}|PrivilegedPod should enable privileged commands")
        );
    }

    /// Each machine skip's expression matches its spec's full text as ginkgo matches it (the
    /// names of v1.37.2's `--dry-run` report), and nothing else of the default focus.
    #[test]
    fn each_machine_skip_matches_its_spec_as_ginkgo_names_it() {
        let specs = [
            (
                PRIVILEGED_POD_SPEC,
                "[sig-node] PrivilegedPod should enable privileged commands [LinuxOnly] \
                 [NodeConformance] [sig-node, NodeConformance]",
            ),
            (
                CADVISOR_METRICS_SPEC,
                "[sig-node] ContainerMetrics [LinuxOnly] when querying /metrics/cadvisor should \
                 report container metrics [NodeConformance] [sig-node, NodeConformance]",
            ),
        ];
        for (expression, name) in specs {
            let re = regex::Regex::new(expression).unwrap();
            assert!(re.is_match(name), "{expression} does not match {name}");
            assert!(
                !re.is_match(
                    "[sig-node] Summary API when querying /stats/summary should report resource \
                     usage through the stats api [NodeConformance]"
                ),
                "{expression}"
            );
        }
    }

    /// The block I/O probe: counters that stay put through a direct write mean the kernel
    /// does not count (the cadvisor spec is skipped); no v1 counters (cgroup v2) mean nothing
    /// to skip.
    #[test]
    fn block_io_is_counted_unless_the_counters_stay_put_through_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let still = dir.path().join("blkio.throttle.io_service_bytes_recursive");
        std::fs::write(&still, "8:0 Read 0\n8:0 Write 0\nTotal 0\n").unwrap();
        assert!(!blkio_counted(&still));
        assert!(blkio_counted(&dir.path().join("absent")));
    }

    #[test]
    fn a_ci_subset_selecting_another_number_of_specs_is_refused() {
        let (opts, expected) = ci_runs().remove(0);
        check_ci_selection(&opts, expected, expected).unwrap();
        let err = check_ci_selection(&opts, expected - 1, expected).unwrap_err();
        assert!(err.to_string().contains("renamed or removed"), "{err}");
    }

    #[test]
    fn a_dry_run_is_serial_whatever_the_procs() {
        let opts = Options {
            mode: Mode::DryRun,
            procs: 3,
            ..Options::default()
        };
        let ctx = RunContext {
            bin: PathBuf::from("/bin"),
            report_dir: PathBuf::from("/r"),
            target: Target::None,
        };
        let args = ginkgo_args(&opts, &ctx);
        assert!(args.contains(&"--procs=1".to_owned()), "{args:?}");
    }

    #[test]
    fn a_dry_run_is_ginkgos_dry_run_of_the_focus() {
        let opts = Options::parse(&strings(&["--dry-run"])).unwrap();
        let ctx = RunContext {
            bin: PathBuf::from("/c/bin"),
            report_dir: PathBuf::from("/r"),
            target: Target::None,
        };
        let args = ginkgo_args(&opts, &ctx);
        let binary = args.iter().position(|a| a == "/c/bin/e2e.test").unwrap();
        let (ginkgo, rest) = args.split_at(binary);
        assert!(ginkgo.contains(&"--dry-run".to_owned()), "{args:?}");
        assert!(ginkgo.contains(&r"--focus=\[NodeConformance\]".to_owned()));
        assert!(ginkgo.contains(&format!("--skip={SKIP}")));
        assert!(ginkgo.contains(&"--output-dir=/r".to_owned()));
        assert!(ginkgo.contains(&"--junit-report=junit.xml".to_owned()));
        assert!(ginkgo.contains(&"--procs=1".to_owned()));
        assert_eq!(rest[1], "--");
        assert!(rest.contains(&"--provider=skeleton".to_owned()));
        assert!(
            !rest.iter().any(|a| a.starts_with("--kubeconfig")),
            "{rest:?}"
        );
    }

    /// Issue 27 (harness 3): a real run of `e2e.test` names the cluster's kubeconfig and
    /// kubectl after `--`, and is no dry run; one of `e2e_node.test` asks for the
    /// conformance mode (services started, no kubelet), no pre-pulled images, the token and
    /// the node.
    #[test]
    fn a_run_points_the_suite_at_the_node() {
        let opts = Options::parse(&strings(&["--focus", "Pods"])).unwrap();
        let ctx = RunContext {
            bin: PathBuf::from("/c/bin"),
            report_dir: PathBuf::from("/r"),
            target: Target::Cluster {
                kubeconfig: PathBuf::from("/k/admin.kubeconfig"),
                kubectl: PathBuf::from("/k/kubectl"),
            },
        };
        let args = ginkgo_args(&opts, &ctx);
        assert!(!args.contains(&"--dry-run".to_owned()));
        assert!(args.contains(&"--focus=Pods".to_owned()));
        let dashes = args.iter().position(|a| a == "--").unwrap();
        let binary_args = &args[dashes + 1..];
        assert!(binary_args.contains(&"--kubeconfig=/k/admin.kubeconfig".to_owned()));
        assert!(binary_args.contains(&"--kubectl-path=/k/kubectl".to_owned()));
        assert!(binary_args.contains(&"--report-dir=/r".to_owned()));

        let opts = Options::parse(&strings(&["--suite", "node"])).unwrap();
        let ctx = RunContext {
            target: Target::Node {
                bearer_token: "t0k3n".to_owned(),
                node_name: "node-a".to_owned(),
                runtime_endpoint: "unix:///c.sock".to_owned(),
                system_spec: Some(PathBuf::from("/n/sysspec.yaml")),
            },
            ..ctx
        };
        let args = ginkgo_args(&opts, &ctx);
        let dashes = args.iter().position(|a| a == "--").unwrap();
        assert_eq!(args[dashes - 1], "/c/bin/e2e_node.test");
        for flag in [
            "--conformance=true",
            "--start-services=true",
            "--prepull-images=false",
            "--bearer-token=t0k3n",
            "--node-name=node-a",
            "--container-runtime-endpoint=unix:///c.sock",
            "--host=https://127.0.0.1:6443",
            "--system-spec-file=/n/sysspec.yaml",
        ] {
            assert!(
                args[dashes + 1..].contains(&flag.to_owned()),
                "{flag}: {args:?}"
            );
        }
    }

    /// Issue 27 (harness 3): the counts come from ginkgo's JUnit report: setup nodes are not
    /// specs, a spec skipped while running is skipped with its reason, one a filter left out
    /// is not counted, every failing state is a failure.
    #[test]
    fn the_summary_counts_ginkgos_junit_report() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" disabled="3" errors="1" failures="1" time="12.5">
  <testsuite name="Kubernetes e2e suite" package="/c/bin" tests="6" disabled="0" skipped="3" errors="1" failures="1" time="12.5" timestamp="2026-12-03T19:00:00">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.0"></testcase>
    <testcase name="[It] [sig-node] Pods should get a host IP [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="passed" time="5.1">
      <system-err>...</system-err>
    </testcase>
    <testcase name="[It] [sig-node] Probing container should be &#34;ready&#34; [NodeConformance]" classname="Kubernetes e2e suite" status="failed" time="3.2">
      <failure message="timed out" type="failed">...</failure>
    </testcase>
    <testcase name="[It] [sig-node] Lifecycle should panic [NodeConformance]" classname="Kubernetes e2e suite" status="panicked" time="0.2">
      <error message="boom" type="panicked">...</error>
    </testcase>
    <testcase name="[It] [sig-node] Sysctls should support sysctls [NodeConformance]" classname="Kubernetes e2e suite" status="skipped" time="0.1">
      <skipped message="skipped - Only supported for providers [gce] (not skeleton)"></skipped>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-node] Pending spec" classname="Kubernetes e2e suite" status="pending" time="0">
      <skipped message="pending"></skipped>
    </testcase>
  </testsuite>
</testsuites>"#;
        let summary = Summary::from_junit(xml).unwrap();
        assert_eq!(summary.specs.len(), 6);
        assert_eq!(summary.to_string(), "1 passed, 2 failed, 1 skipped");
        assert_eq!(
            summary.specs[1].0,
            r#"[sig-node] Probing container should be "ready" [NodeConformance]"#
        );
        assert_eq!(
            summary.specs[3].1,
            Outcome::Skipped("Only supported for providers [gce] (not skeleton)".to_owned())
        );
        assert_eq!(summary.specs[4].1, Outcome::NotSelected);
        assert!(summary.setup_failures.is_empty());
        assert!(Summary::from_junit(r#"<testcase name="[It] x" status="weird">"#).is_err());
        // A failed setup node ran no spec: the run failed all the same.
        let before_suite = xml.replace(
            r#"name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed""#,
            r#"name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="failed""#,
        );
        assert_eq!(
            Summary::from_junit(&before_suite).unwrap().setup_failures,
            vec!["[SynchronizedBeforeSuite]".to_owned()]
        );
    }

    /// Issue 27 (harness 2): the images are those the release lists; a list without one of
    /// them (another release) is refused.
    #[test]
    fn the_test_images_are_the_releases() {
        let list = "registry.k8s.io/e2e-test-images/agnhost:2.66.1\n\
                    registry.k8s.io/e2e-test-images/agnhost:2.55\n\
                    registry.k8s.io/e2e-test-images/busybox:1.36.1-1\n\
                    registry.k8s.io/e2e-test-images/busybox:1.37.0-2\n\
                    registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1\n\
                    registry.k8s.io/e2e-test-images/nginx:1.27.0-2\n\
                    registry.k8s.io/e2e-test-images/nginx:1.28.0-2\n\
                    registry.k8s.io/e2e-test-images/nonewprivs:1.4\n\
                    registry.k8s.io/e2e-test-images/nonroot:1.5\n\
                    registry.k8s.io/etcd:3.6.5-0\n\
                    registry.k8s.io/pause:3.10.2\n";
        check_images_listed(list).unwrap();
        let older = list.replace("agnhost:2.66.1", "agnhost:2.52");
        let err = check_images_listed(&older).unwrap_err().to_string();
        assert!(err.contains("agnhost:2.66.1"), "{err}");
    }

    /// The cache is keyed by the pinned Kubernetes release and ginkgo's version, both read
    /// from `tools/k8s/go.mod`.
    #[test]
    fn the_cache_is_keyed_by_kubernetes_and_ginkgo() {
        let root = crate::workspace_root();
        let dir = cache_dir(&root).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let text = fs::read_to_string(root.join("tools/k8s/go.mod")).unwrap();
        let ginkgo = required_version(&text, GINKGO_MODULE).unwrap();
        assert!(ginkgo.starts_with("v2."), "{ginkgo}");
        assert_eq!(
            name,
            format!(
                "k8s-{}-e2e-ginkgo-{ginkgo}",
                pinned_versions(&root).unwrap().kubernetes
            )
        );
    }
}

#[cfg(test)]
mod agnhost_certificate_tests {
    /// The certificate and key agnhost's image carries are a matching PEM pair for localhost
    /// (checked with the openssl CLI, independent of rcgen).
    #[test]
    fn agnhost_localhost_certificate_is_a_pem_pair_for_localhost() {
        let (crt, key) = super::agnhost_localhost_certificate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c"), &crt).unwrap();
        std::fs::write(dir.path().join("k"), &key).unwrap();
        let text = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(dir.path().join("c"))
            .output()
            .unwrap();
        assert!(text.status.success(), "{text:?}");
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("DNS:localhost"), "{text}");
        let public = |args: &[&str], file: &str| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .arg(dir.path().join(file))
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            out.stdout
        };
        assert_eq!(
            public(&["x509", "-noout", "-pubkey", "-in"], "c"),
            public(&["pkey", "-pubout", "-in"], "k")
        );
    }
}
