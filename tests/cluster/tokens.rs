//! Issue 25, item 4 on containerd: the pods a real cluster makes. The ServiceAccount
//! admission plugin's `kube-api-access-*` volume (a bound token through TokenRequest, the
//! `kube-root-ca.crt` ConfigMap, the namespace from the downward API) mounts and its token
//! authenticates a pod-side request; a short-lived token is replaced before it expires; and
//! ConfigMap and Secret volumes and env follow the real API server's objects and watches.
//!
//! The pods reach the API server at `https://10.88.0.1:<forwarder port>` (the node's address
//! on its pod network, which the serving certificate names). busybox's `wget` speaks TLS
//! through its own `ssl_client`, which implements no certificate validation (busybox 1.35
//! `networking/tls.c`: "TLS certificate validation not implemented") and takes no CA file: the
//! pods pass `--no-check-certificate`, and the tests compare the mounted `ca.crt` with the
//! cluster's CA instead.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::cri::CriNode;
use crate::node::wait_ready;
use crate::support::{Cluster, POD_NETWORK_GATEWAY};

/// Where ServiceAccount admission mounts the `kube-api-access-*` volume.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The user agent of the pods' requests (the audit log names it).
const CLIENT_AGENT: &str = "rustlet-tokens-test";

/// Creates `ns` and waits until the controllers have made what ServiceAccount admission and
/// the kube-api-access volume need there: the `default` ServiceAccount and the
/// `kube-root-ca.crt` ConfigMap.
fn namespace_with_service_account(cluster: &Cluster, ns: &str) {
    cluster.kubectl(&["create", "namespace", ns]);
    cluster.wait_for(&format!("serviceaccount default in {ns}"), || {
        cluster
            .try_get(&["-n", ns, "serviceaccount", "default"])
            .ok_or_else(|| "absent".to_owned())
    });
    cluster.wait_for(&format!("configmap kube-root-ca.crt in {ns}"), || {
        cluster
            .try_get(&["-n", ns, "configmap", "kube-root-ca.crt"])
            .ok_or_else(|| "absent".to_owned())
    });
}

/// Waits until pod `ns/name` has finished (Succeeded or Failed); returns it.
fn wait_finished(cluster: &Cluster, ns: &str, name: &str) -> Value {
    cluster.wait_for(&format!("pod {ns}/{name} finished"), || {
        let pod = cluster
            .try_get(&["-n", ns, "pod", name])
            .ok_or_else(|| "no pod".to_owned())?;
        match pod["status"]["phase"].as_str() {
            Some("Succeeded" | "Failed") => Ok(pod),
            _ => Err(pod["status"].to_string()),
        }
    })
}

/// Waits until pod `ns/name` is Running; returns it.
fn wait_running(cluster: &Cluster, ns: &str, name: &str) -> Value {
    cluster.wait_for(&format!("pod {ns}/{name} running"), || {
        let pod = cluster
            .try_get(&["-n", ns, "pod", name])
            .ok_or_else(|| "no pod".to_owned())?;
        match pod["status"]["phase"].as_str() {
            Some("Running") => Ok(pod),
            _ => Err(pod["status"].to_string()),
        }
    })
}

/// The directory of volume `volume` (of plugin `plugin`, e.g. `kubernetes.io~projected`) of
/// `pod` under the agent's root dir.
fn volume_dir(node: &CriNode, pod: &Value, plugin: &str, volume: &str) -> PathBuf {
    let uid = pod["metadata"]["uid"].as_str().expect("a pod UID");
    node.containerd
        .dir()
        .join("root/pods")
        .join(uid)
        .join("volumes")
        .join(plugin)
        .join(volume)
}

/// Everything the containers of `pod` wrote to their CRI log files (for failure messages).
fn container_logs(node: &CriNode, pod: &Value) -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let mut out = String::new();
    let pod_logs = node.containerd.dir().join("root/pod-logs");
    for dir in rustlet_cri::logs::pod_log_directories(&pod_logs, &rustlet_core::PodUid::new(uid))
        .unwrap_or_default()
    {
        walk(&dir, &mut out);
    }
    out
}

