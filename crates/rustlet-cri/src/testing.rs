//! The test helper for real containers: a private containerd (its own root, state, socket, runc
//! root, CNI configuration and network namespace under a privileged temp dir) with a busybox
//! image built here from the static `/bin/busybox`, since no registry is reachable.
//!
//! Nothing touches the host's containerd, mounts or network: containerd runs inside a new
//! network namespace (host-network pods share that namespace, the CNI bridge lives in it), in
//! the test run's private mount namespace (see `rustlet_mount::testing`). On drop every
//! container is force-deleted through runc, containerd stops, and what is still mounted under
//! the temp dir is unmounted before the dir is removed.
//!
//! [`PrivateContainerd::serve_registry`] serves an image tarball's images from a
//! [`LocalRegistry`] in containerd's network namespace, as their registry, for pulls that
//! cannot be avoided (`imagePullPolicy: Always`).
//!
//! [`GrpcHealthServer`] is a gRPC health server as agnhost's `grpc-health-checking`, for the
//! gRPC probe's tests.
//!
//! Like the mount tests: without root, containerd, runc or the CNI plugins the test prints
//! `skipped: needs CAP_SYS_ADMIN` and why; with `RUSTLET_REQUIRE_PRIVILEGED=1` it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustlet_mount::testing::{PrivilegedDir, privileged_dir};

use crate::client::CriClient;

mod registry;
pub use registry::LocalRegistry;
use registry::RegistryContent;

/// The workload image every test pod can use (`/bin/sh`, `sleep`, `cat`, `httpd`, `nc`...).
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:1";
/// The sandbox ("pause") image: the same busybox, `sleep infinity`.
pub const PAUSE_IMAGE: &str = "localhost/pause:1";

/// The machine's static busybox, of the CRI tests' images.
const HOST_BUSYBOX: &str = "/bin/busybox";

/// Busybox applets linked into the image's `/bin`.
const APPLETS: &[&str] = &[
    "sh",
    "sleep",
    "cat",
    "echo",
    "ls",
    "test",
    "[",
    "true",
    "false",
    "mkdir",
    "touch",
    "wc",
    "grep",
    "head",
    "tail",
    "env",
    "id",
    "hostname",
    "ip",
    "ps",
    "kill",
    "nc",
    "httpd",
    "date",
    "printf",
    "stat",
    "rm",
    "mv",
    "cp",
    "seq",
    "mount",
    "df",
    "wget",
    "ssl_client",
];

/// A private containerd for one test.
pub struct PrivateContainerd {
    child: Option<Child>,
    dir: Option<PrivilegedDir>,
    endpoint: String,
}

fn require(test: &str, what: &str, present: bool) -> Option<()> {
    if present {
        return Some(());
    }
    if std::env::var("RUSTLET_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: needs {what}, absent, and RUSTLET_REQUIRE_PRIVILEGED=1");
    }
    eprintln!("{test}: skipped: needs CAP_SYS_ADMIN and {what}");
    None
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
}

impl PrivateContainerd {
    /// Starts containerd with the busybox image imported, or `None` after printing why the
    /// test is skipped (panics instead under `RUSTLET_REQUIRE_PRIVILEGED=1`).
    pub async fn start(test: &str) -> Option<Self> {
        let dir = privileged_dir(test)?;
        require(test, "containerd", on_path("containerd"))?;
        require(test, "runc", on_path("runc"))?;
        require(test, "ctr", on_path("ctr"))?;
        require(
            test,
            "the CNI plugins",
            Path::new("/usr/lib/cni/bridge").is_file(),
        )?;
        require(
            test,
            "a static /bin/busybox",
            Path::new(HOST_BUSYBOX).is_file(),
        )?;
        let root = dir.path().to_owned();
        write_config(&root).expect("containerd config");
        // A network namespace of its own, kept by a bind mount (so that containerd can be
        // stopped and started again in it), with its loopback up.
        let netns = root.join("netns");
        std::fs::write(&netns, "").expect("netns file");
        let status = Command::new("unshare")
            .arg(format!("--net={}", netns.display()))
            .args(["ip", "link", "set", "lo", "up"])
            .status()
            .expect("unshare --net");
        assert!(status.success(), "creating the network namespace: {status}");
        let endpoint = format!("unix://{}", root.join("containerd.sock").display());
        let mut this = Self {
            child: None,
            dir: Some(dir),
            endpoint,
        };
        this.start_again().await;
        this.import_image();
        Some(this)
    }

