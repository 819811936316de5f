//! A read-only image registry for a private containerd: the pull half of the OCI distribution
//! API (`GET`/`HEAD` of `/v2/`, of `/v2/<name>/manifests/<tag or digest>` and of
//! `/v2/<name>/blobs/<digest>`) over the images of an OCI image layout tarball (such as
//! [`super::oci_layout_tar`] writes), listening on 127.0.0.1 inside containerd's network
//! namespace, and named in containerd's registry hosts directory as the mirror of each
//! registry host its images name (`registry.k8s.io` for `registry.k8s.io/pause:3.10.2`).
//!
//! A pod whose `imagePullPolicy` is `Always` makes the agent pull its image whether it is
//! present or not (upstream's kubelet does the same); with no registry reachable such a pull
//! fails. Upstream's e2e specs pull their test images that way (the Containers Lifecycle
//! image-update specs), so the conformance run serves the images it built here, under their
//! own names, as their registry would.
//!
//! Plain HTTP/1.1, one request per connection (`Connection: close`), each on a thread of its
//! own; unknown names and digests are `404` with the distribution API's error body, methods
//! other than `GET` and `HEAD` are `405`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The most a request's head may take (a pull's requests are a few hundred bytes).
const MAX_REQUEST_HEAD: u64 = 64 * 1024;
/// How long a connection may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks whether the registry is dropped.
const POLL: Duration = Duration::from_millis(50);

/// The blobs and tags of an OCI image layout tarball.
#[derive(Debug, Default)]
pub(crate) struct RegistryContent {
    /// Per digest (`sha256:<hex>`): the blob.
    blobs: HashMap<String, Arc<Vec<u8>>>,
    /// Per manifest digest: its media type.
    manifests: HashMap<String, String>,
    /// Per (repository, tag) (`e2e-test-images/busybox`, `1.37.0-2`): the manifest's digest.
    tags: HashMap<(String, String), String>,
    /// The registry hosts the images name (those the registry stands in for).
    hosts: Vec<String>,
}

/// One answer to a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RegistryAnswer {
    /// The HTTP status code.
    pub(crate) status: u16,
    /// `Content-Type`.
    pub(crate) content_type: String,
    /// `Docker-Content-Digest` (manifests and blobs).
    pub(crate) digest: Option<String>,
    /// The body (the whole of it, also for `HEAD`, whose answer sends only its length).
    pub(crate) body: Arc<Vec<u8>>,
}

impl RegistryContent {
    /// Reads an OCI image layout tarball: its blobs and, from its `index.json`, each image's
    /// name (the `io.containerd.image.name` annotation, `<host>/<repository>:<tag>`).
    pub(crate) fn from_layout_tar(tar: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(tar)?;
        let mut archive = tar::Archive::new(file);
        let mut content = Self::default();
        let mut index = None;
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            let path = path.trim_start_matches("./").to_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            if path == "index.json" {
                index = Some(data);
            } else if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                content
                    .blobs
                    .insert(format!("sha256:{hex}"), Arc::new(data));
            }
        }
        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let index = index.ok_or_else(|| invalid(format!("{}: no index.json", tar.display())))?;
        let index: serde_json::Value = serde_json::from_slice(&index)
            .map_err(|e| invalid(format!("{}: index.json: {e}", tar.display())))?;
        for manifest in index["manifests"].as_array().into_iter().flatten() {
            let (Some(digest), Some(name)) = (
                manifest["digest"].as_str(),
                manifest["annotations"]["io.containerd.image.name"].as_str(),
            ) else {
                continue;
            };
            let media_type = manifest["mediaType"]
                .as_str()
                .unwrap_or("application/vnd.oci.image.manifest.v1+json");
            let Some((host, repository, tag)) = split_image_name(name) else {
                return Err(invalid(format!("{}: image name {name:?}", tar.display())));
            };
            content
                .manifests
                .insert(digest.to_owned(), media_type.to_owned());
            content
                .tags
                .insert((repository.to_owned(), tag.to_owned()), digest.to_owned());
            if !content.hosts.iter().any(|h| h == host) {
                content.hosts.push(host.to_owned());
            }
        }
        Ok(content)
    }

    /// The registry hosts the images name.
    pub(crate) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The answer to `method` of `target` (a request's path and query).
    pub(crate) fn answer(&self, method: &str, target: &str) -> RegistryAnswer {
        if method != "GET" && method != "HEAD" {
            return error(405, "UNSUPPORTED", "a read-only registry");
        }
        let path = target.split_once('?').map_or(target, |(path, _)| path);
        if path == "/v2/" || path == "/v2" {
            return RegistryAnswer {
                status: 200,
                content_type: "application/json".to_owned(),
                digest: None,
                body: Arc::new(b"{}".to_vec()),
            };
        }
        let Some(rest) = path.strip_prefix("/v2/") else {
            return error(404, "NAME_UNKNOWN", "not a registry path");
        };
        if let Some((repository, reference)) = rest.rsplit_once("/manifests/") {
            let digest = if reference.starts_with("sha256:") {
                Some(reference.to_owned())
            } else {
                self.tags
                    .get(&(repository.to_owned(), reference.to_owned()))
                    .cloned()
            };
            let found = digest.and_then(|digest| {
                let media_type = self.manifests.get(&digest)?;
                let body = self.blobs.get(&digest)?;
                Some((digest, media_type, body))
            });
            return match found {
                Some((digest, media_type, body)) => RegistryAnswer {
                    status: 200,
                    content_type: media_type.clone(),
                    digest: Some(digest),
                    body: Arc::clone(body),
                },
                None => error(404, "MANIFEST_UNKNOWN", "manifest unknown"),
            };
        }
        if let Some((_, digest)) = rest.rsplit_once("/blobs/") {
            return match self.blobs.get(digest) {
                Some(body) => RegistryAnswer {
                    status: 200,
                    content_type: "application/octet-stream".to_owned(),
                    digest: Some(digest.to_owned()),
                    body: Arc::clone(body),
                },
                None => error(404, "BLOB_UNKNOWN", "blob unknown"),
            };
        }
        error(404, "NAME_UNKNOWN", "not a registry path")
    }
}

