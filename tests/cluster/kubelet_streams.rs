//! Issue 26 item 4 through the real control plane: `kubectl exec -it` driven through a
//! pseudo-terminal the test opens, `kubectl attach` (with and without a TTY), `kubectl
//! port-forward` to a TCP server in a pod, the node proxy's `/run`, an idle session closed
//! after `streamingConnectionIdleTimeout`, and `kubectl logs --since`/`--since-time`. Each
//! goes kubectl → API server → the agent's port 10250 → containerd's stream server (or CRI
//! `ExecSync`), on a [`ServedNode`].

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustlet_cri::testing::BUSYBOX_IMAGE;
use serde_json::Value;

use crate::kubelet_server::ServedNode;
use crate::node::wait_ready;
use crate::support::{Cluster, DEADLINE};

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: streams
  namespace: default
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 1
  containers:
  - name: shell
    image: IMAGE
    command: [sleep, '3600']
  - name: reader
    image: IMAGE
    stdin: true
    command: [sh, -c, 'while read line; do echo \"got $line\"; done']
  - name: terminal
    image: IMAGE
    stdin: true
    tty: true
    command: [sh]
  - name: echo
    image: IMAGE
    command: [nc, -ll, -p, '8080', -e, cat]
  - name: clock
    image: IMAGE
    command: [sh, -c, 'echo early; sleep 10; echo late; sleep 3600']
";

/// Applies [`POD`] and waits until each of its containers runs. The node does not declare
/// `ExtendWebSocketsToKubelet` (the agent proxies bytes and translates no WebSocket v5), so
/// the API server speaks SPDY to it.
fn start_pod(cluster: &Cluster) {
    let node = wait_ready(cluster, "node-a", "True");
    let declared = node["status"]["declaredFeatures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !declared.iter().any(|f| f == "ExtendWebSocketsToKubelet"),
        "{declared:?}"
    );
    cluster.apply(&POD.replace("IMAGE", BUSYBOX_IMAGE));
    cluster.wait_for("every container of the pod runs", || {
        let pod = cluster.get(&["pod", "streams"]);
        let statuses = pod["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (statuses.len() == 5 && statuses.iter().all(|c| c["state"]["running"].is_object()))
            .then_some(())
            .ok_or_else(|| pod["status"].to_string())
    });
}

/// `kubectl` as the admin, run as the cluster runs it (inside its network namespace), its
/// standard streams left to the caller: for sessions that outlive one call.
fn kubectl(cluster: &Cluster, args: &[&str]) -> Command {
    let inner = &cluster.inner;
    let netns = inner
        .netns()
        .expect("a ServedNode's cluster runs in a namespace");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", netns.display()))
        .arg("--")
        .arg(inner.bin().join("kubectl"))
        .arg("--kubeconfig")
        .arg(inner.admin_kubeconfig())
        .args(args);
    cmd
}

/// Waits for `child` to exit, failing after [`DEADLINE`].
fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what} did not exit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ends a kubectl session the test started.
fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Bytes read by a thread from a stream, as they come.
struct Output {
    chunks: Receiver<Vec<u8>>,
    seen: Vec<u8>,
    /// Where the next [`Self::wait_for`] starts looking.
    mark: usize,
}

