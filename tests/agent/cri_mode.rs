//! `--runtime cri`: the agent on a private containerd (see `rustlet_cri::testing`), real
//! processes reading and writing through the volumes the agent mounted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustlet_cri::CriClient;
use rustlet_cri::testing::{GrpcHealthServer, HealthAnswer, PrivateContainerd, scratch};
use serde_json::Value;

use crate::harness::{Agent, run_to_end, start_in, start_with_env};

/// A private containerd, a root directory and a manifest directory for one test.
struct Cri {
    containerd: PrivateContainerd,
    root: PathBuf,
    manifests: PathBuf,
}

impl Cri {
    fn new(test: &str, files: &[(&str, &str)]) -> Option<Self> {
        let containerd = PrivateContainerd::start_blocking(test)?;
        let root = containerd.dir().join("root");
        let manifests = containerd.dir().join("manifests");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&manifests).unwrap();
        for (name, text) in files {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        Some(Self {
            containerd,
            root,
            manifests,
        })
    }

    /// The agent, in containerd's network namespace (the node's network of these tests: pod
    /// IPs are reachable from it, as on a node).
    fn start(&self) -> Agent {
        self.start_with_env(&[])
    }

    /// [`Self::start`] with environment variables for the agent.
    fn start_with_env(&self, env: &[(&str, &str)]) -> Agent {
        self.start_with(&[], env)
    }

    /// [`Self::start`] with more flags and environment variables for the agent.
    fn start_with(&self, flags: &[&str], env: &[(&str, &str)]) -> Agent {
        let netns = self.containerd.netns();
        let mut args = vec![
            "--node-name",
            "node-a",
            "--root-dir",
            self.root.to_str().unwrap(),
            "--local",
            self.manifests.to_str().unwrap(),
            "--runtime",
            "cri",
            "--container-runtime-endpoint",
            self.containerd.endpoint(),
        ];
        args.extend(flags);
        start_with_env(
            Some(&netns),
            &args,
            env,
            &self.containerd.dir().join("agent.log"),
        )
    }

    /// The mark the agent of [`Self::start`] puts on what it creates.
    fn owner_labels(&self) -> std::collections::HashMap<String, String> {
        rustlet_cri::CriConfig {
            node_name: "node-a".into(),
            ..rustlet_cri::CriConfig::new(self.containerd.endpoint(), &self.root)
        }
        .owner_labels()
    }

    /// The runtime's sandboxes and containers (IDs), listed through CRI.
    fn listed(&self) -> (Vec<String>, Vec<(String, i32)>) {
        let endpoint = self.containerd.endpoint().to_owned();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                    .await
                    .unwrap();
                let sandboxes = client.list_pod_sandboxes().await.unwrap();
                let containers = client.list_containers().await.unwrap();
                (
                    sandboxes.into_iter().map(|s| s.id).collect(),
                    containers.into_iter().map(|c| (c.id, c.state)).collect(),
                )
            })
    }
}

/// Waits until the pod's container `main` runs; returns the pod.
fn running(agent: &Agent, name: &str) -> Value {
    agent.wait_for(&format!("{name} running"), || {
        agent
            .pod(name)
            .filter(|p| container(p, "main")["state"]["running"].is_object())
    })
}

fn uid(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The pod's log directory (`<root>/pod-logs/<namespace>_<name>_<uid>`), if there is one.
fn pod_log_dir(root: &Path, uid: &str) -> Option<PathBuf> {
    let pod = rustlet_core::PodUid::new(uid);
    rustlet_cri::logs::pod_log_directories(&root.join("pod-logs"), &pod)
        .unwrap()
        .pop()
}

/// The lines a container wrote to stdout, from its CRI log file.
fn log_lines(root: &Path, uid: &str, container: &str) -> Vec<String> {
    let Some(dir) = pod_log_dir(root, uid) else {
        return Vec::new();
    };
    let path = dir.join(format!("{container}/0.log"));
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        // `<time> stdout F <text>`
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
        .collect()
}

const SHARED: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: shared
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: writer
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo written by $(WHO) > /shared/msg; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    env:
    - {name: WHO, value: the-writer}
    volumeMounts:
    - {name: shared, mountPath: /shared}
  - name: reader
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "until [ -f /shared/msg ]; do sleep 0.1; done; cat /shared/msg; grep -c ' /scratch tmpfs ' /proc/mounts; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {name: shared, mountPath: /shared, readOnly: true}
    - {name: scratch, mountPath: /scratch}
  - name: stubborn
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "while true; do sleep 1; done"]
  volumes:
  - name: shared
    emptyDir: {}
  - name: scratch
    emptyDir:
      medium: Memory
"#;

#[test]
fn cri_two_containers_share_an_empty_dir_and_deletion_stops_and_removes_them() {
    let Some(cri) = Cri::new(
        "cri_two_containers_share_an_empty_dir",
        &[("shared.yaml", SHARED)],
    ) else {
        return;
    };
    let agent = cri.start();
    let pod = agent.wait_for("both containers running", || {
        agent.pod("shared").filter(|p| {
            p["status"]["phase"] == "Running"
                && container(p, "writer")["state"]["running"].is_object()
                && container(p, "reader")["state"]["running"].is_object()
        })
    });
    let uid = uid(&pod);
    for name in ["writer", "reader"] {
        let c = container(&pod, name);
        assert!(
            c["containerID"]
                .as_str()
                .is_some_and(|id| id.starts_with("containerd://")),
            "{c}"
        );
        assert!(
            c["imageID"]
                .as_str()
                .is_some_and(|id| id.starts_with("sha256:")),
            "{c}"
        );
        assert_eq!(c["image"], "localhost/busybox:1");
        assert_eq!(c["restartCount"], 0);
    }
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.88.")),
        "{pod}"
    );
    // The reader saw the writer's file, through the volume the agent made, and its Memory
    // emptyDir is a tmpfs inside the container.
    let lines = agent.wait_for("the reader's output", || {
        let lines = log_lines(&cri.root, &uid, "reader");
        (lines.len() >= 2).then_some(lines)
    });
    assert_eq!(lines[..2], ["written by the-writer", "1"]);
    assert_eq!(
        std::fs::read_to_string(cri.root.join(format!(
            "pods/{uid}/volumes/kubernetes.io~empty-dir/shared/msg"
        )))
        .unwrap(),
        "written by the-writer\n"
    );
    let (sandboxes, containers) = cri.listed();
    assert_eq!((sandboxes.len(), containers.len()), (1, 3));

    // Deleting the manifest stops the three (two exit 0 on SIGTERM; the stubborn one, a PID 1
    // that ignores it, is killed when the grace period ends), removes them and the sandbox,
    // then the pod and its directory.
    std::fs::remove_file(cri.manifests.join("shared.yaml")).unwrap();
    agent.wait_for("the pod deleted", || {
        agent.pod("shared").is_none().then_some(())
    });
    agent.wait_for("the runtime emptied", || {
        let (s, c) = cri.listed();
        (s.is_empty() && c.is_empty()).then_some(())
    });
    agent.wait_for("the pod directory removed", || {
        (!cri.root.join("pods").join(&uid).exists()).then_some(())
    });
    // The log directory goes in the same cleanup, after the pod directory: waited for too.
    agent.wait_for("the pod's log directory removed", || {
        pod_log_dir(&cri.root, &uid).is_none().then_some(())
    });
}

const FAILS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: fails
  namespace: default
spec:
  restartPolicy: Never
  initContainers:
  - name: init
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo init done"]
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "exit 3"]
"#;

const ABSENT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: absent
  namespace: default
spec:
  containers:
  - name: main
    image: localhost/absent:1
"#;

