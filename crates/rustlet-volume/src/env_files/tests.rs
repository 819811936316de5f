//! Upstream's `ParseEnv` cases (`pkg/kubelet/util/env/env_util_test.go`), the `FileKeyRef`
//! errors of `makeEnvironmentVariables`, and a hostile pod's files.

use std::os::unix::fs::symlink;

use super::*;

fn parse(content: &str, key: &str) -> Result<String, ParseError> {
    parse_env(content.as_bytes(), Path::new("/v/config.env"), key)
}

fn selector(volume: &str, path: &str, key: &str, optional: Option<bool>) -> FileKeySelector {
    FileKeySelector {
        volume_name: volume.into(),
        path: path.into(),
        key: key.into(),
        optional,
    }
}

#[test]
fn parse_env_reads_single_quoted_values_as_upstream() {
    let file = "# a comment\n\n   \nCONFIG_1='value1'\n\t CONFIG_2='value2' # trailing\nEMPTY=''\n";
    assert_eq!(parse(file, "CONFIG_1").unwrap(), "value1");
    assert_eq!(
        parse(file, "CONFIG_2").unwrap(),
        "value2",
        "leading blanks, comment"
    );
    assert_eq!(parse(file, "EMPTY").unwrap(), "");
    assert_eq!(parse(file, "ABSENT").unwrap(), "", "absent is empty");
    // Literal: no escapes, no expansion; `=` and `#` inside the quotes are content.
    assert_eq!(
        parse("K='a\\n$(B) ${C} = #x'\n", "K").unwrap(),
        "a\\n$(B) ${C} = #x"
    );
    // Multi-line values keep their newlines; a CRLF file reads as LF.
    assert_eq!(
        parse("K='one\ntwo\nthree'\n", "K").unwrap(),
        "one\ntwo\nthree"
    );
    assert_eq!(parse("A='1'\r\nK='v'\r\n", "K").unwrap(), "v");
    // Blank after `=`: the empty string, as a shell's `K= 'v'`.
    assert_eq!(parse("K= 'v'\n", "K").unwrap(), "");
    assert_eq!(
        parse("O= 'v'\nK='w'", "K").unwrap(),
        "w",
        "no newline at the end"
    );
    // The first definition wins (upstream returns at the first match).
    assert_eq!(parse("K='1'\nK='2'\n", "K").unwrap(), "1");
}

#[test]
fn parse_env_refuses_what_upstream_refuses_with_its_messages() {
    let cases = [
        (
            "JUSTTEXT\n",
            "invalid environment variable format at line 1: missing '='",
        ),
        (
            "='v'\n",
            "invalid environment variable format at line 1: empty variable name",
        ),
        (
            "A='1'\nK ='v'\n",
            "invalid environment variable format at line 2: whitespace before '=' is not allowed",
        ),
        (
            "K=v\n",
            "invalid environment variable format at line 1: value must be enclosed in single quotes",
        ),
        (
            "K=\"v\"\n",
            "invalid environment variable format at line 1: value must be enclosed in single quotes",
        ),
        (
            "K='v' extra\n",
            "invalid environment variable format at line 1: unexpected content after closing quote",
        ),
        (
            "A='1'\nK='never\nclosed\n",
            "invalid environment variable format starting at line 2: unclosed single quote",
        ),
    ];
    for (content, message) in cases {
        let err = parse(content, "K").unwrap_err();
        assert_eq!(err.to_string(), message, "{content:?}");
    }
    // A malformed line after the key is never reached.
    assert_eq!(parse("K='v'\nbroken\n", "K").unwrap(), "v");
}

#[test]
fn parse_env_lines_are_bounded_as_go_s_scanner() {
    let fits = format!("K='{}'\n", "x".repeat(MAX_LINE_BYTES - 6));
    assert_eq!(parse(&fits, "K").unwrap().len(), MAX_LINE_BYTES - 6);
    let long = format!("K='{}'\n", "x".repeat(MAX_LINE_BYTES));
    assert_eq!(
        parse(&long, "K").unwrap_err().to_string(),
        "error reading environment variable file \"/v/config.env\": bufio.Scanner: token too long"
    );
    // A long line inside a quoted value ends the value: unclosed, as upstream.
    let inside = format!("K='a\n{}'\n", "x".repeat(MAX_LINE_BYTES));
    assert!(matches!(parse(&inside, "K"), Err(ParseError::Unclosed(1))));
    // The selected value is bounded (deviation), another key's never buffered.
    let line = "y".repeat(1000);
    let huge = format!("K='{}'\n", vec![line.as_str(); 2000].join("\n"));
    assert!(matches!(
        parse(&huge, "K"),
        Err(ParseError::ValueTooLong { .. })
    ));
    assert_eq!(parse(&format!("{huge}W='w'\n"), "W").unwrap(), "w");
}

#[test]
fn file_key_refs_resolve_from_the_volume_and_fail_as_upstream() {
    let volume = tempfile::tempdir().unwrap();
    std::fs::create_dir(volume.path().join("sub")).unwrap();
    std::fs::write(
        volume.path().join("sub/config.env"),
        "CONFIG_1='value1'\nCONFIG_2='value2'\nEMPTY=''\n",
    )
    .unwrap();
    let path = |name: &str| (name == "config").then(|| volume.path().to_owned());
    let resolved = resolve(
        &[
            selector("config", "sub/config.env", "CONFIG_1", None),
            selector("config", "sub/config.env", "CONFIG_2", Some(false)),
            selector("config", "sub/config.env", "ABSENT", Some(true)),
            selector("config", "sub/config.env", "EMPTY", Some(true)),
        ],
        path,
    )
    .unwrap();
    let values: Vec<_> = resolved
        .iter()
        .map(|(k, v)| (k.key.as_str(), v.as_str()))
        .collect();
    assert_eq!(values, [("CONFIG_1", "value1"), ("CONFIG_2", "value2")]);

    let err = |s: FileKeySelector| resolve(&[s], path).unwrap_err().to_string();
    assert_eq!(
        err(selector("other", "config.env", "K", Some(true))),
        "cannot find the volume \"other\" referenced by FileKeyRef",
        "optional does not cover a missing volume"
    );
    assert_eq!(
        err(selector("config", "sub/config.env", "ABSENT", None)),
        format!(
            "environment variable key \"ABSENT\" not found in file {:?}",
            volume.path().join("sub/config.env")
        )
    );
    assert_eq!(
        err(selector("config", "missing.env", "K", Some(true))),
        "couldn't parse env file",
        "optional does not cover a missing file"
    );
}

/// A pod's file is hostile: nothing outside its volume is read, whatever the path or the
/// links in the volume say, and a FIFO does not hang the agent.
#[test]
fn file_key_refs_never_leave_the_volume() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.env"), "K='stolen'\n").unwrap();
    let volume = tempfile::tempdir().unwrap();
    symlink(
        outside.path().join("secret.env"),
        volume.path().join("link.env"),
    )
    .unwrap();
    symlink(outside.path(), volume.path().join("dir")).unwrap();
    nix::unistd::mkfifo(
        &volume.path().join("fifo.env"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    std::fs::create_dir(volume.path().join("d")).unwrap();
    let root = volume.path();
    for rel in [
        "link.env",
        "dir/secret.env",
        "../secret.env",
        "d/../../secret.env",
        "/etc/passwd",
        "fifo.env",
        "d",
    ] {
        let result = read_env_file(root, rel, "K");
        assert!(
            matches!(result, Err(ParseError::Open { .. })),
            "{rel}: {result:?}"
        );
    }
}
