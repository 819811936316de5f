//! The conformance runner (issue 27): upstream's `e2e.test` against the `rustlet` binary as a
//! node of the real control plane on a private containerd, with the release's test images
//! built here without a registry. Run by `cargo xtask conformance` (see xtask's
//! `conformance` module), never by a plain `cargo test` (`test = false`): as root in a
//! private mount namespace,
//!
//! ```sh
//! cargo test -p rustlet --test conformance -- images <bin dir> <busybox> <images dir>
//! cargo test -p rustlet --test conformance -- run [--focus REGEX] [--skip REGEX] [--procs N]
//! ```
//!
//! `images` writes the OCI image layout tarball of every image of
//! [`xtask::conformance::TEST_IMAGES`], on the mainline busybox of [`xtask::busybox`]; `run`
//! starts the node (the cluster's `ServedNode`: the control plane in containerd's network
//! namespace, the agent with its kubelet server at 10.88.0.1:10250), imports the images and
//! serves them as by their registry in the node's network namespace (for the pulls of
//! `imagePullPolicy: Always`), runs ginkgo on `e2e.test` inside that namespace, copies the
//! agent's and containerd's logs beside the JUnit report and prints the agent's refused
//! requests and `N passed, M failed, K skipped`; it fails when a spec did.

// The cluster tests' harness, reused as it is: the agent's start (`tests/agent`), the control
// plane (`support`), the Node helpers (`node`) and the served node (`kubelet_server`). Their
// tests are not compiled here (no test harness), so some helpers are unused.
#[allow(dead_code)]
#[path = "../agent/harness.rs"]
mod harness;
#[allow(dead_code, unused_imports)]
#[path = "../cluster/kubelet_server.rs"]
mod kubelet_server;
#[allow(dead_code, unused_imports)]
#[path = "../cluster/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../cluster/support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustlet_cri::testing::{
    LayerEntry, LocalRegistry, OciImage, PrivateContainerd, busybox_applets_of, busybox_layer_of,
    layer, oci_layout_tar,
};
use xtask::conformance::{
    Mode, NODE_SUITE_HOST, Options, Outcome, RunContext, Suite, Target, TestImage,
    check_images_listed, fresh_dir, ginkgo_args, ginkgo_command, read_summary, report_dir,
    run_ginkgo,
};

/// The node's name.
const NODE: &str = "conformance-node";

/// The images' tarball in the images dir.
const IMAGES_TAR: &str = "e2e-images.tar";

/// The version of what `images` builds: raise it when the images change, so that a cached
/// tarball of an older build is built anew (the cache holds it beside the names).
const IMAGES_VERSION: u32 = 8;

/// `curl URL` as `wget -q -O - URL` (the agnhost image's `curl`, see [`images`]).
const CURL_STAND_IN: &[u8] = b"#!/bin/sh
url=
for arg in \"$@\"; do
    case \"$arg\" in
        -*) ;;
        *) url=\"$arg\" ;;
    esac
done
exec wget -q -O - \"$url\"
";

/// busybox's `PATH` (upstream's busybox image: the Docker default).
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("images") if args.len() == 4 => {
            let tar = images(
                Path::new(&args[1]),
                Path::new(&args[2]),
                Path::new(&args[3]),
            );
            println!("{}", tar.display());
        }
        Some("run") => run(&args[1..]),
        _ => panic!(
            "usage: conformance images <bin dir> <busybox> <images dir> | conformance run \
             [OPTIONS] (cargo xtask conformance)"
        ),
    }
}