#[test]
fn cri_exit_3_with_restart_policy_never_fails_and_an_absent_image_backs_off() {
    let Some(cri) = Cri::new(
        "cri_exit_3_with_restart_policy_never_fails",
        &[("fails.yaml", FAILS), ("absent.yaml", ABSENT)],
    ) else {
        return;
    };
    let agent = cri.start();
    let pod = agent.wait_for_phase("fails", "Failed");
    let init = &pod["status"]["initContainerStatuses"][0];
    assert_eq!(init["state"]["terminated"]["exitCode"], 0, "{pod}");
    assert_eq!(init["state"]["terminated"]["reason"], "Completed", "{pod}");
    let main = container(&pod, "main");
    assert_eq!(main["state"]["terminated"]["exitCode"], 3, "{pod}");
    assert_eq!(main["state"]["terminated"]["reason"], "Error", "{pod}");
    assert_eq!(main["restartCount"], 0);

    // No registry: the pull fails, then the container waits in back-off between pulls.
    let seen = agent.wait_for("ImagePullBackOff", || {
        let pod = agent.pod("absent")?;
        let reason = container(&pod, "main")["state"]["waiting"]["reason"].clone();
        (reason == "ImagePullBackOff").then_some(pod)
    });
    assert_eq!(seen["status"]["phase"], "Pending");
    let message = container(&seen, "main")["state"]["waiting"]["message"].clone();
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("localhost/absent:1")),
        "{message}"
    );
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(
        log.contains("ErrImagePull"),
        "the first failure is ErrImagePull:\n{log}"
    );
}

const SLEEPER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: NAME
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
"#;

#[test]
fn cri_kill_9_of_the_agent_leaves_containers_running_and_a_restart_adopts_them() {
    let Some(cri) = Cri::new(
        "cri_kill_9_of_the_agent_leaves_containers_running",
        &[
            ("stays.yaml", &SLEEPER.replace("NAME", "stays")),
            ("goes.yaml", &SLEEPER.replace("NAME", "goes")),
        ],
    ) else {
        return;
    };
    let agent = cri.start();
    let before = running(&agent, "stays");
    let goes = running(&agent, "goes");
    agent.kill9();
    // The containers outlive the agent.
    let (_, containers) = cri.listed();
    assert_eq!(containers.len(), 2);
    assert!(
        containers.iter().all(|(_, state)| *state == 1),
        "{containers:?}"
    );

    // Meanwhile one manifest goes; the restarted agent adopts the other pod's container
    // (same ID, no restart) and removes the gone pod's.
    std::fs::remove_file(cri.manifests.join("goes.yaml")).unwrap();
    let agent = cri.start();
    let after = running(&agent, "stays");
    assert_eq!(
        container(&after, "main")["containerID"],
        container(&before, "main")["containerID"]
    );
    assert_eq!(
        container(&after, "main")["state"]["running"]["startedAt"],
        container(&before, "main")["state"]["running"]["startedAt"]
    );
    assert_eq!(container(&after, "main")["restartCount"], 0);
    let gone_id = container(&goes, "main")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    agent.wait_for("the gone pod's container removed", || {
        let (sandboxes, containers) = cri.listed();
        (sandboxes.len() == 1 && containers.len() == 1 && containers[0].0 != gone_id).then_some(())
    });
    assert_eq!(agent.terminate().code(), Some(0));
    // SIGTERM stops nothing either.
    let (_, containers) = cri.listed();
    assert_eq!(containers.len(), 1);
}

#[test]
fn cri_an_absent_runtime_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    let endpoint = format!("unix://{}/nothing.sock", dir.path().display());
    let (status, stderr) = run_to_end(&[
        "--node-name",
        "node-a",
        "--root-dir",
        dir.path().join("root").to_str().unwrap(),
        "--local",
        manifests.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--runtime",
        "cri",
        "--container-runtime-endpoint",
        &endpoint,
    ]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--runtime cri")
            && stderr.contains(&endpoint)
            && stderr.contains("does not answer"),
        "{stderr}"
    );
    let (status, stderr) = run_to_end(&[
        "--node-name",
        "node-a",
        "--root-dir",
        "/tmp/x",
        "--local",
        manifests.to_str().unwrap(),
        "--runtime",
        "cri",
        "--container-runtime-endpoint",
        "tcp://127.0.0.1:1",
    ]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--container-runtime-endpoint"), "{stderr}");
}

const PROBED: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: probed
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "touch /ctl/alive; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {name: ctl, mountPath: /ctl}
    readinessProbe:
      exec: {command: ["cat", "/ctl/ready"]}
      periodSeconds: 1
      failureThreshold: 1
    livenessProbe:
      exec: {command: ["cat", "/ctl/alive"]}
      periodSeconds: 1
      failureThreshold: 2
  - name: web
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -p 8080 -h /tmp/www"]
    ports:
    - {name: http, containerPort: 8080}
    startupProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      httpGet: {path: /healthz, port: http}
      periodSeconds: 1
  volumes:
  - name: ctl
    emptyDir: {}
"#;

#[test]
fn cri_probes_flip_readiness_both_ways_and_a_failed_liveness_probe_restarts() {
    let Some(cri) = Cri::new("cri_probes_flip_readiness", &[("probed.yaml", PROBED)]) else {
        return;
    };
    let agent = cri.start();
    let ready = |p: &Value, name: &str| container(p, name)["ready"] == true;
    // Without /ctl/ready the app is not ready; the web container's startup (TCP) and
    // readiness (HTTP GET on its named port) probes pass.
    let pod = agent.wait_for("web ready, app running but not ready", || {
        agent.pod("probed").filter(|p| {
            ready(p, "web")
                && container(p, "web")["started"] == true
                && container(p, "app")["state"]["running"].is_object()
                && !ready(p, "app")
        })
    });
    assert_eq!(
        crate::harness::condition(&pod, "Ready").as_deref(),
        Some("False")
    );
    let uid = uid(&pod);
    let ctl = cri
        .root
        .join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/ctl"));
    std::fs::write(ctl.join("ready"), "").unwrap();
    let pod = agent.wait_for("the pod ready", || {
        agent
            .pod("probed")
            .filter(|p| crate::harness::condition(p, "Ready").as_deref() == Some("True"))
    });
    assert!(ready(&pod, "app") && ready(&pod, "web"));
    std::fs::remove_file(ctl.join("ready")).unwrap();
    agent.wait_for("the app unready again", || {
        agent.pod("probed").filter(|p| {
            !ready(p, "app") && crate::harness::condition(p, "Ready").as_deref() == Some("False")
        })
    });

    // The liveness probe fails twice: the container is killed and started again; its command
    // makes it alive again.
    let first = container(&pod, "app")["containerID"].clone();
    std::fs::remove_file(ctl.join("alive")).unwrap();
    let pod = agent.wait_for("the app restarted", || {
        agent.pod("probed").filter(|p| {
            let app = container(p, "app");
            app["restartCount"] == 1 && app["state"]["running"].is_object()
        })
    });
    let app = container(&pod, "app");
    assert_ne!(app["containerID"], first);
    assert_eq!(
        app["lastState"]["terminated"]["containerID"], first,
        "{app}"
    );
    assert_eq!(container(&pod, "web")["restartCount"], 0);
}

/// Two pods with a gRPC liveness probe (upstream's "should *not* be restarted with a GRPC
/// liveness probe" and "should be restarted with a GRPC liveness probe"): `serving`, on the
/// host network, probes a health server the test runs there (`PORT`); `wrong-port` probes a
/// port of its own pod IP where nothing listens.
const GRPC_PROBED: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: serving}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    livenessProbe:
      grpc: {port: PORT}
      periodSeconds: 1
      timeoutSeconds: 1
      failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata: {name: wrong-port}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    livenessProbe:
      grpc: {port: 2333}
      periodSeconds: 1
      timeoutSeconds: 1
      failureThreshold: 1
"#;

