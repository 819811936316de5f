//! Starting the agent, talking to its HTTP endpoints, and waiting for states.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a state may take to appear before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running agent.
pub struct Agent {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
    /// The network namespace the agent runs in (`None`: this process's).
    pub netns: Option<PathBuf>,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs the binary with `args` (and `--listen` on a free port); its stderr goes to `log`.
pub fn start(args: &[&str], log: &Path) -> Agent {
    start_in(None, args, log)
}

/// [`start`] inside the network namespace `netns` (a `/proc/<pid>/ns/net`), through
/// `nsenter`; the endpoints are then reached from inside it too.
pub fn start_in(netns: Option<&Path>, args: &[&str], log: &Path) -> Agent {
    start_with_env(netns, args, &[], log)
}

/// [`start_in`] with environment variables set for the agent alone.
pub fn start_with_env(
    netns: Option<&Path>,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Agent {
    let port = match netns {
        // A fresh namespace has every port free.
        Some(_) => 10255,
        None => free_port(),
    };
    let listen = format!("127.0.0.1:{port}");
    let stderr = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut command = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(env!("CARGO_BIN_EXE_rustlet"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_rustlet")),
    };
    // The tests start many agents in one network namespace: none serves the kubelet server
    // (on :10250 by default in kube mode, as the kubelet's) unless the test asks for it.
    if !args.iter().any(|a| a.starts_with("--enable-server")) {
        command.arg("--enable-server=false");
    }
    // Nor the healthz endpoint (127.0.0.1:10248 by default, as the kubelet's).
    if !args.iter().any(|a| a.starts_with("--healthz-port")) {
        command.arg("--healthz-port=0");
    }
    let child = command
        .args(args)
        .args(["--listen", &listen])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("starting rustlet");
    let agent = Agent {
        child,
        port,
        log: log.to_owned(),
        netns: netns.map(Path::to_owned),
    };
    agent.wait_for("healthy", || {
        agent.get("/healthz").filter(|(code, _)| *code == 200)
    });
    agent
}

/// Runs the binary to its end; returns its exit status and stderr.
pub fn run_to_end(args: &[&str]) -> (ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rustlet"))
        .args(args)
        .output()
        .expect("running rustlet");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Agent {
    /// `GET path`: the status code and the body, or `None` when nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = self.connect()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        // HTTP/1.0: the body ends with the connection (`/pods` streams its list, which an
        // HTTP/1.1 client receives chunked).
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    }

    /// A connection to the endpoints: in the agent's network namespace when it has its own
    /// (this thread enters it for the connect only; the socket stays in it).
    fn connect(&self) -> Option<TcpStream> {
        let Some(ns) = &self.netns else {
            return TcpStream::connect(("127.0.0.1", self.port)).ok();
        };
        use nix::sched::{CloneFlags, setns};
        let own = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let target = std::fs::File::open(ns).ok()?;
        setns(&target, CloneFlags::CLONE_NEWNET).unwrap();
        let stream = TcpStream::connect(("127.0.0.1", self.port));
        setns(&own, CloneFlags::CLONE_NEWNET).expect("back to the test's network namespace");
        stream.ok()
    }

    /// The `/pods` list's items.
    pub fn pods(&self) -> Vec<Value> {
        self.get("/pods")
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The pod named `name` from `/pods`.
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
    }

    /// Polls `check` until it gives a value; fails with the agent's log otherwise.
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(value) = check() {
                return value;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("timed out waiting for {what}; agent log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the pod has this phase; returns it.
    pub fn wait_for_phase(&self, name: &str, phase: &str) -> Value {
        self.wait_for(&format!("pod {name} {phase}"), || {
            self.pod(name).filter(|p| p["status"]["phase"] == phase)
        })
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        self.child.wait().unwrap()
    }

    /// Waits until the agent exits by itself; its exit status.
    pub fn wait_exit(mut self) -> ExitStatus {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not exit; log: {:?}",
                self.log
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mount points at or below `dir`, from this process's mount table.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_string_lossy().into_owned();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// A condition's status in a pod's status.
pub fn condition(pod: &Value, type_: &str) -> Option<String> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(str::to_owned))
}