/// Writes (unless there already) `<out>/e2e-images.tar`: every test image of the release,
/// built from the static `busybox` (mainline's, as upstream's busybox image) and the cache's
/// `agnhost` and `nonewprivs`.
fn images(bin: &Path, busybox: &Path, out: &Path) -> PathBuf {
    let tar = out.join(IMAGES_TAR);
    // The tarball is taken from the cache only when it holds the images asked for now, as
    // built now.
    let names_file = out.join(format!("{IMAGES_TAR}.names"));
    let names: String = std::iter::once(format!("version {IMAGES_VERSION}\n"))
        .chain(
            xtask::conformance::TEST_IMAGES
                .iter()
                .map(|(name, _)| format!("{name}\n")),
        )
        .collect();
    if tar.is_file() && std::fs::read_to_string(&names_file).ok().as_ref() == Some(&names) {
        eprintln!("conformance: images cached in {}", tar.display());
        return tar;
    }
    let applets = busybox_applets_of(busybox);
    let applets: Vec<&str> = applets.iter().map(String::as_str).collect();
    let busybox = busybox_layer_of(busybox, &applets);
    let agnhost_binary = read(&bin.join("agnhost"));
    let (localhost_crt, localhost_key) =
        xtask::conformance::agnhost_localhost_certificate().unwrap();
    // upstream: test/images/agnhost/Dockerfile (`ADD agnhost agnhost`, `RUN ln -s agnhost
    // agnhost-2`, `RUN mkdir /uploads`).
    let agnhost = layer(&[
        LayerEntry::File {
            path: "agnhost",
            mode: 0o755,
            data: &agnhost_binary,
        },
        LayerEntry::Symlink {
            path: "agnhost-2",
            target: "agnhost",
        },
        LayerEntry::Dir {
            path: "uploads",
            mode: 0o755,
        },
        // upstream: `ADD localhost.crt localhost.crt`, `ADD localhost.key localhost.key`.
        LayerEntry::File {
            path: "localhost.crt",
            mode: 0o644,
            data: localhost_crt.as_bytes(),
        },
        LayerEntry::File {
            path: "localhost.key",
            mode: 0o644,
            data: localhost_key.as_bytes(),
        },
        // upstream's agnhost is Alpine with `curl`, which the lifecycle hook specs' exec hooks
        // run (`sh -c "curl http://<ip>:8080/echo?msg=poststart"`): a stand-in over busybox's
        // `wget` for a plain GET of one URL (options are ignored).
        LayerEntry::Dir {
            path: "usr",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/local",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/local/bin",
            mode: 0o755,
        },
        LayerEntry::File {
            path: "usr/local/bin/curl",
            mode: 0o755,
            data: CURL_STAND_IN,
        },
    ]);
    // upstream: test/images/nonewprivs/Dockerfile (`COPY nnp /usr/local/bin/nnp`,
    // `RUN chmod +s`).
    let nnp_binary = read(&bin.join("nonewprivs"));
    let nonewprivs = layer(&[
        LayerEntry::Dir {
            path: "usr",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/local",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/local/bin",
            mode: 0o755,
        },
        LayerEntry::File {
            path: "usr/local/bin/nnp",
            mode: 0o6755,
            data: &nnp_binary,
        },
    ]);
    let nginx = layer(&[
        LayerEntry::Dir {
            path: "usr",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/share",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/share/nginx",
            mode: 0o755,
        },
        LayerEntry::Dir {
            path: "usr/share/nginx/html",
            mode: 0o755,
        },
        LayerEntry::File {
            path: "usr/share/nginx/html/index.html",
            mode: 0o644,
            data: b"<html><body>Welcome to nginx!</body></html>\n",
        },
    ]);
    // Above busybox in every image: stand-ins for what upstream's images have beyond it.
    let stand_ins = layer(&[
        LayerEntry::Dir {
            path: "bin",
            mode: 0o755,
        },
        // upstream's agnhost has bash, which specs run as `/bin/bash -c <script>` (the probe
        // specs' termination scripts: functions, `trap`, loops, all of which busybox's shell
        // runs).
        LayerEntry::File {
            path: "bin/bash",
            mode: 0o755,
            data: b"#!/bin/sh\nexec /bin/sh \"$@\"\n",
        },
    ]);
    let only_busybox = [busybox.as_slice(), stand_ins.as_slice()];
    let with_agnhost = [busybox.as_slice(), stand_ins.as_slice(), agnhost.as_slice()];
    let with_nnp = [
        busybox.as_slice(),
        stand_ins.as_slice(),
        nonewprivs.as_slice(),
    ];
    let with_nginx = [busybox.as_slice(), stand_ins.as_slice(), nginx.as_slice()];
    // Each image's own top layer names it (`/etc/e2e-test-image`), so that two tags built
    // from the same layers (busybox 1.36.1-1 and 1.37.0-2, agnhost 2.55 and 2.66.1) are two
    // images with two IDs, as upstream's are: the specs that update a container's image from
    // one to the other read the new name in the container's status.
    let name_layers: Vec<Vec<u8>> = xtask::conformance::TEST_IMAGES
        .iter()
        .map(|(name, _)| {
            layer(&[
                LayerEntry::Dir {
                    path: "etc",
                    mode: 0o755,
                },
                LayerEntry::File {
                    path: "etc/e2e-test-image",
                    mode: 0o644,
                    data: name.as_bytes(),
                },
            ])
        })
        .collect();
    let layer_lists: Vec<Vec<&[u8]>> = xtask::conformance::TEST_IMAGES
        .iter()
        .zip(&name_layers)
        .map(|((_, kind), own)| {
            let base: &[&[u8]] = match kind {
                TestImage::Busybox | TestImage::NonRoot => &only_busybox,
                TestImage::Agnhost | TestImage::Pause => &with_agnhost,
                TestImage::NonewPrivs => &with_nnp,
                TestImage::Nginx => &with_nginx,
            };
            base.iter().copied().chain([own.as_slice()]).collect()
        })
        .collect();
    let images: Vec<OciImage<'_>> = xtask::conformance::TEST_IMAGES
        .iter()
        .zip(&layer_lists)
        .map(|((name, kind), layers)| {
            let plain = OciImage {
                name,
                entrypoint: &[],
                cmd: &["sh"],
                user: "",
                env: &[PATH],
                layers,
            };
            match kind {
                TestImage::Busybox => plain,
                TestImage::Agnhost => OciImage {
                    entrypoint: &["/agnhost"],
                    cmd: &["pause"],
                    ..plain
                },
                TestImage::Pause => OciImage {
                    entrypoint: &["/agnhost", "pause"],
                    cmd: &[],
                    ..plain
                },
                TestImage::NonRoot => OciImage {
                    user: "1234",
                    ..plain
                },
                TestImage::NonewPrivs => OciImage {
                    cmd: &["nnp"],
                    ..plain
                },
                TestImage::Nginx => OciImage {
                    cmd: &["httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"],
                    ..plain
                },
            }
        })
        .collect();
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("creating {}: {e}", out.display()));
    let staging = out.join(format!("{IMAGES_TAR}.tmp-{}", std::process::id()));
    std::fs::write(&staging, oci_layout_tar(&images))
        .unwrap_or_else(|e| panic!("writing {}: {e}", staging.display()));
    std::fs::rename(&staging, &tar)
        .unwrap_or_else(|e| panic!("renaming to {}: {e}", tar.display()));
    std::fs::write(&names_file, names)
        .unwrap_or_else(|e| panic!("writing {}: {e}", names_file.display()));
    eprintln!("conformance: images written to {}", tar.display());
    tar
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// One run of a suite against the agent.
fn run(args: &[String]) {
    let opts = Options::parse(args).expect("the options of cargo xtask conformance");
    assert_eq!(opts.mode, Mode::Run, "a dry run needs no node");
    match opts.suite {
        Suite::Cluster => run_cluster(&opts),
        Suite::Node => run_node(&opts),
    }
}