/// upstream "should be restarted with a GRPC liveness probe" and "should *not* be restarted
/// with a GRPC liveness probe" through the binary: the agent checks `grpc.health.v1` at the
/// pod IP; a pod whose port has no server is restarted, a pod whose server answers `SERVING`
/// is not, and is restarted once the server answers `NOT_SERVING`.
#[test]
fn cri_a_failing_grpc_liveness_probe_restarts_the_container_and_a_serving_one_does_not() {
    let Some(cri) = Cri::new("cri_a_failing_grpc_liveness_probe_restarts", &[]) else {
        return;
    };
    // The health server listens on the loopback of containerd's network namespace: the
    // host network of these pods, where the agent runs.
    let listener = {
        let netns = cri.containerd.netns();
        std::thread::spawn(move || {
            use nix::sched::{CloneFlags, setns};
            let target = std::fs::File::open(netns).unwrap();
            // This thread alone enters it, and ends there.
            setns(&target, CloneFlags::CLONE_NEWNET).unwrap();
            std::net::TcpListener::bind("127.0.0.1:0").unwrap()
        })
        .join()
        .unwrap()
    };
    let server = GrpcHealthServer::start(listener, "");
    std::fs::write(
        cri.manifests.join("grpc.yaml"),
        GRPC_PROBED.replace("PORT", &server.port().to_string()),
    )
    .unwrap();
    let agent = cri.start();
    let first = container(&running(&agent, "serving"), "main")["containerID"].clone();
    // Nothing at 2333: the check fails at its 1 s deadline and the container is replaced.
    let pod = agent.wait_for("wrong-port restarted", || {
        agent.pod("wrong-port").filter(|p| {
            let main = container(p, "main");
            main["restartCount"].as_i64() >= Some(1) && main["state"]["running"].is_object()
        })
    });
    let main = container(&pod, "main");
    assert!(main["lastState"]["terminated"].is_object(), "{main}");
    // Meanwhile the serving pod's container passed several checks and still runs.
    let pod = agent.pod("serving").unwrap();
    let main = container(&pod, "main");
    assert_eq!(main["restartCount"], 0, "{main}");
    assert_eq!(main["containerID"], first, "{main}");

    server.set(HealthAnswer::NotServing);
    let pod = agent.wait_for("serving restarted", || {
        agent.pod("serving").filter(|p| {
            let main = container(p, "main");
            main["restartCount"] == 1 && main["state"]["running"].is_object()
        })
    });
    let main = container(&pod, "main");
    assert_ne!(main["containerID"], first);
    assert_eq!(
        main["lastState"]["terminated"]["containerID"], first,
        "{main}"
    );
}

const CONTENT: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data:
  greeting: hello
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData:
  password: s3cret
---
apiVersion: v1
kind: Pod
metadata: {name: content}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo env $GREETING $PASSWORD $CFG_greeting; grep ' /etc/secret tmpfs ' /proc/mounts | wc -l; cat /etc/secret/password; echo; last=; trap 'exit 0' TERM; while true; do now=$(cat /etc/app/greeting); [ \"$now\" != \"$last\" ] && echo file $now; last=$now; sleep 0.2 & wait $!; done"]
    env:
    - name: GREETING
      valueFrom: {configMapKeyRef: {name: app-config, key: greeting}}
    - name: PASSWORD
      valueFrom: {secretKeyRef: {name: app-secret, key: password}}
    envFrom:
    - {configMapRef: {name: app-config}, prefix: CFG_}
    volumeMounts:
    - {name: config, mountPath: /etc/app}
    - {name: secret, mountPath: /etc/secret, readOnly: true}
  volumes:
  - name: config
    configMap: {name: app-config}
  - name: secret
    secret: {secretName: app-secret}
"#;

const CRASHER: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "exit 1"]
"#;

#[test]
fn cri_config_map_and_secret_reach_the_process_by_volume_and_env_and_a_crash_loop_backs_off() {
    let Some(cri) = Cri::new(
        "cri_config_map_and_secret_reach_the_process",
        &[("content.yaml", CONTENT), ("crasher.yaml", CRASHER)],
    ) else {
        return;
    };
    let agent = cri.start();
    let uid = uid(&agent.wait_for_phase("content", "Running"));
    let lines = agent.wait_for("the app's first output", || {
        let lines = log_lines(&cri.root, &uid, "app");
        (lines.len() >= 4).then_some(lines)
    });
    assert_eq!(
        lines[..4],
        ["env hello s3cret hello", "1", "s3cret", "file hello"],
        "env from the ConfigMap and Secret, the secret on a tmpfs, the ConfigMap's file"
    );
    // An edit of the ConfigMap reaches the running process through its volume.
    std::fs::write(
        cri.manifests.join("content.yaml"),
        CONTENT.replace("greeting: hello", "greeting: changed"),
    )
    .unwrap();
    agent.wait_for("the process reading the new value", || {
        log_lines(&cri.root, &uid, "app")
            .iter()
            .any(|l| l == "file changed")
            .then_some(())
    });

    // Exit 1 under `Always`: restarted, then held in CrashLoopBackOff (10 s doubling) with the
    // exit as lastState.
    let pod = agent.wait_for("CrashLoopBackOff", || {
        agent
            .pod("crasher")
            .filter(|p| container(p, "main")["state"]["waiting"]["reason"] == "CrashLoopBackOff")
    });
    let main = container(&pod, "main");
    assert_eq!(main["lastState"]["terminated"]["exitCode"], 1, "{main}");
    assert!(main["restartCount"].as_i64().unwrap() >= 1, "{main}");
    assert!(
        main["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("back-off 10s restarting failed container=main")),
        "{main}"
    );
    assert_eq!(pod["status"]["phase"], "Running");
}

#[test]
fn cri_a_runtime_that_goes_away_and_comes_back_is_used_again() {
    let Some(mut cri) = Cri::new(
        "cri_a_runtime_that_goes_away_and_comes_back",
        &[("stays.yaml", &SLEEPER.replace("NAME", "stays"))],
    ) else {
        return;
    };
    let agent = cri.start();
    let before = running(&agent, "stays");
    cri.containerd.stop();
    // Meanwhile a pod comes; its sandbox cannot be made yet.
    std::fs::write(
        cri.manifests.join("later.yaml"),
        SLEEPER.replace("NAME", "later"),
    )
    .unwrap();
    agent.wait_for("the failed relist in the log", || {
        std::fs::read_to_string(&agent.log)
            .unwrap_or_default()
            .contains("relisting the container runtime failed")
            .then_some(())
    });
    assert_eq!(agent.get("/healthz").map(|(code, _)| code), Some(200));
    cri.containerd.start_again_blocking();
    // The same channel reconnects: the new pod starts, the old one's container is the same.
    running(&agent, "later");
    let after = running(&agent, "stays");
    assert_eq!(
        container(&after, "main")["containerID"],
        container(&before, "main")["containerID"]
    );
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("the container runtime answers again"), "{log}");
}

/// Kube mode on containerd: a test API server over a store, and the agent against it in this
/// process's network namespace (where the server listens).
struct KubeCri {
    cri: Cri,
    rt: tokio::runtime::Runtime,
    store: std::sync::Arc<rustlet_api::local::store::Store>,
    server: rustlet_api::test_server::TestApiServer,
    kubeconfig: PathBuf,
}

impl KubeCri {
    fn new(test: &str) -> Option<Self> {
        let cri = Cri::new(test, &[])?;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = std::sync::Arc::new(rustlet_api::local::store::Store::default());
        let server = rt
            .block_on(rustlet_api::test_server::TestApiServer::start(
                store.clone(),
            ))
            .unwrap();
        let kubeconfig = cri.containerd.dir().join("kubeconfig");
        std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
        Some(Self {
            cri,
            rt,
            store,
            server,
            kubeconfig,
        })
    }