/// The file system type of the mount at `path` (this process's mount table), if it is one.
fn mount_type(path: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_string_lossy();
    table.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (before.split(' ').nth(4)? == path).then(|| after.split(' ').next().map(str::to_owned))?
    })
}

/// The permission bits of `path` (following the AtomicWriter's symlinks).
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The admin's TokenReview of `token` (`kubectl create -f -`): its `status`.
fn token_review(cluster: &Cluster, token: &str) -> Value {
    let review = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    });
    let out = cluster.kubectl_output(
        &["create", "-f", "-", "-o", "json"],
        Some(&review.to_string()),
    );
    assert!(
        out.status.success(),
        "TokenReview: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("a TokenReview");
    answer["status"].clone()
}

/// Asserts that a TokenReview authenticates `token` as `ns`'s `default` ServiceAccount,
/// bound to `pod` (the API server's pod-name and pod-uid extras of a bound token).
fn assert_token_of(cluster: &Cluster, token: &str, ns: &str, pod: &Value) {
    let status = token_review(cluster, token);
    assert_eq!(status["authenticated"], true, "TokenReview: {status}");
    let user = &status["user"];
    assert_eq!(
        user["username"],
        format!("system:serviceaccount:{ns}:default"),
        "{status}"
    );
    let extra = &user["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"][0], pod["metadata"]["name"],
        "{status}"
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"][0], pod["metadata"]["uid"],
        "{status}"
    );
}

/// What a client pod sends as its bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bearer {
    /// The mounted token file as it is.
    Mounted,
    /// The mounted token with the last six characters of its signature replaced.
    Corrupted,
}

/// A pod (restartPolicy Never) that checks its kube-api-access files and POSTs a
/// SelfSubjectReview to the API server with its token (or a corrupted copy); it exits 0 only
/// when the API server answered that it is `system:serviceaccount:<ns>:default`.
fn client_pod(ns: &str, name: &str, node: &str, port: u16, bearer: Bearer) -> String {
    let corrupt = match bearer {
        Bearer::Mounted => "",
        Bearer::Corrupted => "token=${token%??????}AAAAAA; ",
    };
    let gateway = std::net::Ipv4Addr::from(POD_NETWORK_GATEWAY);
    let script = format!(
        "set -e; test \"$(cat {SA_DIR}/namespace)\" = {ns}; \
         grep -q 'BEGIN CERTIFICATE' {SA_DIR}/ca.crt; \
         for f in token ca.crt namespace; do test \"$(stat -L -c %a {SA_DIR}/$f)\" = 644; done; \
         token=$(cat {SA_DIR}/token); {corrupt}\
         answer=$(wget -q -O - -U {CLIENT_AGENT}/{name} --no-check-certificate \
         --header \"Authorization: Bearer $token\" --header 'Content-Type: application/json' \
         --post-data '{{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}}' \
         https://{gateway}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews); \
         echo \"$answer\"; \
         echo \"$answer\" | grep -q '\"username\":\"system:serviceaccount:{ns}:default\"'"
    );
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:1",
                "command": ["sh", "-c", script],
            }],
        },
    });
    pod.to_string()
}

/// A pod that sleeps on `node`, with the volumes ServiceAccount admission gives it and the
/// pod-level `security_context` (`null`: none).
fn holder_pod(ns: &str, name: &str, node: &str, security_context: Value) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": security_context,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:1",
                "command": ["sleep", "3600"],
            }],
        },
    })
    .to_string()
}

/// The directory of `pod`'s `kube-api-access-*` volume under the agent's root dir.
fn api_access_dir(node: &CriNode, pod: &Value) -> PathBuf {
    let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
    let access = volumes
        .iter()
        .filter_map(|v| v["name"].as_str())
        .find(|n| n.starts_with("kube-api-access-"))
        .unwrap_or_else(|| panic!("no kube-api-access volume: {volumes:?}"));
    volume_dir(node, pod, "kubernetes.io~projected", access)
}

/// The audit events of the pod `name`'s own requests (its user agent).
fn client_requests(cluster: &Cluster, name: &str) -> Vec<Value> {
    let agent = format!("{CLIENT_AGENT}/{name}");
    cluster
        .audit_events()
        .into_iter()
        .filter(|e| e["userAgent"] == agent.as_str())
        .collect()
}