/// The cache's binaries and the images' tarball, checked against the release's image list.
fn binaries_and_images(root: &Path) -> (PathBuf, PathBuf) {
    let bin = xtask::conformance::cached_binaries(root)
        .expect("reading tools/k8s/go.mod")
        .expect("the test binaries are built (cargo xtask conformance build)");
    let listed = Command::new(bin.join("e2e.test"))
        .arg("--list-images")
        .output()
        .expect("running e2e.test --list-images");
    check_images_listed(&String::from_utf8_lossy(&listed.stdout)).unwrap();
    let images_dir = xtask::conformance::cache_dir(root)
        .expect("the cache dir")
        .join("images");
    let busybox = xtask::busybox::cached_binary()
        .expect("the busybox cache")
        .expect("busybox is built (cargo xtask conformance build)");
    let tar = images(&bin, &busybox, &images_dir);
    (bin, tar)
}

/// The images of `tar` served as by their registries (`registry.k8s.io`) to the node's
/// containerd, for as long as the returned registry lives: the specs that run a container with
/// `imagePullPolicy: Always` (the Containers Lifecycle image-update specs) make the agent pull
/// an image it has, as upstream's kubelet does, and no registry is reachable.
fn serve_images(containerd: &PrivateContainerd, tar: &Path) -> LocalRegistry {
    let registry = containerd
        .serve_registry(tar)
        .unwrap_or_else(|e| panic!("serving {}: {e}", tar.display()));
    eprintln!(
        "conformance: the test images are served as by their registry at {} in the node's \
         network namespace",
        registry.addr()
    );
    registry
}

