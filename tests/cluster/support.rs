//! What every real-cluster test needs: a control plane of its own (xtask's [`TestCluster`]:
//! upstream's etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback,
//! stopped when the test ends), `kubectl` as the admin, the API server's audit log, and a
//! forwarder that brings the API server into a private containerd's network namespace (where
//! the agent of a CRI test runs and its pods live).

use std::io::Read as _;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use xtask::cluster::{Options, TestCluster, cached_binaries};

/// How long a cluster-side state (scheduling, controllers, the agent's reports) may take.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The address of the private containerd's bridge (`10.88.0.0/16`, host-local's first
/// address): the node's own address as its pods see it.
pub const POD_NETWORK_GATEWAY: [u8; 4] = [10, 88, 0, 1];

/// A control plane for one test; its directory is kept when the test fails.
pub struct Cluster {
    pub inner: TestCluster,
    dir: Option<tempfile::TempDir>,
}

/// Starts a cluster with certificates for `nodes` (and whatever `tune` changes), or `None`
/// after saying why when the control plane has not been built (`cargo xtask cluster build`);
/// under `RUSTLET_REQUIRE_CLUSTER=1` (as `.ci/run` sets) that fails instead.
pub fn cluster(test: &str, nodes: &[&str], tune: impl FnOnce(&mut Options)) -> Option<Cluster> {
    let root = xtask::workspace_root();
    let bin = cached_binaries(&root).expect("reading tools/k8s/go.mod");
    let Some(bin) = bin else {
        if std::env::var("RUSTLET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!("{test}: the control plane is not built and RUSTLET_REQUIRE_CLUSTER=1");
        }
        eprintln!("{test}: skipped: the control plane is not built (cargo xtask cluster build)");
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("rustlet-{test}-"))
        .tempdir()
        .expect("a temp dir");
    let mut opts = Options::new(dir.path().join("cluster"), nodes);
    opts.audit = true;
    tune(&mut opts);
    let inner =
        TestCluster::up(&bin, &opts).unwrap_or_else(|e| panic!("{test}: cluster up: {e:#}"));
    Some(Cluster {
        inner,
        dir: Some(dir),
    })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("the cluster's files are kept: {}", dir.keep().display());
        }
    }
}

impl Cluster {
    /// A directory for the test's own files (root dirs, logs), removed with the cluster's.
    pub fn scratch(&self, name: &str) -> PathBuf {
        let path = self.dir.as_ref().expect("live").path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// `kubectl` as the admin; its output whatever its exit status.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.inner
            .kubectl(args, stdin)
            .unwrap_or_else(|e| panic!("kubectl {}: {e:#}", args.join(" ")))
    }

