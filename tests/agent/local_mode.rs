//! Local mode: a manifest directory in, real mounts and statuses out.

use std::path::{Path, PathBuf};

use rustlet_mount::testing::{PrivilegedDir, privileged_dir};

use crate::harness::{Agent, condition, mounts_under, run_to_end, start, start_with_env};

const WEB: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
spec:
  containers:
  - name: server
    image: busybox
    volumeMounts:
    - {name: cache, mountPath: /cache}
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: cache
    emptyDir: {}
  - name: scratch
    emptyDir:
      medium: Memory
";

const KEEP: &str = "apiVersion: v1
kind: Pod
metadata:
  name: keep
  namespace: default
spec:
  containers:
  - name: server
    image: busybox
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: scratch
    emptyDir:
      medium: Memory
";

/// A privileged temp dir with a root directory and a manifest directory for one test.
struct Local {
    dir: PrivilegedDir,
    root: PathBuf,
    manifests: PathBuf,
}

impl Local {
    /// `None` (the test is skipped) without the privileges to mount.
    fn new(test: &str, files: &[(&str, &str)]) -> Option<Self> {
        let dir = privileged_dir(test)?;
        let (root, manifests) = (dir.mkdir("root"), dir.mkdir("manifests"));
        for (name, text) in files {
            std::fs::write(manifests.join(name), text).unwrap();
        }
        Some(Self {
            dir,
            root,
            manifests,
        })
    }

    fn args(&self) -> Vec<&str> {
        args(
            self.root.to_str().unwrap(),
            self.manifests.to_str().unwrap(),
        )
    }

    fn start(&self) -> Agent {
        start(&self.args(), &self.dir.path().join("agent.log"))
    }
}

fn args<'a>(root: &'a str, manifests: &'a str) -> Vec<&'a str> {
    vec![
        "--node-name",
        "node-a",
        "--root-dir",
        root,
        "--local",
        manifests,
    ]
}

fn uid(pod: &serde_json::Value) -> String {
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

fn volume_dir(root: &Path, uid: &str, name: &str) -> std::path::PathBuf {
    root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/{name}"))
}

#[test]
fn a_manifest_pod_runs_with_its_volumes_and_is_deleted_when_its_manifest_goes() {
    let Some(local) = Local::new("a_manifest_pod_runs_with_its_volumes", &[("web.yaml", WEB)])
    else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let agent = local.start();
    let pod = agent.wait_for_phase("web", "Running");
    for type_ in [
        "PodScheduled",
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ] {
        assert_eq!(
            condition(&pod, type_).as_deref(),
            Some("True"),
            "{type_}: {pod}"
        );
    }
    assert_eq!(pod["status"]["hostIP"], "127.0.0.1");
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .unwrap()
            .starts_with("10.88.")
    );
    let server = &pod["status"]["containerStatuses"][0];
    assert_eq!(server["ready"], true);
    assert!(server["state"]["running"].is_object(), "{server}");
    let uid = uid(&pod);
    let scratch = volume_dir(root, &uid, "scratch");
    assert!(volume_dir(root, &uid, "cache").is_dir());
    assert_eq!(
        mounts_under(root),
        [scratch.to_string_lossy()],
        "the Memory emptyDir is a tmpfs, mounted once"
    );

    assert_eq!(agent.get("/healthz"), Some((200, "ok".to_owned())));
    let metrics = agent.wait_for("volume counts in /metrics", || {
        let (code, text) = agent.get("/metrics")?;
        (code == 200 && text.contains("volume_manager_total_volumes{")).then_some(text)
    });
    for name in [
        "pod_status_sync_duration_seconds_count",
        "status_api_requests_total{verb=\"patch\",code=\"200\"}",
        "storage_operation_duration_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(metrics.contains(name), "{name} in /metrics:\n{metrics}");
    }

    std::fs::remove_file(manifests.join("web.yaml")).unwrap();
    agent.wait_for("the pod deleted", || {
        agent.pod("web").is_none().then_some(())
    });
    agent.wait_for("its directory removed", || {
        (!root.join("pods").join(&uid).exists()).then_some(())
    });
    assert!(mounts_under(root).is_empty(), "nothing left mounted");
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}