    fn start(&self) -> Agent {
        start_in(
            None,
            &[
                "--node-name",
                "node-a",
                "--root-dir",
                self.cri.root.to_str().unwrap(),
                "--kubeconfig",
                self.kubeconfig.to_str().unwrap(),
                "--runtime",
                "cri",
                "--container-runtime-endpoint",
                self.cri.containerd.endpoint(),
            ],
            &self.cri.containerd.dir().join("agent.log"),
        )
    }

    fn pods(&self) -> kube::api::Api<k8s_openapi::api::core::v1::Pod> {
        kube::api::Api::namespaced(self.rt.block_on(self.server.client()).unwrap(), "default")
    }

    /// Creates the manifest's pod, bound to node-a, through the API; returns it as created.
    fn create(&self, manifest: &str) -> k8s_openapi::api::core::v1::Pod {
        let mut pod: k8s_openapi::api::core::v1::Pod = serde_saphyr::from_str(manifest).unwrap();
        pod.spec.as_mut().unwrap().node_name = Some("node-a".into());
        self.rt
            .block_on(self.pods().create(&kube::api::PostParams::default(), &pod))
            .unwrap()
    }

    /// The pod as the store holds it.
    fn stored(&self, name: &str) -> Result<Value, rustlet_api::local::store::StoreError> {
        use rustlet_api::local::store::{Kind, ObjectRef};
        self.store.get(&ObjectRef::new(Kind::Pod, "default", name))
    }
}

/// Kube mode on containerd: the pod from the API runs as a real container; its deletion stops
/// the container before the agent's DELETE (grace 0, the pod's UID), and the exited container
/// and the sandbox are removed once the pod has left the API (issue 24 item 4: as upstream's
/// container GC, they stay until the terminal status is durable).
#[test]
fn cri_kube_mode_stops_the_containers_before_deleting_with_the_uid_and_removes_them_after() {
    let Some(kube) = KubeCri::new("cri_kube_mode_stops_and_removes_the_containers") else {
        return;
    };
    let agent = kube.start();
    let created = kube.create(&SLEEPER.replace("NAME", "web"));
    let uid = created.metadata.uid.clone().unwrap();
    let stored = agent.wait_for("web running in the API", || {
        let stored = kube.stored("web").ok()?;
        (stored["status"]["containerStatuses"][0]["state"]["running"].is_object()).then_some(stored)
    });
    assert!(
        stored["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{stored}"
    );
    assert_eq!(kube.cri.listed().1.len(), 1);

    kube.rt
        .block_on(
            kube.pods()
                .delete("web", &kube::api::DeleteParams::default()),
        )
        .unwrap();
    agent.wait_for("web deleted from the API", || {
        kube.stored("web").err().filter(|e| e.code() == 404)
    });
    agent.wait_for("the exited container and the sandbox removed", || {
        let (sandboxes, containers) = kube.cri.listed();
        (sandboxes.is_empty() && containers.is_empty()).then_some(())
    });
    let deletes: Vec<_> = kube
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::DELETE && r.path.ends_with("/pods/web"))
        .collect();
    assert_eq!(
        deletes.len(),
        2,
        "the user's, then the agent's: {deletes:?}"
    );
    let body: Value = serde_json::from_str(&deletes[1].body).unwrap();
    assert_eq!(body["gracePeriodSeconds"], 0, "{body}");
    assert_eq!(body["preconditions"]["uid"], uid.as_str(), "{body}");
    assert!(agent.terminate().success());
}

/// An agent that died between CreateContainer and StartContainer left a sandbox and a created,
/// never started container (made here by hand, with the labels the agent gives them): the next
/// agent adopts the sandbox, removes the stale container and starts a fresh one.
#[test]
fn cri_a_container_created_but_never_started_by_a_dead_agent_is_replaced() {
    use rustlet_cri::config::{ContainerInputs, container_config, sandbox_config};
    use rustlet_cri::security::{ContainerSecurityInputs, ImageUser};
    use rustlet_pods::runtime::ContainerKind;

    let uid = "0a7e8f2c-1d3b-4c5e-9f60-7182a3b4c5d6";
    let manifest = SLEEPER.replace("NAME", "stale").replace(
        "  namespace: default\n",
        &format!("  namespace: default\n  uid: {uid}\n"),
    );
    let Some(cri) = Cri::new(
        "cri_a_container_created_but_never_started",
        &[("stale.yaml", &manifest)],
    ) else {
        return;
    };
    let pod: k8s_openapi::api::core::v1::Pod = serde_saphyr::from_str(&manifest).unwrap();
    let spec_container = pod.spec.as_ref().unwrap().containers[0].clone();
    let endpoint = cri.containerd.endpoint().to_owned();
    let log_dir = rustlet_cri::logs::pod_logs_directory(
        &cri.root.join("pod-logs"),
        "default",
        "stale",
        &rustlet_core::PodUid::new(uid),
    )
    .unwrap();
    std::fs::create_dir_all(log_dir.join("main")).unwrap();
    let (sandbox, stale) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            let mut sandbox_cfg = sandbox_config(&pod, 0, &log_dir, "").unwrap();
            sandbox_cfg.labels.extend(cri.owner_labels());
            let sandbox = client.run_pod_sandbox(sandbox_cfg.clone()).await.unwrap();
            let image = client
                .image_status(rustlet_cri::testing::BUSYBOX_IMAGE)
                .await
                .unwrap()
                .unwrap()
                .id;
            let mut config = container_config(
                &pod,
                &spec_container,
                &ContainerInputs {
                    kind: ContainerKind::Regular,
                    attempt: 0,
                    image_ref: &image,
                    mounts: &[],
                    env: &[],
                    security: ContainerSecurityInputs {
                        image_user: &ImageUser::Uid(0),
                        seccomp_profile_root: &cri.root.join("seccomp"),
                        namespace_target: None,
                    },
                    termination_log: None,
                    node: rustlet_cri::runtime::host_node_resources(),
                },
            )
            .unwrap();
            config.labels.extend(cri.owner_labels());
            let stale = client
                .create_container(&sandbox, config, sandbox_cfg)
                .await
                .unwrap();
            (sandbox, stale)
        });
    let agent = cri.start();
    let pod = running(&agent, "stale");
    let id = container(&pod, "main")["containerID"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(id, format!("containerd://{stale}"));
    let (sandboxes, containers) = cri.listed();
    assert_eq!(sandboxes, [sandbox], "the sandbox is adopted");
    assert_eq!(
        containers.len(),
        1,
        "the stale container is removed: {containers:?}"
    );
    assert_eq!(format!("containerd://{}", containers[0].0), id);
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("created and never started"), "{log}");
}

/// B11 (upstream 1.35): an agent restart does not flip a Ready pod unready until its readiness
/// probe runs again: a container that started more than 10 s before the new agent keeps the
/// Ready it had. The Ready condition's lastTransitionTime in the API stays the same.
#[test]
fn cri_an_agent_restart_keeps_a_ready_pod_ready() {
    let Some(kube) = KubeCri::new("cri_an_agent_restart_keeps_a_ready_pod_ready") else {
        return;
    };
    let agent = kube.start();
    kube.create(&SLEEPER.replace("NAME", "probed").replace(
        "    command:",
        "    readinessProbe:\n      exec: {command: [\"true\"]}\n      periodSeconds: 30\n    command:",
    ));
    let ready_since = |stored: &Value| -> Option<String> {
        stored["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "True")
            .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
    };
    let before = agent.wait_for("probed Ready in the API", || {
        ready_since(&kube.stored("probed").ok()?)
    });
    // Upstream's rule needs the container to have started more than 10 s before the new agent.
    std::thread::sleep(Duration::from_secs(11));
    agent.kill9();
    let writes_before = kube.server.count(&http::Method::PATCH, "/pods/probed");
    let agent = kube.start();
    // The new agent syncs the pod (its first status) and probes it again (period 30 s: once,
    // at once); the Ready condition never left True.
    agent.wait_for("the restarted agent's view of the pod", || {
        agent
            .pod("probed")
            .filter(|p| container(p, "main")["ready"] == true)
    });
    // Room for any status write the new agent would make (none is awaited: with nothing
    // changed it may write nothing at all).
    std::thread::sleep(Duration::from_secs(2));
    let stored = kube.stored("probed").unwrap();
    assert_eq!(
        ready_since(&stored).as_deref(),
        Some(before.as_str()),
        "{stored}"
    );
    let patches: Vec<String> = kube
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::PATCH && r.path.ends_with("/pods/probed"))
        .skip(writes_before)
        .map(|r| r.body)
        .collect();
    assert!(
        patches.iter().all(|b| !b.contains("\"False\"")),
        "no condition went False after the restart: {patches:?}"
    );
    assert!(agent.terminate().success());
}

