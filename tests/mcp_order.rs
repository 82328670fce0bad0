//! The MCP gateway's session order against a real nats-server and fuseboxd: a call's
//! result is reported without waiting for its commit (`fusebox-mcp/src/order.rs`), and
//! still the daemon applies it before it decides the session's next call, and a stop
//! answered to it refuses that call and is on the kill switch.

use std::time::Duration;

use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::event::{Effect, Output, ResultKind, ToolResult};
use fusebox_core::{Action, Decision, Event};
use fusebox_e2e::*;
use fusebox_mcp::mapping::{self, Verdict};
use fusebox_mcp::run::{GuardedRun, RunIdentity};
use serde_json::json;

fn decided(answer: Gate) -> Decision {
    match answer {
        Gate::Decided(decision) => decision,
        other => panic!("not decided: {other:?}"),
    }
}

fn numbered(seq: u64, body: serde_json::Value) -> Event {
    let mut event = json!({
        "v": 1, "id": format!("held-{seq}"), "tenant": "mcp", "run": "held",
        "seq": seq, "ts_ms": 1_000 + seq,
    });
    event
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    fusebox_e2e::event(event)
}

/// What the gateway relies on: a call numbered after a result that has not arrived yet
/// is held until that result is applied, so its decision sees it (here: the ledger
/// answers the repeated operation with the stored result instead of "in flight").
#[tokio::test]
async fn a_call_that_overtakes_the_result_before_it_is_decided_after_it() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let send = json!({"type": "tool_call", "tool": "send_email", "args": {"id": "m-1"},
                      "op_key": "email:m-1", "effect": "write"});
    let mut first = send.clone();
    first["call_id"] = json!("c1");
    let mut again = send;
    again["call_id"] = json!("c2");
    decided(
        client
            .gate(&numbered(1, json!({"type": "run_started"})))
            .await,
    );
    let call = decided(client.gate(&numbered(2, first)).await);
    assert_eq!(call.action, Action::Execute);
    let next = {
        let client = client.clone();
        tokio::spawn(async move { decided(client.gate(&numbered(4, again)).await) })
    };
    // The next call is on its way first (and held); then the result.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let result = numbered(
        3,
        json!({"type": "tool_result", "call_id": "c1", "tool": "send_email",
               "kind": "SUCCESS", "output": {"sent": "m-1"}}),
    );
    decided(client.gate(&result).await);
    let next = next.await.unwrap();
    assert_eq!(
        next.action,
        Action::UseCompletedResult,
        "the call was decided before the result numbered before it: {next:?}"
    );
    assert_eq!(next.result, Some(json!({"sent": "m-1"})));
}

fn result(call_id: &str, tool: &str, kind: ResultKind, output: serde_json::Value) -> ToolResult {
    ToolResult {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        kind,
        code: (kind != ResultKind::Success).then(|| "denied".to_owned()),
        retry_after_ms: None,
        terminal: None,
        output: Some(Output::Json(output)),
        progress: None,
    }
}

/// A session of its own run, or (`--run`) of a run named for it.
async fn session(client: &FuseboxClient, named: Option<&str>) -> std::sync::Arc<GuardedRun> {
    let id = RunIdentity::for_session("mcp", named, None);
    let run = std::sync::Arc::new(GuardedRun::start(client.clone(), id));
    run.announce().await;
    run
}

/// Each result is reported without waiting, and the next call, sent right after, is
/// decided with that result applied: numbered in the session's own run, and waited for
/// in a run named by `--run` (which other sessions may share).
#[tokio::test]
async fn the_next_call_of_a_session_is_decided_with_the_result_before_it() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let own = repeats_get_the_stored_result(&client, None).await;
    let status = client.run_status("mcp", &own).await.unwrap();
    assert!(
        status.summary.last_seq.is_some(),
        "a session's own run is numbered"
    );
    let named = repeats_get_the_stored_result(&client, Some("named-run")).await;
    let status = client.run_status("mcp", &named).await.unwrap();
    assert_eq!(status.summary.last_seq, None, "a named run is not numbered");
}

/// Three keyed writes, each repeated right after its result: the repeat must get the
/// stored result. Returns the run id.
async fn repeats_get_the_stored_result(client: &FuseboxClient, named: Option<&str>) -> String {
    let run = session(client, named).await;
    for message in ["m-7", "m-8", "m-9"] {
        let args = json!({ "message_id": message }).as_object().cloned();
        let key = Some(format!("send_email:{}:{message}", run.id.run));
        let call_id = run.call_id();
        let gate = run
            .gate_call(
                &call_id,
                "send_email",
                args.as_ref(),
                key.clone(),
                Some(Effect::Write),
            )
            .await;
        assert_eq!(decided(gate).action, Action::Execute);
        let sent = json!(format!("sent {message}"));
        let outcome = result(&call_id, "send_email", ResultKind::Success, sent.clone());
        run.report(move || outcome);
        let again = run.call_id();
        let gate = run
            .gate_call(
                &again,
                "send_email",
                args.as_ref(),
                key,
                Some(Effect::Write),
            )
            .await;
        let decision = decided(gate);
        assert_eq!(
            decision.action,
            Action::UseCompletedResult,
            "the repeat was decided without the result: {decision:?}"
        );
        assert_eq!(decision.result, Some(sent));
    }
    run.finish().await;
    run.id.run.clone()
}

/// A stop answered to a result (here a fatal result) latches the session: the call
/// right after it is refused with that stop, the tool never runs, and the stop is on the
/// kill switch.
#[tokio::test]
async fn a_stop_answered_to_a_result_refuses_the_next_call_and_is_on_the_kill_switch() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let run = session(&client, None).await;
    let call_id = run.call_id();
    let gate = run.gate_call(&call_id, "deploy", None, None, None).await;
    assert!(gate.may_run());
    run.report(move || result(&call_id, "deploy", ResultKind::Fatal, json!("no access")));
    let next_id = run.call_id();
    let next = run.gate_call(&next_id, "list_page", None, None, None).await;
    assert!(!next.may_run(), "the call after the stop ran: {next:?}");
    let Verdict::Stop(refused) = mapping::verdict(&next) else {
        panic!("the call after the stop was not refused with it: {next:?}");
    };
    let said = serde_json::to_string(&refused).unwrap();
    assert!(said.contains("FAILED") && said.contains("fatal"), "{said}");
    run.finish().await;
    assert!(
        run.latched().is_some(),
        "the result's stop latches the session"
    );
    let mut kept = None;
    for _ in 0..50 {
        kept = client.kept_stop("mcp", &run.id.run).await.unwrap();
        if kept.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = kept.expect("the stop is on the kill switch");
    assert_eq!(kept.action, Action::Stop);
    let reason = kept.report.as_ref().map(|report| report.reason.as_str());
    assert_eq!(reason, Some("fatal"), "{kept:?}");
}