#[test]
fn restart_policies_end_in_their_phases_and_a_crash_loop_counts_restarts() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let read = |file: &str| std::fs::read_to_string(examples.join(file)).unwrap();
    let (job, crashloop) = (read("job.yaml"), read("crashloop.yaml"));
    let Some(local) = Local::new(
        "restart_policies_end_in_their_phases",
        &[("job.yaml", &job), ("crashloop.yaml", &crashloop)],
    ) else {
        return;
    };
    let agent = local.start();
    let once = agent.wait_for_phase("once", "Succeeded");
    let init = &once["status"]["initContainerStatuses"][0];
    assert_eq!(init["state"]["terminated"]["reason"], "Completed", "{init}");
    let work = &once["status"]["containerStatuses"][0];
    assert_eq!(work["state"]["terminated"]["exitCode"], 0, "{work}");
    assert_eq!(condition(&once, "Ready").as_deref(), Some("False"));

    let broken = agent.wait_for_phase("broken", "Failed");
    let app = &broken["status"]["containerStatuses"][0];
    assert_eq!(app["state"]["terminated"]["exitCode"], 3, "{app}");
    assert_eq!(app["restartCount"], 0);

    let flaky = agent.wait_for("flaky restarted", || {
        agent
            .pod("flaky")
            .filter(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1))
    });
    assert_eq!(flaky["status"]["phase"], "Running");
    let app = &flaky["status"]["containerStatuses"][0];
    assert_eq!(app["lastState"]["terminated"]["exitCode"], 3, "{app}");
    agent.wait_for("a crash-loop back-off", || {
        agent.pod("flaky").filter(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        })
    });
    let (once, broken) = (agent.pod("once").unwrap(), agent.pod("broken").unwrap());
    assert!(agent.terminate().success());

    // After a restart the finished pods keep their statuses and are not run again (W2); the
    // running one starts again (a simulated container does not outlive the agent).
    let agent = local.start();
    agent.wait_for("flaky run again and restarted", || {
        agent
            .pod("flaky")
            .filter(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1))
    });
    for before in [&once, &broken] {
        let name = before["metadata"]["name"].as_str().unwrap();
        let after = agent.pod(name).unwrap();
        assert_eq!(
            after["metadata"]["uid"], before["metadata"]["uid"],
            "{name}"
        );
        assert_eq!(
            after["status"]["phase"], before["status"]["phase"],
            "{name}"
        );
        assert_eq!(
            after["status"]["containerStatuses"], before["status"]["containerStatuses"],
            "{name}: the same finished containers, not a new run"
        );
    }
    assert!(agent.terminate().success());
}

#[test]
fn a_restart_after_sigterm_or_kill_9_adopts_mounts_and_tears_down_what_went_meanwhile() {
    let Some(local) = Local::new(
        "a_restart_adopts_mounts",
        &[("keep.yaml", KEEP), ("web.yaml", WEB)],
    ) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let agent = local.start();
    let keep = uid(&agent.wait_for_phase("keep", "Running"));
    let web = uid(&agent.wait_for_phase("web", "Running"));
    let data = volume_dir(root, &keep, "scratch").join("data");
    std::fs::write(&data, "survives").unwrap();

    // SIGTERM: exit 0, every mount left in place.
    let before = mounts_under(root);
    assert_eq!(before.len(), 2);
    assert!(agent.terminate().success());
    assert_eq!(mounts_under(root), before, "mounts stay after SIGTERM");

    // Start again, then kill -9 while it runs; meanwhile web's manifest goes.
    let agent = local.start();
    assert_eq!(
        uid(&agent.wait_for_phase("keep", "Running")),
        keep,
        "same pod"
    );
    agent.kill9();
    std::fs::remove_file(manifests.join("web.yaml")).unwrap();

    let agent = local.start();
    agent.wait_for_phase("keep", "Running");
    agent.wait_for("web's volumes torn down and its directory removed", || {
        (!root.join("pods").join(&web).exists()).then_some(())
    });
    assert_eq!(
        mounts_under(root),
        [volume_dir(root, &keep, "scratch").to_string_lossy()],
        "keep's tmpfs adopted, not stacked; web's gone"
    );
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "survives");
    assert!(agent.terminate().success());
}

#[test]
fn a_second_agent_on_the_same_root_is_refused() {
    let Some(local) = Local::new("a_second_agent_on_the_same_root_is_refused", &[]) else {
        return;
    };
    let agent = local.start();
    let mut second = local.args();
    second.extend(["--listen", "127.0.0.1:0"]);
    let (status, stderr) = run_to_end(&second);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another rustlet already runs"), "{stderr}");
    assert!(agent.terminate().success());
}