/// One run of the cluster suite against the agent.
fn run_cluster(opts: &Options) {
    let root = xtask::workspace_root();
    let (bin, tar) = binaries_and_images(&root);

    let node = kubelet_server::ServedNode::start("conformance", NODE)
        .expect("RUSTLET_REQUIRE_* make a missing part fail instead");
    node.containerd.import(&tar);
    let registry = serve_images(&node.containerd, &tar);
    node::wait_ready(&node.cluster, NODE, "True");

    let report = report_dir(&root, opts);
    let ctx = RunContext {
        bin: bin.clone(),
        report_dir: report.clone(),
        target: Target::Cluster {
            kubeconfig: node.cluster.inner.admin_kubeconfig(),
            kubectl: node.cluster.inner.bin().join("kubectl"),
        },
    };
    let summary = run_ginkgo(
        &bin,
        &ginkgo_args(opts, &ctx),
        &report,
        Some(&node.containerd.netns()),
    );
    for (log, name) in [
        (node.containerd.dir().join("agent.log"), "agent.log"),
        (
            node.containerd.dir().join("containerd.log"),
            "containerd.log",
        ),
        // Every request's answer (a spec's "bad status" is an error the API server answered).
        (node.cluster.inner.dir().join("logs/audit.log"), "audit.log"),
    ] {
        let _ = std::fs::copy(&log, report.join(name));
    }
    // Every refusal, listed for a look: the specs delete their namespaces (and pods) while
    // the agent may still read them, and the Node authorizer answers a read of a pod it no
    // longer relates to the node with 403 (the cluster tests' stricter `refused_requests_of_node`
    // panics on such a refusal that was never answered later).
    let refused = node
        .cluster
        .refused_requests_of(&format!("system:node:{NODE}"));
    drop(registry);
    drop(node);
    let summary = summary.expect("ginkgo's JUnit report");
    if !refused.is_empty() {
        println!("requests of the agent the API server refused: {refused:#?}");
    }
    report_summary(&summary, &report);
}

/// Prints every failed and skipped spec and `N passed, M failed, K skipped`; fails when a
/// spec did.
fn report_summary(summary: &xtask::conformance::Summary, report: &Path) {
    for (spec, outcome) in &summary.specs {
        match outcome {
            Outcome::Failed => println!("FAILED  {spec}"),
            Outcome::Skipped(reason) => println!("SKIPPED {spec}: {reason}"),
            Outcome::Passed | Outcome::NotSelected => {}
        }
    }
    for node in &summary.setup_failures {
        println!("FAILED  {node} (the suite's setup: see the JUnit report)");
    }
    println!("{summary} ({})", report.join("junit.xml").display());
    assert!(
        summary.failed() == 0 && summary.setup_failures.is_empty(),
        "{summary}"
    );
}

/// How long the node suite may take to validate the system and start its etcd and API
/// server before the agent is started against it.
const NODE_SUITE_SERVICES_DEADLINE: Duration = Duration::from_secs(300);

