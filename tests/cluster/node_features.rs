//! Issue 27's node features through the real control plane on containerd ([`CriNode`]): what
//! upstream's `[NodeConformance]` specs read back through the API server.

use rustlet_cri::testing::BUSYBOX_IMAGE;

use crate::cri::CriNode;
use crate::node::wait_ready;

/// Issue 27 (node features), upstream "[sig-node] Pods should contain environment variables
/// for services" (`getServiceEnvVarMap`; the Node authorizer lets the node watch Services) and
/// "Container Runtime ... should report termination message if TerminationMessagePath is set":
/// a container of a pod bound to the node has `KUBERNETES_SERVICE_HOST` and the variables of a
/// Service of its namespace; what it wrote to `/dev/termination-log` is its termination
/// message in the API.
#[test]
fn cri_a_containers_environment_has_the_services_and_its_termination_message_shows() {
    let Some(node) = CriNode::start("cri-service-env", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "features"]);
    cluster.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: fooservice, namespace: features}\n\
         spec: {ports: [{port: 8765, targetPort: 8080}], selector: {name: server}}\n",
    );
    let cluster_ip = cluster.get(&["-n", "features", "service", "fooservice"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_owned();
    let kubernetes_ip =
        cluster.get(&["-n", "default", "service", "kubernetes"])["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .to_owned();
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: client-envvars, namespace: features}}\n\
         spec:\n  nodeName: node-a\n  restartPolicy: Never\n  containers:\n  - name: env\n    \
         image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [/bin/sh, -c, \
         'env | grep -E \"^(KUBERNETES_SERVICE_HOST|FOOSERVICE_SERVICE_HOST|FOOSERVICE_PORT)=\" \
         | sort > /dev/termination-log']\n"
    ));
    let message = cluster.wait_for("the client pod succeeds", || {
        let pod = cluster.get(&["-n", "features", "pod", "client-envvars"]);
        match pod["status"]["phase"].as_str() {
            Some("Succeeded") => Ok(
                pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            _ => Err(format!("{}", pod["status"])),
        }
    });
    assert_eq!(
        message,
        format!(
            "FOOSERVICE_PORT=tcp://{cluster_ip}:8765\nFOOSERVICE_SERVICE_HOST={cluster_ip}\n\
             KUBERNETES_SERVICE_HOST={kubernetes_ip}\n"
        )
    );
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Issue 27 (node features), upstream "[sig-node] Pod Extended (container restart policy)
/// Container Restart Rules should restart container on rule match" and "should restart
/// container on container-level restart policy Never", "Override hostname of Pod a pod with
/// hostname and hostnameOverride fields will have hostnameOverride as hostname" and
/// "PodOSRejection Kubelet [LinuxOnly] should reject pod when the node OS doesn't match pod's
/// OS", through the API server: its status validation takes the rule's restart of a container
/// in a `Never` pod (no request of the agent refused), a `Never` container in an `Always` pod
/// fails the pod unrestarted, the container's host name is the override (the spec's own
/// `hostname -f` check), and a `windows` pod is Failed `PodOSNotSupported`.
#[test]
fn cri_restart_rules_hostname_override_and_os_rejection_through_the_api_server() {
    let Some(node) = CriNode::start("cri-restart-rules", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "rules"]);
    let pod = |name: &str, pod_policy: &str, container: &str, extra: &str| {
        cluster.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: rules}}\n\
             spec:\n  nodeName: node-a\n  restartPolicy: {pod_policy}\n{extra}  containers:\n  \
             - name: main-container\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n\
             {container}"
        ));
    };
    pod(
        "rule-match",
        "Never",
        "    command: [/bin/sh, -c, 'exit 42']\n    restartPolicy: Never\n    \
         restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}]\n",
        "",
    );
    pod(
        "container-never",
        "Always",
        "    command: [/bin/sh, -c, 'exit 1']\n    restartPolicy: Never\n",
        "",
    );
    pod(
        "override",
        "Never",
        "    command: [/bin/sh, -c, \"echo $(hostname)';'$(hostname -f)';' > \
         /dev/termination-log\"]\n",
        "  hostname: custom-host\n  subdomain: t\n  hostnameOverride: override.example.host\n",
    );
    pod(
        "wrong-pod-os",
        "Always",
        "    command: [/bin/sh, -c, 'sleep 1000']\n",
        "  os: {name: windows}\n",
    );
    let status = |name: &str| cluster.get(&["-n", "rules", "pod", name])["status"].clone();
    cluster.wait_for("the rule's exit code restarts the container", || {
        let s = status("rule-match");
        match s["containerStatuses"][0]["restartCount"].as_i64() {
            Some(n) if n > 0 && s["phase"] == "Running" => Ok(()),
            _ => Err(format!("{s}")),
        }
    });
    cluster.wait_for("the Never container fails its Always pod", || {
        let s = status("container-never");
        match s["phase"].as_str() {
            Some("Failed") => Ok(()),
            _ => Err(format!("{s}")),
        }
    });
    assert_eq!(
        status("container-never")["containerStatuses"][0]["restartCount"],
        0
    );
    let message = cluster.wait_for("the override pod succeeds", || {
        let s = status("override");
        match s["phase"].as_str() {
            Some("Succeeded") => Ok(s["containerStatuses"][0]["state"]["terminated"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()),
            _ => Err(format!("{s}")),
        }
    });
    assert_eq!(message, "override.example.host;override.example.host;\n");
    cluster.wait_for("the windows pod is rejected", || {
        let s = status("wrong-pod-os");
        match (s["phase"].as_str(), s["reason"].as_str()) {
            (Some("Failed"), Some("PodOSNotSupported")) => Ok(()),
            _ => Err(format!("{s}")),
        }
    });
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Issue 27, upstream "[sig-apps] Job containers restarted by container restart policy should
/// not trigger PodFailurePolicy" (`[NodeConformance]`): a Job's `Never` pod whose container
/// has `restartPolicy: OnFailure` fails once (exit 1, which the Job's podFailurePolicy would
/// turn into a failed Job) and is restarted in place by the agent, so the pod succeeds and the
/// Job completes. It needs the control plane's job controller as well as the restart rules.
#[test]
fn cri_containers_restarted_by_container_restart_policy_should_not_trigger_pod_failure_policy() {
    let Some(node) = CriNode::start("cri-job-restart", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "jobs"]);
    cluster.apply(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: fail-once, namespace: jobs}}\n\
         spec:\n  parallelism: 1\n  completions: 1\n  backoffLimit: 1\n  podFailurePolicy:\n    \
         rules:\n    - action: FailJob\n      onExitCodes: {{containerName: c, operator: In, \
         values: [1]}}\n  template:\n    spec:\n      nodeName: node-a\n      \
         restartPolicy: Never\n      volumes: [{{name: data, emptyDir: {{}}}}]\n      \
         containers:\n      - name: c\n        image: {BUSYBOX_IMAGE}\n        \
         imagePullPolicy: Never\n        restartPolicy: OnFailure\n        \
         volumeMounts: [{{name: data, mountPath: /data}}]\n        command: [/bin/sh, -c, \
         'if [ -r /data/foo ]; then exit 0; else touch /data/foo; exit 1; fi']\n"
    ));
    cluster.wait_for("the Job complete", || {
        let job = cluster.get(&["-n", "jobs", "job", "fail-once"]);
        let complete = job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Complete" && c["status"] == "True");
        if complete && job["status"]["succeeded"] == 1 {
            Ok(())
        } else {
            Err(job["status"].to_string())
        }
    });
    let pods = cluster.get(&["-n", "jobs", "pods"]);
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "one pod, restarted in place: {pods:#?}");
    assert_eq!(pods[0]["status"]["phase"], "Succeeded");
    assert_eq!(pods[0]["status"]["containerStatuses"][0]["restartCount"], 1);
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