#[test]
fn bad_flags_and_config_values_exit_2_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, "apiQPS: fast\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--bogus"], "--bogus"),
        (
            vec!["--node-name", "n", "--root-dir", d],
            "--local DIR or --kubeconfig FILE",
        ),
        (
            vec![
                "--node-name",
                "n",
                "--root-dir",
                d,
                "--local",
                "/nonexistent",
            ],
            "--local",
        ),
        (
            vec![
                "--node-name",
                "n",
                "--root-dir",
                d,
                "--local",
                d,
                "--config",
                config.to_str().unwrap(),
            ],
            "apiQPS",
        ),
        (
            vec![
                "--node-name",
                "n",
                "--root-dir",
                d,
                "--local",
                d,
                "--listen",
                "nope",
            ],
            "--listen",
        ),
    ];
    for (args, named) in cases {
        let (status, stderr) = run_to_end(&args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?} should name {named}: {stderr}"
        );
    }
    let (status, stdout_err) = run_to_end(&["--help"]);
    assert!(status.success(), "{stdout_err}");
}

/// [`WEB`] as `nfs`, its disk volume of a type local mode does not support.
fn nfs_pod() -> String {
    WEB.replace("name: web", "name: nfs")
        .replace("emptyDir: {}", "nfs: {server: example.invalid, path: /x}")
}

#[test]
fn bad_manifests_and_an_unknown_volume_type_leave_the_other_pods_unharmed() {
    let nfs = nfs_pod();
    let Some(local) = Local::new(
        "bad_manifests_leave_the_other_pods_unharmed",
        &[
            ("web.yaml", WEB),
            ("truncated.yaml", &WEB[..WEB.len() / 2]),
            ("garbage.json", "{\"kind\": "),
            (
                "hostile.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: evil, namespace: default}\ndata: {\"../escape\": x}\n",
            ),
            ("nfs.yaml", &nfs),
        ],
    ) else {
        return;
    };
    let log = local.dir.path().join("agent.log");
    let agent = local.start();
    agent.wait_for_phase("web", "Running");
    let nfs = agent.wait_for("the nfs pod reported", || agent.pod("nfs"));
    assert_eq!(nfs["status"]["phase"], "Pending", "{nfs}");
    let text = std::fs::read_to_string(&log).unwrap();
    for file in ["truncated.yaml", "garbage.json", "hostile.yaml"] {
        assert!(text.contains(file), "{file} reported: {text}");
    }
    assert!(agent.pod("evil").is_none());
    assert!(agent.terminate().success());
}

/// Upstream's kubelet without an API server logs each event ("Event occurred", at verbosity 3)
/// and sends none; so does local mode, at debug level: a started pod's `Started` and an
/// unsupported volume's `FailedMount` warning are in the log, and nothing shows them at the
/// default level.
#[test]
fn local_events_are_logged_at_debug_as_a_kubelet_without_an_api_server_does() {
    let nfs = nfs_pod();
    let Some(local) = Local::new(
        "local_events_are_logged",
        &[("web.yaml", WEB), ("nfs.yaml", &nfs)],
    ) else {
        return;
    };
    let log = local.dir.path().join("agent.log");
    let agent = start_with_env(
        None,
        &local.args(),
        &[("RUSTLET_LOG", "info,rustlet_volume::events=debug")],
        &log,
    );
    agent.wait_for_phase("web", "Running");
    let event = |object: &str, kind: &str, reason: &str| {
        std::fs::read_to_string(&log).unwrap().lines().any(|l| {
            l.contains("Event occurred")
                && l.contains(&format!("object={object} "))
                && l.contains(&format!("type=\"{kind}\" reason=\"{reason}\""))
        })
    };
    agent.wait_for("web's Started event in the log", || {
        event("default/web", "Normal", "Started").then_some(())
    });
    agent.wait_for("nfs's FailedMount event in the log", || {
        event("default/nfs", "Warning", "FailedMount").then_some(())
    });
    assert!(agent.terminate().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("no API server: events are logged at debug level, not sent"),
        "{text}"
    );

    // At the default level, no event is logged: the failed sync that raises nfs's
    // FailedMount is logged, the event is not.
    std::fs::remove_file(&log).unwrap();
    let agent = local.start();
    agent.wait_for("nfs's failed sync in the log", || {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines()
            .any(|l| {
                l.contains("pod=default/nfs") && l.contains("Unable to attach or mount volumes")
            })
            .then_some(())
    });
    assert!(agent.terminate().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("Event occurred"), "{text}");
}

const FIXED: &str = "apiVersion: v1
kind: Pod
metadata:
  name: fixed
  namespace: default
  uid: 6d1a5e36-0c4b-4c59-9a43-5a2f0f1c7d01
spec:
  containers:
  - name: server
    image: busybox
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: scratch
    emptyDir:
      medium: Memory
";