/// One run of the node suite: `e2e_node.test --conformance=true --start-services=true` in the
/// private containerd's network namespace, where its API server listens on 127.0.0.1:6443
/// and reaches the agent's kubelet server at the node IP (10.88.0.1); the agent registers
/// once that API server answers. upstream's own kubelet gets the same from
/// `test/e2e_node/services/kubelet.go`: the token of the suite's `known_tokens.csv`
/// (`system:masters`), `insecure-skip-tls-verify`, anonymous access to its port (the API
/// server sends no client certificate) and `AlwaysAllow`.
fn run_node(opts: &Options) {
    assert_eq!(
        std::env::var("RUSTLET_PRIVATE_MOUNT_NS").as_deref(),
        Ok("1"),
        "the node suite mounts over /run/kubernetes: run it in a private mount namespace \
         (cargo xtask conformance)"
    );
    let root = xtask::workspace_root();
    let (bin, tar) = binaries_and_images(&root);
    let containerd = PrivateContainerd::start_blocking("conformance-node")
        .expect("RUSTLET_REQUIRE_PRIVILEGED makes a missing part fail instead");
    containerd.import(&tar);
    let registry = serve_images(&containerd, &tar);
    node_address(&containerd);
    let _host = HostPaths::prepare();
    let cgroups = NodeCgroups::prepare();
    if let (Some(cgroups), Some(pid)) = (&cgroups, containerd.pid()) {
        cgroups.move_process("runtime", pid);
    }

    let report = report_dir(&root, opts);
    fresh_dir(&report).unwrap();
    // ginkgo runs a precompiled suite in the binary's directory, where the suite's services
    // write `known_tokens.csv`: links in a directory of the run's own.
    let suite_dir = report.join("suite");
    std::fs::create_dir_all(&suite_dir).unwrap();
    for name in ["ginkgo", "e2e_node.test"] {
        std::os::unix::fs::symlink(bin.join(name), suite_dir.join(name)).unwrap();
    }
    let agent_root = containerd.dir().join("root");
    let manifests = containerd.dir().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let token = random_token();
    let ctx = RunContext {
        bin: suite_dir.clone(),
        report_dir: report.clone(),
        target: Target::Node {
            bearer_token: token.clone(),
            node_name: NODE.to_owned(),
            runtime_endpoint: containerd.endpoint().to_owned(),
            system_spec: None,
        },
    };
    let mut ginkgo = ginkgo_command(
        &suite_dir,
        &ginkgo_args(opts, &ctx),
        &report,
        Some(&containerd.netns()),
    );
    if let Some(cgroups) = &cgroups {
        ginkgo = cgroups.started_in("system", &ginkgo);
    }
    let mut ginkgo = ginkgo.spawn().expect("starting ginkgo");

    // The agent, once the suite's API server answers.
    let deadline = Instant::now() + NODE_SUITE_SERVICES_DEADLINE;
    let mut agent = None;
    while agent.is_none() {
        if let Some(status) = ginkgo.try_wait().unwrap() {
            eprintln!("conformance: ginkgo ended ({status}) before its API server answered");
            break;
        }
        if suite_api_server_answers(&containerd, &token) {
            agent = Some(start_node_agent(
                &containerd,
                &token,
                &agent_root,
                &manifests,
                cgroups.as_ref(),
            ));
        } else {
            assert!(
                Instant::now() < deadline,
                "the node suite's API server did not answer within {NODE_SUITE_SERVICES_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let status = ginkgo.wait().expect("waiting for ginkgo");
    drop(agent);
    for (log, name) in [
        (containerd.dir().join("agent.log"), "agent.log"),
        (containerd.dir().join("containerd.log"), "containerd.log"),
    ] {
        let _ = std::fs::copy(&log, report.join(name));
    }
    drop(registry);
    // The pods the agent ran (the UIDs its log names) lose the cgroups it left (a terminated
    // pod's stays until the pod is removed) once containerd, and with it their processes, is
    // gone.
    let pod_uids =
        logged_pod_uids(&std::fs::read_to_string(report.join("agent.log")).unwrap_or_default());
    drop(containerd);
    if let Some(cgroups) = &cgroups {
        cgroups.remove_pod_cgroups(&pod_uids);
    }
    let summary = read_summary(&report, &status.to_string()).expect("ginkgo's JUnit report");
    report_summary(&summary, &report);
}

/// The pod UIDs an agent log names (`uid=<uid>` of its pod spans).
fn logged_pod_uids(log: &str) -> Vec<String> {
    let mut uids: Vec<String> = log
        .split("uid=")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_hexdigit() || *c == '-')
                .collect::<String>()
        })
        .filter(|uid| !uid.is_empty())
        .collect();
    uids.sort();
    uids.dedup();
    uids
}