    /// The network namespace containerd runs in (the pods' host network): a path for
    /// `nsenter --net=` or `setns`.
    pub fn netns(&self) -> PathBuf {
        self.dir().join("netns")
    }

    /// Stops containerd (SIGTERM) and waits for it; containers and their shims go on, as
    /// when a node's containerd restarts.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }

    /// Starts containerd (again) and waits until the CRI plugin answers.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "containerd is running");
        let root = self.dir().to_owned();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(root.join("containerd.log"))
            .expect("log file");
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns().display()))
            .arg("containerd")
            .arg("--config")
            .arg(root.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        self.child = Some(child);
        self.wait_ready().await;
    }

    /// [`Self::start_again`] for a test without an async runtime.
    pub fn start_again_blocking(&mut self) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(self.start_again());
    }

    /// [`Self::start`] for a test without an async runtime.
    pub fn start_blocking(test: &str) -> Option<Self> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(Self::start(test))
    }

    /// Makes containerd lose a container's state while its process runs on, so that CRI
    /// reports it `CONTAINER_UNKNOWN` (as a node's containerd can after a crash): stops
    /// containerd, removes the CRI plugin's status checkpoint of the container
    /// (`<root>/io.containerd.grpc.v1.cri/containers/<id>/status`) and starts containerd again.
    /// containerd 1.6's `loadContainer` (pkg/cri/server/restart.go), unable to read the
    /// checkpoint, starts from `unknownContainerStatus()` (`Unknown: true`); finding the task
    /// running it keeps that state and watches the task, and only the task's exit (by itself or
    /// by a StopContainer) turns it into EXITED. `id` is the CRI container ID (a
    /// `containerd://` prefix is dropped).
    pub async fn lose_container_state(&mut self, id: &str) {
        let raw = id.split_once("://").map_or(id, |(_, raw)| raw);
        self.stop();
        let status = self
            .dir()
            .join("root/io.containerd.grpc.v1.cri/containers")
            .join(raw)
            .join("status");
        std::fs::remove_file(&status)
            .unwrap_or_else(|e| panic!("removing {}: {e}", status.display()));
        self.start_again().await;
    }

    /// [`Self::lose_container_state`] for a test without an async runtime.
    pub fn lose_container_state_blocking(&mut self, id: &str) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(self.lose_container_state(id));
    }

    /// `unix://<socket>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The containerd process's ID (`None` once it is stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The private temp dir (containerd's files are beneath it; a test may use it too).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("live").path()
    }

    /// containerd's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// Waits (real time: containerd is a real process) until the CRI plugin answers.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(client) = CriClient::new(&self.endpoint, Duration::from_secs(2))
                && client.version().await.is_ok()
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 30 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn import_image(&self) {
        let tar = self.dir().join("busybox-oci.tar");
        std::fs::write(&tar, build_image_tar()).expect("write image");
        self.import(&tar);
    }

    /// Imports an OCI image layout tarball (such as [`oci_layout_tar`] writes) into the
    /// `k8s.io` namespace, where CRI sees its images under their annotated names.
    pub fn import(&self, tar: &Path) {
        let socket = self.dir().join("containerd.sock");
        let out = Command::new("ctr")
            .arg("-a")
            .arg(&socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr images import: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Serves the images of the OCI image layout tarball `tar` from a [`LocalRegistry`] in
    /// containerd's network namespace and makes it the mirror of each registry host they name
    /// (a `hosts.toml` in the registry hosts directory the CRI plugin reads at each pull:
    /// `<dir>/registry-hosts/<host>/hosts.toml`), so that a pull of one of them (a pod's
    /// `imagePullPolicy: Always`) is served as by its registry. Pulls stop being served when
    /// the registry is dropped.
    pub fn serve_registry(&self, tar: &Path) -> std::io::Result<LocalRegistry> {
        let content = RegistryContent::from_layout_tar(tar)?;
        let hosts = content.hosts().to_vec();
        let registry = LocalRegistry::serve_in(&self.netns(), content)?;
        for host in hosts {
            let dir = self.dir().join("registry-hosts").join(&host);
            std::fs::create_dir_all(&dir)?;
            let config = format!(
                "server = \"https://{host}\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                registry.addr()
            );
            std::fs::write(dir.join("hosts.toml"), config)?;
        }
        Ok(registry)
    }

    /// Force-deletes every container runc knows under the private root (a test's pods do not
    /// outlive it), then stops containerd.
    fn teardown(&mut self) {
        let Some(dir) = self.dir.as_ref() else { return };
        let runc_root = dir.path().join("runc-root").join("k8s.io");
        if let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force", id])
                    .output();
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims of this containerd (their `-address` is our socket) exit once their
        // containers are gone; kill any left.
        let socket = dir.path().join("containerd.sock");
        kill_shims_of(&socket);
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        self.teardown();
        // PrivilegedDir unmounts what is left beneath the dir and removes it.
        self.dir.take();
    }
}

fn kill_shims_of(socket: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let needle = socket.as_os_str().as_encoded_bytes();
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let is_shim = cmdline.starts_with(b"/usr/bin/containerd-shim")
            || cmdline
                .windows(b"containerd-shim".len())
                .any(|w| w == b"containerd-shim");
        if is_shim && cmdline.windows(needle.len()).any(|w| w == needle) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

fn write_config(root: &Path) -> std::io::Result<()> {
    let d = root.display();
    let config = format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "{d}/registry-hosts"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{d}/cni-conf"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "{d}/runc-root"
          SystemdCgroup = false
"#
    );
    std::fs::write(root.join("config.toml"), config)?;
    std::fs::create_dir_all(root.join("registry-hosts"))?;
    let cni = root.join("cni-conf");
    std::fs::create_dir_all(&cni)?;
    let conf = format!(
        r#"{{ "cniVersion": "1.0.0", "name": "rustlet-test",
  "plugins": [ {{ "type": "bridge", "bridge": "rltest0", "isGateway": true, "ipMasq": false,
                 "hairpinMode": true,
                 "ipam": {{ "type": "host-local", "ranges": [[{{"subnet": "10.88.0.0/16"}}]],
                           "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{d}/cni-ipam" }} }},
               {{ "type": "loopback" }} ] }}"#
    );
    // Written whole, then renamed: CRI reloads the directory on every file event.
    let tmp = root.join("podnet.tmp");
    std::fs::write(&tmp, conf)?;
    std::fs::rename(tmp, cni.join("10-podnet.conflist"))
}

fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn append_file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
    b.append_data(&mut h, path, data).expect("tar entry");
}

/// The image's one layer: busybox, its applets, `/etc/passwd`, empty mount points.
fn build_layer() -> Vec<u8> {
    busybox_layer(APPLETS)
}

/// A layer of busybox (`/bin/busybox` of the machine, which must be static) with `applets`
/// linked in `/bin`, `/etc/passwd` (root, nobody) and `/etc/group`, `/tmp` (1777) and empty
/// mount points.
pub fn busybox_layer(applets: &[&str]) -> Vec<u8> {
    busybox_layer_of(Path::new(HOST_BUSYBOX), applets)
}

/// [`busybox_layer`] of the static busybox binary at `busybox` (the conformance images': a
/// build of mainline busybox) in place of the machine's.
pub fn busybox_layer_of(busybox: &Path, applets: &[&str]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for dir in [
        "bin", "etc", "proc", "sys", "dev", "data", "root", "var", "www",
    ] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, format!("{dir}/"), std::io::empty())
            .expect("tar dir");
    }
    let mut h = header(tar::EntryType::Directory, 0o1777, 0);
    b.append_data(&mut h, "tmp/", std::io::empty())
        .expect("tar dir");
    let binary =
        std::fs::read(busybox).unwrap_or_else(|e| panic!("reading {}: {e}", busybox.display()));
    append_file(&mut b, "bin/busybox", 0o755, &binary);
    for applet in applets {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, format!("bin/{applet}"), "busybox")
            .expect("tar link");
    }
    append_file(
        &mut b,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    );
    append_file(&mut b, "etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n");
    b.into_inner().expect("layer tar")
}

/// Every applet the machine's `/bin/busybox` has (`busybox --list`), but `busybox` itself (a
/// link of that name would replace the binary with a link to itself).
pub fn all_busybox_applets() -> Vec<String> {
    busybox_applets_of(Path::new(HOST_BUSYBOX))
}

