//! What every real-cluster test needs: a control plane of its own (xtask's [`TestCluster`]:
//! upstream's etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback,
//! stopped when the test ends), `kubectl` as the admin, the API server's audit log, and a
//! forwarder that brings the API server into a private containerd's network namespace (where
//! the agent of a CRI test runs and its pods live).

use std::io::Read as _;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustlet_mount::testing::{PrivilegedDir, privileged_dir};
use serde_json::Value;
use xtask::cluster::{Options, TestCluster, cached_binaries};

/// How long a cluster-side state (scheduling, controllers, the agent's reports) may take.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The address of the private containerd's bridge (`10.88.0.0/16`, host-local's first
/// address): the node's own address as its pods see it.
pub const POD_NETWORK_GATEWAY: [u8; 4] = [10, 88, 0, 1];

/// The `evictionHard` of every test agent: upstream's memory threshold, and 1 % for the disk
/// (the default 10 %). The agents share the machine's disk with the build; on a machine with
/// less than 10 % free, the default makes every node report DiskPressure, as upstream's kubelet
/// would, the controller taints it, and no pod is scheduled: tests of scheduling lower the
/// disk thresholds as an operator of such a node would.
pub const TEST_EVICTION_HARD: &str = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"1%\"\n  nodefs.inodesFree: \"1%\"\n";

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

    /// [`Self::refused_requests_of`] `system:node:<node>` but for the TokenRequests the API
    /// server refused only because its caches lagged behind its store (see
    /// [`refusals_of_lagging_caches`]).
    ///
    /// The refusals of the moment after a binding that were answered on a later try
    /// ([`Self::refusals_beyond_binding_lag`]: a ConfigMap or Secret read, a TokenRequest) are
    /// forgiven too.
    pub fn refused_requests_of_node(&self, node: &str) -> Vec<String> {
        let mut refused = self
            .refusals_beyond_binding_lag(&format!("system:node:{node}"))
            .refused;
        for explained in refusals_of_lagging_caches(&self.audit_events(), node) {
            if let Some(i) = refused.iter().position(|r| *r == explained) {
                refused.remove(i);
            }
        }
        refused
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

    /// [`Self::wait_for`] with a deadline of `limit` instead of [`DEADLINE`] (for what a
    /// cluster does on a clock of minutes, such as a token refresh).
    pub fn wait_for_within<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            match check() {
                Ok(value) => return value,
                Err(seen) if Instant::now() > deadline => {
                    panic!("timed out after {limit:?} waiting for {what}; last seen: {seen}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
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

/// Of the audit `events`, the TokenRequests of `system:node:<node>` that the API server
/// refused only because its caches lagged behind its store, as [`Cluster::refused_requests_of`]
/// words them: each names (in its audited body) a pod whose binding to `node` had completed
/// before the request came, and a later TokenRequest of the node for that pod was granted.
/// NodeRestriction reads the pod from the API server's informer and the Node authorizer its
/// graph, both fed by a watch that can trail the node's own watch of its pods; upstream's
/// kubelet meets the same refusal ("node requested token bound to a pod scheduled on a
/// different node", or "no relationship found") and retries the mount, as the agent does. A
/// refused token for a pod not bound to the node before it, or never granted, is not here.
pub fn refusals_of_lagging_caches(events: &[Value], node: &str) -> Vec<String> {
    let user = format!("system:node:{node}");
    let bound_at = |pod_uid: &str| {
        events
            .iter()
            .filter(|e| e["objectRef"]["subresource"] == "binding")
            .filter(|e| e["responseStatus"]["code"] == 201)
            .filter(|e| e["requestObject"]["metadata"]["uid"] == pod_uid)
            .filter(|e| e["requestObject"]["target"]["name"] == node)
            .filter_map(|e| e["stageTimestamp"].as_str())
            .min()
    };
    let token_requests = |code: u64| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["user"]["username"] == user.as_str())
            .filter(|e| e["objectRef"]["subresource"] == "token")
            .filter(|e| e["responseStatus"]["code"] == code)
            .collect()
    };
    let granted = token_requests(201);
    let mut explained = Vec::new();
    for refused in token_requests(403) {
        let pod = &refused["requestObject"]["spec"]["boundObjectRef"];
        let (Some(uid), Some(at)) = (
            pod["uid"].as_str(),
            refused["requestReceivedTimestamp"].as_str(),
        ) else {
            continue;
        };
        // Audit timestamps are RFC 3339 in UTC with microseconds: their text sorts as time.
        let bound_before = bound_at(uid).is_some_and(|bound| bound < at);
        let granted_later = granted.iter().any(|g| {
            g["requestObject"]["spec"]["boundObjectRef"]["uid"] == uid
                && g["requestReceivedTimestamp"]
                    .as_str()
                    .is_some_and(|t| t > at)
        });
        if bound_before && granted_later {
            explained.push(format!(
                "403 {} {}: {}",
                refused["verb"].as_str().unwrap_or_default(),
                refused["requestURI"].as_str().unwrap_or_default(),
                refused["responseStatus"]["message"]
                    .as_str()
                    .unwrap_or_default()
            ));
        }
    }
    explained
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

/// A network namespace of its own for one agent (only its loopback, up), kept by a bind mount
/// on a file in a privileged temp dir as `rustlet_cri::testing::PrivateContainerd` keeps
/// containerd's; the mount goes when it is dropped. `None` after saying why when the test
/// cannot make one (it needs root in the test run's private mount namespace); under
/// `RUSTLET_REQUIRE_PRIVILEGED=1` that fails instead.
pub struct PrivateNetns {
    dir: PrivilegedDir,
}

impl PrivateNetns {
    pub fn new(test: &str) -> Option<Self> {
        let dir = privileged_dir(test)?;
        let path = dir.path().join("netns");
        std::fs::write(&path, "").expect("the netns file");
        let status = Command::new("unshare")
            .arg(format!("--net={}", path.display()))
            .args(["ip", "link", "set", "lo", "up"])
            .status()
            .expect("running unshare --net");
        assert!(status.success(), "creating the network namespace: {status}");
        Some(Self { dir })
    }

    /// The namespace: a path for `nsenter --net=`, `setns` or [`Forwarder::into_netns`].
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("netns")
    }

    /// The privileged temp dir the namespace's file is in; what is mounted beneath it is
    /// unmounted when the namespace is dropped (a place for the agent's root dir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `kubectl get <args> --watch -o json` as the admin: every version of the objects the API
/// server sends, each with the moment it arrived here. Stops kubectl when dropped.
pub struct Watch {
    child: Child,
    seen: Receiver<(Instant, Value)>,
}

impl Cluster {
    /// Starts a [`Watch`] of `kubectl get <args>`.
    pub fn watch(&self, args: &[&str]) -> Watch {
        let mut child = Command::new(self.inner.bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.inner.admin_kubeconfig())
            .arg("get")
            .args(args)
            .args(["--watch", "-o", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("running kubectl get --watch");
        let stdout = child.stdout.take().expect("kubectl's stdout");
        let (send, seen) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let objects = serde_json::Deserializer::from_reader(stdout).into_iter::<Value>();
            for object in objects {
                let Ok(object) = object else { return };
                if send.send((Instant::now(), object)).is_err() {
                    return;
                }
            }
        });
        Watch { child, seen }
    }
}

impl Watch {
    /// The next version that arrives before `until`, with when it arrived; `None` once
    /// `until` has passed. Fails when kubectl's watch ends.
    pub fn next_before(&mut self, until: Instant) -> Option<(Instant, Value)> {
        let wait = until.saturating_duration_since(Instant::now());
        match self.seen.recv_timeout(wait) {
            Ok(seen) => Some(seen),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                panic!("kubectl's watch ended: {:?}", self.child.try_wait())
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
