//! `cargo xtask cluster`: a real Kubernetes control plane on loopback for tests, built from
//! upstream's Go modules (`tools/k8s/`).
//!
//! * `build`: builds `etcd`, `kube-apiserver`, `kube-controller-manager`, `kube-scheduler` and
//!   `kubectl` at the versions `tools/k8s/go.mod` pins, into a cache outside the repository
//!   keyed by those versions (`${XDG_CACHE_HOME:-~/.cache}/rustlet/k8s-<v>-etcd-<v>/bin/`);
//!   a warm cache builds nothing.
//! * `up [--dir D] [--nodes a,b] [--node-monitor-grace-period 20s]`: builds (or takes from the
//!   cache) the binaries, writes a PKI and kubeconfigs into `D` (default
//!   `<temp dir>/rustlet-cluster`), starts etcd, kube-apiserver, kube-controller-manager and
//!   kube-scheduler listening on 127.0.0.1 only, and waits until `/readyz` answers and both
//!   controllers hold their leader leases.
//! * `down [--dir D]`: stops every process `up` started there (its pid files); removes nothing
//!   outside `D`.
//! * `env [--dir D]`: prints `export KUBECONFIG=...` and `export PATH=<binaries>:$PATH`.
//! * `smoke [--dir D]`: `up` with one node, checks the API server, the Node authorizer and
//!   NodeRestriction with `kubectl`, then `down`, and checks no process is left.
//!
//! Go is test tooling only: nothing here is linked into Rustlet.

use std::fs;
use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The binaries the cache holds, in start order (kubectl last: it is not a server).
const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// The servers `up` starts, in start order; `down` stops them in reverse.
const SERVERS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The service network (the API server's `kubernetes` Service takes its first address).
const SERVICE_CIDR: &str = "10.96.0.0/24";
const FIRST_SERVICE_IP: [u8; 4] = [10, 96, 0, 1];
/// The audit policy of `--audit`: every request's metadata (user, verb, resource, user agent,
/// code), once, when its response is complete; TokenRequests and pod bindings with their
/// request bodies too (the pod a token is bound to, the node a pod is bound to: what tells a
/// refusal by the API server's lagging caches from the agent's mistake). Neither request
/// carries a secret (the issued token is in the response, which is not logged).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
    - level: Request\n  resources:\n  - group: \"\"\n    resources: [serviceaccounts/token, pods/binding]\n\
    - level: Metadata\n";

/// The service-account token issuer (kubeadm's default).
const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// How long `up` waits for each stage (this machine's cores are shared: be generous).
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// What `cargo xtask cluster --help` prints.
const USAGE: &str = "\
usage: cargo xtask cluster <task> [options]

tasks:
  build   builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl at
          the versions tools/k8s/go.mod pins, into a cache outside the repository
  up      starts a control plane on 127.0.0.1 and prints how to run nodes against it
  down    stops what `up` started in the directory (removes nothing)
  env     prints the KUBECONFIG and PATH exports for the directory
  smoke   `up` with one node, checks the Node authorizer and NodeRestriction, then `down`

options (up, down, env, smoke):
  --dir D                          the cluster's directory (default <temp dir>/rustlet-cluster)
  --nodes a,b                      a client certificate and kubeconfig for each of these nodes
  --node-monitor-grace-period 20s  kube-controller-manager's grace period
  --apiserver-ip IP                one more address the API server's certificate names
  --audit                          the API server's audit log, in <dir>/logs/audit.log
  --aggregation                    the aggregation layer, for extension API servers
";

/// `-h`, `--help` or `help` anywhere among the arguments.
fn wants_help(args: &[String]) -> bool {
    args.iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
}

/// `cargo xtask cluster <sub> [options]`.
pub fn main(root: &Path, args: &[String]) -> Result<()> {
    if wants_help(args) {
        print!("{USAGE}");
        return Ok(());
    }
    let Some((sub, rest)) = args.split_first() else {
        bail!("a task is needed\n\n{USAGE}");
    };
    let opts = Options::parse(rest)?;
    match sub.as_str() {
        "build" => build(root).map(|bin| println!("{}", bin.display())),
        "up" => {
            let bin = build(root)?;
            up(&bin, &opts).map(drop)?;
            print_usage(&bin, &opts.dir, &opts.nodes);
            Ok(())
        }
        "down" => down(&opts.dir),
        "env" => {
            let bin = bin_dir(&pinned_versions(root)?)?;
            print!("{}", env_lines(&bin, &opts.dir));
            Ok(())
        }
        "smoke" => smoke(root, &opts),
        other => bail!("unknown cluster task {other:?}\n\n{USAGE}"),
    }
}

/// The options of `up`, `down`, `env` and `smoke`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The cluster's own directory: PKI, kubeconfigs, etcd data, logs, pid files.
    pub dir: PathBuf,
    /// A node client certificate and kubeconfig is written for each of these node names.
    pub nodes: Vec<String>,
    /// kube-controller-manager's `--node-monitor-grace-period` (short, for tests).
    pub node_monitor_grace_period: String,
    /// More IP addresses the API server's serving certificate names besides 127.0.0.1 and
    /// the first service IP (`--apiserver-ip`): where a test forwards the API server to, such
    /// as a pod network's gateway, so that a pod verifies it with the cluster CA.
    pub extra_apiserver_ips: Vec<[u8; 4]>,
    /// The API server's audit log, every request at `Metadata` level (TokenRequests and pod
    /// bindings at `Request`), to `logs/audit.log` (`--audit`): who asked what, with its user
    /// agent, for the request-rate figures and the tests' refused requests.
    pub audit: bool,
    /// Runs every server (and `kubectl`) inside this network namespace (a `/proc/<pid>/ns/net`
    /// or a bind-mounted namespace file; `nsenter` needs root): its loopback instead of the
    /// host's, so that a node agent in that namespace and the API server reach each other
    /// (`logs`/`exec` go from the API server to the node), and nothing listens on the host.
    pub netns: Option<PathBuf>,
    /// kube-apiserver also signs TLS 1.2 handshakes with SHA-1 (`GODEBUG=tlssha1=1`) for
    /// clients that send no `signature_algorithms` (RFC 5246 then means SHA-1, which Go
    /// refuses since 1.25 by RFC 9155): busybox's `wget` (its `ssl_client`), the only HTTPS
    /// client of the CRI tests' pods, is one. Test clusters only.
    pub sha1_tls_signatures: bool,
    /// More IP addresses each node certificate (`pki/node-<name>.crt`, which also serves the
    /// node's port 10250) names besides 127.0.0.1: the node IPs the API server reaches the
    /// nodes at (it verifies them with the cluster CA, `--kubelet-certificate-authority`).
    pub extra_node_ips: Vec<[u8; 4]>,
    /// The API server's aggregation layer for an extension API server such as
    /// metrics-server (`--aggregation`).
    pub aggregation: Aggregation,
}

