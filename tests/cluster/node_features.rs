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