/// `<host>/<repository>:<tag>` split in three (a name without a host or a tag is refused, and
/// a host that is no directory name: it names the mirror's configuration directory).
fn split_image_name(name: &str) -> Option<(&str, &str, &str)> {
    let (host, rest) = name.split_once('/')?;
    let (repository, tag) = rest.rsplit_once(':')?;
    let host_ok = !host.is_empty() && host != "." && host != "..";
    (host_ok && !repository.is_empty() && !tag.is_empty() && !tag.contains('/'))
        .then_some((host, repository, tag))
}

/// The distribution API's error answer.
fn error(status: u16, code: &str, message: &str) -> RegistryAnswer {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message }] });
    RegistryAnswer {
        status,
        content_type: "application/json".to_owned(),
        digest: None,
        body: Arc::new(body.to_string().into_bytes()),
    }
}

/// The registry, served until dropped.
pub struct LocalRegistry {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl LocalRegistry {
    /// Serves `content` on 127.0.0.1 (a free port) inside the network namespace `netns` (a
    /// path for `setns`).
    pub(crate) fn serve_in(netns: &Path, content: RegistryContent) -> std::io::Result<Self> {
        let netns = std::fs::File::open(netns)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let content = Arc::new(content);
        // The listener is made by a thread that joined the namespace (a socket stays in the
        // namespace it was made in); the thread then accepts on it.
        let accept = std::thread::spawn(move || {
            let listener = nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
                .and_then(|()| TcpListener::bind("127.0.0.1:0"))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            let listener = match listener {
                Ok(listener) => listener,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr());
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let content = Arc::clone(&content);
                        std::thread::spawn(move || {
                            // A connection's failure is the client's to see.
                            let _ = serve_connection(stream, &content);
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(POLL);
                    }
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        let addr = rx
            .recv()
            .map_err(|_| std::io::Error::other("the registry's thread ended"))??;
        Ok(Self {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// Where it listens (inside the namespace).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Reads one request's head from `stream` and writes the answer.
fn serve_connection(stream: TcpStream, content: &RegistryContent) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_REQUEST_HEAD));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers are read and ignored (no range requests: containerd fetches whole blobs).
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let answer = content.answer(method, target);
    let reason = match answer.status {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
         Docker-Distribution-API-Version: registry/2.0\r\nConnection: close\r\n",
        answer.status,
        answer.content_type,
        answer.body.len()
    );
    if let Some(digest) = &answer.digest {
        head.push_str(&format!("Docker-Content-Digest: {digest}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = stream;
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        stream.write_all(&answer.body)?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{OciImage, layer, oci_layout_tar};

    fn content() -> (RegistryContent, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let top = layer(&[]);
        let layers: [&[u8]; 1] = [&top];
        let image = OciImage {
            name: "registry.example/e2e-test-images/busybox:1.37.0-2",
            entrypoint: &[],
            cmd: &["sh"],
            user: "",
            env: &[],
            layers: &layers,
        };
        let tar = dir.path().join("images.tar");
        std::fs::write(&tar, oci_layout_tar(&[image])).unwrap();
        (RegistryContent::from_layout_tar(&tar).unwrap(), dir)
    }

    /// A pull resolves the tag to the manifest's digest (`HEAD`), then reads the manifest and
    /// each blob by digest, as containerd's resolver and fetcher do.
    #[test]
    fn a_pull_reads_the_manifest_by_tag_and_the_blobs_by_digest() {
        let (content, _dir) = content();
        assert_eq!(content.hosts(), ["registry.example"]);
        assert_eq!(content.answer("GET", "/v2/").status, 200);
        let by_tag = content.answer(
            "HEAD",
            "/v2/e2e-test-images/busybox/manifests/1.37.0-2?ns=registry.example",
        );
        assert_eq!(by_tag.status, 200);
        assert_eq!(
            by_tag.content_type,
            "application/vnd.oci.image.manifest.v1+json"
        );
        let digest = by_tag.digest.clone().unwrap();
        let by_digest = content.answer(
            "GET",
            &format!("/v2/e2e-test-images/busybox/manifests/{digest}"),
        );
        assert_eq!(by_digest, by_tag);
        let manifest: serde_json::Value = serde_json::from_slice(&by_digest.body).unwrap();
        let config = manifest["config"]["digest"].as_str().unwrap();
        let blob = content.answer(
            "GET",
            &format!("/v2/e2e-test-images/busybox/blobs/{config}"),
        );
        assert_eq!(blob.status, 200);
        assert_eq!(blob.digest.as_deref(), Some(config));
    }

    #[test]
    fn unknown_names_tags_and_digests_are_not_found_and_writes_refused() {
        let (content, _dir) = content();
        for path in [
            "/v2/e2e-test-images/busybox/manifests/1.36.1-1",
            "/v2/e2e-test-images/agnhost/manifests/1.37.0-2",
            "/v2/e2e-test-images/busybox/blobs/sha256:00",
            "/v2/e2e-test-images/busybox/tags/list",
            "/etc/passwd",
        ] {
            assert_eq!(content.answer("GET", path).status, 404, "{path}");
        }
        assert_eq!(
            content
                .answer("PUT", "/v2/e2e-test-images/busybox/manifests/1.37.0-2")
                .status,
            405
        );
    }
}