/// Gives the namespace the node's address before any pod runs: the pods' bridge (the CNI
/// config's `rltest0`, which the bridge plugin otherwise makes at the first sandbox) with
/// its gateway address 10.88.0.1/16, and a default route through it. The suite's API server
/// reaches the agent's port at that address from the start (`/configz`), and finds its
/// advertise address from the default route (it binds 127.0.0.1 and is given no
/// `--advertise-address`; without a default route it does not start: `Unable to find
/// suitable network address`).
fn node_address(containerd: &PrivateContainerd) {
    let gateway = std::net::Ipv4Addr::from(support::POD_NETWORK_GATEWAY);
    for args in [
        vec!["link", "add", "rltest0", "type", "bridge"],
        vec!["addr", "add", &format!("{gateway}/16"), "dev", "rltest0"],
        vec!["link", "set", "rltest0", "up"],
        vec!["route", "add", "default", "dev", "rltest0"],
    ] {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", containerd.netns().display()))
            .args(["--", "ip"])
            .args(&args)
            .output()
            .expect("running ip");
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Whether `GET /healthz` of the node suite's API server answers `ok` inside the namespace.
fn suite_api_server_answers(containerd: &PrivateContainerd, token: &str) -> bool {
    Command::new("nsenter")
        .arg(format!("--net={}", containerd.netns().display()))
        .args(["--", "curl", "-sk", "--max-time", "5", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("{NODE_SUITE_HOST}/healthz"))
        .output()
        .is_ok_and(|out| out.stdout == b"ok")
}

/// The agent as the node suite's node: registered with the suite's API server with its
/// token, its kubelet server on 0.0.0.0:10250 (a self-signed certificate under its root dir),
/// anonymous requests allowed, static pods from `manifests`.
fn start_node_agent(
    containerd: &PrivateContainerd,
    token: &str,
    root: &Path,
    manifests: &Path,
    cgroups: Option<&NodeCgroups>,
) -> harness::Agent {
    let dir = containerd.dir();
    let kubeconfig = dir.join("agent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e-node\n  cluster:\n    \
             server: {NODE_SUITE_HOST}\n    insecure-skip-tls-verify: true\nusers:\n- name: \
             kubelet\n  user:\n    token: {token}\ncontexts:\n- name: e2e-node\n  context:\n    \
             cluster: e2e-node\n    user: kubelet\ncurrent-context: e2e-node\n"
        ),
    )
    .unwrap();
    let config = dir.join("config.yaml");
    let gateway = std::net::Ipv4Addr::from(support::POD_NETWORK_GATEWAY);
    std::fs::write(
        &config,
        format!(
            "nodeIP: {gateway}\n{}authentication:\n  anonymous:\n    enabled: true\n\
             authorization:\n  mode: AlwaysAllow\npodLogsDir: {POD_LOGS_DIR}\n\
             containerLogsDir: {CONTAINER_LOGS_DIR}\ndevicePluginsDir: {DEVICE_PLUGINS_DIR}\n{}",
            support::TEST_EVICTION_HARD,
            cgroups.map(NodeCgroups::config).unwrap_or_default(),
        ),
    )
    .unwrap();
    harness::start_in(
        Some(&containerd.netns()),
        &[
            "--node-name",
            NODE,
            "--root-dir",
            root.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--runtime",
            "cri",
            "--container-runtime-endpoint",
            containerd.endpoint(),
            "--enable-server",
            "--pod-manifest-path",
            manifests.to_str().unwrap(),
            // The kubelet's healthz endpoint on 127.0.0.1:10248, as upstream's (the test
            // harness turns it off elsewhere): specs check the kubelet's health there. The
            // namespace is the run's own, so the port is free.
            "--healthz-port",
            "10248",
        ],
        &dir.join("agent.log"),
    )
}

/// The node's cgroups, as upstream's e2e_node runs the kubelet on a host without systemd
/// (`test/e2e_node/services/kubelet.go`: `kubeletCgroups: /kubelet`, `systemCgroups:
/// /system`, `--runtime-cgroups` the runtime's, `cgroupsPerQOS` under `cgroupRoot: /`).
/// `cgroupRoot` is upstream's `/` (the Kubelet Cgroup Manager specs look for `/kubepods`
/// whatever the root; its QoS cgroups stay after the run, as upstream's); the three others
/// are under a cgroup root private to the run (`/rustlet-conformance-<pid>`), removed after
/// it: the agent moves itself into `kubelet`, the private containerd is moved into
/// `runtime` (the shims it starts later are born there), and ginkgo, the suite and its
/// services are started in `system`. The Summary API spec reads each as a system container
/// (`misc`: the host runs no systemd). `None` on a host without cgroup v1 hierarchies.
struct NodeCgroups {
    root: String,
    tree: rustlet_cri::cgroups::PodCgroupsConfig,
    /// Whether some hierarchy had `/kubepods` before the run: if none had, the run made it
    /// (the agent's QoS cgroups) and removes it after.
    kubepods_before: bool,
}

impl NodeCgroups {
    fn prepare() -> Option<Self> {
        let root = format!("/rustlet-conformance-{}", std::process::id());
        let tree = rustlet_cri::cgroups::PodCgroupsConfig {
            mount: "/sys/fs/cgroup".into(),
            root: "/".to_owned(),
        };
        let kubepods_before = std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .any(|hierarchy| hierarchy.path().join("kubepods").is_dir());
        match tree.ensure_cgroup(&root) {
            Ok(_) => Some(Self {
                root,
                tree,
                kubepods_before,
            }),
            Err(e) => {
                eprintln!("conformance: no system cgroups for the node ({e})");
                None
            }
        }
    }

    fn name(&self, part: &str) -> String {
        format!("{}/{part}", self.root)
    }

    fn move_process(&self, part: &str, pid: u32) {
        let name = self.name(part);
        self.tree
            .move_process(&name, pid)
            .unwrap_or_else(|e| panic!("moving process {pid} into {name}: {e}"));
    }

    /// `cmd` started inside cgroup `part` (a shell joins it, then becomes `cmd`).
    fn started_in(&self, part: &str, cmd: &Command) -> Command {
        let name = self.name(part);
        let dirs = self
            .tree
            .ensure_cgroup(&name)
            .unwrap_or_else(|e| panic!("making {name}: {e}"));
        let mut script = String::new();
        for dir in dirs {
            script.push_str(&format!(
                "echo $$ > '{}' && ",
                dir.join("cgroup.procs").display()
            ));
        }
        script.push_str("exec \"$@\"");
        let mut wrapped = Command::new("sh");
        wrapped
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        for (key, value) in cmd.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        wrapped
    }

    /// The agent's configuration keys.
    fn config(&self) -> String {
        format!(
            "cgroupsPerQOS: true\ncgroupRoot: /\nkubeletCgroups: {root}/kubelet\n\
             runtimeCgroups: {root}/runtime\nsystemCgroups: {root}/system\n",
            root = self.root
        )
    }
}

impl NodeCgroups {
    /// Removes cgroup `name` and the cgroups under it from every hierarchy, deepest first.
    fn remove_tree(name: &str) {
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for hierarchy in hierarchies.flatten() {
            let top = hierarchy.path().join(name.trim_start_matches('/'));
            let mut dirs = Vec::new();
            let mut stack = vec![top];
            while let Some(dir) = stack.pop() {
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    for entry in entries.flatten() {
                        if entry.file_type().is_ok_and(|t| t.is_dir()) {
                            stack.push(entry.path());
                        }
                    }
                    dirs.push(dir);
                }
            }
            // Depth first: the deepest directories are the longest paths.
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in dirs {
                if let Err(e) = std::fs::remove_dir(&dir) {
                    eprintln!("conformance: leaving cgroup {}: {e}", dir.display());
                }
            }
        }
    }

    /// The `pod<uid>` cgroups (and their containers' within) of the run's pods `uids` under
    /// `/kubepods`, which the agent leaves when it stops with pods (as the kubelet does).
    fn remove_pod_cgroups(&self, uids: &[String]) {
        for uid in uids {
            if uid.is_empty() || uid.contains(['/', '.']) {
                continue;
            }
            for qos in ["", "/burstable", "/besteffort"] {
                Self::remove_tree(&format!("/kubepods{qos}/pod{uid}"));
            }
        }
    }
}

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        Self::remove_tree(&self.root);
        // Nothing of the run stays on the host: the agent's `/kubepods` (upstream's kubelet
        // keeps its own), when the run made it.
        if !self.kubepods_before {
            Self::remove_tree("/kubepods");
        }
    }
}

