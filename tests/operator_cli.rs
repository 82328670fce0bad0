//! `fusebox runs|run|cancel|resume|tail|bench` against a secured deployment (issue 17
//! part 7): deploy/nats/accounts.conf as shipped, the CLI connecting as the `operator`
//! user through each way it takes settings (flags, environment, a config file's
//! `[nats]`), and a tenant user refused by the server for every operator command.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fusebox_client::RunOptions;
use fusebox_e2e::deploy_nats::placeholder_password;
use fusebox_e2e::{bin, SecuredStack};
use serde_json::{json, Value};

/// How the CLI is told who it is.
#[derive(Clone, Copy)]
enum Via {
    Flags,
    Env,
    File,
}

fn fusebox(stack: &SecuredStack, user: &str, via: Via, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("fusebox"));
    cmd.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("FUSEBOX_") {
            cmd.env_remove(key);
        }
    }
    // Tenants and the benchmark have inboxes of their own (deploy/nats/accounts.conf).
    let inbox = match user {
        "bench" => Some("_INBOX.bench".to_owned()),
        user => user.strip_prefix("tenant-").map(|t| format!("_INBOX.{t}")),
    };
    match via {
        Via::Flags => {
            cmd.args(["--nats-url", &stack.url(), "--nats-user", user])
                // The password from the environment, as the help advises.
                .env("FUSEBOX_NATS_PASSWORD", placeholder_password(user));
            if let Some(inbox) = &inbox {
                cmd.args(["--nats-inbox-prefix", inbox]);
            }
        }
        Via::Env => {
            cmd.env("FUSEBOX_NATS_URL", stack.url())
                .env("FUSEBOX_NATS_USER", user)
                .env("FUSEBOX_NATS_PASSWORD", placeholder_password(user));
            if let Some(inbox) = &inbox {
                cmd.env("FUSEBOX_NATS_INBOX_PREFIX", inbox);
            }
        }
        Via::File => {
            let path = stack.dir.path().join(format!("{user}.toml"));
            let mut nats = toml::Table::new();
            nats.insert("urls".into(), vec![stack.url()].into());
            nats.insert("user".into(), user.into());
            nats.insert("password".into(), placeholder_password(user).into());
            if let Some(inbox) = &inbox {
                nats.insert("inbox_prefix".into(), inbox.clone().into());
            }
            let mut doc = toml::Table::new();
            doc.insert("nats".into(), nats.into());
            std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
            cmd.arg("--config").arg(Path::new(&path));
        }
    }
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("running fusebox")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "fusebox failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_command_works_as_the_operator_and_is_refused_to_a_tenant() {
    let stack = SecuredStack::start().await;
    let acme = stack.client("tenant-acme", Duration::from_secs(5)).await;
    let handle = acme
        .start_run("acme", "r1", RunOptions::default())
        .await
        .expect("tenant run");
    assert!(handle.call("search", json!({"q": "x"})).await.1.may_run());

    // runs, three ways.
    for via in [Via::Flags, Via::Env, Via::File] {
        let out = ok(&run(fusebox(&stack, "operator", via, &["runs"])));
        assert!(out.contains("acme/r1"), "{out}");
    }
    let out = ok(&run(fusebox(
        &stack,
        "operator",
        Via::Env,
        &["run", "acme/r1", "--json"],
    )));
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    assert_eq!(status["summary"]["run"], "r1");
    // One rule: `--json` alone chooses JSON. Piped (as here) without it, `run` and
    // `runs` print the same table a terminal shows.
    for args in [&["run", "acme/r1"][..], &["runs"][..]] {
        let out = ok(&run(fusebox(&stack, "operator", Via::Env, args)));
        assert!(
            out.lines()
                .all(|line| serde_json::from_str::<Value>(line).is_err()),
            "{args:?} piped must print its table, not JSON:\n{out}"
        );
        assert!(out.contains("acme/r1"), "{args:?}: {out}");
    }
    let help = ok(&run(fusebox(
        &stack,
        "operator",
        Via::Env,
        &["run", "--help"],
    )));
    assert!(help.contains("instead of a table"), "{help}");

    // tail follows the run while cancel stops it.
    let mut tail = fusebox(
        &stack,
        "operator",
        Via::File,
        &["tail", "acme/r1", "--json"],
    );
    let mut tail = tail
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tail");
    let mut tail_err = BufReader::new(tail.stderr.take().unwrap());
    let mut line = String::new();
    tail_err.read_line(&mut line).expect("tail's first line");
    assert!(line.contains("following"), "{line}");
    let out = ok(&run(fusebox(
        &stack,
        "operator",
        Via::Flags,
        &["cancel", "acme/r1", "--reason", "runaway"],
    )));
    assert!(out.contains("acme/r1 stop"), "{out}");
    let mut tail_out = BufReader::new(tail.stdout.take().unwrap());
    let mut seen = String::new();
    tail_out.read_line(&mut seen).expect("tail prints the stop");
    let decision: Value = serde_json::from_str(seen.trim()).expect("decision JSON");
    assert_eq!(decision["action"], "stop");
    tail.kill().expect("stop tail");
    let _ = tail.wait();
    let out = ok(&run(fusebox(
        &stack,
        "operator",
        Via::Env,
        &[
            "resume",
            "acme/r1",
            "--evidence",
            r#"{"approval_id":"A-1"}"#,
        ],
    )));
    assert!(out.contains("continue"), "{out}");

    // A tenant user: the server refuses each operator command, and the CLI says so.
    for args in [
        vec!["runs"],
        vec!["run", "acme/r1"],
        vec!["cancel", "acme/r1"],
        vec![
            "resume",
            "acme/r1",
            "--evidence",
            r#"{"approval_id":"A-2"}"#,
        ],
        vec!["tail"],
        vec!["tail", "globex"],
        vec![
            "bench",
            "gate",
            "--serial",
            "10",
            "--parallel",
            "10",
            "--ingest",
            "10",
        ],
    ] {
        let mut full = args.clone();
        if args[0] != "tail" {
            full.extend(["--timeout", "1s"]);
        }
        let out = run(fusebox(&stack, "tenant-acme", Via::Env, &full));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail as a tenant");
        assert!(stderr.contains("refused"), "{args:?}: {stderr}");
    }
    // ... and changed nothing: the run is open, as the operator resumed it.
    let out = ok(&run(fusebox(
        &stack,
        "operator",
        Via::Env,
        &["run", "acme/r1", "--json"],
    )));
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    assert_eq!(status["summary"]["open"], true, "{status}");
}