/// [`all_busybox_applets`] of the busybox binary at `busybox`.
pub fn busybox_applets_of(busybox: &Path) -> Vec<String> {
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .unwrap_or_else(|e| panic!("running {} --list: {e}", busybox.display()));
    assert!(out.status.success(), "busybox --list: {}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/') && *a != "busybox")
        .map(str::to_owned)
        .collect()
}

/// One entry of a layer built by [`layer`] (paths relative to the image's root; parent
/// directories are not implied).
pub enum LayerEntry<'a> {
    /// A directory.
    Dir {
        /// Its path.
        path: &'a str,
        /// Its mode.
        mode: u32,
    },
    /// A regular file.
    File {
        /// Its path.
        path: &'a str,
        /// Its mode, setuid bits included.
        mode: u32,
        /// Its content.
        data: &'a [u8],
    },
    /// A symbolic link.
    Symlink {
        /// Its path.
        path: &'a str,
        /// What it points at.
        target: &'a str,
    },
}

/// A layer tarball of `entries`, owned by root, mtime 0.
pub fn layer(entries: &[LayerEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for entry in entries {
        match entry {
            LayerEntry::Dir { path, mode } => {
                let mut h = header(tar::EntryType::Directory, *mode, 0);
                b.append_data(
                    &mut h,
                    format!("{}/", path.trim_end_matches('/')),
                    std::io::empty(),
                )
                .expect("tar dir");
            }
            LayerEntry::File { path, mode, data } => append_file(&mut b, path, *mode, data),
            LayerEntry::Symlink { path, target } => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                b.append_link(&mut h, path, target).expect("tar link");
            }
        }
    }
    b.into_inner().expect("layer tar")
}

/// One image of an OCI image layout tarball ([`oci_layout_tar`]).
pub struct OciImage<'a> {
    /// The full reference containerd names the image by (`io.containerd.image.name`).
    pub name: &'a str,
    /// The config's `Entrypoint` (empty: none).
    pub entrypoint: &'a [&'a str],
    /// The config's `Cmd`.
    pub cmd: &'a [&'a str],
    /// The config's `User` (empty: root).
    pub user: &'a str,
    /// The config's `Env`.
    pub env: &'a [&'a str],
    /// The layer tarballs, bottom first (a layer shared by images is stored once).
    pub layers: &'a [&'a [u8]],
}

/// The busybox image whose config says `User: 1234` (a non-root image).
pub const NUMERIC_USER_IMAGE: &str = "localhost/busybox-uid:1";
/// The busybox image whose config says `User: nobody` (a user by name, UID 65534 in its
/// `/etc/passwd`).
pub const NAMED_USER_IMAGE: &str = "localhost/busybox-named:1";

/// The images of the tarball: name and the config's `User` (empty: root).
const IMAGES: &[(&str, &str)] = &[
    (BUSYBOX_IMAGE, ""),
    (PAUSE_IMAGE, ""),
    (NUMERIC_USER_IMAGE, "1234"),
    (NAMED_USER_IMAGE, "nobody"),
];

/// An OCI image layout tarball of the one busybox layer under [`BUSYBOX_IMAGE`] and
/// [`PAUSE_IMAGE`], and with another user in its config under [`NUMERIC_USER_IMAGE`] and
/// [`NAMED_USER_IMAGE`].
pub fn build_image_tar() -> Vec<u8> {
    let layer = build_layer();
    let layers = [layer.as_slice()];
    let images: Vec<OciImage<'_>> = IMAGES
        .iter()
        .map(|(name, user)| OciImage {
            name,
            entrypoint: &[],
            cmd: &["/bin/sleep", "infinity"],
            user,
            env: &["PATH=/bin"],
            layers: &layers,
        })
        .collect();
    oci_layout_tar(&images)
}

/// An OCI image layout tarball (`ctr images import` takes it) of `images`, each named by
/// its `io.containerd.image.name` annotation; blobs shared by images are stored once.
pub fn oci_layout_tar(images: &[OciImage<'_>]) -> Vec<u8> {
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests = Vec::new();
    for image in images {
        let digests: Vec<String> = image.layers.iter().map(|l| sha256_hex(l)).collect();
        let mut config = serde_json::json!({
            "Env": image.env, "Cmd": image.cmd, "User": image.user
        });
        if !image.entrypoint.is_empty() {
            config["Entrypoint"] = serde_json::json!(image.entrypoint);
        }
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {
                "type": "layers",
                "diff_ids": digests.iter().map(|d| format!("sha256:{d}")).collect::<Vec<_>>(),
            },
        })
        .to_string()
        .into_bytes();
        let config_digest = sha256_hex(&config);
        let layers: Vec<serde_json::Value> = digests
            .iter()
            .zip(image.layers)
            .map(|(digest, layer)| {
                serde_json::json!({
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": format!("sha256:{digest}"),
                    "size": layer.len(),
                })
            })
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{config_digest}"),
                "size": config.len(),
            },
            "layers": layers,
        })
        .to_string()
        .into_bytes();
        let manifest_digest = sha256_hex(&manifest);
        let tag = image.name.rsplit(':').next().unwrap_or("latest");
        manifests.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }));
        let layer_blobs = digests
            .into_iter()
            .zip(image.layers.iter().map(|l| l.to_vec()));
        let own = [(config_digest, config), (manifest_digest, manifest)];
        for (digest, blob) in layer_blobs.chain(own) {
            if !blobs.iter().any(|(d, _)| *d == digest) {
                blobs.push((digest, blob));
            }
        }
    }
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": manifests })
        .to_string()
        .into_bytes();
    let mut b = tar::Builder::new(Vec::new());
    append_file(
        &mut b,
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    );
    append_file(&mut b, "index.json", 0o644, &index);
    for (digest, blob) in &blobs {
        append_file(&mut b, &format!("blobs/sha256/{digest}"), 0o644, blob);
    }
    b.into_inner().expect("image tar")
}