/// Whether the API server proxies to extension API servers (upstream's aggregation layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// No `--requestheader-*` or `--proxy-client-*` flags (the default).
    #[default]
    Off,
    /// The front proxy as kubeadm sets it up: `--requestheader-client-ca-file` (the cluster CA;
    /// kubeadm has a CA of its own for it), `--requestheader-allowed-names=front-proxy-client`,
    /// the `X-Remote-*` headers, the proxy's client certificate `pki/front-proxy-client.crt`,
    /// and `--enable-aggregator-routing` (no kube-proxy here: the API server goes to an
    /// APIService's endpoints directly).
    FrontProxy,
}

impl Options {
    /// The defaults for a cluster in `dir`, with certificates for `nodes`.
    pub fn new(dir: impl Into<PathBuf>, nodes: &[&str]) -> Self {
        Options {
            dir: dir.into(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            node_monitor_grace_period: "20s".to_owned(),
            extra_apiserver_ips: Vec::new(),
            audit: false,
            netns: None,
            sha1_tls_signatures: false,
            extra_node_ips: Vec::new(),
            aggregation: Aggregation::Off,
        }
    }

    fn parse(args: &[String]) -> Result<Self> {
        let mut opts = Options::new(std::env::temp_dir().join("rustlet-cluster"), &[]);
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
                "--dir" => opts.dir = PathBuf::from(value()?),
                "--nodes" => {
                    opts.nodes = value()?
                        .split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect();
                }
                "--node-monitor-grace-period" => opts.node_monitor_grace_period = value()?,
                "--apiserver-ip" => {
                    let ip: std::net::Ipv4Addr = value()?
                        .parse()
                        .context("--apiserver-ip needs an IPv4 address")?;
                    opts.extra_apiserver_ips.push(ip.octets());
                }
                "--audit" => opts.audit = true,
                "--aggregation" => opts.aggregation = Aggregation::FrontProxy,
                other => bail!("unknown option {other:?}"),
            }
        }
        for node in &opts.nodes {
            check_node_name(node)?;
        }
        if opts.dir.is_relative() {
            opts.dir = std::env::current_dir()
                .context("reading the current directory")?
                .join(&opts.dir);
        }
        Ok(opts)
    }
}

/// A node name must be a DNS-1123 subdomain (it becomes a Node's name and a certificate SAN).
fn check_node_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-'));
    if !ok {
        bail!("node name {name:?} is not a DNS-1123 subdomain");
    }
    Ok(())
}

/// The versions `tools/k8s/go.mod` pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Versions {
    /// `k8s.io/kubernetes`, e.g. `v1.37.2`.
    pub(crate) kubernetes: String,
    /// `go.etcd.io/etcd/server/v3`, e.g. `v3.7.0`.
    pub(crate) etcd: String,
}

impl Versions {
    /// The minor version of Kubernetes (`37` of `v1.37.2`).
    fn kubernetes_minor(&self) -> Result<&str> {
        self.kubernetes
            .strip_prefix("v1.")
            .and_then(|rest| rest.split('.').next())
            .with_context(|| format!("parsing the Kubernetes version {:?}", self.kubernetes))
    }
}

pub(crate) fn pinned_versions(root: &Path) -> Result<Versions> {
    let path = root.join("tools/k8s/go.mod");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_go_mod(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The `require`d versions of `k8s.io/kubernetes` and `go.etcd.io/etcd/server/v3`.
fn parse_go_mod(text: &str) -> Result<Versions> {
    Ok(Versions {
        kubernetes: required_version(text, "k8s.io/kubernetes")?,
        etcd: required_version(text, "go.etcd.io/etcd/server/v3")?,
    })
}

/// The version a `go.mod` text `require`s of `module`.
pub(crate) fn required_version(text: &str, module: &str) -> Result<String> {
    text.lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .filter_map(|l| l.strip_prefix(module)?.strip_prefix(' '))
        .map(|rest| rest.split_whitespace().next().unwrap_or_default())
        .find(|v| v.starts_with('v'))
        .map(str::to_owned)
        .with_context(|| format!("no require line for {module}"))
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/rustlet/k8s-<v>-etcd-<v>/bin`.
fn bin_dir(v: &Versions) -> Result<PathBuf> {
    Ok(cache_root()?
        .join(format!("k8s-{}-etcd-{}", v.kubernetes, v.etcd))
        .join("bin"))
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/rustlet`: where the built test tooling is kept.
pub(crate) fn cache_root() -> Result<PathBuf> {
    let cache = match std::env::var_os("XDG_CACHE_HOME").filter(|s| !s.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(
            std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?,
        )
        .join(".cache"),
    };
    Ok(cache.join("rustlet"))
}

/// The Go toolchain: `$GO`, else `go` on `PATH`, else `/usr/local/go/bin/go`.
pub(crate) fn go_binary() -> PathBuf {
    if let Some(go) = std::env::var_os("GO").filter(|s| !s.is_empty()) {
        return PathBuf::from(go);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("go"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/local/go/bin/go"))
}

/// The linker flags upstream's `hack/lib/version.sh` sets, so `--version` and the API server's
/// `/version` say the pinned release (the compatibility-version checks read it too).
pub(crate) fn ldflags(v: &Versions) -> Result<String> {
    let minor = v.kubernetes_minor()?;
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (var, value) in [
            ("gitVersion", v.kubernetes.as_str()),
            ("gitMajor", "1"),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        ] {
            flags.push(format!("-X {pkg}.{var}={value}"));
        }
    }
    flags.push(format!(
        "-X go.etcd.io/etcd/api/v3/version.GitSHA={}",
        v.etcd
    ));
    Ok(flags.join(" "))
}

/// Builds the binaries into the cache unless all are there already; returns the cache's `bin`.
pub fn build(root: &Path) -> Result<PathBuf> {
    let versions = pinned_versions(root)?;
    let bin = bin_dir(&versions)?;
    if BINARIES.iter().all(|b| bin.join(b).is_file()) {
        eprintln!("xtask: cluster: binaries cached in {}", bin.display());
        return Ok(bin);
    }
    let parent = bin.parent().context("the cache dir has a parent")?;
    let staging = parent.join(format!("bin.tmp-{}", std::process::id()));
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let mut packages: Vec<String> = BINARIES
        .iter()
        .filter(|b| **b != "etcd")
        .map(|b| format!("k8s.io/kubernetes/cmd/{b}"))
        .collect();
    packages.push("./cmd/etcd".to_owned());
    let go = go_binary();
    let mut out_dir = staging.as_os_str().to_owned();
    out_dir.push("/");
    eprintln!(
        "xtask: cluster: building Kubernetes {} and etcd {} into {} (cold: tens of minutes)",
        versions.kubernetes,
        versions.etcd,
        bin.display()
    );
    let started = Instant::now();
    // Two parallel compiles at a lowered priority: the machine's cores are shared.
    let status = Command::new("nice")
        .args(["-n", "10"])
        .arg(&go)
        .args(["build", "-p", "2", "-trimpath", "-ldflags"])
        .arg(ldflags(&versions)?)
        .arg("-o")
        .arg(&out_dir)
        .args(&packages)
        .env("CGO_ENABLED", "0")
        .current_dir(root.join("tools/k8s"))
        .status()
        .with_context(|| format!("starting {} build", go.display()))?;
    if !status.success() {
        bail!("go build of the control plane failed: {status}");
    }
    crate::replace_dir(&staging, &bin)?;
    eprintln!(
        "xtask: cluster: built in {:.0?} into {}",
        started.elapsed(),
        bin.display()
    );
    Ok(bin)
}

/// The loopback ports of one cluster.
#[derive(Debug, Clone, Copy)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

/// A free port on 127.0.0.1 (the listener is closed again; the server binds it right after).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener
        .local_addr()
        .context("reading a bound address")?
        .port())
}

impl Ports {
    fn pick() -> Result<Self> {
        Ok(Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            apiserver: free_port()?,
            controller_manager: free_port()?,
            scheduler: free_port()?,
        })
    }
}

/// Where `up` puts what it writes; everything lives under `dir`.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn pki(&self, file: &str) -> PathBuf {
        self.dir.join("pki").join(file)
    }
    fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.kubeconfig"))
    }
    fn pid_file(&self, server: &str) -> PathBuf {
        self.dir.join("run").join(format!("{server}.pid"))
    }
    fn log(&self, server: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{server}.log"))
    }
}

