//! The conformance runner (issue 27): upstream's `e2e.test` against the `rustlet` binary as a
//! node of the real control plane on a private containerd, with the release's test images
//! built here without a registry. Run by `cargo xtask conformance` (see xtask's
//! `conformance` module), never by a plain `cargo test` (`test = false`): as root in a
//! private mount namespace,
//!
//! ```sh
//! cargo test -p rustlet --test conformance -- images <bin dir> <images dir>
//! cargo test -p rustlet --test conformance -- run [--focus REGEX] [--skip REGEX] [--procs N]
//! ```
//!
//! `images` writes the OCI image layout tarball of every image of
//! [`xtask::conformance::TEST_IMAGES`]; `run` starts the node (the cluster's `ServedNode`: the
//! control plane in containerd's network namespace, the agent with its kubelet server at
//! 10.88.0.1:10250), imports the images, runs ginkgo on `e2e.test` inside that namespace,
//! copies the agent's and containerd's logs beside the JUnit report and prints the agent's
//! refused requests and `N passed, M failed, K skipped`; it fails when a spec did.

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

use rustlet_cri::testing::{
    LayerEntry, OciImage, all_busybox_applets, busybox_layer, layer, oci_layout_tar,
};
use xtask::conformance::{
    Mode, Options, Outcome, RunContext, Suite, Target, TestImage, check_images_listed, ginkgo_args,
    report_dir, run_ginkgo,
};

/// The node's name.
const NODE: &str = "conformance-node";

/// The images' tarball in the images dir.
const IMAGES_TAR: &str = "e2e-images.tar";

/// The version of what `images` builds: raise it when the images change, so that a cached
/// tarball of an older build is built anew (the cache holds it beside the names).
const IMAGES_VERSION: u32 = 4;

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
        Some("images") if args.len() == 3 => {
            let tar = images(Path::new(&args[1]), Path::new(&args[2]));
            println!("{}", tar.display());
        }
        Some("run") => run(&args[1..]),
        _ => panic!(
            "usage: conformance images <bin dir> <images dir> | conformance run [OPTIONS] \
             (cargo xtask conformance)"
        ),
    }
}

/// Writes (unless there already) `<out>/e2e-images.tar`: every test image of the release,
/// built from the machine's static busybox and the cache's `agnhost` and `nonewprivs`.
fn images(bin: &Path, out: &Path) -> PathBuf {
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
    let applets = all_busybox_applets();
    let applets: Vec<&str> = applets.iter().map(String::as_str).collect();
    let busybox = busybox_layer(&applets);
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
    let only_busybox = [busybox.as_slice()];
    let with_agnhost = [busybox.as_slice(), agnhost.as_slice()];
    let with_nnp = [busybox.as_slice(), nonewprivs.as_slice()];
    let with_nginx = [busybox.as_slice(), nginx.as_slice()];
    let images: Vec<OciImage<'_>> = xtask::conformance::TEST_IMAGES
        .iter()
        .map(|(name, kind)| {
            let plain = OciImage {
                name,
                entrypoint: &[],
                cmd: &["sh"],
                user: "",
                env: &[PATH],
                layers: &only_busybox,
            };
            match kind {
                TestImage::Busybox => plain,
                TestImage::Agnhost => OciImage {
                    entrypoint: &["/agnhost"],
                    cmd: &["pause"],
                    layers: &with_agnhost,
                    ..plain
                },
                TestImage::Pause => OciImage {
                    entrypoint: &["/agnhost", "pause"],
                    cmd: &[],
                    layers: &with_agnhost,
                    ..plain
                },
                TestImage::NonRoot => OciImage {
                    user: "1234",
                    ..plain
                },
                TestImage::NonewPrivs => OciImage {
                    cmd: &["nnp"],
                    layers: &with_nnp,
                    ..plain
                },
                TestImage::Nginx => OciImage {
                    cmd: &["httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"],
                    layers: &with_nginx,
                    ..plain
                },
            }
        })
        .collect();
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("creating {}: {e}", out.display()));
    let staging = out.join(format!("{IMAGES_TAR}.tmp"));
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

/// One run of the cluster suite against the agent.
fn run(args: &[String]) {
    let opts = Options::parse(args).expect("the options of cargo xtask conformance");
    assert_eq!(
        opts.suite,
        Suite::Cluster,
        "only the cluster suite runs here"
    );
    assert_eq!(opts.mode, Mode::Run, "a dry run needs no node");
    let root = xtask::workspace_root();
    let bin = xtask::conformance::cached_binaries(&root)
        .expect("reading tools/k8s/go.mod")
        .expect("the test binaries are built (cargo xtask conformance build)");
    let listed = Command::new(bin.join("e2e.test"))
        .arg("--list-images")
        .output()
        .expect("running e2e.test --list-images");
    check_images_listed(&String::from_utf8_lossy(&listed.stdout)).unwrap();
    let images_dir = xtask::conformance::cache_dir(&root)
        .expect("the cache dir")
        .join("images");
    let tar = images(&bin, &images_dir);

    let node = kubelet_server::ServedNode::start("conformance", NODE)
        .expect("RUSTLET_REQUIRE_* make a missing part fail instead");
    node.containerd.import(&tar);
    node::wait_ready(&node.cluster, NODE, "True");

    let report = report_dir(&root, &opts);
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
        &ginkgo_args(&opts, &ctx),
        &report,
        Some(&node.containerd.netns()),
    );
    for (log, name) in [
        (node.containerd.dir().join("agent.log"), "agent.log"),
        (
            node.containerd.dir().join("containerd.log"),
            "containerd.log",
        ),
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
    drop(node);
    let summary = summary.expect("ginkgo's JUnit report");
    for (spec, outcome) in &summary.specs {
        match outcome {
            Outcome::Failed => println!("FAILED  {spec}"),
            Outcome::Skipped(reason) => println!("SKIPPED {spec}: {reason}"),
            Outcome::Passed | Outcome::NotSelected => {}
        }
    }
    if !refused.is_empty() {
        println!("requests of the agent the API server refused: {refused:#?}");
    }
    println!("{summary} ({})", report.join("junit.xml").display());
    assert!(summary.failed() == 0, "{summary}");
}
