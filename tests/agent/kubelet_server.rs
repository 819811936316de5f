//! Issue 26: the kubelet server of the binary in local mode. There is no API server to review
//! tokens or access: with `--client-ca-file` the server takes client certificates of that CA
//! only (any such user is allowed), refuses others and requests without one (401).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::start;

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `<name>-ca.crt|key` in `dir`.
fn ca(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (crt, key) = (
        dir.join(format!("{name}-ca.crt")),
        dir.join(format!("{name}-ca.key")),
    );
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        crt.to_str().unwrap(),
        "-days",
        "1",
        "-subj",
        &format!("/CN={name}-ca"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,digitalSignature",
    ]);
    (crt, key)
}

/// A v3 client certificate of `user` signed by the CA `(crt, key)`.
fn client(dir: &Path, ca: &(PathBuf, PathBuf), user: &str) -> (PathBuf, PathBuf) {
    let (crt, key, csr, ext) = (
        dir.join(format!("{user}.crt")),
        dir.join(format!("{user}.key")),
        dir.join(format!("{user}.csr")),
        dir.join("client.ext"),
    );
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
        "-subj",
        &format!("/CN={user}"),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-CA",
        ca.0.to_str().unwrap(),
        "-CAkey",
        ca.1.to_str().unwrap(),
        "-extfile",
        ext.to_str().unwrap(),
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        crt.to_str().unwrap(),
    ]);
    (crt, key)
}

/// `curl -k` (the server's certificate is its self-signed one) to `url`: code and body.
fn curl(url: &str, cert: Option<&(PathBuf, PathBuf)>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sSk", "-w", "\n%{http_code}"]);
    if let Some((crt, key)) = cert {
        cmd.arg("--cert").arg(crt).arg("--key").arg(key);
    }
    let out = cmd.arg(url).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code = code.trim().parse().unwrap_or(0);
    assert!(
        code != 0,
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, body.to_owned())
}

#[test]
fn local_mode_serves_client_certificates_of_its_ca_only() {
    let dir = tempfile::tempdir().unwrap();
    let (root, manifests, pki) = (
        dir.path().join("root"),
        dir.path().join("manifests"),
        dir.path().join("pki"),
    );
    for d in [&root, &manifests, &pki] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ours = ca(&pki, "ours");
    let theirs = ca(&pki, "theirs");
    let alice = client(&pki, &ours, "alice");
    let mallory = client(&pki, &theirs, "mallory");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let _agent = start(
        &[
            "--node-name",
            "node-a",
            "--root-dir",
            root.to_str().unwrap(),
            "--local",
            manifests.to_str().unwrap(),
            "--enable-server",
            "--address",
            "127.0.0.1",
            "--port",
            &port,
            "--client-ca-file",
            ours.0.to_str().unwrap(),
        ],
        &dir.path().join("agent.log"),
    );
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    // The harness waited for the read-only port; the kubelet server listens before it.
    assert_eq!(curl(&url("/healthz"), Some(&alice)), (200, "ok".to_owned()));
    let (code, body) = curl(&url("/pods"), Some(&alice));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(r#""kind":"PodList""#), "{body}");
    // `/metrics` (`nodes/metrics`): the agent's registry, as on the read-only port.
    let (code, body) = curl(&url("/metrics"), Some(&alice));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("process_resident_memory_bytes"), "{body}");
    assert_eq!(
        curl(&url("/pods"), Some(&mallory)),
        (401, "Unauthorized".to_owned())
    );
    assert_eq!(curl(&url("/pods"), None), (401, "Unauthorized".to_owned()));
}

/// Issue 26 item 6: the healthz endpoint (the kubelet's `--healthz-port`, plain HTTP on
/// loopback) answers `ok` beside the read-only port, and serves nothing else.
#[test]
fn healthz_port_answers_ok_in_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let (root, manifests) = (dir.path().join("root"), dir.path().join("manifests"));
    std::fs::create_dir_all(&manifests).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let _agent = start(
        &[
            "--node-name",
            "node-a",
            "--root-dir",
            root.to_str().unwrap(),
            "--local",
            manifests.to_str().unwrap(),
            "--healthz-port",
            &port,
        ],
        &dir.path().join("agent.log"),
    );
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    assert_eq!(get("/healthz"), ("200".to_owned(), "ok".to_owned()));
    assert_eq!(get("/pods").0, "404");
}