/// Issue 24 item 3: on a containerd shared with another agent, the orphan pass stops and
/// removes only what carries this agent's mark (its node name and root directory). A sandbox
/// with upstream's labels but without the mark (another kubelet's pod) survives; an unknown
/// sandbox with the mark (this agent's, from a pod gone while it was down) is removed, which
/// shows the orphan pass ran.
#[test]
fn cri_the_orphan_pass_leaves_what_another_agent_created_on_a_shared_containerd() {
    use rustlet_cri::config::sandbox_config;

    let Some(cri) = Cri::new(
        "cri_the_orphan_pass_leaves_what_another_agent_created",
        &[("stays.yaml", &SLEEPER.replace("NAME", "stays"))],
    ) else {
        return;
    };
    let endpoint = cri.containerd.endpoint().to_owned();
    let sandbox = |name: &str, uid: &str, marked: bool| {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }))
        .unwrap();
        let log_dir = cri.containerd.dir().join("other-logs").join(uid);
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut config = sandbox_config(&pod, 0, &log_dir, "").unwrap();
        if marked {
            config.labels.extend(cri.owner_labels());
        }
        let endpoint = endpoint.clone();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                    .await
                    .unwrap();
                client.run_pod_sandbox(config).await.unwrap()
            })
    };
    let foreign = sandbox("foreign", "5b0c6a1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b", false);
    let ours = sandbox("gone", "7c1d2e3f-4a5b-4c6d-9e0f-1a2b3c4d5e6f", true);
    let agent = cri.start();
    running(&agent, "stays");
    agent.wait_for("the agent's own orphan removed", || {
        let (sandboxes, _) = cri.listed();
        (!sandboxes.contains(&ours)).then_some(())
    });
    let (sandboxes, _) = cri.listed();
    assert!(
        sandboxes.contains(&foreign),
        "the other agent's sandbox survives: {sandboxes:?}"
    );
    assert_eq!(
        sandboxes.len(),
        2,
        "the foreign one and the pod's: {sandboxes:?}"
    );
    assert!(agent.terminate().success());
    let (sandboxes, _) = cri.listed();
    assert!(sandboxes.contains(&foreign), "{sandboxes:?}");
}

/// Issue 24 item 4: a finished pod never runs again. The agent is aborted (a fault point of the
/// test build) right after it reclaimed a `Never` pod that succeeded, and the terminal status
/// is taken out of the state file, as a crash before its write leaves it: the exited
/// container is still there, and the restarted agent reads the pod's phase from it instead of
/// running the pod again.
#[test]
fn cri_a_finished_pod_never_runs_again_after_a_crash_before_its_status_is_durable() {
    let once = r#"apiVersion: v1
kind: Pod
metadata:
  name: once
  namespace: default
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "sleep 1; exit 0"]
"#;
    let Some(cri) = Cri::new(
        "cri_a_finished_pod_never_runs_again",
        &[("once.yaml", once)],
    ) else {
        return;
    };
    let agent = cri.start_with_env(&[("RUSTLET_FAULT_ABORT_AT", "reclaimed")]);
    let status = agent.wait_exit();
    assert!(
        !status.success(),
        "aborted at the fault point (a build without the fault-injection feature runs on): \
         {status:?}"
    );
    let (_, before) = cri.listed();
    assert_eq!(before.len(), 1, "the exited container is kept: {before:?}");
    assert_eq!(before[0].1, 2, "CONTAINER_EXITED: {before:?}");
    let statuses = cri.root.join("local-pod-statuses.json");
    let _ = std::fs::remove_file(&statuses);

    let agent = cri.start();
    let pod = agent.wait_for_phase("once", "Succeeded");
    let uid = uid(&pod);
    agent.wait_for("the terminal status durable", || {
        let saved: Value = serde_json::from_slice(&std::fs::read(&statuses).ok()?).ok()?;
        (saved[&uid]["phase"] == "Succeeded").then_some(())
    });
    let (_, after) = cri.listed();
    assert_eq!(after, before, "no container created again");
    let main = container(&pod, "main");
    assert_eq!(main["state"]["terminated"]["exitCode"], 0, "{main}");
    assert_eq!(main["restartCount"], 0, "{main}");
    assert!(agent.terminate().success());
}

/// Issue 24 item 12 (W26 step 12): a pod deleted while the agent was down is found only in
/// the runtime after the restart; it counts as running until the orphan pass has stopped its
/// containers, so its emptyDir is torn down after them, not under them. The container reads
/// its emptyDir when it is told to stop and writes what it saw to a hostPath.
#[test]
fn cri_an_orphans_volumes_are_torn_down_after_its_containers_stop() {
    let Some(cri) = Cri::new("cri_an_orphans_volumes_are_torn_down_after", &[]) else {
        return;
    };
    let out = cri.containerd.dir().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: orphan
  namespace: default
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo data > /cache/marker; trap 'cat /cache/marker > /out/seen 2>&1; exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {{name: cache, mountPath: /cache}}
    - {{name: out, mountPath: /out}}
  volumes:
  - name: cache
    emptyDir: {{}}
  - name: out
    hostPath: {{path: {}, type: Directory}}
"#,
        out.display()
    );
    std::fs::write(cri.manifests.join("orphan.yaml"), manifest).unwrap();
    let agent = cri.start();
    let pod = running(&agent, "orphan");
    let marker = cri.root.join(format!(
        "pods/{}/volumes/kubernetes.io~empty-dir/cache/marker",
        uid(&pod)
    ));
    agent.wait_for("the marker written", || marker.exists().then_some(()));
    agent.kill9();
    std::fs::remove_file(cri.manifests.join("orphan.yaml")).unwrap();

    let agent = cri.start();
    agent.wait_for("the orphan's sandbox removed", || {
        cri.listed().0.is_empty().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(out.join("seen")).unwrap(),
        "data\n",
        "the emptyDir was still there when the container was told to stop"
    );
    agent.wait_for("the orphan's directory removed", || {
        (!marker.parent().unwrap().exists()).then_some(())
    });
    assert!(agent.terminate().success());
}

const SECURED: &str = r#"apiVersion: v1
kind: Secret
metadata: {name: only-group}
stringData:
  key: for-the-group
---
apiVersion: v1
kind: Pod
metadata: {name: secured}
spec:
  restartPolicy: Never
  securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "id; cat /secret/key; echo; grep -E '^(Uid|Gid|Groups):' /proc/self/status"]
    volumeMounts:
    - {name: secret, mountPath: /secret}
  volumes:
  - name: secret
    secret: {secretName: only-group, defaultMode: 0400}
---
apiVersion: v1
kind: Pod
metadata: {name: refused}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "id"]
"#;

