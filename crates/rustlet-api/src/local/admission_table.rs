//! Issue 14's table: every manifest in `testdata/admission` carries the API server's verdict in
//! its header (`# verdict: accepted`, `# verdict: refused: <message>`, `# verdict: ignored:
//! <message>`), and runs twice: through the manifest directory of local mode, and as POSTs to
//! the test API server, which shares the store's admission.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::manifests::{DirectorySync, parse_yaml};
use super::store::{Kind, Store};

#[derive(Debug, PartialEq)]
enum Verdict {
    Accepted,
    Refused(String),
    Ignored(String),
}

fn cases() -> Vec<(PathBuf, Vec<Verdict>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/admission");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let cases: Vec<_> = files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let verdicts: Vec<Verdict> = text
                .lines()
                .filter_map(|l| l.strip_prefix("# verdict: "))
                .map(|v| match v.split_once(": ") {
                    Some(("refused", message)) => Verdict::Refused(message.to_owned()),
                    Some(("ignored", message)) => Verdict::Ignored(message.to_owned()),
                    _ if v == "accepted" => Verdict::Accepted,
                    _ => panic!("{}: unknown verdict {v:?}", path.display()),
                })
                .collect();
            assert!(!verdicts.is_empty(), "{}: no verdict", path.display());
            (path, verdicts)
        })
        .collect();
    assert!(cases.len() >= 30, "the table is in the repository");
    cases
}

/// The documents of a case the store serves.
fn served(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    parse_yaml(path, &text)
        .unwrap()
        .into_iter()
        .filter(|d| {
            let field = |p: &str| d.pointer(p).and_then(Value::as_str).unwrap_or("");
            Kind::from_type(field("/apiVersion"), field("/kind")).is_some()
        })
        .collect()
}

#[test]
fn the_table_through_the_manifest_directory() {
    let mut failures = Vec::new();
    for (path, verdicts) in cases() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        let store = Arc::new(Store::default());
        let mut sync = DirectorySync::new(dir.path(), "node-a", store.clone());
        let report = sync.sync();
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        let stored = |document: &Value| {
            Store::reference_of(document)
                .ok()
                .is_some_and(|r| store.get(&r).is_ok())
        };
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let expected_errors = verdicts
            .iter()
            .filter(|v| !matches!(v, Verdict::Accepted))
            .count();
        if errors.len() != expected_errors {
            failures.push(format!("{name}: expected {verdicts:?}, got {errors:?}"));
            continue;
        }
        for verdict in &verdicts {
            match verdict {
                Verdict::Accepted | Verdict::Ignored(_) => {
                    if let Some(missing) = served(&path).iter().find(|d| !stored(d)) {
                        failures.push(format!("{name}: not stored: {}", missing["metadata"]));
                    }
                }
                Verdict::Refused(_) => {
                    if served(&path).iter().any(stored) {
                        failures.push(format!("{name}: a refused object was stored"));
                    }
                }
            }
            if let Verdict::Refused(message) | Verdict::Ignored(message) = verdict
                && !errors.iter().any(|e| e.contains(message.as_str()))
            {
                failures.push(format!("{name}: expected {message:?} in {errors:?}"));
            }
        }
        // Said once: a second scan reports nothing.
        let again = sync.sync();
        if !again.errors.is_empty() {
            failures.push(format!("{name}: reported again: {:?}", again.errors));
        }
        // Every refusal names the file and the document.
        for error in &errors {
            if !error.contains(&format!("{name} document ")) {
                failures.push(format!(
                    "{name}: the message does not name the file and document: {error}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Needs the test API server (feature `test-util`, on in `cargo xtask ci`).
#[cfg(feature = "test-util")]
#[tokio::test]
async fn the_table_against_the_test_api_server() {
    use crate::test_server::TestApiServer;
    let store = Arc::new(Store::default());
    let server = TestApiServer::start(store.clone()).await.unwrap();
    let client = server.client().await.unwrap();
    let mut failures = Vec::new();
    for (path, verdicts) in cases() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let refused: Vec<&String> = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Refused(m) => Some(m),
                _ => None,
            })
            .collect();
        for document in served(&path) {
            let reference = Store::reference_of(&document).unwrap();
            let namespace = match reference.kind.is_namespaced() {
                true => format!("namespaces/{}/", reference.namespace),
                false => String::new(),
            };
            let uri = format!("/api/v1/{namespace}{}", reference.kind.plural());
            let request = http::Request::post(uri)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&document).unwrap())
                .unwrap();
            let result = client.request::<Value>(request).await;
            match (result, refused.first()) {
                (Ok(_), None) => {}
                (Err(kube::Error::Api(status)), Some(message)) => {
                    // As the API server words it: `Pod "x" is invalid: field: ...`.
                    let kind_first = status.message.starts_with(reference.kind.name());
                    if status.code != 422
                        || !status.message.contains(message.as_str())
                        || !kind_first
                    {
                        failures.push(format!(
                            "{name}: expected 422 {message:?}, got {} {:?}",
                            status.code, status.message
                        ));
                    }
                }
                (Ok(_), Some(message)) => {
                    failures.push(format!("{name}: accepted, expected {message:?}"));
                }
                (Err(e), _) => failures.push(format!("{name}: refused: {e}")),
            }
            // Each case in a clean namespace of names: remove what was created.
            let _ = store.delete(
                &reference,
                &super::store::DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_config_map_of_exactly_one_mebibyte_of_values_is_accepted() {
    let store = Store::default();
    let half = "x".repeat(512 * 1024);
    let exact = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "big", "namespace": "default"},
        "data": {"first-key-name": half, "second-key-name": half}});
    store.create(exact).unwrap();
    let over = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bigger", "namespace": "default"},
        "data": {"a": half, "b": format!("{half}y")}});
    let err = store.create(over).unwrap_err().to_string();
    assert!(
        err.contains("data: Too long"),
        "{}",
        &err[..err.len().min(300)]
    );
}
