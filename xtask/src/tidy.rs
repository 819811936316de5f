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

/// The library crates: each is packaged as a crate of its own (issue 28), with the metadata,
/// README and license a library user expects.
pub const LIBRARIES: &[&str] = &[
    "rustlet-core",
    "rustlet-status",
    "rustlet-volume",
    "rustlet-mount",
    "rustlet-api",
    "rustlet-pods",
    "rustlet-cri",
    "rustlet-server",
];

/// Crates whose normal dependency tree (default features) stays lean: a user of the mount
/// library or of the pure status rules compiles no API client, gRPC stack or HTTP server.
pub const LEAN_TREES: &[&str] = &["rustlet-core", "rustlet-mount"];

/// What a lean tree never contains: these crates and their `<name>-*` companions
/// (kube-client, tonic-build, hyper-util, axum-core...).
pub const HEAVY: &[&str] = &["kube", "tonic", "axum", "hyper"];

/// Runs every check.
pub fn check_all(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    problems.extend(check_module_docs(root)?);
    problems.extend(check_ignores(root)?);
    problems.extend(check_layering(root)?);
    problems.extend(check_codemap(root)?);
    problems.extend(check_rule_names(root)?);
    problems.extend(check_package_metadata(root)?);
    problems.extend(check_lean_trees(root)?);
    problems.extend(check_readmes(root)?);
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

/// Every library crate can be packaged as a crate of its own: description, the workspace's
/// license with the license text in the package, repository, documentation, a README that
/// exists, keywords, categories, docs.rs metadata, still `publish = false`, and a version on
/// every path dependency a package keeps (dev-dependencies are dropped from a package).
pub fn check_package_metadata(root: &Path) -> Result<Vec<String>> {
    let meta = cargo_metadata(root)?;
    let mut problems = Vec::new();
    if !root.join("LICENSE").is_file() {
        problems.push("LICENSE: the workspace's license text is missing".to_owned());
    }
    for name in LIBRARIES {
        let package = meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == *name);
        match package {
            Some(package) => problems.extend(package_problems(package)),
            None => problems.push(format!("{name}: not a workspace member")),
        }
    }
    Ok(problems)
}

/// The problems of one package of `cargo metadata`'s output.
fn package_problems(package: &serde_json::Value) -> Vec<String> {
    let name = package["name"].as_str().unwrap_or_default();
    let dir = Path::new(package["manifest_path"].as_str().unwrap_or_default())
        .parent()
        .unwrap_or(Path::new(""))
        .to_path_buf();
    let mut problems = Vec::new();
    let mut missing = |what: &str| problems.push(format!("{name}: Cargo.toml has no {what}"));
    for field in ["description", "repository", "documentation", "readme"] {
        if package[field].as_str().is_none_or(str::is_empty) {
            missing(field);
        }
    }
    for field in ["keywords", "categories"] {
        if package[field].as_array().is_none_or(Vec::is_empty) {
            missing(field);
        }
    }
    if package["metadata"]["docs"]["rs"].is_null() {
        missing("[package.metadata.docs.rs]");
    }
    if package["license"].as_str() != Some("Apache-2.0") {
        problems.push(format!(
            "{name}: license must be the workspace's Apache-2.0"
        ));
    }
    // `publish = false` is an empty list of registries.
    if package["publish"].as_array().is_none_or(|r| !r.is_empty()) {
        problems.push(format!(
            "{name}: keep `publish = false` until the team decides to publish"
        ));
    }
    if let Some(readme) = package["readme"].as_str()
        && !dir.join(readme).is_file()
    {
        problems.push(format!("{name}: its readme {readme} does not exist"));
    }
    // A symlink to the workspace's LICENSE: cargo packages the text it points at.
    if !dir.join("LICENSE").is_file() {
        problems.push(format!(
            "{name}: no LICENSE in the crate directory (link ../../LICENSE), so its package lacks the license text"
        ));
    }
    for dep in package["dependencies"].as_array().into_iter().flatten() {
        let kind = dep["kind"].as_str().unwrap_or("normal");
        if dep["path"].is_string() && kind != "dev" && dep["req"] == "*" {
            problems.push(format!(
                "{name}: path dependency {} has no version: its package could not name it",
                dep["name"].as_str().unwrap_or_default()
            ));
        }
    }
    problems
}

/// The sections every library crate's README has.
pub const README_SECTIONS: &[&str] = &[
    "## What it is not for",
    "## Feature flags",
    "## Example",
    "## Layer",
];

/// Every library crate has a README with [`README_SECTIONS`], naming each of its features,
/// whose examples run as the crate's doctests (`lib.rs` includes it under `cfg(doctest)`).
pub fn check_readmes(root: &Path) -> Result<Vec<String>> {
    let meta = cargo_metadata(root)?;
    let mut problems = Vec::new();
    for name in LIBRARIES {
        let Some(package) = meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == *name)
        else {
            continue;
        };
        let features: Vec<&str> = package["features"]
            .as_object()
            .into_iter()
            .flat_map(|f| f.keys())
            .map(String::as_str)
            .filter(|f| *f != "default")
            .collect();
        let dir = root.join("crates").join(name);
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap_or_default();
        problems.extend(readme_problems(name, &readme, &lib, &features));
    }
    Ok(problems)
}