/// A directory for a test's own files beside containerd's.
pub fn scratch(containerd: &PrivateContainerd, name: &str) -> PathBuf {
    let p = containerd.dir().join(name);
    std::fs::create_dir_all(&p).expect("scratch dir");
    p
}

/// What a [`GrpcHealthServer`] answers a `Check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthAnswer {
    /// `SERVING`.
    Serving,
    /// `NOT_SERVING` (agnhost after `--delay-unhealthy-sec` or `/make-not-serving`).
    NotServing,
    /// The `UNIMPLEMENTED` error of a server without the health service.
    Unimplemented,
    /// Nothing, ever (a server that hangs).
    Hang,
}

/// A gRPC health server on a listener of the test's, answering as agnhost's
/// `grpc-health-checking` (the upstream e2e specs' gRPC server): `NOT_FOUND` "unknown service"
/// for a service other than its own, else the [`HealthAnswer`] set (at first `SERVING`).
/// It runs on a thread of its own, so sync and async tests can use it; dropping it stops it.
pub struct GrpcHealthServer {
    port: u16,
    answer: std::sync::Arc<std::sync::Mutex<HealthAnswer>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// agnhost's `HealthChecker`.
struct AgnhostHealth {
    service: String,
    answer: std::sync::Arc<std::sync::Mutex<HealthAnswer>>,
}

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for AgnhostHealth {
    async fn check(
        &self,
        request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
        use tonic_health::pb::health_check_response::ServingStatus;
        let answer = *self.answer.lock().unwrap_or_else(|e| e.into_inner());
        if answer == HealthAnswer::Unimplemented {
            return Err(tonic::Status::unimplemented("unimplemented"));
        }
        if request.get_ref().service != self.service {
            return Err(tonic::Status::not_found("unknown service"));
        }
        let status = match answer {
            HealthAnswer::Serving => ServingStatus::Serving,
            HealthAnswer::NotServing => ServingStatus::NotServing,
            HealthAnswer::Unimplemented | HealthAnswer::Hang => {
                return std::future::pending().await;
            }
        };
        Ok(tonic::Response::new(
            tonic_health::pb::HealthCheckResponse {
                status: status as i32,
            },
        ))
    }

    type WatchStream = tonic::codegen::tokio_stream::Empty<
        Result<tonic_health::pb::HealthCheckResponse, tonic::Status>,
    >;

    async fn watch(
        &self,
        _request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("unimplemented"))
    }
}

impl GrpcHealthServer {
    /// Serves `service`'s health (`""`: agnhost's default) on `listener` (bound by the test,
    /// in whichever network namespace it likes).
    pub fn start(listener: std::net::TcpListener, service: &str) -> Self {
        let port = listener.local_addr().expect("a bound listener").port();
        listener.set_nonblocking(true).expect("non-blocking");
        let answer = std::sync::Arc::new(std::sync::Mutex::new(HealthAnswer::Serving));
        let health = AgnhostHealth {
            service: service.to_owned(),
            answer: answer.clone(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
                let serve = tonic::transport::Server::builder()
                    .add_service(tonic_health::pb::health_server::HealthServer::new(health))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
                // Stopping drops the runtime with the connections' tasks, hung calls included.
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
        });
        Self {
            port,
            answer,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What it answers from now on.
    pub fn set(&self, answer: HealthAnswer) {
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = answer;
    }
}

impl Drop for GrpcHealthServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