/// One certificate `up` issues from the cluster CA.
struct Leaf<'a> {
    /// File stem under `pki/` (`<stem>.crt`, `<stem>.key`).
    stem: String,
    common_name: &'a str,
    organization: Option<&'a str>,
    client: bool,
    server: bool,
    dns_names: Vec<String>,
    ips: Vec<[u8; 4]>,
}

/// Writes the cluster CA, every certificate and the service-account key pair into `pki/`.
/// Removes `node-*.kubeconfig` and `pki/node-*.{crt,key}`, the files an earlier `up` wrote for
/// its nodes.
fn remove_stale_node_files(layout: &Layout) -> Result<()> {
    for dir in [layout.dir.clone(), layout.dir.join("pki")] {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", dir.display()))?
                .path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let ours = name.starts_with("node-")
                && [".kubeconfig", ".crt", ".key"]
                    .iter()
                    .any(|e| name.ends_with(e));
            if ours {
                fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn write_pki(
    layout: &Layout,
    nodes: &[String],
    extra_apiserver_ips: &[[u8; 4]],
    extra_node_ips: &[[u8; 4]],
) -> Result<()> {
    fs::create_dir_all(layout.dir.join("pki")).context("creating pki/")?;
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "rustlet-test-cluster-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).context("signing the CA")?;
    write_secret(&layout.pki("ca.key"), &ca_key.serialize_pem())?;
    write_file(&layout.pki("ca.crt"), &ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let node_cns: Vec<String> = nodes.iter().map(|n| format!("system:node:{n}")).collect();
    let mut leaves = vec![
        Leaf {
            stem: "apiserver".into(),
            common_name: "kube-apiserver",
            organization: None,
            client: false,
            server: true,
            dns_names: [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(str::to_owned)
            .to_vec(),
            ips: [[127, 0, 0, 1], FIRST_SERVICE_IP]
                .into_iter()
                .chain(extra_apiserver_ips.iter().copied())
                .collect(),
        },
        client_leaf(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
        ),
        client_leaf("admin", "kubernetes-admin", Some("system:masters")),
        // The aggregation layer's client certificate to extension API servers.
        client_leaf("front-proxy-client", "front-proxy-client", None),
        client_leaf(
            "kube-controller-manager",
            "system:kube-controller-manager",
            None,
        ),
        client_leaf("kube-scheduler", "system:kube-scheduler", None),
    ];
    for (node, cn) in nodes.iter().zip(&node_cns) {
        // Client (to the API server) and serving (the node's own port 10250) in one.
        leaves.push(Leaf {
            stem: format!("node-{node}"),
            common_name: cn,
            organization: Some("system:nodes"),
            client: true,
            server: true,
            dns_names: vec![node.clone(), "localhost".to_owned()],
            ips: [[127, 0, 0, 1]]
                .into_iter()
                .chain(extra_node_ips.iter().copied())
                .collect(),
        });
    }
    for leaf in &leaves {
        let key = KeyPair::generate().with_context(|| format!("generating {}'s key", leaf.stem))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name);
        if let Some(o) = leaf.organization {
            params.distinguished_name.push(DnType::OrganizationName, o);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if leaf.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if leaf.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        for name in &leaf.dns_names {
            params.subject_alt_names.push(SanType::DnsName(
                name.clone()
                    .try_into()
                    .with_context(|| format!("{name:?} as a DNS SAN"))?,
            ));
        }
        for ip in &leaf.ips {
            params
                .subject_alt_names
                .push(SanType::IpAddress((*ip).into()));
        }
        let cert = params
            .signed_by(&key, &issuer)
            .with_context(|| format!("signing {}", leaf.stem))?;
        write_secret(
            &layout.pki(&format!("{}.key", leaf.stem)),
            &key.serialize_pem(),
        )?;
        write_file(&layout.pki(&format!("{}.crt", leaf.stem)), &cert.pem())?;
    }

    // The service-account token signing key (ES256: ring generates no RSA keys).
    let sa = KeyPair::generate().context("generating the service-account key")?;
    write_secret(&layout.pki("sa.key"), &sa.serialize_pem())?;
    write_file(&layout.pki("sa.pub"), &sa.public_key_pem())?;
    Ok(())
}

fn client_leaf<'a>(stem: &str, common_name: &'a str, organization: Option<&'a str>) -> Leaf<'a> {
    Leaf {
        stem: stem.to_owned(),
        common_name,
        organization,
        client: true,
        server: false,
        dns_names: Vec::new(),
        ips: Vec::new(),
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A private key: readable by its owner only.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// A kubeconfig for `user` whose certificate is `pki/<stem>.crt`, with file paths (absolute).
fn kubeconfig(layout: &Layout, port: u16, user: &str, stem: &str) -> String {
    let q = |p: PathBuf| serde_json::Value::String(p.display().to_string()).to_string();
    let user_q = serde_json::Value::String(user.to_owned()).to_string();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rustlet\n  cluster:\n    \
         server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\nusers:\n\
         - name: {user_q}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n\
         contexts:\n- name: rustlet\n  context:\n    cluster: rustlet\n    user: {user_q}\n\
         current-context: rustlet\n",
        ca = q(layout.pki("ca.crt")),
        crt = q(layout.pki(&format!("{stem}.crt"))),
        key = q(layout.pki(&format!("{stem}.key"))),
    )
}

/// The command line of each server (checked against `--help` of the pinned release).
fn server_args(server: &str, layout: &Layout, ports: Ports, opts: &Options) -> Vec<String> {
    let p = |f: &str| layout.pki(f).display().to_string();
    let dir = layout.dir.display();
    let etcd_url = format!("http://127.0.0.1:{}", ports.etcd_client);
    let peer_url = format!("http://127.0.0.1:{}", ports.etcd_peer);
    let args: Vec<String> = match server {
        "etcd" => vec![
            "--name=default".into(),
            format!("--data-dir={dir}/etcd-data"),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // A throw-away test store: no fsync keeps it quick on a busy disk.
            "--unsafe-no-fsync=true".into(),
        ],
        "kube-apiserver" => vec![
            format!("--etcd-servers={etcd_url}"),
            // In a namespace of its own the API server listens on all of that namespace's
            // addresses (its pods reach it at their gateway); else on the host's loopback only.
            format!(
                "--bind-address={}",
                if opts.netns.is_some() {
                    "0.0.0.0"
                } else {
                    "127.0.0.1"
                }
            ),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.apiserver),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,\
             NodeRestriction,DefaultStorageClass,ResourceQuota"
                .into(),
            format!("--service-account-issuer={SA_ISSUER}"),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!(
                "--kubelet-client-certificate={}",
                p("apiserver-kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            format!("--kubelet-certificate-authority={}", p("ca.crt")),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--allow-privileged=true".into(),
            // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints
            // validation refuses: keep the reconciler off on a loopback-only cluster.
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={dir}/pki/generated"),
            "--profiling=false".into(),
        ]
        .into_iter()
        .chain(
            (opts.aggregation == Aggregation::FrontProxy)
                .then(|| {
                    [
                        format!("--requestheader-client-ca-file={}", p("ca.crt")),
                        "--requestheader-allowed-names=front-proxy-client".to_owned(),
                        "--requestheader-username-headers=X-Remote-User".to_owned(),
                        "--requestheader-group-headers=X-Remote-Group".to_owned(),
                        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
                        format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                        format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                        "--enable-aggregator-routing=true".to_owned(),
                    ]
                })
                .into_iter()
                .flatten(),
        )
        .chain(
            opts.audit
                .then(|| {
                    [
                        format!("--audit-policy-file={dir}/audit-policy.yaml"),
                        format!("--audit-log-path={dir}/logs/audit.log"),
                        "--audit-log-format=json".to_owned(),
                    ]
                })
                .into_iter()
                .flatten(),
        )
        .collect(),
        "kube-controller-manager" => {
            let kc = layout
                .kubeconfig("kube-controller-manager")
                .display()
                .to_string();
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", ports.controller_manager),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--use-service-account-credentials=true".into(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                format!("--controllers={}", CONTROLLERS.join(",")),
                format!(
                    "--node-monitor-grace-period={}",
                    opts.node_monitor_grace_period
                ),
                "--profiling=false".into(),
            ]
        }
        "kube-scheduler" => {
            let kc = layout.kubeconfig("kube-scheduler").display().to_string();
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", ports.scheduler),
                "--profiling=false".into(),
            ]
        }
        other => unreachable!("no server {other}"),
    };
    args
}

/// The environment variables a server gets besides this process's own.
fn server_env(server: &str, opts: &Options) -> Vec<(&'static str, &'static str)> {
    match server {
        "kube-apiserver" if opts.sha1_tls_signatures => vec![("GODEBUG", "tlssha1=1")],
        _ => Vec::new(),
    }
}

/// kube-controller-manager's controllers (names as `--help` of the pinned release lists them):
/// what a node's tests need, nothing of a cloud. The job controller runs the `[NodeConformance]`
/// Job spec of `e2e.test` (without it the Job made no pod and the spec timed out).
const CONTROLLERS: &[&str] = &[
    "job-controller",
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "garbage-collector-controller",
    "replicaset-controller",
    "deployment-controller",
    "namespace-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "clusterrole-aggregation-controller",
    "certificatesigningrequest-signing-controller",
    "certificatesigningrequest-approving-controller",
];

/// A pid file's process, if it is still one of ours (its executable is in `bin`).
fn our_live_process(pid_file: &Path, bin: Option<&Path>) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    if !alive(pid) {
        return None;
    }
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = pid_file.file_stem()?.to_str()?;
    let ours = exe.file_name().and_then(|n| n.to_str()) == Some(name)
        && bin.is_none_or(|b| exe.parent() == Some(b));
    ours.then_some(pid)
}

/// Whether `pid` runs (a zombie has stopped).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Starts the cluster `opts` describes; returns the API server's port.
fn up(bin: &Path, opts: &Options) -> Result<u16> {
    let layout = Layout {
        dir: opts.dir.clone(),
    };
    for server in SERVERS {
        if let Some(pid) = our_live_process(&layout.pid_file(server), None) {
            bail!(
                "{server} (pid {pid}) of a cluster in {} still runs: `cargo xtask cluster down --dir {}` first",
                layout.dir.display(),
                layout.dir.display()
            );
        }
    }
    for sub in ["run", "logs"] {
        fs::create_dir_all(layout.dir.join(sub))
            .with_context(|| format!("creating {}/{sub}", layout.dir.display()))?;
    }
    // A fresh store every time: tests start from an empty cluster.
    let data = layout.dir.join("etcd-data");
    if data.exists() {
        fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
    }
    // A new CA and new ports every time: node files of an earlier `up` (other `--nodes`) would
    // name a port nothing listens on and a CA nothing trusts, so they go.
    remove_stale_node_files(&layout)?;
    write_pki(
        &layout,
        &opts.nodes,
        &opts.extra_apiserver_ips,
        &opts.extra_node_ips,
    )?;
    if opts.audit {
        write_file(&layout.dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
    }
    let ports = Ports::pick()?;
    for (user, stem) in [
        ("kubernetes-admin", "admin"),
        ("system:kube-controller-manager", "kube-controller-manager"),
        ("system:kube-scheduler", "kube-scheduler"),
    ] {
        write_file(
            &layout.kubeconfig(stem),
            &kubeconfig(&layout, ports.apiserver, user, stem),
        )?;
    }
    for node in &opts.nodes {
        let stem = format!("node-{node}");
        write_file(
            &layout.kubeconfig(&stem),
            &kubeconfig(
                &layout,
                ports.apiserver,
                &format!("system:node:{node}"),
                &stem,
            ),
        )?;
    }
    let result = start_all(bin, &layout, ports, opts);
    if result.is_err() {
        eprintln!("xtask: cluster: start failed; stopping what was started");
        let _ = down(&layout.dir);
    }
    result.map(|()| ports.apiserver)
}

fn start_all(bin: &Path, layout: &Layout, ports: Ports, opts: &Options) -> Result<()> {
    let mut children = Vec::new();
    for server in &SERVERS[..2] {
        children.push(start(bin, layout, server, ports, opts)?);
    }
    let admin = layout.kubeconfig("admin");
    wait_for("the API server's /readyz", &mut children, layout, || {
        kubectl(
            bin,
            opts.netns.as_deref(),
            &admin,
            &["get", "--raw", "/readyz"],
        )
        .is_ok_and(|o| o.status.success())
    })?;
    for server in &SERVERS[2..] {
        children.push(start(bin, layout, server, ports, opts)?);
    }
    wait_for(
        "the controller manager's and the scheduler's leader leases",
        &mut children,
        layout,
        || {
            kubectl(
                bin,
                opts.netns.as_deref(),
                &admin,
                &[
                    "-n",
                    "kube-system",
                    "get",
                    "lease",
                    "kube-controller-manager",
                    "kube-scheduler",
                ],
            )
            .is_ok_and(|o| o.status.success())
        },
    )
}

/// Starts one server in its own process group (so a terminal's ^C to `xtask` spares it),
/// logging to `logs/<server>.log`, and records its pid.
fn start(
    bin: &Path,
    layout: &Layout,
    server: &'static str,
    ports: Ports,
    opts: &Options,
) -> Result<(&'static str, Child)> {
    let log_path = layout.log(server);
    let log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let log2 = log.try_clone().context("duplicating a log file")?;
    let child = command_in(opts.netns.as_deref(), bin.join(server))
        .envs(server_env(server, opts))
        .args(server_args(server, layout, ports, opts))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .current_dir(&layout.dir)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {server}"))?;
    write_file(&layout.pid_file(server), &format!("{}\n", child.id()))?;
    eprintln!(
        "xtask: cluster: started {server} (pid {}), log {}",
        child.id(),
        log_path.display()
    );
    Ok((server, child))
}

/// Polls `ready` each second until it holds, failing early when a server exits.
fn wait_for(
    what: &str,
    children: &mut [(&'static str, Child)],
    layout: &Layout,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if ready() {
            eprintln!("xtask: cluster: {what}: ok");
            return Ok(());
        }
        for (server, child) in children.iter_mut() {
            if let Some(status) = child.try_wait().context("polling a server")? {
                bail!(
                    "{server} exited ({status}) while waiting for {what}; its log:\n{}",
                    log_tail(&layout.log(server))
                );
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{what} not ready after {READY_TIMEOUT:?}; logs in {}",
                layout.dir.join("logs").display()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `program`, run inside the network namespace `netns` when one is given (through `nsenter`,
/// which execs it: the pid is the program's).
fn command_in(netns: Option<&Path>, program: PathBuf) -> Command {
    match netns {
        Some(ns) => {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

fn kubectl(bin: &Path, netns: Option<&Path>, kubeconfig: &Path, args: &[&str]) -> Result<Output> {
    command_in(netns, bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running kubectl")
}

/// Stops every server whose pid file is in `dir` (newest first): SIGTERM, then SIGKILL after
/// 30 s. Only processes whose executable is the server the pid file names are signalled.
fn down(dir: &Path) -> Result<()> {
    let layout = Layout {
        dir: dir.to_path_buf(),
    };
    for server in SERVERS.iter().rev() {
        let pid_file = layout.pid_file(server);
        if let Some(pid) = our_live_process(&pid_file, None) {
            eprintln!("xtask: cluster: stopping {server} (pid {pid})");
            signal(pid, "TERM")?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if alive(pid) {
                eprintln!("xtask: cluster: {server} ignored SIGTERM; killing it");
                signal(pid, "KILL")?;
            }
        }
        if pid_file.exists() {
            fs::remove_file(&pid_file)
                .with_context(|| format!("removing {}", pid_file.display()))?;
        }
    }
    eprintln!(
        "xtask: cluster: down ({} kept: logs, PKI, kubeconfigs)",
        dir.display()
    );
    Ok(())
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    // It may have exited between the check and the signal: only a live process is an error.
    if !status.success() && alive(pid) {
        bail!("kill -{sig} {pid} failed: {status}");
    }
    Ok(())
}

fn env_lines(bin: &Path, dir: &Path) -> String {
    format!(
        "export KUBECONFIG={}\nexport PATH={}:$PATH\n",
        dir.join("admin.kubeconfig").display(),
        bin.display()
    )
}

fn print_usage(bin: &Path, dir: &Path, nodes: &[String]) {
    println!("The control plane is up (everything in {}).", dir.display());
    println!("Use it with:\n");
    print!("{}", env_lines(bin, dir));
    println!("kubectl get ns");
    let layout = Layout {
        dir: dir.to_owned(),
    };
    for node in nodes {
        println!(
            "\nRun node {node} (as root):\n\n{}",
            node_command(&layout, node)
        );
    }
    println!(
        "\nA node's kubeconfig: {}/node-<name>.kubeconfig. Stop it with: cargo xtask cluster down --dir {}",
        dir.display(),
        dir.display()
    );
}

/// The agent's command line for `node` of the cluster laid out in `layout`: its kubeconfig,
/// and the node certificate as the serving certificate of its port 10250 (the API server
/// verifies kubelets with the cluster CA: with the agent's own self-signed pair `kubectl logs`
/// and `exec` fail with "certificate signed by unknown authority"), the node IP that
/// certificate names (127.0.0.1: without `--node-ip` the agent reports the host's address,
/// which it does not), and the cluster CA for its clients (the API server's own client
/// certificate among them).
fn node_command(layout: &Layout, node: &str) -> String {
    let stem = format!("node-{node}");
    let path = |p: PathBuf| p.display().to_string();
    format!(
        "rustlet --node-name {node} --root-dir /var/lib/rustlet-{node} --node-ip 127.0.0.1 \\\n  \
         --kubeconfig {} \\\n  \
         --tls-cert-file {} --tls-private-key-file {} \\\n  \
         --client-ca-file {}",
        path(layout.kubeconfig(&stem)),
        path(layout.pki(&format!("{stem}.crt"))),
        path(layout.pki(&format!("{stem}.key"))),
        path(layout.pki("ca.crt")),
    )
}

/// `up` with one node, the checks of the issue with `kubectl`, `down`, and no process left.
fn smoke(root: &Path, opts: &Options) -> Result<()> {
    let node = "smoke-a";
    let opts = Options {
        nodes: vec![node.to_owned()],
        ..opts.clone()
    };
    let bin = build(root)?;
    up(&bin, &opts).map(drop)?;
    let checks = smoke_checks(&bin, &opts.dir, node);
    let pids: Vec<u32> = SERVERS
        .iter()
        .filter_map(|s| our_live_process(&opts.dir.join("run").join(format!("{s}.pid")), None))
        .collect();
    down(&opts.dir)?;
    checks?;
    let left: Vec<u32> = pids.into_iter().filter(|p| alive(*p)).collect();
    if !left.is_empty() {
        bail!("processes left after down: {left:?}");
    }
    eprintln!("xtask: cluster: smoke: ok (no process left)");
    Ok(())
}

fn smoke_checks(bin: &Path, dir: &Path, node: &str) -> Result<()> {
    let admin = dir.join("admin.kubeconfig");
    let node_kc = dir.join(format!("node-{node}.kubeconfig"));
    let run = |kc: &Path, args: &[&str], stdin: Option<&str>| -> Result<Output> {
        let mut cmd = Command::new(bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(kc).args(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("running kubectl")?;
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .context("kubectl's stdin")?
                .write_all(text.as_bytes())
                .context("writing kubectl's stdin")?;
        }
        let out = child.wait_with_output().context("waiting for kubectl")?;
        eprintln!(
            "xtask: smoke: kubectl {} -> {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out)
    };
    let stdout = |o: &Output| String::from_utf8_lossy(&o.stdout).trim().to_owned();

    let readyz = run(&admin, &["get", "--raw", "/readyz"], None)?;
    if stdout(&readyz) != "ok" {
        bail!("/readyz answered {:?}", stdout(&readyz));
    }
    let ns = run(&admin, &["get", "ns", "-o", "name"], None)?;
    for want in ["namespace/default", "namespace/kube-system"] {
        if !stdout(&ns).lines().any(|l| l == want) {
            bail!("kubectl get ns lacks {want}");
        }
    }
    let whoami = run(
        &node_kc,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username} {.status.userInfo.groups}",
        ],
        None,
    )?;
    if !stdout(&whoami).starts_with(&format!("system:node:{node} "))
        || !stdout(&whoami).contains("system:nodes")
    {
        bail!(
            "the node is {:?}, not system:node:{node} in system:nodes",
            stdout(&whoami)
        );
    }
    // The Node authorizer: a node reads its own Node only (1.37 restricts node reads to the
    // node's own object), never Secrets cluster-wide nor a Secret no pod of it uses.
    let own_node = format!("node/{node}");
    let checks: [(&[&str], &str); 5] = [
        (&["auth", "can-i", "get", &own_node], "yes"),
        (&["auth", "can-i", "get", "node/smoke-other"], "no"),
        (&["auth", "can-i", "list", "nodes"], "no"),
        (
            &["auth", "can-i", "list", "secrets", "--all-namespaces"],
            "no",
        ),
        (
            &["auth", "can-i", "get", "secret/anything", "-n", "default"],
            "no",
        ),
    ];
    for (args, want) in checks {
        let out = run(&node_kc, args, None)?;
        // `no - <the authorizer's reason>` when it gives one.
        let answer = stdout(&out);
        if answer.split_whitespace().next() != Some(want) {
            bail!(
                "kubectl {} as the node: {answer:?}, want {want:?}",
                args.join(" "),
            );
        }
    }
    // NodeRestriction: the node may create its own Node, never another's.
    let node_object = |name: &str| {
        format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}"}}}}"#)
    };
    let own = run(&node_kc, &["create", "-f", "-"], Some(&node_object(node)))?;
    if !own.status.success() {
        bail!("the node could not create its own Node");
    }
    let other = run(
        &node_kc,
        &["create", "-f", "-"],
        Some(&node_object("smoke-other")),
    )?;
    let err = String::from_utf8_lossy(&other.stderr);
    if other.status.success() || !err.contains("Forbidden") {
        bail!("the node created another node's Node (NodeRestriction is off)");
    }
    Ok(())
}

/// The cached binaries of the pinned versions, when `build` has made them; `None` otherwise
/// (nothing is built here: a test must not start a 20-minute Go build).
pub fn cached_binaries(root: &Path) -> Result<Option<PathBuf>> {
    let bin = bin_dir(&pinned_versions(root)?)?;
    Ok(BINARIES
        .iter()
        .all(|b| bin.join(b).is_file())
        .then_some(bin))
}

/// Whether `up` failed because a server found its port taken (by another process between
/// the pick and the bind).
fn is_port_race(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("address already in use")
}

/// A control plane started for one test, as `cargo xtask cluster up` starts it, and stopped
/// (every process it started, as `down`) when dropped, also when the test panics.
pub struct TestCluster {
    bin: PathBuf,
    dir: PathBuf,
    apiserver_port: u16,
    netns: Option<PathBuf>,
}

impl TestCluster {
    /// Starts a cluster in `opts.dir` with the binaries in `bin` (see [`cached_binaries`]).
    pub fn up(bin: &Path, opts: &Options) -> Result<Self> {
        // The ports are picked free and released before the servers bind them: a cluster of
        // a test running beside this one may take one in between ("address already in use",
        // seen in CI). `up` stops what it started on a failure; a new try picks new ports.
        let mut tries = 0;
        let apiserver_port = loop {
            tries += 1;
            match up(bin, opts) {
                Ok(port) => break port,
                Err(e) if tries < 3 && is_port_race(&e) => {
                    eprintln!("xtask: cluster: a port was taken meanwhile; again with new ports");
                }
                Err(e) => return Err(e),
            }
        };
        Ok(Self {
            bin: bin.to_owned(),
            dir: opts.dir.clone(),
            apiserver_port,
            netns: opts.netns.clone(),
        })
    }

    /// The directory of its PKI, kubeconfigs, logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where `kubectl` and the servers are.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The network namespace it runs in, if not this process's.
    pub fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    /// The API server's port on 127.0.0.1 (of [`Self::netns`] when it has one).
    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// The kubeconfig of `kubernetes-admin` (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The kubeconfig of `system:node:<node>` (one of `Options::nodes`).
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.dir.join(format!("node-{node}.kubeconfig"))
    }

    /// A file of the cluster's PKI (`ca.crt`, `node-<name>.crt`...).
    pub fn pki(&self, file: &str) -> PathBuf {
        self.dir.join("pki").join(file)
    }

    /// `kubectl` as the admin, with `stdin` when given; its output whatever its exit status.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let mut cmd = command_in(self.netns.as_deref(), self.bin.join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .arg("--request-timeout=30s")
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("running kubectl")?;
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .context("kubectl's stdin")?
                .write_all(text.as_bytes())
                .context("writing kubectl's stdin")?;
        }
        child.wait_with_output().context("waiting for kubectl")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Err(e) = down(&self.dir) {
            eprintln!(
                "xtask: cluster: stopping the test cluster in {}: {e:#}",
                self.dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl x509 -ext subjectAltName` of a certificate: its names, as text.
    fn subject_alt_names(cert: &Path) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(cert)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// An `up` without the nodes of an earlier one leaves none of their kubeconfigs or
    /// certificates (they named the earlier port and CA: rustlet's first try against the
    /// cluster met `client error (Connect)` through such a kubeconfig); others stay.
    #[test]
    fn an_earlier_ups_node_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            dir: dir.path().to_owned(),
        };
        fs::create_dir_all(dir.path().join("pki")).unwrap();
        for file in [
            "node-a.kubeconfig",
            "pki/node-a.crt",
            "pki/node-a.key",
            "admin.kubeconfig",
            "pki/ca.crt",
            "node-notes.txt",
        ] {
            fs::write(dir.path().join(file), "x").unwrap();
        }
        remove_stale_node_files(&layout).unwrap();
        for gone in ["node-a.kubeconfig", "pki/node-a.crt", "pki/node-a.key"] {
            assert!(!dir.path().join(gone).exists(), "{gone}");
        }
        for kept in ["admin.kubeconfig", "pki/ca.crt", "node-notes.txt"] {
            assert!(dir.path().join(kept).exists(), "{kept}");
        }
    }

    /// Issue 26: a node certificate also serves the node's port 10250 at the node IPs the API
    /// server reaches it at (`extra_node_ips`), besides 127.0.0.1 and the node's name.
    #[test]
    fn node_certificates_name_the_extra_node_ips() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            dir: dir.path().to_owned(),
        };
        write_pki(&layout, &["node-a".to_owned()], &[], &[[10, 88, 0, 1]]).unwrap();
        let text = subject_alt_names(&layout.pki("node-node-a.crt"));
        assert!(text.contains("IP Address:10.88.0.1"), "{text}");
        assert!(text.contains("IP Address:127.0.0.1"), "{text}");
        assert!(text.contains("DNS:node-a"), "{text}");
    }

    /// `up` prints each node's command line: every file it names is one `up` wrote, and the
    /// serving certificate names the node IP it gives (a self-signed pair or another address
    /// makes `kubectl logs` fail with an x509 error).
    #[test]
    fn the_printed_node_command_names_the_files_up_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            dir: dir.path().to_owned(),
        };
        write_pki(&layout, &["node-a".to_owned()], &[], &[]).unwrap();
        write_file(&layout.kubeconfig("node-node-a"), "x").unwrap();
        let command = node_command(&layout, "node-a");
        let words: Vec<&str> = command.split_whitespace().filter(|w| *w != "\\").collect();
        let value = |flag: &str| {
            let i = words
                .iter()
                .position(|w| *w == flag)
                .unwrap_or_else(|| panic!("{flag}"));
            words[i + 1]
        };
        for (flag, file) in [
            ("--kubeconfig", layout.kubeconfig("node-node-a")),
            ("--tls-cert-file", layout.pki("node-node-a.crt")),
            ("--tls-private-key-file", layout.pki("node-node-a.key")),
            ("--client-ca-file", layout.pki("ca.crt")),
        ] {
            assert_eq!(Path::new(value(flag)), file, "{flag}");
            assert!(file.is_file(), "{flag}: {}", file.display());
        }
        assert_eq!(value("--node-name"), "node-a");
        let names = subject_alt_names(&layout.pki("node-node-a.crt"));
        assert!(
            names.contains(&format!("IP Address:{}", value("--node-ip"))),
            "{names}"
        );
    }

    /// The pinned Kubernetes is the release the workspace's k8s-openapi version feature names.
    #[test]
    fn pinned_kubernetes_matches_the_k8s_openapi_feature() {
        let root = crate::workspace_root();
        let v = pinned_versions(&root).unwrap();
        let cargo = fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let line = cargo
            .lines()
            .find(|l| l.starts_with("k8s-openapi"))
            .unwrap();
        let feature = format!("\"v1_{}\"", v.kubernetes_minor().unwrap());
        assert!(
            line.contains(&feature),
            "{line} lacks {feature} for {}",
            v.kubernetes
        );
        assert!(v.etcd.starts_with("v3."), "{}", v.etcd);
    }

    /// Every staging module is replaced with the pinned release's `v0.<minor>.<patch>`.
    #[test]
    fn staging_modules_are_replaced_at_the_pinned_release() {
        let root = crate::workspace_root();
        let v = pinned_versions(&root).unwrap();
        let staging = v.kubernetes.replacen("v1.", "v0.", 1);
        let go_mod = fs::read_to_string(root.join("tools/k8s/go.mod")).unwrap();
        let replaces: Vec<&str> = go_mod
            .lines()
            .filter(|l| l.trim_start().starts_with("replace k8s.io/"))
            .collect();
        for module in [
            "k8s.io/api",
            "k8s.io/apimachinery",
            "k8s.io/client-go",
            "k8s.io/apiserver",
        ] {
            assert!(
                replaces
                    .iter()
                    .any(|l| l.contains(&format!("{module} => {module} {staging}"))),
                "no replace of {module} at {staging}"
            );
        }
        assert!(
            replaces.iter().all(|l| l.ends_with(&staging)),
            "{replaces:?}"
        );
    }

    #[test]
    fn go_mod_require_lines_parse() {
        let v = parse_go_mod(
            "module x\nrequire go.etcd.io/etcd/server/v3 v3.7.0\nrequire (\n\tk8s.io/kubernetes v1.37.2 // indirect\n\tk8s.io/kubernetes-x v9\n)\n",
        )
        .unwrap();
        assert_eq!(
            v,
            Versions {
                kubernetes: "v1.37.2".into(),
                etcd: "v3.7.0".into()
            }
        );
        assert!(parse_go_mod("module x\n").is_err());
    }

    /// `--help` prints the usage (anywhere among the arguments), and the usage names every
    /// task `main` runs and every option `Options::parse` takes.
    #[test]
    fn the_usage_is_printed_for_help_and_names_every_task_and_option() {
        let args = |list: &[&str]| list.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        assert!(wants_help(&args(&["--help"])));
        assert!(wants_help(&args(&["up", "-h"])));
        assert!(wants_help(&args(&["help"])));
        assert!(!wants_help(&args(&["up", "--dir", "/tmp/c"])));
        assert!(main(Path::new("/nonexistent"), &args(&["--help"])).is_ok());
        for task in ["build", "up", "down", "env", "smoke"] {
            assert!(USAGE.contains(&format!("\n  {task} ")), "{task}");
        }
        let source = include_str!("cluster.rs");
        let parse = &source[source.find("fn parse(").unwrap()..];
        let parse = &parse[..parse.find("other => bail!").unwrap()];
        let flags: Vec<&str> = parse
            .split('"')
            .filter(|part| part.starts_with("--") && !part.contains(' '))
            .collect();
        assert!(flags.len() >= 6, "{flags:?}");
        for flag in flags {
            assert!(
                USAGE.contains(&format!("  {flag} ")),
                "{flag} is not in the usage"
            );
        }
        let unknown = main(Path::new("/nonexistent"), &args(&["frobnicate"])).unwrap_err();
        assert!(unknown.to_string().contains("usage:"), "{unknown}");
    }

    #[test]
    fn options_parse_nodes_dir_and_grace_period() {
        let args: Vec<String> = [
            "--dir",
            "/tmp/c",
            "--nodes=a,b.c",
            "--node-monitor-grace-period",
            "9s",
        ]
        .map(str::to_owned)
        .to_vec();
        let o = Options::parse(&args).unwrap();
        assert_eq!(o.dir, PathBuf::from("/tmp/c"));
        assert_eq!(o.nodes, ["a", "b.c"]);
        assert_eq!(o.node_monitor_grace_period, "9s");
        for bad in ["A", "-a", "a..b", "a_b"] {
            assert!(
                Options::parse(&["--nodes".into(), bad.into()]).is_err(),
                "{bad}"
            );
        }
    }

    /// Every server listens on 127.0.0.1 only, and the API server has the authorizers and
    /// admission plugins of a secure cluster.
    #[test]
    fn servers_listen_on_loopback_only() {
        let layout = Layout {
            dir: PathBuf::from("/c"),
        };
        let ports = Ports {
            etcd_client: 1,
            etcd_peer: 2,
            apiserver: 3,
            controller_manager: 4,
            scheduler: 5,
        };
        let opts = Options::parse(&[]).unwrap();
        for server in SERVERS {
            let args = server_args(server, &layout, ports, &opts);
            for a in &args {
                if (a.contains("://") && !a.starts_with("--service-account-issuer"))
                    || a.starts_with("--bind-address")
                {
                    assert!(a.contains("127.0.0.1"), "{server}: {a}");
                }
            }
        }
        let api = server_args("kube-apiserver", &layout, ports, &opts);
        assert!(api.contains(&"--authorization-mode=Node,RBAC".to_owned()));
        let admission = api
            .iter()
            .find_map(|a| a.strip_prefix("--enable-admission-plugins="))
            .unwrap();
        for plugin in ["NodeRestriction", "ServiceAccount"] {
            assert!(admission.split(',').any(|p| p == plugin), "{plugin}");
        }
    }

    /// `--aggregation` gives the API server the front proxy's flags (the request-header CA,
    /// the allowed name and headers, its client certificate, the aggregator's endpoint
    /// routing), and nothing of it by default.
    #[test]
    fn the_aggregation_layer_is_set_up_only_when_asked() {
        let layout = Layout {
            dir: PathBuf::from("/c"),
        };
        let ports = Ports {
            etcd_client: 1,
            etcd_peer: 2,
            apiserver: 3,
            controller_manager: 4,
            scheduler: 5,
        };
        let off = Options::parse(&[]).unwrap();
        let args = server_args("kube-apiserver", &layout, ports, &off);
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--requestheader") || a.starts_with("--proxy-client")),
            "{args:?}"
        );
        let on = Options::parse(&["--aggregation".to_owned()]).unwrap();
        assert_eq!(on.aggregation, Aggregation::FrontProxy);
        let args = server_args("kube-apiserver", &layout, ports, &on);
        for flag in [
            "--requestheader-client-ca-file=/c/pki/ca.crt",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--proxy-client-cert-file=/c/pki/front-proxy-client.crt",
            "--proxy-client-key-file=/c/pki/front-proxy-client.key",
            "--enable-aggregator-routing=true",
        ] {
            assert!(args.contains(&flag.to_owned()), "{flag} in {args:?}");
        }
    }

    /// `Options::sha1_tls_signatures` reaches the API server alone, as the GODEBUG setting
    /// that lets Go sign TLS 1.2 handshakes with SHA-1; no server gets it by default.
    #[test]
    fn the_api_server_takes_sha1_tls_signatures_only_when_asked() {
        let mut opts = Options::parse(&[]).unwrap();
        for server in SERVERS {
            assert_eq!(server_env(server, &opts), Vec::new(), "{server}");
        }
        opts.sha1_tls_signatures = true;
        assert_eq!(
            server_env("kube-apiserver", &opts),
            vec![("GODEBUG", "tlssha1=1")]
        );
        for server in SERVERS.iter().filter(|s| **s != "kube-apiserver") {
            assert_eq!(server_env(server, &opts), Vec::new(), "{server}");
        }
    }

    /// The PKI: every certificate chains to the CA and carries the identity the authorizers
    /// read (checked with openssl, independent of rcgen).
    #[test]
    fn pki_certificates_chain_to_the_ca_with_their_identities() {
        let dir = std::env::temp_dir().join(format!("xtask-pki-{}", std::process::id()));
        let layout = Layout { dir: dir.clone() };
        write_pki(&layout, &["n1".to_owned()], &[[10, 88, 0, 1]], &[]).unwrap();
        let ca = layout.pki("ca.crt");
        for (stem, subject) in [
            ("admin", "CN=kubernetes-admin, O=system:masters"),
            ("node-n1", "CN=system:node:n1, O=system:nodes"),
            ("apiserver", "CN=kube-apiserver"),
            ("front-proxy-client", "CN=front-proxy-client"),
            (
                "kube-controller-manager",
                "CN=system:kube-controller-manager",
            ),
        ] {
            let crt = layout.pki(&format!("{stem}.crt"));
            let verify = Command::new("openssl")
                .args(["verify", "-CAfile"])
                .arg(&ca)
                .arg(&crt)
                .output()
                .unwrap();
            assert!(verify.status.success(), "{stem}: {verify:?}");
            let text = Command::new("openssl")
                .args([
                    "x509",
                    "-noout",
                    "-subject",
                    "-nameopt",
                    "sep_comma_plus_space",
                    "-in",
                ])
                .arg(&crt)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout);
            assert!(text.contains(subject), "{stem}: {text}");
        }
        let san = subject_alt_names(&layout.pki("apiserver.crt"));
        assert!(
            san.contains("IP Address:127.0.0.1")
                && san.contains("IP Address:10.88.0.1")
                && san.contains("DNS:localhost"),
            "{san} (with --apiserver-ip 10.88.0.1)"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A server's bind failure is told from other failures: only it is tried again.
    #[test]
    fn a_taken_port_is_a_port_race_and_other_failures_are_not() {
        let race = anyhow::anyhow!(
            "kube-controller-manager exited (exit status: 1) while waiting; its log:\n\
             failed to listen on 127.0.0.1:41925: bind: address already in use"
        );
        assert!(is_port_race(&race.context("cluster up")));
        assert!(!is_port_race(&anyhow::anyhow!(
            "etcd exited (exit status: 2)"
        )));
    }
}