    /// `kubectl` as the admin; its stdout, failing the test when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_stdin(args, None)
    }

    fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("kubectl prints UTF-8")
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(yaml));
    }

    /// `kubectl get <args> -o json`, parsed.
    pub fn get(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend(args);
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).expect("kubectl -o json prints JSON")
    }

    /// Like [`Self::get`], `None` when kubectl fails (NotFound).
    pub fn try_get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get"];
        all.extend(args);
        all.extend(["-o", "json"]);
        let out = self.kubectl_output(&all, None);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("kubectl -o json prints JSON"))
    }

    /// The API server's audit events so far (one JSON object per request).
    pub fn audit_events(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.inner.dir().join("logs/audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The audit events of requests by `user` that the API server refused with 4xx other
    /// than 404 and 409 (NotFound and Conflict are answers a client handles) and than a 403
    /// for writing into a namespace being deleted (`NamespaceTerminating`: an event about a
    /// pod of that namespace, as upstream's kubelet meets it too), each as
    /// `"<code> <verb> <requestURI>: <message>"`.
    pub fn refused_requests_of(&self, user: &str) -> Vec<String> {
        self.audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == user)
            .filter(|e| {
                let causes = e["responseStatus"]["details"]["causes"].as_array();
                !causes.is_some_and(|c| c.iter().any(|c| c["reason"] == "NamespaceTerminating"))
            })
            .filter_map(|e| {
                let code = e["responseStatus"]["code"].as_u64()?;
                ((400..500).contains(&code) && code != 404 && code != 409).then(|| {
                    format!(
                        "{code} {} {}: {}",
                        e["verb"].as_str().unwrap_or_default(),
                        e["requestURI"].as_str().unwrap_or_default(),
                        e["responseStatus"]["message"].as_str().unwrap_or_default()
                    )
                })
            })
            .collect()
    }

    /// [`Self::refused_requests_of`] without the refusals of the moment after a pod's
    /// binding, which upstream's kubelet meets too and retries: the Node authorizer's graph and
    /// NodeRestriction's pod cache follow the API server's own watch, a moment behind the
    /// binding, so a read of the new pod's ConfigMap or Secret is denied (`no relationship
    /// found between node ...`) and a token for it refused (`... bound to a pod scheduled on a
    /// different node`) until they catch up (kubernetes/kubernetes#49880, #113429, #133269).
    /// Each of those must have been answered (2xx) when asked again; the report says how many
    /// there were and the longest wait. (The cluster bench uses it; the tests do not yet.)
    #[allow(dead_code)]
    pub fn refusals_beyond_binding_lag(&self, user: &str) -> Refusals {
        const LAG: [&str; 2] = [
            "no relationship found between node",
            "node requested token bound to a pod scheduled on a different node",
        ];
        let (lagging, refused): (Vec<String>, Vec<String>) = self
            .refused_requests_of(user)
            .into_iter()
            .partition(|r| r.starts_with("403 ") && LAG.iter().any(|m| r.contains(m)));
        let events: Vec<Value> = self
            .audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == user)
            .collect();
        let at = |e: &Value| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .expect("an audit event has requestReceivedTimestamp")
        };
        let answered = |e: &Value| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| (200..300).contains(&c))
        };
        let mut longest_wait = Duration::ZERO;
        for denied in events.iter().filter(|e| {
            e["responseStatus"]["code"] == 403
                && e["responseStatus"]["message"]
                    .as_str()
                    .is_some_and(|m| LAG.iter().any(|l| m.contains(l)))
        }) {
            let uri = &denied["requestURI"];
            let later = events
                .iter()
                .filter(|e| e["requestURI"] == *uri && answered(e) && at(e) > at(denied))
                .map(at)
                .min()
                .unwrap_or_else(|| panic!("{uri} was refused after a binding, never answered"));
            let wait = Duration::try_from(later.duration_since(at(denied))).unwrap_or_default();
            longest_wait = longest_wait.max(wait);
        }
        Refusals {
            refused,
            binding_lag: lagging.len(),
            longest_wait,
        }
    }

    /// A copy of `node`'s kubeconfig whose server is `https://127.0.0.1:<port>` (a forwarder's
    /// port), written beside the original.
    pub fn node_kubeconfig_at(&self, node: &str, port: u16) -> PathBuf {
        let original = self.inner.node_kubeconfig(node);
        let text = std::fs::read_to_string(&original).unwrap();
        let from = format!("https://127.0.0.1:{}", self.inner.apiserver_port());
        assert!(text.contains(&from), "{} names {from}", original.display());
        let path = original.with_extension(format!("{port}.kubeconfig"));
        std::fs::write(
            &path,
            text.replace(&from, &format!("https://127.0.0.1:{port}")),
        )
        .unwrap();
        path
    }

    /// Polls `check` each 200 ms until it gives a value; fails after [`DEADLINE`], saying
    /// what was awaited and the last thing seen.
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match check() {
                Ok(value) => return value,
                Err(seen) if Instant::now() > deadline => {
                    panic!("timed out after {DEADLINE:?} waiting for {what}; last seen: {seen}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

/// What [`Cluster::refusals_beyond_binding_lag`] found.
#[allow(dead_code)]
#[derive(Debug)]
pub struct Refusals {
    /// Refused requests, as [`Cluster::refused_requests_of`] shows them, but those of the
    /// moment after a binding.
    pub refused: Vec<String>,
    /// How many requests were refused in the moment after a binding, each answered later.
    pub binding_lag: usize,
    /// The longest wait from such a refusal to the answer of the same request.
    pub longest_wait: Duration,
}

/// Accepts connections on `0.0.0.0:<port>` inside a network namespace and joins each to
/// `target` in this process's own (the API server on the host's loopback), so that an agent
/// and pods in that namespace reach the API server without a route out of it: nothing of
/// the host's network changes. Stops accepting when dropped.
pub struct Forwarder {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    pub fn into_netns(netns: &Path, target: SocketAddr) -> Self {
        use nix::sched::{CloneFlags, setns};
        let own = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let theirs = std::fs::File::open(netns).unwrap();
        // The socket belongs to the namespace of the thread that makes it.
        setns(&theirs, CloneFlags::CLONE_NEWNET).expect("entering the test's network namespace");
        let listener = TcpListener::bind("0.0.0.0:0");
        setns(&own, CloneFlags::CLONE_NEWNET).expect("back to the test's network namespace");
        let listener = listener.expect("binding the forwarder in the namespace");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        inbound.set_nonblocking(false).unwrap();
                        if let Ok(outbound) = TcpStream::connect(target) {
                            splice(inbound, outbound);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => return,
                }
            }
        });
        Self { port, stop }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies bytes both ways between `a` and `b` until each side has closed.
fn splice(a: TcpStream, b: TcpStream) {
    let pump = |mut from: TcpStream, to: TcpStream| {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            let mut to = to;
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    };
    pump(a.try_clone().unwrap(), b.try_clone().unwrap());
    pump(b, a);
}