/// Issue 10 item 17, both sequences: a pod without a UID of its own that is edited, or
/// removed and restored, comes back as a new pod with a fresh UID (never the terminating one);
/// a manifest that carries its UID comes back under it once the old incarnation is finished,
/// with fresh volumes.
#[test]
fn an_edited_or_restored_manifest_is_a_new_incarnation() {
    let Some(local) = Local::new(
        "an_edited_or_restored_manifest_is_a_new_incarnation",
        &[("web.yaml", WEB), ("fixed.yaml", FIXED)],
    ) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let agent = local.start();
    let first = uid(&agent.wait_for_phase("web", "Running"));

    // An edit of the spec: the old pod terminates, then the new one runs.
    std::fs::write(
        manifests.join("web.yaml"),
        WEB.replace("busybox", "busybox:2"),
    )
    .unwrap();
    let second = agent.wait_for("web edited and running again", || {
        agent
            .pod("web")
            .filter(|p| uid(p) != first && p["status"]["phase"] == "Running")
    });
    let second = uid(&second);
    agent.wait_for("the first incarnation's directory removed", || {
        (!root.join("pods").join(&first).exists()).then_some(())
    });

    // Removed, then restored as soon as its pod terminates.
    std::fs::remove_file(manifests.join("web.yaml")).unwrap();
    agent.wait_for("web terminating or gone", || match agent.pod("web") {
        None => Some(()),
        Some(p) => {
            (!p["metadata"]["deletionTimestamp"].is_null() || uid(&p) != second).then_some(())
        }
    });
    std::fs::write(manifests.join("web.yaml"), WEB).unwrap();
    let third = agent.wait_for("web restored and running", || {
        agent
            .pod("web")
            .filter(|p| uid(p) != second && p["status"]["phase"] == "Running")
    });
    assert_ne!(uid(&third), first, "never a UID seen before");

    // A UID written in the manifest comes back under the same UID, with fresh volumes.
    let fixed = uid(&agent.wait_for_phase("fixed", "Running"));
    let data = volume_dir(root, &fixed, "scratch").join("data");
    std::fs::write(&data, "old incarnation").unwrap();
    std::fs::remove_file(manifests.join("fixed.yaml")).unwrap();
    agent.wait_for("fixed gone", || agent.pod("fixed").is_none().then_some(()));
    std::fs::write(manifests.join("fixed.yaml"), FIXED).unwrap();
    let back = agent.wait_for_phase("fixed", "Running");
    assert_eq!(uid(&back), fixed);
    assert!(volume_dir(root, &fixed, "scratch").is_dir());
    assert!(!data.exists(), "the new incarnation's emptyDir is fresh");
    assert!(agent.terminate().success());
}

fn numbered(n: usize) -> String {
    KEEP.replace("name: keep", &format!("name: p{n}"))
}