/// Issue 24 item 2, through the binary: a pod's `securityContext.runAsUser` (here with
/// `runAsGroup` and `fsGroup`) is the process's user, and `fsGroup` is a supplemental group, so
/// that a secret file readable by its group alone (0400 and the fsGroup walk's group read) is
/// read; a pod with `runAsNonRoot` whose image runs as root shows `CreateContainerConfigError`
/// with upstream's message and never runs.
#[test]
fn cri_the_pods_security_context_is_the_containers_user_and_run_as_non_root_refuses_root() {
    let Some(cri) = Cri::new(
        "cri_the_pods_security_context_is_the_containers_user",
        &[("secured.yaml", SECURED)],
    ) else {
        return;
    };
    let agent = cri.start();
    let pod = agent.wait_for_phase("secured", "Succeeded");
    let lines = log_lines(&cri.root, &uid(&pod), "main");
    assert_eq!(
        lines,
        [
            "uid=1000 gid=3000 groups=2000,3000",
            "for-the-group",
            "Uid:\t1000\t1000\t1000\t1000",
            "Gid:\t3000\t3000\t3000\t3000",
            "Groups:\t2000 3000 ",
        ],
        "{pod}"
    );
    let pod = agent.wait_for("the refused pod's reason", || {
        agent.pod("refused").filter(|p| {
            container(p, "main")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
    });
    let uid = uid(&pod);
    assert_eq!(
        container(&pod, "main")["state"]["waiting"]["message"],
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"refused_default({uid})\", container: main)"
        ),
        "{pod}"
    );
    let (_, containers) = cri.listed();
    assert_eq!(
        containers.len(),
        1,
        "only the secured pod's: {containers:?}"
    );
}

fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

const INIT_CRASHER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: init-crasher
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: setup
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "exit 1"]
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
"#;

/// Item 6 (C14, C15): an init container that fails under `Always` is held in
/// `CrashLoopBackOff` (10 s doubling) with its exit as `lastState`, as a regular container is,
/// instead of being restarted at once, again and again.
#[test]
fn cri_a_failing_init_container_backs_off_in_crash_loop_back_off() {
    let Some(cri) = Cri::new(
        "cri_a_failing_init_container_backs_off",
        &[("init-crasher.yaml", INIT_CRASHER)],
    ) else {
        return;
    };
    let agent = cri.start();
    let pod = agent.wait_for("the init container in CrashLoopBackOff", || {
        agent.pod("init-crasher").filter(|p| {
            init_container(p, "setup")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        })
    });
    let setup = init_container(&pod, "setup");
    assert_eq!(setup["lastState"]["terminated"]["exitCode"], 1, "{setup}");
    assert!(
        setup["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("back-off 10s restarting failed container=setup")),
        "{setup}"
    );
    // The first crash restarts at once (upstream's quirk); the second waits 10 s.
    assert_eq!(setup["restartCount"], 1, "{setup}");
    assert_eq!(pod["status"]["phase"], "Pending");
    assert!(
        container(&pod, "main")["state"]["running"].is_null(),
        "the container waits for initialization: {pod}"
    );
}

const REINIT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: reinit
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: setup
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo setup >> /data/runs"]
    volumeMounts:
    - {name: data, mountPath: /data}
  - name: more
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo more >> /data/runs"]
    volumeMounts:
    - {name: data, mountPath: /data}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
  volumes:
  - name: data
    emptyDir: {}
"#;

/// Item 7 (C8, C13): when the pod's sandbox dies (stopped behind the agent's back), a new one
/// is made and the init containers that had completed run again, in order, before the
/// container.
#[test]
fn cri_a_new_sandbox_runs_the_init_containers_again() {
    let Some(cri) = Cri::new(
        "cri_a_new_sandbox_runs_the_init_containers_again",
        &[("reinit.yaml", REINIT)],
    ) else {
        return;
    };
    let agent = cri.start();
    let uid = uid(&running(&agent, "reinit"));
    let runs = cri.root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~empty-dir/data/runs"
    ));
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "setup\nmore\n");
    let (sandboxes, _) = cri.listed();
    assert_eq!(sandboxes.len(), 1);
    // The sandbox dies: stopped through CRI, which stops its containers too.
    let endpoint = cri.containerd.endpoint().to_owned();
    let old_id = sandboxes[0].clone();
    let old = old_id.clone();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            client.stop_pod_sandbox(&old).await.unwrap();
        });
    let pod = agent.wait_for("main running again in a new sandbox", || {
        agent.pod("reinit").filter(|p| {
            let main = container(p, "main");
            main["state"]["running"].is_object() && main["restartCount"] == 1
        })
    });
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "setup\nmore\nsetup\nmore\n",
        "the init containers ran again, in order"
    );
    assert_eq!(init_container(&pod, "setup")["restartCount"], 1, "{pod}");
    assert_eq!(init_container(&pod, "more")["restartCount"], 1, "{pod}");
    let (sandboxes, _) = cri.listed();
    assert!(
        sandboxes.iter().any(|s| *s != old_id),
        "a new sandbox: {sandboxes:?}"
    );
}

/// A pod whose container appends `start` to `/out/log` when it starts and, on SIGTERM,
/// waits until `/out/gate` exists (the test opens it), appends `term` and exits 0.
fn gated(name: &str, restart_policy: &str, out: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  restartPolicy: {restart_policy}
  terminationGracePeriodSeconds: 60
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo start >> /out/log; trap 'until [ -e /out/gate ]; do sleep 0.1; done; echo term >> /out/log; exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {{name: out, mountPath: /out}}
  volumes:
  - name: out
    hostPath: {{path: {}, type: Directory}}
"#,
        out.display()
    )
}

/// The lines of `<out>/log`.
fn gated_log(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Issue 24 item 8 through the binary: a `restartPolicy: Never` pod whose running container
/// containerd lost (`CONTAINER_UNKNOWN`, see `PrivateContainerd::lose_container_state`) shows
/// it terminated with `ContainerStatusUnknown` and exit code 137 (upstream
/// `convertToAPIContainerStatuses`) and goes Failed, not Succeeded; the container, which may
/// still run, is stopped (its TERM trap runs), and the pod stays Failed after its exit 0.
#[test]
fn cri_a_never_pods_container_in_unknown_state_is_container_status_unknown_and_the_pod_fails() {
    let Some(mut cri) = Cri::new("cri_a_never_pods_container_in_unknown_state", &[]) else {
        return;
    };
    let out = scratch(&cri.containerd, "out");
    std::fs::write(
        cri.manifests.join("lost.yaml"),
        gated("lost", "Never", &out),
    )
    .unwrap();
    let agent = cri.start();
    let pod = running(&agent, "lost");
    let id = container(&pod, "main")["containerID"]
        .as_str()
        .unwrap()
        .to_owned();
    cri.containerd.lose_container_state_blocking(&id);
    // The first terminal status: the unknown state lasts until the container exits, which it
    // cannot do before the gate opens (or the 60 s grace, longer than the harness deadline).
    let pod = agent.wait_for("a terminal phase", || {
        agent
            .pod("lost")
            .filter(|p| p["status"]["phase"] == "Failed" || p["status"]["phase"] == "Succeeded")
    });
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    let main = container(&pod, "main");
    assert_eq!(
        main["state"]["terminated"]["reason"], "ContainerStatusUnknown",
        "{pod}"
    );
    assert_eq!(main["state"]["terminated"]["exitCode"], 137, "{pod}");
    assert_eq!(main["containerID"], id.as_str(), "{pod}");

    // The agent stops it: the TERM trap waits at the gate.
    std::fs::write(out.join("gate"), "").unwrap();
    let pod = agent.wait_for("the container stopped", || {
        agent.pod("lost").filter(|p| {
            container(p, "main")["state"]["terminated"]["exitCode"] == 0
                && gated_log(&out).contains(&"term".to_owned())
        })
    });
    assert_eq!(pod["status"]["phase"], "Failed", "{pod}");
    assert_eq!(gated_log(&out), ["start", "term"]);
}

/// Issue 24 item 8 through the binary: a `restartPolicy: Always` pod's container that
/// containerd lost (`CONTAINER_UNKNOWN`) may still run, so it is stopped before its
/// replacement starts (upstream `computePodActions`: "try killing it before restart"); the
/// container's log shows the old one's TERM trap before the new one's start.
#[test]
fn cri_an_always_pods_container_in_unknown_state_is_killed_before_a_new_one_starts() {
    let Some(mut cri) = Cri::new("cri_an_always_pods_container_in_unknown_state", &[]) else {
        return;
    };
    let out = scratch(&cri.containerd, "out");
    std::fs::write(out.join("gate"), "").unwrap();
    std::fs::write(
        cri.manifests.join("lost.yaml"),
        gated("lost", "Always", &out),
    )
    .unwrap();
    let agent = cri.start();
    let pod = running(&agent, "lost");
    let id = container(&pod, "main")["containerID"]
        .as_str()
        .unwrap()
        .to_owned();
    cri.containerd.lose_container_state_blocking(&id);
    agent.wait_for("a second start", || {
        (gated_log(&out).iter().filter(|l| *l == "start").count() == 2).then_some(())
    });
    assert_eq!(gated_log(&out), ["start", "term", "start"]);
    let pod = agent.wait_for("the new container running", || {
        agent.pod("lost").filter(|p| {
            let main = container(p, "main");
            main["state"]["running"].is_object() && main["containerID"] != id.as_str()
        })
    });
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    assert_eq!(container(&pod, "main")["restartCount"], 1, "{pod}");
}

const CHATTY: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: chatty
  namespace: default
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "i=0; while [ $i -lt 20 ]; do echo line-$i; i=$((i+1)); done; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after-rotation; exec sleep 1000"]
"#;

