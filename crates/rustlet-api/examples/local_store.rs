//! rustlet-api as a library: the local store fed from a directory of manifests, as the agent's
//! local mode (`--local DIR`) keeps it. No cluster: the store gives UIDs, resourceVersions and
//! graceful deletion as the API server would.
//!
//! Run with `cargo run -p rustlet-api --example local_store [DIR]`. With a directory, it syncs
//! that directory once and lists what the store then holds (nothing in DIR is changed). Without
//! one, it writes two manifests to a temporary directory, syncs, removes the pod's manifest
//! and syncs again, to show the pod terminating rather than vanishing.

use std::path::Path;
use std::sync::Arc;

use rustlet_api::local::manifests::DirectorySync;
use rustlet_api::local::store::{Kind, Selection, Store};

const POD: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: config
      mountPath: /etc/app
  volumes:
  - name: config
    configMap:
      name: web-config
";

const CONFIG_MAP: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
  namespace: default
data:
  greeting: hello
";

fn main() {
    let store = Arc::new(Store::default());
    if let Some(dir) = std::env::args_os().nth(1) {
        let mut sync = DirectorySync::new(&dir, "node-a", store.clone());
        print_report("sync", &sync.sync());
        print_store(&store);
        return;
    }

    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("web.yaml"), POD).expect("write web.yaml");
    std::fs::write(dir.path().join("config.yaml"), CONFIG_MAP).expect("write config.yaml");
    let mut sync = DirectorySync::new(dir.path(), "node-a", store.clone());

    let report = sync.sync();
    print_report("first sync", &report);
    assert_eq!(
        report.applied.len(),
        2,
        "the pod and the ConfigMap are applied"
    );
    print_store(&store);

    remove(dir.path(), "web.yaml");
    let report = sync.sync();
    print_report("after removing web.yaml", &report);
    assert_eq!(
        report.terminating.len(),
        1,
        "the pod terminates, it is not dropped"
    );
    print_store(&store);
}

fn remove(dir: &Path, file: &str) {
    std::fs::remove_file(dir.join(file)).expect("remove the manifest");
}

fn print_report(when: &str, report: &rustlet_api::local::manifests::SyncReport) {
    println!("{when}:");
    for r in &report.applied {
        println!("  applied     {r}");
    }
    for r in &report.terminating {
        println!("  terminating {r}");
    }
    for r in &report.removed {
        println!("  removed     {r}");
    }
    for e in &report.errors {
        println!("  error       {e}");
    }
}

fn print_store(store: &Store) {
    for kind in [Kind::Pod, Kind::ConfigMap] {
        let (objects, resource_version) = store.list(&Selection::all(kind));
        for o in objects {
            let meta = &o["metadata"];
            println!(
                "  store: {} {}/{} uid={} nodeName={} deletionTimestamp={} (list at rv {resource_version})",
                kind.name(),
                meta["namespace"].as_str().unwrap_or(""),
                meta["name"].as_str().unwrap_or(""),
                meta["uid"].as_str().unwrap_or(""),
                o["spec"]["nodeName"].as_str().unwrap_or("-"),
                meta["deletionTimestamp"].as_str().unwrap_or("-"),
            );
        }
    }
}