/// The tmpfs mount points the agent should have: one per running pod, once each.
fn expect_mounts(agent: &Agent, root: &Path, names: &[String]) {
    agent.wait_for("every wanted pod running with exactly its tmpfs", || {
        let pods = agent.pods();
        let running: Vec<&serde_json::Value> = names
            .iter()
            .filter_map(|n| pods.iter().find(|p| p["metadata"]["name"] == n.as_str()))
            .filter(|p| p["status"]["phase"] == "Running")
            .collect();
        if running.len() != names.len() || pods.len() != names.len() {
            return None;
        }
        let mut want: Vec<String> = running
            .iter()
            .map(|p| {
                volume_dir(root, &uid(p), "scratch")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        want.sort();
        let mut have = mounts_under(root);
        have.sort();
        // No pod directory left behind (orphans go at the next housekeeping).
        let dirs = std::fs::read_dir(root.join("pods")).ok()?.count();
        (have == want && dirs == names.len()).then_some(())
    });
}

/// `kill -9` in the middle of a mount storm and in the middle of a teardown, with the desired
/// state changed while the agent is down: it converges, each wanted tmpfs mounted once,
/// nothing leaked.
#[test]
fn kill_9_in_the_middle_of_mounting_and_of_tearing_down_converges() {
    let Some(local) = Local::new("kill_9_in_the_middle_of_mounting", &[]) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    for n in 0..30 {
        std::fs::write(manifests.join(format!("p{n}.yaml")), numbered(n)).unwrap();
    }
    let agent = local.start();
    agent.wait_for("the first pod running", || {
        agent
            .pods()
            .iter()
            .any(|p| p["status"]["phase"] == "Running")
            .then_some(())
    });
    agent.kill9();
    // While it is down: ten go, five come.
    for n in 0..10 {
        std::fs::remove_file(manifests.join(format!("p{n}.yaml"))).unwrap();
    }
    for n in 30..35 {
        std::fs::write(manifests.join(format!("p{n}.yaml")), numbered(n)).unwrap();
    }
    let agent = local.start();
    let names: Vec<String> = (10..35).map(|n| format!("p{n}")).collect();
    expect_mounts(&agent, root, &names);

    // Now in the middle of a teardown.
    for n in 10..25 {
        std::fs::remove_file(manifests.join(format!("p{n}.yaml"))).unwrap();
    }
    agent.wait_for("a teardown under way", || {
        (agent.pods().len() < names.len()).then_some(())
    });
    agent.kill9();
    let agent = local.start();
    let names: Vec<String> = (25..35).map(|n| format!("p{n}")).collect();
    expect_mounts(&agent, root, &names);
    assert!(agent.terminate().success());
}

const CONTENT: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data:
  app.conf: \"greeting=hello\\n\"
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData:
  password: s3cret
---
apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: config, mountPath: /etc/app}
    - {name: secret, mountPath: /etc/secret}
  volumes:
  - name: config
    configMap: {name: app-config, defaultMode: 0440}
  - name: secret
    secret: {secretName: app-secret}
";

/// Issue 12: configMap and secret volumes from manifests: the files with their modes, the
/// secret on a tmpfs, an edit of the ConfigMap written into the volume within seconds, and
/// everything torn down with the pod.
#[test]
fn config_map_and_secret_volumes_follow_their_manifests() {
    let Some(local) = Local::new("config_map_and_secret_volumes", &[("app.yaml", CONTENT)]) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let agent = local.start();
    let uid = uid(&agent.wait_for_phase("app", "Running"));
    let volume =
        |plugin: &str, name: &str| root.join(format!("pods/{uid}/volumes/{plugin}/{name}"));
    let config = volume("kubernetes.io~configmap", "config");
    let secret = volume("kubernetes.io~secret", "secret");
    assert_eq!(
        std::fs::read_to_string(config.join("app.conf")).unwrap(),
        "greeting=hello\n"
    );
    let mode = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(
        mode(&config.join("app.conf")),
        0o440,
        "YAML octal defaultMode"
    );
    assert_eq!(
        std::fs::read_to_string(secret.join("password")).unwrap(),
        "s3cret"
    );
    assert_eq!(mode(&secret.join("password")), 0o644);
    assert_eq!(
        mounts_under(root),
        [secret.to_string_lossy()],
        "the secret on a tmpfs, the configMap on disk"
    );

    std::fs::write(
        manifests.join("app.yaml"),
        CONTENT.replace("greeting=hello", "greeting=changed"),
    )
    .unwrap();
    agent.wait_for("the ConfigMap edit in the volume", || {
        let text = std::fs::read_to_string(config.join("app.conf")).ok()?;
        (text == "greeting=changed\n").then_some(())
    });

    // A restart adopts both volumes: no new version written (the content did not change), no
    // second tmpfs stacked on the secret.
    let versions = || [&config, &secret].map(|v| std::fs::read_link(v.join("..data")).unwrap());
    let before = versions();
    assert!(agent.terminate().success());
    let agent = local.start();
    assert_eq!(self::uid(&agent.wait_for_phase("app", "Running")), uid);
    assert_eq!(versions(), before, "unchanged content is not written again");
    assert_eq!(
        mounts_under(root),
        [secret.to_string_lossy()],
        "adopted, not stacked"
    );
    assert_eq!(
        std::fs::read_to_string(secret.join("password")).unwrap(),
        "s3cret"
    );

    std::fs::remove_file(manifests.join("app.yaml")).unwrap();
    agent.wait_for("the pod's volumes torn down", || {
        (!root.join("pods").join(&uid).exists()).then_some(())
    });
    assert!(mounts_under(root).is_empty());
    assert!(agent.terminate().success());
}

const DOWNWARD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: info
  labels: {app: web}
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: podinfo, mountPath: /etc/podinfo}
    - {name: all, mountPath: /etc/all}
  volumes:
  - name: podinfo
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: name, fieldRef: {fieldPath: metadata.name}}
  - name: all
    projected:
      defaultMode: 0440
      sources:
      - configMap:
          name: info-config
          items: [{key: level, path: config/level}]
      - downwardAPI:
          items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: info-config}
data: {level: debug}
---
apiVersion: v1
kind: Pod
metadata:
  name: tokened
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: token, mountPath: /var/run/secrets/tokens}
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: scratch
    emptyDir: {}
  - name: token
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3600}
";

