//! The agent's interfaces as a user meets them: `--read-only-port` (0 turns the plain-HTTP
//! endpoints off) and its log on stderr when stderr is not a terminal.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustlet_mount::testing::privileged_dir;

use crate::harness::{Agent, DEADLINE};

/// Runs the binary in local mode over an empty manifest directory with `extra` flags, stderr
/// to `<dir>/agent.log` (a file, not a terminal; `NO_COLOR` unset), until it logs that it runs.
fn start_logging_to_a_file(dir: &Path, extra: &[&str]) -> Agent {
    let (root, manifests) = (dir.join("root"), dir.join("manifests"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    let log = dir.join("agent.log");
    let stderr = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rustlet"))
        .args(["--node-name", "node-a", "--root-dir"])
        .arg(&root)
        .arg("--local")
        .arg(&manifests)
        // The healthz endpoint (127.0.0.1:10248 by default) is off, as in the harness: these
        // agents run side by side and the sockets they hold are checked.
        .args(if extra.iter().any(|a| a.starts_with("--healthz-port")) {
            &[][..]
        } else {
            &["--healthz-port=0"][..]
        })
        .args(extra)
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("starting rustlet");
    let mut agent = Agent {
        child,
        port: 0,
        log,
        netns: None,
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        if log.contains("rustlet running") {
            break;
        }
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("the agent exited ({status}):\n{log}");
        }
        assert!(Instant::now() < deadline, "the agent does not run:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.port = extra
        .windows(2)
        .find(|w| w[0] == "--read-only-port")
        .map_or(0, |w| w[1].parse().unwrap());
    agent
}

/// The local addresses (`127.0.0.1:10255` style, IPv4 and IPv6 tables) of the TCP sockets in
/// LISTEN state that process `pid` holds, from its fds and its network namespace's tables.
fn listening_sockets(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_owned())
        })
        .collect();
    let mut listening = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields.get(3) == Some(&"0A")
                && fields.get(9).is_some_and(|i| inodes.iter().any(|x| x == i))
            {
                let port = fields[1].rsplit(':').next().unwrap();
                listening.push(format!(
                    "{table} port {}",
                    u16::from_str_radix(port, 16).unwrap()
                ));
            }
        }
    }
    listening
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Item 17: `--read-only-port 0` turns the plain-HTTP endpoints off: the agent runs and
/// holds no listening socket. A non-zero port is where they answer, whatever `--listen` says.
#[test]
fn read_only_port_0_turns_the_plain_http_endpoints_off() {
    let Some(dir) = privileged_dir("read_only_port_0_turns_the_plain_http_endpoints_off") else {
        return;
    };
    let port = free_port().to_string();
    let on = start_logging_to_a_file(
        &dir.mkdir("on"),
        &["--listen", "127.0.0.1:1", "--read-only-port", &port],
    );
    assert_eq!(
        listening_sockets(on.child.id()),
        [format!("tcp port {port}")]
    );
    assert_eq!(on.get("/healthz").map(|(code, _)| code), Some(200));
    assert!(on.terminate().success());

    let off = start_logging_to_a_file(
        &dir.mkdir("off"),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--read-only-port",
            "0",
        ],
    );
    assert_eq!(listening_sockets(off.child.id()), Vec::<String>::new());
    let log = std::fs::read_to_string(&off.log).unwrap();
    assert!(log.contains("the read-only endpoints are off"), "{log}");
    assert!(off.terminate().success());
}

/// Item 18: with stderr a file, not a terminal, the log carries no ANSI escape sequences.
#[test]
fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let Some(dir) = privileged_dir("log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal")
    else {
        return;
    };
    let agent =
        start_logging_to_a_file(dir.path(), &["--read-only-port", &free_port().to_string()]);
    assert!(agent.terminate().success());
    let log = std::fs::read(dir.path().join("agent.log")).unwrap();
    assert!(
        log.windows(b"rustlet running".len())
            .any(|w| w == b"rustlet running"),
        "{}",
        String::from_utf8_lossy(&log)
    );
    assert!(
        !log.contains(&0x1b),
        "an ESC byte in the log:\n{}",
        String::from_utf8_lossy(&log).escape_debug()
    );
}