/// A token for the suite's `known_tokens.csv` (32 hex digits from the kernel's random
/// source).
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The host paths the node suite uses, made for the run and put back after it (in the
/// runner's private mount namespace):
///
/// * `/rootfs`: with `--conformance=true` the suite's system validation first does
///   `chroot("/rootfs")` (upstream's node-test image mounts the host's root there); a link
///   to `/` when there is none;
/// * `/run/kubernetes`: the suite's API server writes its self-signed serving certificate
///   into kube-apiserver's default `--cert-dir`; a private tmpfs over it;
/// * `/var/log/pods`, `/var/log/containers`: the kubelet's log directories, which the
///   ContainerLogPath specs read through hostPath volumes; the agent is given them
///   (`podLogsDir`, `containerLogsDir`; its defaults are under its root), each a private
///   tmpfs;
/// * `/var/lib/kubelet/device-plugins`: the device plugins' directory, a private tmpfs.
struct HostPaths {
    made_rootfs: bool,
    /// The directories this run made for [`PRIVATE_DIRS`], parents first (removed after it,
    /// in reverse).
    made_dirs: Vec<PathBuf>,
}

/// kube-apiserver's default `--cert-dir` (`/var/run/kubernetes`, `/var/run` being `/run`).
const CERT_DIR: &str = "/run/kubernetes";

/// The kubelet's default `podLogsDir`.
const POD_LOGS_DIR: &str = "/var/log/pods";

/// The kubelet's `/var/log/containers` (upstream's `ContainerLogsDir`).
const CONTAINER_LOGS_DIR: &str = "/var/log/containers";

/// The kubelet's device plugin directory (upstream `pluginapi.DevicePluginPath`), where the
/// Device Plugin specs' plugin puts its socket and finds `kubelet.sock`; the agent is given it
/// (`devicePluginsDir`; its default is under its root).
const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The host directories the run covers with a private tmpfs each.
const PRIVATE_DIRS: [&str; 4] = [
    CERT_DIR,
    POD_LOGS_DIR,
    CONTAINER_LOGS_DIR,
    DEVICE_PLUGINS_DIR,
];

impl HostPaths {
    fn prepare() -> Self {
        let rootfs = Path::new("/rootfs");
        let made_rootfs = rootfs.symlink_metadata().is_err();
        if made_rootfs {
            std::os::unix::fs::symlink("/", rootfs).expect("linking /rootfs to /");
        }
        let mut made_dirs = Vec::new();
        for dir in PRIVATE_DIRS {
            let missing: Vec<PathBuf> = Path::new(dir)
                .ancestors()
                .take_while(|d| !d.exists())
                .map(Path::to_path_buf)
                .collect();
            for made in missing.into_iter().rev() {
                std::fs::create_dir(&made)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", made.display()));
                made_dirs.push(made);
            }
            let status = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", dir])
                .status()
                .expect("running mount");
            assert!(status.success(), "mounting a tmpfs on {dir}: {status}");
        }
        HostPaths {
            made_rootfs,
            made_dirs,
        }
    }
}

impl Drop for HostPaths {
    fn drop(&mut self) {
        for dir in PRIVATE_DIRS {
            let _ = Command::new("umount").arg(dir).status();
        }
        for dir in self.made_dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
        if self.made_rootfs {
            let _ = std::fs::remove_file("/rootfs");
        }
    }
}