/// Issue 12: a downwardAPI volume shows the pod's fields and follows a label edit; a projected
/// service account token, which local mode cannot issue, fails that volume with a clear error
/// and leaves the pod's other volumes mounted.
#[test]
fn downward_api_follows_labels_and_a_token_volume_fails_clearly_in_local_mode() {
    let Some(local) = Local::new("downward_api_and_token", &[("pods.yaml", DOWNWARD)]) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let agent = local.start();
    let info = uid(&agent.wait_for_phase("info", "Running"));
    let podinfo = root.join(format!(
        "pods/{info}/volumes/kubernetes.io~downward-api/podinfo"
    ));
    assert_eq!(
        std::fs::read_to_string(podinfo.join("labels")).unwrap(),
        "app=\"web\""
    );
    assert_eq!(
        std::fs::read_to_string(podinfo.join("name")).unwrap(),
        "info"
    );
    let all = root.join(format!("pods/{info}/volumes/kubernetes.io~projected/all"));
    assert_eq!(
        std::fs::read_to_string(all.join("config/level")).unwrap(),
        "debug"
    );
    assert_eq!(std::fs::read_to_string(all.join("ns")).unwrap(), "default");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(all.join("ns"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o440);
    }
    let mounted = mounts_under(&root.join(format!("pods/{info}")));
    assert!(
        mounted.contains(&podinfo.to_string_lossy().into_owned())
            && mounted.contains(&all.to_string_lossy().into_owned()),
        "downwardAPI and projected on tmpfs: {mounted:?}"
    );
    std::fs::write(
        manifests.join("pods.yaml"),
        DOWNWARD.replace("labels: {app: web}", "labels: {app: web, tier: front}"),
    )
    .unwrap();
    agent.wait_for("the new labels in the volume", || {
        let text = std::fs::read_to_string(podinfo.join("labels")).ok()?;
        (text == "app=\"web\"\ntier=\"front\"").then_some(())
    });
    assert_eq!(
        uid(&agent.pod("info").unwrap()),
        info,
        "a label edit keeps the pod"
    );

    let tokened = uid(&agent.pod("tokened").unwrap());
    agent.wait_for("the token volume's clear error", || {
        let log = std::fs::read_to_string(&agent.log).ok()?;
        log.contains("local mode has no token issuer").then_some(())
    });
    let pod = agent.pod("tokened").unwrap();
    assert_eq!(pod["status"]["phase"], "Pending", "{pod}");
    assert!(
        root.join(format!(
            "pods/{tokened}/volumes/kubernetes.io~empty-dir/scratch"
        ))
        .is_dir(),
        "the other volume is mounted"
    );
    assert!(
        !root
            .join(format!(
                "pods/{tokened}/volumes/kubernetes.io~projected/token"
            ))
            .join("..data")
            .exists(),
        "nothing written for the token volume"
    );
    assert!(agent.terminate().success());
}

/// Issue 12, subPath: a container's subPath is created in its volume and bound from a pinned
/// fd under `volume-subpaths/`; one that a symlink planted in the volume would lead outside is
/// the container's `CreateContainerConfigError`, with nothing mounted; deleting the pod
/// removes the binds before the volumes.
#[test]
fn subpaths_are_bound_safely_and_a_symlink_escape_is_refused() {
    let Some(local) = Local::new("subpaths_bound_safely", &[]) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let shared = local.dir.mkdir("shared");
    let outside = local.dir.mkdir("outside");
    std::fs::write(outside.join("secret"), "host data").unwrap();
    std::os::unix::fs::symlink(&outside, shared.join("escape")).unwrap();
    let pods = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: logs}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {{name: scratch, mountPath: /var/log/app, subPath: logs/app}}
  volumes:
  - {{name: scratch, emptyDir: {{}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: escaper}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {{name: shared, mountPath: /x, subPath: escape}}
  volumes:
  - name: shared
    hostPath: {{path: {}, type: Directory}}
",
        shared.display()
    );
    std::fs::write(manifests.join("pods.yaml"), pods).unwrap();
    let agent = local.start();
    let logs = uid(&agent.wait_for_phase("logs", "Running"));
    let target = root.join(format!("pods/{logs}/volume-subpaths/scratch/app/0"));
    assert_eq!(
        mounts_under(&root.join(format!("pods/{logs}"))),
        [target.to_string_lossy()]
    );
    std::fs::write(target.join("line"), "through the bind").unwrap();
    let volume = root.join(format!(
        "pods/{logs}/volumes/kubernetes.io~empty-dir/scratch/logs/app/line"
    ));
    assert_eq!(std::fs::read_to_string(volume).unwrap(), "through the bind");

    let escaper = agent.wait_for("the escape refused", || {
        agent.pod("escaper").filter(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
                == "CreateContainerConfigError"
        })
    });
    let message = escaper["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message
            .contains("failed to prepare subPath for volumeMount \"shared\" of container \"app\""),
        "{message}"
    );
    assert!(
        !message.contains(outside.to_str().unwrap()),
        "no host path: {message}"
    );
    let escaper_uid = uid(&escaper);
    assert!(mounts_under(&root.join(format!("pods/{escaper_uid}"))).is_empty());
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "host data"
    );

    std::fs::remove_file(manifests.join("pods.yaml")).unwrap();
    agent.wait_for("both pods gone with their binds", || {
        (!root.join("pods").join(&logs).exists() && !root.join("pods").join(&escaper_uid).exists())
            .then_some(())
    });
    assert!(mounts_under(root).is_empty());
    assert!(agent.terminate().success());
}