impl Output {
    fn new(mut from: impl std::io::Read + Send + 'static) -> Self {
        let (send, chunks) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if send.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            chunks,
            seen: Vec::new(),
            mark: 0,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    /// Waits up to `limit` for `what` after the last match; true when it came.
    fn wait_for_within(&mut self, what: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let found = self.seen[self.mark..]
                .windows(what.len())
                .position(|w| w == what.as_bytes());
            if let Some(at) = found {
                self.mark += at + what.len();
                return true;
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(wait) {
                Ok(chunk) => self.seen.extend_from_slice(&chunk),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Waits for `what` after the last match, failing after [`DEADLINE`].
    fn wait_for(&mut self, what: &str) {
        assert!(
            self.wait_for_within(what, DEADLINE),
            "waited for {what:?}; got {:?}",
            self.text()
        );
    }
}

/// A pseudo-terminal: the test holds the master, a child gets the slave as its controlling
/// terminal and standard streams (as a user's shell gives kubectl its terminal).
struct Pty {
    master: File,
    slave: OwnedFd,
}

impl Pty {
    /// Opens a pair sized `rows` × `cols`. The test's one FFI call besides [`Self::resize`]
    /// (no safe wrapper of `openpty` in the workspace's dependencies).
    #[allow(unsafe_code)]
    fn open(rows: u16, cols: u16) -> Self {
        let (mut master, mut slave) = (-1, -1);
        let size = winsize(rows, cols);
        // SAFETY: openpty writes two descriptors into the two integers; the name and termios
        // pointers may be null; `size` lives across the call.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors are open and owned by nothing else.
        unsafe {
            Self {
                master: File::from_raw_fd(master),
                slave: OwnedFd::from_raw_fd(slave),
            }
        }
    }

    /// Starts `cmd` on the terminal, through `setsid --ctty` (a session of its own whose
    /// controlling terminal it is, as a login shell's child has).
    fn spawn(&self, cmd: Command) -> Child {
        let io = || Stdio::from(self.slave.try_clone().unwrap());
        Command::new("setsid")
            .args(["--ctty", "--wait"])
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .stdin(io())
            .stdout(io())
            .stderr(io())
            .spawn()
            .expect("starting kubectl on the terminal")
    }

    /// What the terminal shows.
    fn output(&self) -> Output {
        Output::new(self.master.try_clone().unwrap())
    }

    /// Types `text`.
    fn type_text(&self, text: &str) {
        (&self.master).write_all(text.as_bytes()).unwrap();
    }

    /// Resizes the terminal (its foreground process, kubectl, gets SIGWINCH).
    #[allow(unsafe_code)]
    fn resize(&self, rows: u16, cols: u16) {
        let size = winsize(rows, cols);
        // SAFETY: TIOCSWINSZ reads a winsize that lives across the call.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }
}

fn winsize(rows: u16, cols: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A TCP connection to `addr` made from inside the network namespace `netns` (where
/// kubectl, run as the cluster runs it, listens): a socket belongs to the namespace of the
/// thread that makes it.
fn connect_in(netns: &Path, addr: SocketAddr) -> TcpStream {
    let netns = File::open(netns).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("entering the cluster's network namespace");
        TcpStream::connect(addr).expect("connecting to kubectl port-forward")
    })
    .join()
    .unwrap()
}

fn assert_no_refusals(cluster: &Cluster) {
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Item 4: `kubectl exec -it` on a pseudo-terminal reaches an interactive `sh` on a TTY of
/// the container (`tty` names a `/dev/pts/N`, `stty size` shows the terminal's size and then
/// its new size after a resize) and ends with the shell's `exit 3` as kubectl's exit code; a
/// non-TTY `kubectl exec -i` passes stdin through and its exit code too, and keeps stdout and
/// stderr apart; `kubectl attach`
/// reaches a container running with `stdin: true` (its output answers the input sent) and
/// one with `tty: true` through the terminal.
#[test]
fn kubectl_exec_with_a_tty_and_attach_reach_the_container() {
    let Some(node) = ServedNode::start("kubelet-streams-tty", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    start_pod(cluster);

    // exec -it through the terminal.
    let pty = Pty::open(33, 101);
    let mut screen = pty.output();
    let mut exec = pty.spawn(kubectl(
        cluster,
        &["exec", "-it", "streams", "-c", "shell", "--", "sh"],
    ));
    screen.wait_for("# ");
    pty.type_text("tty\r");
    screen.wait_for("/dev/pts/");
    pty.type_text("stty size\r");
    screen.wait_for("33 101");
    // The resize travels on its own stream: ask again until the shell sees it.
    pty.resize(40, 120);
    cluster.wait_for("the container's terminal resized", || {
        pty.type_text("stty size\r");
        screen
            .wait_for_within("40 120", Duration::from_secs(2))
            .then_some(())
            .ok_or_else(|| screen.text())
    });
    pty.type_text("exit 3\r");
    let status = wait_exit(&mut exec, "kubectl exec -it");
    assert_eq!(status.code(), Some(3), "{}", screen.text());

    // exec -i without a TTY: stdin reaches the command, its exit code comes back.
    let out = cluster.kubectl_output(
        &[
            "exec",
            "-i",
            "streams",
            "-c",
            "shell",
            "--",
            "sh",
            "-c",
            "cat; exit 4",
        ],
        Some("piped through\n"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "piped through\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(4));

    // stdout and stderr stay apart without a TTY.
    let out = cluster.kubectl_output(
        &[
            "exec",
            "streams",
            "-c",
            "shell",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2",
        ],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("err\n"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // attach -i to a container with stdin and no TTY.
    let mut attach = kubectl(cluster, &["attach", "-i", "streams", "-c", "reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut answers = Output::new(attach.stdout.take().unwrap());
    let mut input = attach.stdin.take().unwrap();
    input.write_all(b"hello\n").unwrap();
    answers.wait_for("got hello\n");
    input.write_all(b"again\n").unwrap();
    answers.wait_for("got again\n");
    drop(input);
    stop(attach);

    // attach -it to a container with a TTY, through a terminal.
    let pty = Pty::open(24, 80);
    let mut screen = pty.output();
    let attach = pty.spawn(kubectl(
        cluster,
        &["attach", "-it", "streams", "-c", "terminal"],
    ));
    // The shell printed its prompt before the attach: ask for the answer until it comes.
    cluster.wait_for("the attached shell answers", || {
        pty.type_text("echo $((6*7))-attached\r");
        screen
            .wait_for_within("42-attached", Duration::from_secs(2))
            .then_some(())
            .ok_or_else(|| screen.text())
    });
    pty.type_text("tty\r");
    screen.wait_for("/dev/pts/");
    stop(attach);

    assert_no_refusals(cluster);
}

/// Item 4: `kubectl port-forward` to a TCP server in the pod (busybox `nc` echoing with
/// `cat`): bytes sent to the forwarded local port come back, on two connections one after
/// the other. The node proxy's `/run` (upstream: `getRun` → `RunInContainer` → CRI
/// `ExecSync`) answers a command's output, by name and with the pod's UID, and a failing
/// command's exit code as an error. `kubectl logs --since-time` and `--since` show the lines
/// from that moment on.
#[test]
fn kubectl_port_forward_run_and_logs_since_reach_the_pod() {
    let Some(node) = ServedNode::start("kubelet-streams-forward", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    start_pod(cluster);

    // port-forward: kubectl picks the local port and says which.
    let mut forward = kubectl(cluster, &["port-forward", "pod/streams", ":8080"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(forward.stdout.take().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("kubectl port-forward said {line:?}"));
    let netns = cluster.inner.netns().unwrap().to_owned();
    for message in ["ping through the forward\n", "and once more\n"] {
        let mut conn = connect_in(&netns, SocketAddr::from(([127, 0, 0, 1], port)));
        conn.set_read_timeout(Some(DEADLINE)).unwrap();
        conn.write_all(message.as_bytes()).unwrap();
        let mut back = vec![0u8; message.len()];
        conn.read_exact(&mut back).unwrap();
        assert_eq!(String::from_utf8_lossy(&back), message);
    }
    stop(forward);

    // /run through the API server's node proxy.
    let run = |path: &str| cluster.kubectl_output(&["create", "--raw", path, "-f", "-"], Some(""));
    let out = run("/api/v1/nodes/node-a/proxy/run/default/streams/shell?cmd=echo%20ran%20here");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ran here\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = cluster.get(&["pod", "streams"]);
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let out = run(&format!(
        "/api/v1/nodes/node-a/proxy/run/default/streams/{uid}/shell?cmd=hostname"
    ));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "streams\n");
    let out = run("/api/v1/nodes/node-a/proxy/run/default/streams/shell?cmd=false");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("command 'false' exited with 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // logs --since-time / --since.
    let logs = |args: &[&str]| {
        let mut all = vec!["logs", "streams", "-c", "clock"];
        all.extend_from_slice(args);
        let out = cluster.kubectl_output(&all, None);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let stamped = cluster.wait_for("the clock's second line", || {
        let text = logs(&["--timestamps"]);
        (text.lines().count() == 2)
            .then_some(text.clone())
            .ok_or(text)
    });
    let stamp = |line: usize| -> k8s_openapi::jiff::Timestamp {
        let line = stamped.lines().nth(line).unwrap();
        line.split_once(' ').unwrap().0.parse().unwrap()
    };
    let (early, late) = (stamp(0), stamp(1));
    // The API server passes `sinceTime` on in whole seconds: the second of `late` is after
    // `early` (they are 10 s apart).
    let since_time = k8s_openapi::jiff::Timestamp::from_second(late.as_second()).unwrap();
    assert!(since_time > early, "{stamped}");
    assert_eq!(logs(&[&format!("--since-time={since_time}")]), "late\n");
    assert_eq!(logs(&["--since=1h"]), "early\nlate\n");
    // A window that starts between the two lines, 8 s before `late` (counted back from now:
    // kubectl has 7 s to bring the request to the agent).
    let now = k8s_openapi::jiff::Timestamp::now();
    let window = now.duration_since(late).as_secs() + 8;
    assert_eq!(logs(&[&format!("--since={window}s")]), "late\n");

    assert_no_refusals(cluster);
}

/// Item 4, `streamingConnectionIdleTimeout`: with `2s`, an exec session that worked (a `cat`
/// echoed a line) and in which nothing moves since (the `cat` waits on a stdin the test keeps
/// open) is closed by the agent, so kubectl ends; the container runs on.
#[test]
fn an_idle_exec_session_ends_after_the_streaming_connection_idle_timeout() {
    let Some(node) = ServedNode::start_with_config(
        "kubelet-streams-idle",
        "node-a",
        "streamingConnectionIdleTimeout: 2s\n",
    ) else {
        return;
    };
    let cluster = &node.cluster;
    start_pod(cluster);
    let mut exec = kubectl(
        cluster,
        &["exec", "-i", "streams", "-c", "shell", "--", "cat"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // The session works, then nothing moves.
    let mut input = exec.stdin.take().unwrap();
    let mut echoed = Output::new(exec.stdout.take().unwrap());
    input.write_all(b"alive\n").unwrap();
    echoed.wait_for("alive\n");
    wait_exit(&mut exec, "an idle kubectl exec");
    drop(input);
    let pod: Value = cluster.get(&["pod", "streams"]);
    let shell = pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "shell")
        .unwrap();
    assert!(shell["state"]["running"].is_object(), "{shell}");
    assert_eq!(shell["restartCount"], 0, "{shell}");
    assert_no_refusals(cluster);
}

/// A rustls client of the agent's port inside the node's namespace, as the API server's kubelet
/// client (`apiserver-kubelet-client.crt`), verifying the node's certificate with the cluster CA.
fn kubelet_tls(node: &ServedNode) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    let pki = |f: &str| node.cluster.inner.pki(f);
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(pki("ca.crt")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki("apiserver-kubelet-client.crt"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(pki("apiserver-kubelet-client.key")).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = connect_in(&node.containerd.netns(), "10.88.0.1:10250".parse().unwrap());
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    let server = ServerName::try_from("10.88.0.1").unwrap().to_owned();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), server).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// Item 4: a client that speaks WebSocket to the node's `/exec` (upstream's `wsstream`,
/// subprotocol `v4.channel.k8s.io`: one binary message per write, its first byte the
/// channel) reaches containerd's stream server through the agent, which proxies the upgrade
/// whatever its protocol: the command's stdout on channel 1, its stderr on channel 2, and its
/// exit code in the v4 error channel's Status (3).
#[test]
fn a_websocket_exec_reaches_the_container_through_the_kubelet_server() {
    use tungstenite::Message;
    use tungstenite::client::IntoClientRequest as _;

    let Some(node) = ServedNode::start("kubelet-streams-websocket", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    start_pod(cluster);
    let mut request = "wss://10.88.0.1:10250/exec/default/streams/shell?command=sh&command=-c\
        &command=echo%20out%3B%20echo%20err%20%3E%262%3B%20exit%203&output=1&error=1"
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static("v4.channel.k8s.io"),
    );
    let (mut ws, response) = tungstenite::client::client(request, kubelet_tls(&node))
        .unwrap_or_else(|e| panic!("the WebSocket upgrade: {e}"));
    assert_eq!(
        response.headers()["Sec-WebSocket-Protocol"],
        "v4.channel.k8s.io"
    );
    let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        match ws.read() {
            Ok(Message::Binary(data)) if !data.is_empty() => match data[0] {
                1 => stdout.extend_from_slice(&data[1..]),
                2 => stderr.extend_from_slice(&data[1..]),
                3 => status.extend_from_slice(&data[1..]),
                _ => {}
            },
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => break,
            // containerd closes the TCP connection after its close frame without TLS's
            // close_notify: the session is over.
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(e) => panic!("reading the session: {e}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "err\n");
    let status: Value = serde_json::from_slice(&status)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&status)));
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
    assert_no_refusals(cluster);
}