/// Item 4, the service account token: ServiceAccount admission gives the pod a projected
/// `kube-api-access-*` volume; the agent mounts it (token, `ca.crt` from the
/// `kube-root-ca.crt` ConfigMap, the namespace from the downward API, each 0644 as upstream's
/// `defaultMode: 420`), and the pod's request with the token is authenticated by the API
/// server as `system:serviceaccount:<ns>:default` bound to the pod (the audit log shows it); a
/// pod that sends a corrupted token fails.
#[test]
fn cri_the_kube_api_access_volume_mounts_and_its_token_authenticates_the_pod() {
    let Some(node) = CriNode::start("cri-sa-token", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    let port = node.forwarder.port;
    wait_ready(cluster, "node-a", "True");
    namespace_with_service_account(cluster, "tok");
    cluster.apply(&client_pod(
        "tok",
        "client",
        "node-a",
        port,
        Bearer::Mounted,
    ));
    cluster.apply(&client_pod(
        "tok",
        "forger",
        "node-a",
        port,
        Bearer::Corrupted,
    ));

    let client = wait_finished(cluster, "tok", "client");
    assert_eq!(
        client["status"]["phase"],
        "Succeeded",
        "{}\nlogs: {}\nagent: {}",
        client["status"],
        container_logs(&node, &client),
        node.agent.log.display()
    );
    let forger = wait_finished(cluster, "tok", "forger");
    assert_eq!(forger["status"]["phase"], "Failed", "{}", forger["status"]);

    // The API server's own record: the client's request authenticated as the pod's service
    // account, bound to the pod; the forger's was refused as unauthenticated.
    let reviews = client_requests(cluster, "client");
    let review = reviews
        .iter()
        .find(|e| e["requestURI"] == "/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .unwrap_or_else(|| panic!("no SelfSubjectReview of the client: {reviews:#?}"));
    assert_eq!(review["responseStatus"]["code"], 201, "{review}");
    assert_eq!(
        review["user"]["username"], "system:serviceaccount:tok:default",
        "{review}"
    );
    assert_eq!(
        review["user"]["extra"]["authentication.kubernetes.io/pod-name"][0], "client",
        "{review}"
    );
    let forged = client_requests(cluster, "forger");
    assert!(
        !forged.is_empty() && forged.iter().all(|e| e["responseStatus"]["code"] == 401),
        "the forger's requests: {forged:#?}"
    );

    // The volume ServiceAccount admission added, as the agent wrote it (of a pod that still
    // runs: a finished pod's volumes are torn down).
    cluster.apply(&holder_pod("tok", "holder", "node-a", Value::Null));
    let holder = wait_running(cluster, "tok", "holder");
    let dir = api_access_dir(&node, &holder);
    assert_eq!(
        mount_type(&dir).as_deref(),
        Some("tmpfs"),
        "{}",
        dir.display()
    );
    for file in ["token", "ca.crt", "namespace"] {
        assert_eq!(mode_of(&dir.join(file)), 0o644, "{file}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("namespace")).unwrap(),
        "tok"
    );
    let root_ca = cluster.get(&["-n", "tok", "configmap", "kube-root-ca.crt"]);
    let ca = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    assert_eq!(ca, root_ca["data"]["ca.crt"].as_str().unwrap());
    let cluster_ca = std::fs::read_to_string(cluster.inner.pki("ca.crt")).unwrap();
    assert!(ca.contains(cluster_ca.trim()), "{ca}");
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    assert_token_of(cluster, &token, "tok", &holder);

    // With the pod's user and an fsGroup (upstream's projected SetUp and SetVolumeOwnership):
    // the token is 0600 and the user's, then 0640 with the group; the other files 0644 with
    // the group.
    let security = serde_json::json!({"runAsUser": 1000, "fsGroup": 2000});
    cluster.apply(&holder_pod("tok", "owned", "node-a", security));
    let owned = wait_running(cluster, "tok", "owned");
    let dir = api_access_dir(&node, &owned);
    let owner = |file: &str| {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(dir.join(file)).unwrap();
        (mode_of(&dir.join(file)), meta.uid(), meta.gid())
    };
    assert_eq!(owner("token"), (0o640, 1000, 2000), "token");
    assert_eq!(owner("ca.crt"), (0o644, 0, 2000), "ca.crt");
    assert_eq!(owner("namespace"), (0o644, 0, 2000), "namespace");

    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// The audit events of the node's TokenRequests (`create serviceaccounts/token`) in `ns`.
fn token_requests(cluster: &Cluster, node: &str, ns: &str) -> Vec<Value> {
    let user = format!("system:node:{node}");
    cluster
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && e["verb"] == "create"
                && e["objectRef"]["resource"] == "serviceaccounts"
                && e["objectRef"]["subresource"] == "token"
                && e["objectRef"]["namespace"] == ns
        })
        .collect()
}

/// When the API server received the request of audit event `event`.
fn received_at(event: &Value) -> Timestamp {
    let at = event["requestReceivedTimestamp"]
        .as_str()
        .unwrap_or_else(|| panic!("no requestReceivedTimestamp: {event}"));
    Timestamp::from_str(at).unwrap_or_else(|e| panic!("{at:?}: {e}"))
}

/// Item 4, the refresh: a pod's projected serviceAccountToken of `expirationSeconds: 600`
/// (the API server's minimum) is requested again by the agent once 80 % of its lifetime has
/// passed, less a jitter of up to ten seconds (upstream's token manager, `requiresRefresh`),
/// and before it expires, and the file
/// in the pod's volume is replaced with the new token, which differs and authenticates as the
/// pod's service account bound to the pod. The audit log times the node's two TokenRequests.
///
/// This test takes about nine minutes (the token's lifetime cannot be shorter than the API
/// server's 10-minute minimum, and the agent refreshes it after 8 minutes plus at most its
/// one-minute remount period): it is the only slow test of the set, and `cargo xtask test`
/// (so CI) runs it beside the other tests instead of after them (`xtask`'s `SLOW_TEST`, which
/// names it).
#[test]
fn cri_a_projected_token_is_refreshed_after_80_percent_of_its_lifetime() {
    let Some(node) = CriNode::start("cri-token-refresh", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    namespace_with_service_account(cluster, "refresh");
    // Only the test's own token volume: no kube-api-access volume's requests in the log.
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "renewed", "namespace": "refresh"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "node-a"},
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:1",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "short", "mountPath": "/var/run/short"}],
            }],
            "volumes": [{
                "name": "short",
                "projected": {"sources": [{
                    "serviceAccountToken": {"path": "token", "expirationSeconds": 600},
                }]},
            }],
        },
    });
    cluster.apply(&pod.to_string());
    let pod = wait_running(cluster, "refresh", "renewed");
    let file = volume_dir(&node, &pod, "kubernetes.io~projected", "short").join("token");
    let first = std::fs::read_to_string(&file).unwrap();
    assert_token_of(cluster, &first, "refresh", &pod);
    let requests = cluster.wait_for("the first TokenRequest in the audit log", || {
        let requests = token_requests(cluster, "node-a", "refresh");
        if requests.is_empty() {
            Err("none".to_owned())
        } else {
            Ok(requests)
        }
    });
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let issued = received_at(&requests[0]);

    let second =
        cluster.wait_for_within("the token file replaced", Duration::from_secs(660), || {
            let now = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            if now == first {
                Err("the first token".to_owned())
            } else {
                Ok(now)
            }
        });
    // The audit event is written once the response is complete: maybe after the agent wrote.
    let requests = cluster.wait_for("the second TokenRequest in the audit log", || {
        let requests = token_requests(cluster, "node-a", "refresh");
        if requests.len() >= 2 {
            Ok(requests)
        } else {
            Err(format!("{requests:#?}"))
        }
    });
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert_eq!(
        requests[1]["responseStatus"]["code"], 201,
        "{}",
        requests[1]
    );
    let after = received_at(&requests[1])
        .duration_since(issued)
        .as_secs_f64();
    // 80 % of 600 s is 480 s after the token was issued. It is reckoned from the
    // expirationTimestamp, which is in whole seconds (up to one earlier than the audit log's
    // time), and brought forward by the agent's jitter of up to ten seconds, as upstream's.
    assert!(
        (469.0..600.0).contains(&after),
        "the second TokenRequest came {after} s after the first (of a 600 s token)"
    );
    eprintln!("the second TokenRequest came {after:.1} s after the first");
    assert_token_of(cluster, &second, "refresh", &pod);

    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// `KEY=value` lines of a file (`env`'s output), as pairs.