/// Issue 12 in local mode, where no PV controller runs: manifests that bind a claim as the
/// controller would (the claim's UID in the PV's `claimRef`, `status.phase: Bound`) give the
/// pod its local volume.
#[test]
fn a_claim_bound_by_its_manifests_mounts_a_local_volume() {
    let Some(local) = Local::new("local_mode_claim", &[]) else {
        return;
    };
    let disk = local.dir.mkdir("disk");
    std::fs::write(disk.join("hello"), "from the disk").unwrap();
    let manifests = format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-ssd1}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  local: {{path: {}}}
  claimRef: {{namespace: default, name: data, uid: 6d1c2a0e-0000-4000-8000-000000000001}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: [node-a]}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, uid: 6d1c2a0e-0000-4000-8000-000000000001}}
spec:
  volumeName: pv-ssd1
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
status: {{phase: Bound}}
---
apiVersion: v1
kind: Pod
metadata: {{name: db}}
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: data}}
",
        disk.display()
    );
    std::fs::write(local.manifests.join("db.yaml"), manifests).unwrap();
    let agent = local.start();
    let uid = uid(&agent.wait_for_phase("db", "Running"));
    let volume = local.root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~local-volume/pv-ssd1"
    ));
    assert_eq!(
        std::fs::read_to_string(volume.join("hello")).unwrap(),
        "from the disk"
    );
    assert_eq!(mounts_under(&local.root), [volume.to_string_lossy()]);
    // A restart adopts the bind (reconstructed, not stacked).
    assert!(agent.terminate().success());
    let agent = local.start();
    assert_eq!(self::uid(&agent.wait_for_phase("db", "Running")), uid);
    assert_eq!(mounts_under(&local.root), [volume.to_string_lossy()]);
    // The pod goes: the bind goes, the disk's data stays.
    std::fs::remove_file(local.manifests.join("db.yaml")).unwrap();
    agent.wait_for("the volume unmounted", || {
        mounts_under(&local.root).is_empty().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(disk.join("hello")).unwrap(),
        "from the disk"
    );
    assert!(agent.terminate().success());
}

/// Issue 12, fsGroup (V110-V111): the pod's fsGroup owns its emptyDir (setgid, group rwx) and
/// its configMap files (group read), never what a symlink in the volume points to.
#[test]
fn fs_group_owns_the_pods_volumes() {
    use std::os::unix::fs::MetadataExt;
    let manifest = "apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {app.conf: x}
---
apiVersion: v1
kind: Pod
metadata: {name: grouped}
spec:
  securityContext: {fsGroup: 2345}
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: cfg, mountPath: /etc/cfg}
  volumes:
  - {name: scratch, emptyDir: {}}
  - name: cfg
    configMap: {name: cfg, defaultMode: 0400}
";
    let Some(local) = Local::new("fs_group_owns", &[("grouped.yaml", manifest)]) else {
        return;
    };
    let agent = local.start();
    let uid = uid(&agent.wait_for_phase("grouped", "Running"));
    let pod = local.root.join(format!("pods/{uid}/volumes"));
    let scratch = std::fs::metadata(pod.join("kubernetes.io~empty-dir/scratch")).unwrap();
    assert_eq!(scratch.gid(), 2345);
    assert_eq!(scratch.mode() & 0o2000, 0o2000, "setgid");
    let file = std::fs::metadata(pod.join("kubernetes.io~configmap/cfg/app.conf")).unwrap();
    assert_eq!(file.gid(), 2345);
    assert_eq!(file.mode() & 0o777, 0o440, "0400 plus group read");
    assert!(agent.terminate().success());
}

const ONCE: &str = "apiVersion: v1
kind: Pod
metadata:
  name: once
  namespace: default
  annotations:
    rustlet.io/simulate-exit-after: \"0\"
spec:
  restartPolicy: Never
  containers:
  - name: job
    image: busybox
    volumeMounts:
    - {name: out, mountPath: /out}
  volumes:
  - name: out
    emptyDir: {}
";

