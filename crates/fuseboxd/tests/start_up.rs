//! Start-up errors that need no server: each is named on stderr and exits non-zero (2
//! for a bad config). The ones that need a running nats-server are in the end-to-end
//! suite `tests/operation.rs`.

use std::path::Path;
use std::process::{Command, ExitStatus};

use fusebox_e2e::{free_port, write_config};

fn run(dir: &Path, args: &[&str]) -> (ExitStatus, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_fuseboxd"))
        .args(args)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn an_unreachable_nats_is_named_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let closed = format!("nats://127.0.0.1:{}", free_port());
    let (status, stderr) = run(
        dir.path(),
        &["--config", config.to_str().unwrap(), "--nats-url", &closed],
    );
    assert!(!status.success());
    assert!(stderr.contains("cannot connect to NATS"), "{stderr}");
}

#[test]
fn a_bad_config_names_the_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[nats]\nurl = \"typo\"\n").unwrap();
    let (status, stderr) = run(dir.path(), &["--config", bad.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains("bad config") && stderr.contains("url"),
        "{stderr}"
    );
}
