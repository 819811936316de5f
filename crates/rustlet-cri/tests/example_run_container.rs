//! The `run_container` example (`examples/run_container.rs`) against a private containerd: it
//! lists the sandboxes, runs a container to completion in a sandbox of its own, and leaves
//! nothing behind. Privileged: skipped without root (see `rustlet_cri::testing`).

#[allow(dead_code)]
#[path = "../examples/run_container.rs"]
mod example;

use std::time::Duration;

use rustlet_cri::CriClient;
use rustlet_cri::testing::{BUSYBOX_IMAGE, PrivateContainerd};

#[tokio::test]
async fn example_run_container_runs_a_container_and_removes_it() {
    let Some(containerd) = PrivateContainerd::start("example_run_container").await else {
        return;
    };
    let exit_code = example::run(containerd.endpoint(), BUSYBOX_IMAGE)
        .await
        .expect("the example runs its container");
    assert_eq!(exit_code, 0);

    let client = CriClient::connect(containerd.endpoint(), Duration::from_secs(10))
        .await
        .expect("connect");
    assert!(client.list_pod_sandboxes().await.expect("list").is_empty());
    assert!(client.list_containers().await.expect("list").is_empty());
}
