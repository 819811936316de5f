//! Tidy checks: repository conventions that a reviewer should not have to repeat.
//!
//! Each check returns a list of problems (empty when all is well); `cargo xtask tidy` prints
//! them and the tests at the bottom fail on them, so `cargo test` enforces the conventions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Our crates, bottom layer first, with the workspace crates each may depend on (any kind of
/// dependency). A lower layer never names a higher one.
pub const LAYERS: &[(&str, &[&str])] = &[
    ("rustlet-core", &[]),
    ("rustlet-mount", &[]),
    ("rustlet-status", &["rustlet-core"]),
    ("rustlet-volume", &["rustlet-core", "rustlet-mount"]),
    (
        "rustlet-api",
        &["rustlet-core", "rustlet-status", "rustlet-volume"],
    ),
    (
        "rustlet-pods",
        &[
            "rustlet-core",
            "rustlet-status",
            "rustlet-volume",
            "rustlet-mount",
        ],
    ),
    (
        "rustlet-cri",
        &[
            "rustlet-core",
            "rustlet-status",
            "rustlet-volume",
            "rustlet-mount",
            "rustlet-pods",
        ],
    ),
    ("rustlet-server", &["rustlet-core"]),
    (
        "rustlet",
        &[
            "rustlet-server",
            "rustlet-core",
            "rustlet-status",
            "rustlet-volume",
            "rustlet-mount",
            "rustlet-api",
            "rustlet-pods",
            "rustlet-cri",
        ],
    ),
    (
        "rustlet-e2e",
        &[
            "rustlet-core",
            "rustlet-status",
            "rustlet-volume",
            "rustlet-mount",
            "rustlet-api",
            "rustlet-pods",
            "rustlet-cri",
        ],
    ),
    ("xtask", &[]),
];

/// Third-party crates a crate must never depend on (normal dependencies).
pub const FORBIDDEN: &[(&str, &[&str])] = &[
    // Sans-IO: no runtime, no API client, no syscalls.
    (
        "rustlet-core",
        &[
            "tokio",
            "kube",
            "kube-client",
            "kube-runtime",
            "nix",
            "sys-mount",
            "libc",
            "anyhow",
        ],
    ),
    // Usable alone, with no Kubernetes types in its API.
    ("rustlet-mount", &["k8s-openapi", "kube", "anyhow"]),
    ("rustlet-status", &["kube", "nix", "sys-mount", "anyhow"]),
    ("rustlet-volume", &["kube", "anyhow"]),
    ("rustlet-api", &["anyhow"]),
    ("rustlet-pods", &["kube", "anyhow", "tonic"]),
    // The CRI runtime speaks gRPC, never the Kubernetes API.
    ("rustlet-cri", &["kube", "anyhow"]),
];

/// Runs every check.
pub fn check_all(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    problems.extend(check_module_docs(root)?);
    problems.extend(check_ignores(root)?);
    problems.extend(check_layering(root)?);
    problems.extend(check_codemap(root)?);
    problems.extend(check_rule_names(root)?);
    Ok(problems)
}

/// Every `.rs` file of ours, relative to the root.
fn rust_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for top in ["crates", "xtask", "tests", "fuzz"] {
        walk(&root.join(top), &mut out)?;
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every Rust file opens with a `//!` module doc.
pub fn check_module_docs(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in rust_files(root)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        if !text.starts_with("//!") {
            problems.push(format!(
                "{}: must open with a `//!` doc saying what the module is for",
                rel(root, &file)
            ));
        }
    }
    Ok(problems)
}

/// `#[ignore]` needs a reason: `#[ignore = "why"]`.
pub fn check_ignores(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let bare = ["#[ignore]", "#[ignore ]"].map(str::to_owned);
    for file in rust_files(root)? {
        let text = std::fs::read_to_string(&file)?;
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if bare.iter().any(|b| trimmed.starts_with(b.as_str())) {
                problems.push(format!(
                    "{}:{}: #[ignore] without a reason",
                    rel(root, &file),
                    n + 1
                ));
            }
        }
    }
    Ok(problems)
}

fn cargo_metadata(root: &Path) -> Result<serde_json::Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Workspace members and the names of their dependencies, `(name, kind, optional)`.
fn members(root: &Path) -> Result<BTreeMap<String, Vec<(String, String)>>> {
    let meta = cargo_metadata(root)?;
    let mut out = BTreeMap::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default().to_owned();
        let deps = package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                let dep = d["name"].as_str().unwrap_or_default().to_owned();
                let kind = d["kind"].as_str().unwrap_or("normal").to_owned();
                (dep, kind)
            })
            .collect();
        out.insert(name, deps);
    }
    Ok(out)
}