/// `fusebox bench gate` (issue 25 §3): the operator may not put events in, so the
/// benchmark is refused to it with a pointer to the `bench` user, and runs as that user
/// under the shipped permissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_gate_runs_as_the_bench_user_and_tells_the_operator_so() {
    let stack = SecuredStack::start().await;
    let bench = [
        "bench",
        "gate",
        "--serial",
        "20",
        "--parallel",
        "50",
        "--in-flight",
        "8",
        "--ingest",
        "50",
    ];
    let out = run(fusebox(&stack, "operator", Via::Env, &bench));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the operator may not publish gate requests"
    );
    assert!(
        stderr.contains("refused") && stderr.contains("`bench` user"),
        "{stderr}"
    );
    for via in [Via::Flags, Via::File] {
        let out = ok(&run(fusebox(&stack, "bench", via, &bench)));
        assert!(
            out.contains("raw publish + consumer acking")
                && out.contains("ratios: serial p50")
                && out.contains("x the acked consumer)"),
            "{out}"
        );
    }
    // With a directory on the disk, its floors are measured in the same run (one
    // durable append, and requests in flight to a responder that group-commits them
    // there, connected as the same user), and the files they wrote there are gone
    // afterwards.
    let disk = tempfile::tempdir().unwrap();
    let dir = disk.path().to_str().unwrap();
    let with_floor: Vec<&str> = bench
        .iter()
        .copied()
        .chain(["--disk-floor-dir", dir])
        .collect();
    let out = ok(&run(fusebox(&stack, "bench", Via::Flags, &with_floor)));
    assert!(
        out.contains("4 KiB append + fdatasync (disk)")
            && out.contains("durable echo, in flight (disk)")
            && out.contains("(raw NATS + fdatasync)")
            && out.contains("x the durable echo)"),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(disk.path()).unwrap().count(), 0);
}
