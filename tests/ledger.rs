//! The op_key ledger against a real daemon: an operation whose worker died mid-call
//! (its lease runs out by event time) stops the next attempt NEEDS_HUMAN, naming the
//! key; an operator inspects and resolves it with the project's own CLI (`fusebox ledger
//! show | resolve | list`); the resolution is an event of the log, so a restarted daemon
//! replays it. And an instance nobody would watch is refused, never silently accepted.

use std::process::Command;
use std::time::Duration;

use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::{Action, Decision, Event};
use fusebox_e2e::*;
use fusebox_nats::wire::DeadLetter;
use futures_util::StreamExt;
use serde_json::{json, Value};

async fn gate(client: &FuseboxClient, event: &Event) -> Decision {
    match client.gate(event).await {
        Gate::Decided(decision) => decision,
        other => panic!("event {} not decided: {other:?}", event.id),
    }
}

/// Runs `fusebox ledger ARGS --nats-url URL` and returns its stdout; fails the test on a
/// non-zero exit.
fn ledger_cli(nats_url: &str, args: &[&str]) -> String {
    let output = Command::new(bin("fusebox"))
        .arg("ledger")
        .args(args)
        .args(["--nats-url", nats_url])
        .output()
        .expect("run fusebox");
    assert!(
        output.status.success(),
        "fusebox ledger {args:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn call(id: &str, run: &str, ts_ms: u64) -> Event {
    event(
        json!({"v":1,"id":id,"tenant":"acme","run":run,"ts_ms":ts_ms,"type":"tool_call",
        "call_id":format!("c-{id}"),"tool":"send_email","args":{"to":"cfo","subject":"Q3"},
        "op_key":"q3-report"}),
    )
}

#[tokio::test]
async fn a_stale_operation_needs_a_human_who_resolves_it_with_the_cli() {
    let mut setup = Setup::start().await;
    let url = setup.nats.url();
    let client = client(&url).await;
    let t = now_ms();
    // The worker sends the email and dies before the result: nothing more comes.
    assert!(gate(&client, &call("a1", "worker", t))
        .await
        .action
        .lets_tool_run());
    // Within the lease (15 minutes by default) a retry is refused as in flight.
    let early = gate(&client, &call("b1", "retry", t + 60_000)).await;
    assert_eq!(
        early.reason.map(|r| r.as_str()),
        Some("operation_in_flight")
    );
    // Past it, by event time, the outcome is unknown: stop, NEEDS_HUMAN, naming the key.
    let late = gate(&client, &call("b2", "retry2", t + 16 * 60_000)).await;
    assert_eq!(late.action, Action::Stop, "{late:?}");
    let report = late.report.clone().unwrap();
    assert_eq!(report.terminal_state.as_str(), "NEEDS_HUMAN");
    assert_eq!(report.reason.as_str(), "operation_outcome_unknown");
    assert!(
        late.message.as_deref().unwrap().contains("q3-report"),
        "{late:?}"
    );

    // The operator looks: in flight, held by the worker's run.
    let shown: Value =
        serde_json::from_str(&ledger_cli(&url, &["show", "acme", "q3-report", "--json"])).unwrap();
    assert_eq!(shown["state"], "in_flight");
    assert_eq!(shown["run"], "worker");
    assert_eq!(shown["since_ms"], t);
    assert_eq!(shown["lease_ends_ms"], t + 15 * 60_000);
    let listed = ledger_cli(&url, &["list", "acme", "--in-flight", "--json"]);
    assert_eq!(listed.lines().count(), 1, "{listed}");

    // The mail log says it went out: resolve it as completed, with a name on it.
    let resolved: Value = serde_json::from_str(&ledger_cli(
        &url,
        &[
            "resolve",
            "acme",
            "q3-report",
            "--completed",
            r#"{"sent":true}"#,
            "--by",
            "alice",
            "--reason",
            "found in the mail log",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(resolved["action"], "continue");
    assert_eq!(resolved["run"], "worker");
    let message = resolved["message"].as_str().unwrap();
    assert!(
        message.contains("by alice") && message.contains("was in flight"),
        "{message}"
    );

    // Every later call with the key gets the recorded result, also after a restart
    // (the resolve is in the log and replays).
    let answered = gate(&client, &call("c1", "fresh", t + 17 * 60_000)).await;
    assert_eq!(answered.action, Action::UseCompletedResult, "{answered:?}");
    assert_eq!(answered.result, Some(json!({"sent":true})));
    setup.restart_daemon().await;
    let client = fusebox_e2e::client(&url).await;
    let again = gate(&client, &call("d1", "after-restart", t + 18 * 60_000)).await;
    assert_eq!(again.action, Action::UseCompletedResult, "{again:?}");
    let listed: Value =
        serde_json::from_str(&ledger_cli(&url, &["show", "acme", "q3-report", "--json"])).unwrap();
    assert_eq!(listed["state"], "completed");
    assert_eq!(listed["result"], json!({"sent":true}));

    // The stopped run resumes on a human's word and is answered from the ledger too.
    let resumed = client
        .resume(
            "acme",
            "retry2",
            Some("alice"),
            json!({"approval_id":"INC-9"}),
        )
        .await
        .unwrap();
    assert_eq!(resumed.action, Action::Continue, "{resumed:?}");
    let after = gate(&client, &call("b3", "retry2", t + 19 * 60_000)).await;
    assert_eq!(after.action, Action::UseCompletedResult, "{after:?}");

    // Releasing instead lets the next call run; an agent cannot do it on its own subjects.
    let released: Value = serde_json::from_str(&ledger_cli(
        &url,
        &[
            "resolve",
            "acme",
            "q3-report",
            "--release",
            "--by",
            "bob",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(released["action"], "continue", "{released}");
    let rerun = gate(&client, &call("e1", "rerun", t + 20 * 60_000)).await;
    assert!(rerun.action.lets_tool_run(), "{rerun:?}");
    let forged = json!({"v":1,"id":"f1","tenant":"acme","run":"rerun","ts_ms":t,
        "type":"ledger_resolve","op_key":"q3-report","resolution":"released"});
    match client
        .gate_bytes("acme", "rerun", forged.to_string().into_bytes())
        .await
    {
        Gate::Refused(error) => assert_eq!(error.reason, "invalid_field", "{}", error.message),
        other => panic!("an agent's ledger_resolve was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn an_instance_of_a_cloud_nobody_watches_is_refused_and_dead_lettered() {
    // The harness runs the daemon without its watchdog: no instance would be watched.
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let mut dlq = client.nats().subscribe("fusebox.dlq.acme").await.unwrap();
    client.nats().flush().await.unwrap();
    let launched = json!({"v":1,"id":"l1","tenant":"acme","run":"gpu","ts_ms":now_ms(),
        "type":"instance_launched","provider":"gcp","region":"europe-west4","instance_id":"vm-7"});
    match client
        .gate_bytes("acme", "gpu", launched.to_string().into_bytes())
        .await
    {
        Gate::Refused(error) => {
            assert_eq!(error.reason, "unwatched_provider");
            assert!(
                error.message.contains("vm-7") && error.message.contains("would not be watched"),
                "{}",
                error.message
            );
        }
        other => panic!("not refused: {other:?}"),
    }
    let message = tokio::time::timeout(Duration::from_secs(10), dlq.next())
        .await
        .expect("a dead letter")
        .unwrap();
    let letter: DeadLetter = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(letter.error.reason, "unwatched_provider");
    let (_, metrics) = fusebox_e2e::http::http_get(setup.daemon.metrics_port, "/metrics").unwrap();
    assert!(
        metrics.contains(r#"reason="unwatched_provider""#),
        "no rejection counted"
    );
}