/// The layering of the workspace crates and the crates each must never import.
pub fn check_layering(root: &Path) -> Result<Vec<String>> {
    let members = members(root)?;
    let ours: BTreeSet<&str> = LAYERS.iter().map(|(n, _)| *n).collect();
    let mut problems = Vec::new();
    for (name, deps) in &members {
        let Some((_, allowed)) = LAYERS.iter().find(|(n, _)| n == name) else {
            problems.push(format!(
                "crate {name} is not in xtask's LAYERS table: give it a layer"
            ));
            continue;
        };
        let forbidden = FORBIDDEN
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&[][..], |(_, f)| f);
        for (dep, kind) in deps {
            // xtask's library (the real control plane of the cluster tests) is test tooling:
            // a dev-dependency at most, never part of what a crate ships.
            let test_tooling = dep == "xtask" && kind == "dev";
            if ours.contains(dep.as_str())
                && dep != name
                && !allowed.contains(&dep.as_str())
                && !test_tooling
            {
                problems.push(format!(
                    "{name} depends on {dep} ({kind}): a lower layer never imports a higher one"
                ));
            }
            if kind == "normal" && forbidden.contains(&dep.as_str()) {
                problems.push(format!("{name} must never depend on {dep}"));
            }
        }
    }
    Ok(problems)
}

/// Every `crates/*` directory (and `xtask`, `tests`, `tools/k8s`) has a codemap heading in
/// `docs/ARCHITECTURE.md`, and every heading names a directory that exists.
pub fn check_codemap(root: &Path) -> Result<Vec<String>> {
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md"))
        .context("reading docs/ARCHITECTURE.md")?;
    let headings: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("### `"))
        .filter_map(|l| l.split('`').next())
        .map(|s| s.trim_end_matches('/').to_owned())
        .collect();
    let mut dirs: BTreeSet<String> = std::fs::read_dir(root.join("crates"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| format!("crates/{}", e.file_name().to_string_lossy()))
        .collect();
    dirs.insert("xtask".to_owned());
    dirs.insert("tests".to_owned());
    // Test tooling outside the Cargo workspace (Go modules).
    if root.join("tools/k8s/go.mod").exists() {
        dirs.insert("tools/k8s".to_owned());
    }
    let mut problems = Vec::new();
    for dir in dirs.difference(&headings) {
        problems.push(format!(
            "docs/ARCHITECTURE.md: no codemap heading ### `{dir}`"
        ));
    }
    for heading in headings.difference(&dirs) {
        problems.push(format!(
            "docs/ARCHITECTURE.md: codemap heading `{heading}` names no crate"
        ));
    }
    Ok(problems)
}

/// A test named after a spec rule (`r11_...`, `g7_...`, `v42_...`) names a rule that exists:
/// R1-R67, G1-G8 (status manager), V1-V122 (volume manager).
pub fn check_rule_names(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for file in rust_files(root)? {
        let text = std::fs::read_to_string(&file)?;
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.trim().strip_prefix("fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if let Some(problem) = bad_rule_reference(&name) {
                problems.push(format!("{}:{}: {problem}", rel(root, &file), n + 1));
            }
        }
    }
    Ok(problems)
}

fn bad_rule_reference(name: &str) -> Option<String> {
    let first = name.split('_').next()?;
    let (letter, digits) = first.split_at(1);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let number: u32 = digits.parse().ok()?;
    let max = match letter {
        "r" => 67,
        "g" => 8,
        "v" => 122,
        _ => return None,
    };
    (number == 0 || number > max).then(|| {
        format!(
            "{name} names rule {} which the spec does not have",
            first.to_uppercase()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    fn assert_clean(problems: Vec<String>) {
        assert!(problems.is_empty(), "tidy:\n{}", problems.join("\n"));
    }

    #[test]
    fn every_rust_file_opens_with_a_module_doc() {
        assert_clean(check_module_docs(&workspace_root()).unwrap());
    }

    #[test]
    fn no_ignore_without_a_reason() {
        assert_clean(check_ignores(&workspace_root()).unwrap());
    }

    #[test]
    fn crates_respect_the_layering() {
        assert_clean(check_layering(&workspace_root()).unwrap());
    }

    #[test]
    fn every_crate_is_in_the_codemap() {
        assert_clean(check_codemap(&workspace_root()).unwrap());
    }

    #[test]
    fn rule_numbers_in_test_names_exist() {
        assert_clean(check_rule_names(&workspace_root()).unwrap());
    }

    #[test]
    fn rule_reference_parser() {
        assert!(bad_rule_reference("r11_equal_status_is_dropped").is_none());
        assert!(bad_rule_reference("r68_nope").is_some());
        assert!(bad_rule_reference("g9_nope").is_some());
        assert!(bad_rule_reference("v122_ok").is_none());
        assert!(bad_rule_reference("v0_nope").is_some());
        assert!(bad_rule_reference("run_something").is_none());
        assert!(bad_rule_reference("errata3_x").is_none());
    }
}
