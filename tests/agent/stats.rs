//! Issue 26 item 5 through the binary in local mode: the read-only port answers
//! `/stats/summary` (the node's cgroup, filesystem and PID figures, the pod with its
//! containers and its volumes measured), `/metrics/resource` and `/metrics/probes` as the
//! kubelet server does.

use rustlet_mount::testing::privileged_dir;

use crate::harness::start;

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
  volumes:
  - name: cache
    emptyDir: {}
";

#[test]
fn the_read_only_port_serves_the_stats_summary_and_resource_metrics() {
    let Some(dir) = privileged_dir("the_read_only_port_serves_the_stats_summary") else {
        return;
    };
    let (root, manifests) = (dir.mkdir("root"), dir.mkdir("manifests"));
    std::fs::write(manifests.join("web.yaml"), WEB).unwrap();
    let agent = start(
        &[
            "--node-name",
            "node-a",
            "--root-dir",
            root.to_str().unwrap(),
            "--local",
            manifests.to_str().unwrap(),
        ],
        &dir.path().join("agent.log"),
    );
    let pod = agent.wait_for_phase("web", "Running");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    // Something written into the emptyDir counts in its used bytes.
    let cache = root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/cache"));
    std::fs::write(cache.join("blob"), vec![1u8; 256 * 1024]).unwrap();

    let summary: serde_json::Value = agent.wait_for("the pod in /stats/summary", || {
        let (code, body) = agent.get("/stats/summary")?;
        assert_eq!(code, 200, "{body}");
        let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
        (summary["pods"].as_array()?.len() == 1).then_some(summary)
    });
    let node = &summary["node"];
    assert_eq!(node["nodeName"], "node-a");
    assert!(
        node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0,
        "{node}"
    );
    let memory = &node["memory"];
    assert!(memory["workingSetBytes"].as_u64().unwrap() > 0, "{node}");
    assert!(
        memory["workingSetBytes"].as_u64() <= memory["usageBytes"].as_u64(),
        "{node}"
    );
    assert!(node["fs"]["capacityBytes"].as_u64().unwrap() > 0, "{node}");
    // Issue 27 (Summary API): upstream's `GetSystemContainersStats` of the agent's own cgroups
    // (`kubelet`, started when the agent did) and the pods' (`pods`: the root without
    // `cgroupsPerQOS`); neither `runtime` nor `misc` without `runtimeCgroups`/`systemCgroups`.
    let system = node["systemContainers"].as_array().unwrap();
    let names: Vec<&str> = system.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["kubelet", "pods"], "{node}");
    for container in system {
        assert!(
            container["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0,
            "{container}"
        );
        assert!(
            container["memory"]["usageBytes"].as_u64().unwrap() > 0,
            "{container}"
        );
        assert!(container.get("rootfs").is_none(), "{container}");
    }
    // The node's pressures, where the kernel has them.
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        for resource in ["cpu", "memory", "io"] {
            assert!(
                node[resource]["psi"]["some"]["total"].is_u64(),
                "{resource}: {node}"
            );
            assert!(node[resource]["psi"]["full"]["avg10"].is_f64(), "{node}");
        }
    }
    // The agent's network namespace's interfaces (`lo` left out, as cAdvisor does).
    for iface in node["network"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_ne!(iface["name"], "lo", "{node}");
    }
    assert!(node["rlimit"]["maxpid"].as_i64().unwrap() > 0, "{node}");
    let pod = &summary["pods"][0];
    assert_eq!(
        pod["podRef"],
        serde_json::json!({"name": "web", "namespace": "default", "uid": uid})
    );
    assert_eq!(pod["containers"][0]["name"], "server");
    let volume = &pod["volume"][0];
    assert_eq!(volume["name"], "cache");
    assert!(
        volume["usedBytes"].as_u64().unwrap() >= 256 * 1024,
        "{volume}"
    );
    assert!(volume["capacityBytes"].as_u64().unwrap() > 0, "{volume}");
    assert!(
        pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap() >= 256 * 1024,
        "{pod}"
    );

    // A second full summary has a CPU rate of two readings.
    let (_, body) = agent.get("/stats/summary").unwrap();
    let again: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        again["node"]["cpu"]["usageNanoCores"].is_u64(),
        "{}",
        again["node"]
    );

    let (code, metrics) = agent.get("/metrics/resource").unwrap();
    assert_eq!(code, 200);
    for series in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
        "container_start_time_seconds{container=\"server\",namespace=\"default\",pod=\"web\"} ",
        "container_cpu_usage_seconds_total{container=\"server\",namespace=\"default\",pod=\"web\"} 0 ",
        "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 0 ",
        "resource_scrape_error 0",
    ] {
        assert!(metrics.contains(series), "{series} in:\n{metrics}");
    }
    assert_eq!(agent.get("/metrics/probes"), Some((200, String::new())));
    assert!(agent.terminate().success());
}