/// Issue 26 item 3: the agent runs the kubelet's container log manager on the CRI runtime
/// with the config file's `containerLogMaxSize` and `containerLogMonitorInterval`: a log above
/// the size is renamed `0.log.<time>` and containerd writes a new `0.log`; the container's
/// `/var/log/containers`-style symlink under `<root>/container-logs` names the live file.
#[test]
fn cri_the_agent_rotates_a_container_log_above_container_log_max_size() {
    let Some(cri) = Cri::new(
        "cri_the_agent_rotates_a_container_log",
        &[("chatty.yaml", CHATTY)],
    ) else {
        return;
    };
    let config = cri.containerd.dir().join("config.yaml");
    std::fs::write(
        &config,
        "containerLogMaxSize: 200\ncontainerLogMonitorInterval: 3s\n",
    )
    .unwrap();
    let agent = cri.start_with(&["--config", config.to_str().unwrap()], &[]);
    let pod = running(&agent, "chatty");
    let uid = uid(&pod);
    let id = container(&pod, "main")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let dir = pod_log_dir(&cri.root, &uid).unwrap().join("main");
    let rotated = agent.wait_for("the log rotated", || {
        std::fs::read_dir(&dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("0.log."))
            })
    });
    assert!(
        std::fs::read_to_string(&rotated)
            .unwrap()
            .contains("line-19"),
        "{}",
        rotated.display()
    );
    let link = cri
        .root
        .join("container-logs")
        .join(format!("chatty_default_main-{id}.log"));
    assert_eq!(std::fs::read_link(&link).unwrap(), dir.join("0.log"));
    // containerd writes the reopened file.
    let endpoint = cri.containerd.endpoint().to_owned();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            let out = client
                .exec_sync(
                    &id,
                    vec!["touch".into(), "/tmp/go".into()],
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            assert_eq!(out.exit_code, 0);
        });
    agent.wait_for("the new file written", || {
        std::fs::read_to_string(&link)
            .ok()
            .filter(|s| s.contains("after-rotation") && !s.contains("line-"))
    });
    assert!(agent.terminate().success());
}

/// A pod with a sidecar (`side`, an init container with `restartPolicy: Always`) before an
/// ordinary init container and the main container. Each appends to `/out/log`: the sidecar
/// `side` when it starts (then passes its startup probe), and exits 1 when `/out/crash` appears
/// (it removes it) or `side-term` on SIGTERM; the init container `init`, after checking that
/// the sidecar started before it (`init-early` otherwise); the main container `main`, and on
/// SIGTERM `main-term`, then `main-exit` a second later.
fn with_sidecar(out: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: with-sidecar
  namespace: default
spec:
  terminationGracePeriodSeconds: 30
  initContainers:
  - name: side
    image: localhost/busybox:1
    restartPolicy: Always
    command: ["/bin/sh", "-c", "echo side >> /out/log; touch /tmp/started; trap 'echo side-term >> /out/log; exit 0' TERM; while [ ! -e /out/crash ]; do sleep 0.2 & wait $!; done; rm /out/crash; exit 1"]
    startupProbe:
      exec: {{command: ["test", "-e", "/tmp/started"]}}
      periodSeconds: 1
    volumeMounts:
    - {{name: out, mountPath: /out}}
  - name: init
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "if grep -q side /out/log; then echo init >> /out/log; else echo init-early >> /out/log; fi"]
    volumeMounts:
    - {{name: out, mountPath: /out}}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo main >> /out/log; trap 'echo main-term >> /out/log; sleep 1; echo main-exit >> /out/log; exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {{name: out, mountPath: /out}}
  volumes:
  - name: out
    hostPath: {{path: {}, type: Directory}}
"#,
        out.display()
    )
}

/// Issue 27 (sidecar containers), upstream `computeInitContainerActions` and the termination
/// ordering of `killContainersWithSyncResult`: the sidecar starts (and passes its startup
/// probe) before the next init container, the main container after both, with the pod
/// Initialized; the sidecar is restarted when it exits; on deletion it stops after the main
/// container.
#[test]
fn cri_a_sidecar_starts_first_is_restarted_when_it_exits_and_stops_after_the_main_container() {
    let Some(cri) = Cri::new("cri_a_sidecar_starts_first", &[]) else {
        return;
    };
    let out = scratch(&cri.containerd, "out");
    std::fs::write(cri.manifests.join("with-sidecar.yaml"), with_sidecar(&out)).unwrap();
    let agent = cri.start();
    let pod = agent.wait_for("the main container and the sidecar running", || {
        agent.pod("with-sidecar").filter(|p| {
            container(p, "main")["state"]["running"].is_object()
                && init_container(p, "side")["state"]["running"].is_object()
        })
    });
    assert_eq!(gated_log(&out), ["side", "init", "main"], "{pod}");
    let side = init_container(&pod, "side");
    assert_eq!(side["started"], true, "{side}");
    assert_eq!(side["restartCount"], 0, "{side}");
    assert_eq!(
        init_container(&pod, "init")["state"]["terminated"]["exitCode"],
        0,
        "{pod}"
    );
    let initialized = pod["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == "Initialized"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(initialized["status"], "True", "{pod}");
    let uid = uid(&pod);

    // The sidecar exits 1: it is restarted (the first restart is at once), the main container
    // keeps running and the ordinary init container does not run again.
    std::fs::write(out.join("crash"), "").unwrap();
    let pod = agent.wait_for("the sidecar restarted", || {
        agent.pod("with-sidecar").filter(|p| {
            let side = init_container(p, "side");
            side["restartCount"] == 1 && side["state"]["running"].is_object()
        })
    });
    let side = init_container(&pod, "side");
    assert_eq!(side["lastState"]["terminated"]["exitCode"], 1, "{side}");
    assert_eq!(container(&pod, "main")["restartCount"], 0, "{pod}");
    agent.wait_for("the restarted sidecar's line", || {
        (gated_log(&out).len() >= 4).then_some(())
    });
    assert_eq!(gated_log(&out), ["side", "init", "main", "side"]);

    // Deleted: the main container stops first (its trap takes a second), then the sidecar.
    std::fs::remove_file(cri.manifests.join("with-sidecar.yaml")).unwrap();
    agent.wait_for("the pod deleted", || {
        agent.pod("with-sidecar").is_none().then_some(())
    });
    agent.wait_for("the runtime emptied", || {
        let (s, c) = cri.listed();
        (s.is_empty() && c.is_empty()).then_some(())
    });
    assert_eq!(
        gated_log(&out),
        [
            "side",
            "init",
            "main",
            "side",
            "main-term",
            "main-exit",
            "side-term"
        ]
    );
    assert!(!cri.root.join("pods").join(&uid).exists());
}

/// A pod whose sidecar `side` is ready while `/out/side-ready` exists and alive while
/// `/out/side-sick` does not (exec probes, every second).
fn probed_sidecar(out: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: probed-sidecar
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: side
    image: localhost/busybox:1
    restartPolicy: Always
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    readinessProbe:
      exec: {{command: ["test", "-e", "/out/side-ready"]}}
      periodSeconds: 1
    livenessProbe:
      exec: {{command: ["/bin/sh", "-c", "! test -e /out/side-sick"]}}
      periodSeconds: 1
      failureThreshold: 1
    volumeMounts:
    - {{name: out, mountPath: /out}}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
  volumes:
  - name: out
    hostPath: {{path: {}, type: Directory}}
"#,
        out.display()
    )
}

