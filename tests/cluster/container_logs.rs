//! Issue 26 item 3: the kubelet's container log layout and rotation as a user of a real
//! control plane sees them: `kubectl logs` reads the live file after the agent rotated the
//! log, and a `kubectl logs -f` begun before the rotation carries on in the reopened file
//! without losing a line.

use std::io::Read as _;
use std::process::{Command, Stdio};

use rustlet_cri::testing::BUSYBOX_IMAGE;

use crate::kubelet_server::ServedNode;
use crate::node::wait_ready;

/// A child process killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const CHATTY: &str = "apiVersion: v1
kind: Pod
metadata:
  name: chatty
  namespace: default
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, 'printf \"before-%s\\n\" $(seq 0 19); while [ ! -e /tmp/more ]; do sleep 0.1; done; printf \"before-%s\\n\" $(seq 20 99); while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after; exec sleep 3600']
";

/// The agent rotates the container's log above `containerLogMaxSize` (every
/// `containerLogMonitorInterval`): `<podLogsDir>/default_chatty_<uid>/main/0.log.<time>` holds
/// the old lines, containerd writes the new `0.log`, `kubectl logs` shows only what it holds,
/// and a follow from before the rotation shows every line once.
#[test]
fn kubectl_logs_reads_the_live_file_after_the_agent_rotated_it() {
    let Some(node) = ServedNode::start_with_config(
        "container-logs-rotation",
        "node-a",
        "containerLogMaxSize: 2Ki\ncontainerLogMonitorInterval: 3s\n",
    ) else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.apply(&CHATTY.replace("IMAGE", BUSYBOX_IMAGE));
    let logs = |args: &[&str]| {
        let mut all = vec!["logs", "chatty"];
        all.extend_from_slice(args);
        let out = cluster.kubectl_output(&all, None);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The first 20 lines stay under `containerLogMaxSize`: the log is not rotated before the
    // follow starts (with all 100 at once it could be, on a loaded machine, before the first
    // `kubectl logs`, which then saw an empty live file).
    let first: String = (0..20).map(|i| format!("before-{i}\n")).collect();
    let before: String = (0..100).map(|i| format!("before-{i}\n")).collect();
    cluster.wait_for("the first lines", || match logs(&[]) {
        (true, out, _) if out == first => Ok(()),
        (_, out, err) => Err(format!("{out:?} {err}")),
    });

    // A follow through the API server from here on.
    let mut follow = KillOnDrop(
        Command::new("nsenter")
            .arg(format!("--net={}", node.containerd.netns().display()))
            .arg("--")
            .arg(cluster.inner.bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(cluster.inner.admin_kubeconfig())
            .args(["logs", "-f", "chatty"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut follow_out = follow.0.stdout.take().unwrap();
    let (send, followed) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = follow_out.read(&mut buf) {
            if n == 0 || send.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });

    let mut got = Vec::new();
    cluster.wait_for("the follow's first lines", || {
        while let Ok(chunk) = followed.try_recv() {
            got.extend(chunk);
        }
        (got.len() >= first.len())
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&got).into_owned())
    });
    // The other 80 lines in one write: past the size, rotated at the next check.
    let more = cluster.kubectl_output(&["exec", "chatty", "--", "touch", "/tmp/more"], None);
    assert!(
        more.status.success(),
        "{}",
        String::from_utf8_lossy(&more.stderr)
    );

    let pod = cluster.get(&["pod", "chatty"]);
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let root = node.containerd.dir().join("root");
    let dir = root.join(format!("pod-logs/default_chatty_{uid}/main"));
    let rotated = cluster.wait_for("the log rotated", || {
        std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("0.log."))
            .ok_or_else(|| format!("{dir:?}: not rotated yet"))
    });
    let old = std::fs::read_to_string(dir.join(&rotated)).unwrap();
    assert!(old.contains("before-99\n"), "{old}");
    assert_eq!(
        std::fs::read_link(
            root.join("container-logs")
                .join(format!("chatty_default_main-{id}.log"))
        )
        .unwrap(),
        dir.join("0.log")
    );
    // The live file is the new one: nothing in it yet.
    assert_eq!(logs(&[]).1, "");
    let touched = cluster.kubectl_output(&["exec", "chatty", "--", "touch", "/tmp/go"], None);
    assert!(
        touched.status.success(),
        "{}",
        String::from_utf8_lossy(&touched.stderr)
    );
    cluster.wait_for("the line written after the rotation", || match logs(&[]) {
        (true, out, _) if out == "after\n" => Ok(()),
        (_, out, err) => Err(format!("{out:?} {err}")),
    });

    let want = format!("{before}after\n");
    cluster.wait_for("the follow's lines", || {
        while let Ok(chunk) = followed.try_recv() {
            got.extend(chunk);
        }
        (got.len() >= want.len())
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&got).into_owned())
    });
    assert_eq!(String::from_utf8_lossy(&got), want);
    drop(follow);

    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