fn readme_problems(name: &str, readme: &str, lib: &str, features: &[&str]) -> Vec<String> {
    if readme.is_empty() {
        return vec![format!("crates/{name}/README.md: missing or empty")];
    }
    let mut problems = Vec::new();
    for section in README_SECTIONS {
        if !readme.lines().any(|l| l.trim_end() == *section) {
            problems.push(format!("crates/{name}/README.md: no `{section}` section"));
        }
    }
    for feature in features {
        if !readme.contains(&format!("`{feature}`")) {
            problems.push(format!(
                "crates/{name}/README.md: feature `{feature}` is not described"
            ));
        }
    }
    if !lib.contains("include_str!(\"../README.md\")") {
        problems.push(format!(
            "crates/{name}/src/lib.rs: does not include README.md as a doctest (`#[cfg(doctest)]`)"
        ));
    }
    problems
}

/// `cargo tree -p <crate> -e normal` of each [`LEAN_TREES`] crate contains none of [`HEAVY`].
pub fn check_lean_trees(root: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut problems = Vec::new();
    for name in LEAN_TREES {
        let output = Command::new(&cargo)
            .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
            .args(["--format", "{p}", "-p", name])
            .current_dir(root)
            .output()
            .with_context(|| format!("running cargo tree -p {name}"))?;
        if !output.status.success() {
            bail!(
                "cargo tree -p {name} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        problems.extend(heavy_in_tree(
            name,
            &String::from_utf8_lossy(&output.stdout),
        ));
    }
    Ok(problems)
}

/// The [`HEAVY`] crates in a `cargo tree --prefix none --format {p}` listing of `name`.
fn heavy_in_tree(name: &str, tree: &str) -> Vec<String> {
    let found: BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|dep| {
            HEAVY.iter().any(|heavy| {
                dep.strip_prefix(heavy)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
            })
        })
        .collect();
    found
        .into_iter()
        .map(|dep| {
            format!(
                "{name}: `cargo tree -p {name} -e normal` contains {dep}: a user of {name} must not compile it (move it behind a feature)"
            )
        })
        .collect()
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
    fn every_library_crate_packages() {
        assert_clean(check_package_metadata(&workspace_root()).unwrap());
    }

    #[test]
    fn a_package_without_metadata_or_with_an_unversioned_path_dependency_is_refused() {
        let package = serde_json::json!({
            "name": "rustlet-x",
            "manifest_path": "/nonexistent/rustlet-x/Cargo.toml",
            "license": "MIT",
            "publish": null,
            "readme": "README.md",
            "metadata": null,
            "dependencies": [
                {"name": "rustlet-core", "kind": null, "req": "*", "path": "/w/crates/rustlet-core"},
                {"name": "rustlet-x", "kind": "dev", "req": "*", "path": "/nonexistent/rustlet-x"},
                {"name": "serde", "kind": null, "req": "^1"}
            ]
        });
        let problems = package_problems(&package);
        let expected = [
            "no description",
            "no repository",
            "no documentation",
            "no keywords",
            "no categories",
            "no [package.metadata.docs.rs]",
            "license must be",
            "keep `publish = false`",
            "readme README.md does not exist",
            "no LICENSE",
            "path dependency rustlet-core has no version",
        ];
        for e in expected {
            assert!(
                problems.iter().any(|p| p.contains(e)),
                "{e:?} not in {problems:#?}"
            );
        }
        assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    }

    #[test]
    fn every_library_crate_has_a_readme() {
        assert_clean(check_readmes(&workspace_root()).unwrap());
    }

    #[test]
    fn a_readme_without_its_sections_features_or_doctest_is_refused() {
        let readme = "# rustlet-x\n\n## Feature flags\n\n`test-util`: fakes\n\n## Layer\n";
        let problems = readme_problems("rustlet-x", readme, "//! x\n", &["test-util", "fuzzing"]);
        assert_eq!(
            problems,
            [
                "crates/rustlet-x/README.md: no `## What it is not for` section",
                "crates/rustlet-x/README.md: no `## Example` section",
                "crates/rustlet-x/README.md: feature `fuzzing` is not described",
                "crates/rustlet-x/src/lib.rs: does not include README.md as a doctest (`#[cfg(doctest)]`)",
            ]
        );
        assert_eq!(
            readme_problems("rustlet-x", "", "", &[]),
            ["crates/rustlet-x/README.md: missing or empty"]
        );
    }

    #[test]
    fn lean_crates_compile_no_kube_tonic_axum_or_hyper() {
        assert_clean(check_lean_trees(&workspace_root()).unwrap());
    }

    #[test]
    fn heavy_crates_in_a_tree_are_found_by_name() {
        let tree = "rustlet-mount v0.1.0 (/w/crates/rustlet-mount)\n\
                    hyper-util v0.1.10\n\
                    kube-client v5.0.0\n\
                    kubelet-ish v1.0.0\n\
                    tonic v0.14.0\n\
                    tonic v0.14.0\n\
                    hyperlocal-like v1.0.0\n";
        let problems = heavy_in_tree("rustlet-mount", tree);
        let named: Vec<&str> = problems
            .iter()
            .map(|p| {
                p.split(" contains ")
                    .nth(1)
                    .unwrap()
                    .split(':')
                    .next()
                    .unwrap()
            })
            .collect();
        assert_eq!(named, ["hyper-util", "kube-client", "tonic"]);
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