/// A pod that finished before a restart comes back with its status and is not set up again:
/// no volume of it is mounted (its directory was removed when it finished), and no mount is
/// attempted.
#[test]
fn a_pod_finished_before_a_restart_gets_no_mount_after_it() {
    let Some(local) = Local::new("a_pod_finished_before_a_restart", &[("once.yaml", ONCE)]) else {
        return;
    };
    let agent = local.start();
    let once = uid(&agent.wait_for_phase("once", "Succeeded"));
    agent.wait_for("the finished pod's directory removed", || {
        (!local.root.join("pods").join(&once).exists()).then_some(())
    });
    assert!(agent.terminate().success());
    let log_before = std::fs::read_to_string(local.dir.path().join("agent.log")).unwrap();

    let agent = local.start();
    assert_eq!(uid(&agent.wait_for_phase("once", "Succeeded")), once);
    // A few passes of the volume manager (1 s each) go by.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let log = std::fs::read_to_string(local.dir.path().join("agent.log")).unwrap();
    let after = &log[log_before.len()..];
    assert!(!after.contains("MountVolume"), "{after}");
    assert!(!local.root.join("pods").join(&once).exists());
    assert!(agent.terminate().success());
}

/// Issue 24 item 1: a manifest whose `metadata.uid` is `..` would have `<root>/pods` as its
/// pod directory, and its removal took every other pod's data with it. The manifest is now
/// refused at intake (reported, never run), and removing it leaves the other pod's files.
#[test]
fn a_manifest_uid_that_is_not_one_path_component_is_refused_and_removes_nothing() {
    let dotdot = KEEP
        .replace("name: keep", "name: dotdot\n  uid: \"..\"")
        .replace("medium: Memory", "{}");
    let slash = KEEP.replace("name: keep", "name: slash\n  uid: a/b");
    let Some(local) = Local::new(
        "a_manifest_uid_that_is_not_one_path_component",
        &[
            ("keep.yaml", KEEP),
            ("dotdot.yaml", &dotdot),
            ("slash.yaml", &slash),
        ],
    ) else {
        return;
    };
    let (root, manifests) = (&local.root, &local.manifests);
    let log = local.dir.path().join("agent.log");
    let agent = local.start();
    let keep = agent.wait_for_phase("keep", "Running");
    let data = volume_dir(root, &uid(&keep), "scratch").join("data");
    std::fs::write(&data, "precious").unwrap();
    let text = agent.wait_for("both manifests reported", || {
        let text = std::fs::read_to_string(&log).ok()?;
        (text.contains("dotdot.yaml") && text.contains("slash.yaml")).then_some(text)
    });
    assert!(text.contains("metadata.uid"), "the field is named: {text}");
    assert!(agent.pod("dotdot").is_none(), "never admitted");
    assert!(agent.pod("slash").is_none(), "never admitted");

    std::fs::remove_file(manifests.join("dotdot.yaml")).unwrap();
    std::fs::remove_file(manifests.join("slash.yaml")).unwrap();
    // A manifest written after the removals: once its pod runs, the removals were read.
    std::fs::write(
        manifests.join("later.yaml"),
        KEEP.replace("name: keep", "name: later"),
    )
    .unwrap();
    agent.wait_for_phase("later", "Running");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "precious");
    assert_eq!(agent.pod("keep").unwrap()["status"]["phase"], "Running");
    assert!(agent.terminate().success());
}

/// Issue 24 item 5: a zero-length UID state file and a half-written status state file (a
/// crash that lost the write) no longer stop the agent at start: each is said once, moved
/// aside, and written whole again.
#[test]
fn corrupt_state_files_are_moved_aside_and_the_agent_starts() {
    let Some(local) = Local::new(
        "corrupt_state_files_are_moved_aside",
        &[("keep.yaml", KEEP)],
    ) else {
        return;
    };
    let root = &local.root;
    std::fs::write(root.join("local-pod-uids.json"), "").unwrap();
    std::fs::write(
        root.join("local-pod-statuses.json"),
        "{\"6d1a5e36-0c4b\": {\"pha",
    )
    .unwrap();
    let log = local.dir.path().join("agent.log");
    let agent = local.start();
    let keep = agent.wait_for_phase("keep", "Running");
    agent.wait_for("a whole UID state file", || {
        let text = std::fs::read(root.join("local-pod-uids.json")).ok()?;
        let uids: serde_json::Value = serde_json::from_slice(&text).ok()?;
        (uids.as_object()?.values().next()? == &keep["metadata"]["uid"]).then_some(())
    });
    assert!(agent.terminate().success());
    let mut aside: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".corrupt-"))
        .collect();
    aside.sort();
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert!(
        aside[0].starts_with("local-pod-statuses.json.corrupt-"),
        "{aside:?}"
    );
    assert!(
        aside[1].starts_with("local-pod-uids.json.corrupt-"),
        "{aside:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("moved aside").count(),
        2,
        "said once each: {text}"
    );
}