fn condition(pod: &Value, type_: &str) -> Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == type_))
        .map_or(Value::Null, |c| c["status"].clone())
}

/// Issue 27 (sidecar containers), upstream's prober on restartable init containers ("Probing
/// restartable init container"): a sidecar's readiness probe decides its `ready` and counts in
/// the pod's Ready; a failed liveness probe restarts the sidecar, not the main container.
#[test]
fn cri_a_sidecars_readiness_counts_in_the_pods_ready_and_a_failed_liveness_probe_restarts_it() {
    let Some(cri) = Cri::new("cri_a_sidecars_probes", &[]) else {
        return;
    };
    let out = scratch(&cri.containerd, "out");
    std::fs::write(
        cri.manifests.join("probed-sidecar.yaml"),
        probed_sidecar(&out),
    )
    .unwrap();
    let agent = cri.start();
    let pod = running(&agent, "probed-sidecar");
    let side = init_container(&pod, "side");
    assert_eq!(side["ready"], false, "{side}");
    assert_eq!(condition(&pod, "Initialized"), "True", "{pod}");
    assert_eq!(condition(&pod, "Ready"), "False", "{pod}");

    std::fs::write(out.join("side-ready"), "").unwrap();
    let pod = agent.wait_for("the pod Ready with its sidecar", || {
        agent
            .pod("probed-sidecar")
            .filter(|p| condition(p, "Ready") == "True")
    });
    assert_eq!(init_container(&pod, "side")["ready"], true, "{pod}");

    std::fs::write(out.join("side-sick"), "").unwrap();
    let pod = agent.wait_for("the sidecar restarted by its liveness probe", || {
        agent.pod("probed-sidecar").filter(|p| {
            let side = init_container(p, "side");
            side["restartCount"] == 1 && side["state"]["running"].is_object()
        })
    });
    std::fs::remove_file(out.join("side-sick")).unwrap();
    let side = init_container(&pod, "side");
    assert!(side["lastState"]["terminated"].is_object(), "{side}");
    let main = container(&pod, "main");
    assert_eq!(main["restartCount"], 0, "{main}");
    assert!(main["state"]["running"].is_object(), "{main}");
    agent.wait_for("the restarted sidecar ready again", || {
        agent
            .pod("probed-sidecar")
            .filter(|p| condition(p, "Ready") == "True")
    });
}

/// A pod with its own UID (so that a manifest edit updates it instead of making a new pod),
/// and, where `EPHEMERAL` stands, the ephemeral container `kubectl debug` would add.
const DEBUGGED: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: debugged, uid: 3f0c1f9e-27c3-4d3b-9f5e-0e0000000e01}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
EPHEMERAL"#;

const DEBUGGER: &str = r#"  ephemeralContainers:
  - name: debugger
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do echo polo; sleep 1 & wait $!; done"]
    stdin: true
    tty: true
    targetContainerName: main
"#;

/// upstream "Ephemeral Containers will start an ephemeral container in an existing pod"
/// through the binary: an ephemeral container added to a running pod starts in its sandbox
/// (the pod's own container goes on untouched), shows in `ephemeralContainerStatuses`, writes
/// its log, runs an exec, and is stopped with the pod.
#[test]
fn cri_an_ephemeral_container_added_to_a_running_pod_starts_and_stops_with_it() {
    let Some(cri) = Cri::new("cri_an_ephemeral_container_added", &[]) else {
        return;
    };
    let manifest = cri.manifests.join("debugged.yaml");
    std::fs::write(&manifest, DEBUGGED.replace("EPHEMERAL", "")).unwrap();
    let agent = cri.start();
    let pod = running(&agent, "debugged");
    let pod_uid = uid(&pod);
    let main_id = container(&pod, "main")["containerID"].clone();
    assert!(
        pod["status"]["ephemeralContainerStatuses"].is_null(),
        "{pod}"
    );

    std::fs::write(&manifest, DEBUGGED.replace("EPHEMERAL", DEBUGGER)).unwrap();
    let ephemeral = |p: &Value| {
        p["status"]["ephemeralContainerStatuses"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["name"] == "debugger"))
            .cloned()
    };
    let pod = agent.wait_for("the debugger running", || {
        agent
            .pod("debugged")
            .filter(|p| ephemeral(p).is_some_and(|d| d["state"]["running"].is_object()))
    });
    assert_eq!(uid(&pod), pod_uid, "the same pod");
    let debugger = ephemeral(&pod).unwrap();
    assert_eq!(debugger["ready"], false, "{debugger}");
    assert_eq!(debugger["restartCount"], 0, "{debugger}");
    let main = container(&pod, "main");
    assert_eq!(main["containerID"], main_id, "{main}");
    assert_eq!(main["restartCount"], 0, "{main}");
    let (sandboxes, containers) = cri.listed();
    assert_eq!((sandboxes.len(), containers.len()), (1, 2));

    // Its log, and an exec in it (as `kubectl exec -c debugger`).
    agent.wait_for("the debugger's log", || {
        log_lines(&cri.root, &pod_uid, "debugger")
            .iter()
            .any(|l| l.contains("polo"))
            .then_some(())
    });
    let id = debugger["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let endpoint = cri.containerd.endpoint().to_owned();
    let (out, ps) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            let exec = |cmd: &[&str]| {
                let cmd = cmd.iter().map(|s| (*s).to_owned()).collect();
                let (client, id) = (&client, &id);
                async move {
                    client
                        .exec_sync(id, cmd, Duration::from_secs(10))
                        .await
                        .unwrap()
                }
            };
            (exec(&["/bin/echo", "marco"]).await, exec(&["ps"]).await)
        });
    assert_eq!(out.exit_code, 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("marco"));
    // `targetContainerName: main`: the debugger sees main's processes (upstream's
    // `NamespaceMode_TARGET`).
    let ps = String::from_utf8_lossy(&ps.stdout).into_owned();
    assert!(ps.contains("do sleep 1"), "{ps}");

    // The pod deleted: both containers stop and go with the sandbox.
    std::fs::remove_file(&manifest).unwrap();
    agent.wait_for("the pod deleted", || {
        agent.pod("debugged").is_none().then_some(())
    });
    agent.wait_for("the runtime emptied", || {
        let (s, c) = cri.listed();
        (s.is_empty() && c.is_empty()).then_some(())
    });
}