fn env_vars(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Waits until the file `path` holds `want`.
fn wait_file(cluster: &Cluster, path: &Path, want: &str) {
    cluster.wait_for(
        &format!("{} = {want:?}", path.display()),
        || match std::fs::read_to_string(path) {
            Ok(text) if text == want => Ok(()),
            Ok(text) => Err(text),
            Err(e) => Err(e.to_string()),
        },
    );
}

/// Item 4, ConfigMaps and Secrets: a pod that mounts a ConfigMap and a Secret and takes env
/// from both (`valueFrom` keys and `envFrom` with prefixes) runs with that env, the Secret's
/// volume is a tmpfs, and an update of each object reaches its file in the pod's volume (seen
/// from the host and by the container) through the agent's watches of just those objects
/// (`fieldSelector=metadata.name=`, the only form the Node authorizer lets a node watch). The
/// pod's deletion then leaves no request of the agent refused.
#[test]
fn cri_config_map_and_secret_volumes_and_env_follow_the_real_api_server() {
    let Some(node) = CriNode::start("cri-content", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    namespace_with_service_account(cluster, "content");
    cluster.apply(
        "apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: content}
data: {greeting: hello, COLOR: blue}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: content}
stringData: {password: s3cret, TOKEN: abc}
",
    );
    // The container writes its env once, then copies what it sees of both volumes each
    // second, into an emptyDir the test reads from the host.
    let script = "env > /out/env.tmp && mv /out/env.tmp /out/env; \
                  while true; do cat /etc/settings/greeting > /out/greeting.tmp; \
                  mv /out/greeting.tmp /out/greeting; cat /etc/creds/password > /out/password.tmp; \
                  mv /out/password.tmp /out/password; sleep 1; done";
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reader", "namespace": "content"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "node-a"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:1",
                "command": ["sh", "-c", script],
                "env": [
                    {"name": "GREETING",
                     "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                    {"name": "PASSWORD",
                     "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                ],
                "envFrom": [
                    {"configMapRef": {"name": "settings"}, "prefix": "CM_"},
                    {"secretRef": {"name": "creds"}, "prefix": "SECRET_"},
                ],
                "volumeMounts": [
                    {"name": "settings", "mountPath": "/etc/settings"},
                    {"name": "creds", "mountPath": "/etc/creds"},
                    {"name": "out", "mountPath": "/out"},
                ],
            }],
            "volumes": [
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "creds", "secret": {"secretName": "creds"}},
                {"name": "out", "emptyDir": {}},
            ],
        },
    });
    cluster.apply(&pod.to_string());
    let pod = wait_running(cluster, "content", "reader");
    let out = volume_dir(&node, &pod, "kubernetes.io~empty-dir", "out");
    let env = cluster.wait_for("the container's env", || {
        std::fs::read_to_string(out.join("env")).map_err(|e| e.to_string())
    });
    let env = env_vars(&env);
    for (name, value) in [
        ("GREETING", "hello"),
        ("PASSWORD", "s3cret"),
        ("CM_greeting", "hello"),
        ("CM_COLOR", "blue"),
        ("SECRET_password", "s3cret"),
        ("SECRET_TOKEN", "abc"),
    ] {
        assert_eq!(
            env.get(name).map(String::as_str),
            Some(value),
            "{name}: {env:?}"
        );
    }

    let settings = volume_dir(&node, &pod, "kubernetes.io~configmap", "settings");
    let creds = volume_dir(&node, &pod, "kubernetes.io~secret", "creds");
    assert_eq!(
        mount_type(&creds).as_deref(),
        Some("tmpfs"),
        "{}",
        creds.display()
    );
    assert_eq!(mount_type(&settings), None, "a configMap volume is on disk");
    wait_file(cluster, &settings.join("greeting"), "hello");
    wait_file(cluster, &creds.join("password"), "s3cret");
    wait_file(cluster, &out.join("greeting"), "hello");
    wait_file(cluster, &out.join("password"), "s3cret");

    cluster.kubectl(&[
        "-n",
        "content",
        "patch",
        "configmap",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"bonjour"}}"#,
    ]);
    cluster.kubectl(&[
        "-n",
        "content",
        "patch",
        "secret",
        "creds",
        "--type=merge",
        "-p",
        r#"{"stringData":{"password":"n3w"}}"#,
    ]);
    wait_file(cluster, &settings.join("greeting"), "bonjour");
    wait_file(cluster, &creds.join("password"), "n3w");
    wait_file(cluster, &out.join("greeting"), "bonjour");
    wait_file(cluster, &out.join("password"), "n3w");

    // The agent watched each object by name only (the Node authorizer's rule).
    let watches: Vec<String> = cluster
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == "system:node:node-a"
                && matches!(e["verb"].as_str(), Some("watch" | "list"))
                && matches!(
                    e["objectRef"]["resource"].as_str(),
                    Some("configmaps" | "secrets")
                )
        })
        .filter_map(|e| e["requestURI"].as_str().map(str::to_owned))
        .collect();
    assert!(!watches.is_empty(), "no watch of the agent's");
    for uri in &watches {
        assert!(uri.contains("fieldSelector=metadata.name%3D"), "{uri}");
    }

    cluster.kubectl(&["-n", "content", "delete", "pod", "reader", "--wait=true"]);
    let pod_dir = out
        .ancestors()
        .nth(3)
        .expect("the pod's directory")
        .to_owned();
    cluster.wait_for("the pod's directory removed", || {
        if pod_dir.exists() {
            Err(format!("{} is there", pod_dir.display()))
        } else {
            Ok(())
        }
    });
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Item 4, objects that come later: a pod created before the ConfigMap and the Secret its
/// volumes and env name waits (`CreateContainerConfigError` or a volume not yet mounted, as
/// upstream) and starts once both exist, with their content, through the agent's watches of
/// objects that did not exist when they began.
#[test]
fn cri_a_pod_created_before_its_config_map_and_secret_starts_when_they_appear() {
    let Some(node) = CriNode::start("cri-content-later", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    namespace_with_service_account(cluster, "later");
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "early", "namespace": "later"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "node-a"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:1",
                "command": ["sh", "-c", "env > /out/env.tmp && mv /out/env.tmp /out/env; exec sleep 3600"],
                "env": [
                    {"name": "GREETING",
                     "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                    {"name": "PASSWORD",
                     "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                ],
                "volumeMounts": [
                    {"name": "settings", "mountPath": "/etc/settings"},
                    {"name": "out", "mountPath": "/out"},
                ],
            }],
            "volumes": [
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "out", "emptyDir": {}},
            ],
        },
    });
    cluster.apply(&pod.to_string());
    // The agent has tried, and said why it waits (upstream's FailedMount event).
    cluster.wait_for("a FailedMount event of the pod", || {
        let events = cluster.get(&["-n", "later", "events"]);
        let items = events["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .find(|e| e["involvedObject"]["name"] == "early" && e["reason"] == "FailedMount")
            .map(|_| ())
            .ok_or_else(|| format!("{items:?}"))
    });
    let pending = cluster.get(&["-n", "later", "pod", "early"]);
    assert_eq!(
        pending["status"]["phase"], "Pending",
        "{}",
        pending["status"]
    );
    cluster.apply(
        "apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: later}
data: {greeting: hello}
",
    );
    cluster.apply(
        "apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: later}
stringData: {password: s3cret}
",
    );
    let pod = wait_running(cluster, "later", "early");
    let out = volume_dir(&node, &pod, "kubernetes.io~empty-dir", "out");
    let env = cluster.wait_for("the container's env", || {
        std::fs::read_to_string(out.join("env")).map_err(|e| e.to_string())
    });
    let env = env_vars(&env);
    assert_eq!(
        env.get("GREETING").map(String::as_str),
        Some("hello"),
        "{env:?}"
    );
    assert_eq!(
        env.get("PASSWORD").map(String::as_str),
        Some("s3cret"),
        "{env:?}"
    );
    let settings = volume_dir(&node, &pod, "kubernetes.io~configmap", "settings");
    wait_file(cluster, &settings.join("greeting"), "hello");

    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
