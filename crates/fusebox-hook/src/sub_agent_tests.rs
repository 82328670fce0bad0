//! Sub-agents, per agent: the recorded SubagentStart / SubagentStop payloads
//! (tests/fixtures/<agent>-hooks/payloads) and a sub-agent's call, in; the events the
//! hook sends (the sub-agent's start is the caller's, on its run with the session's as
//! parent) and the answers out: a refused start is told to the sub-agent, a sub-agent's
//! end is never blocked, a stopped sub-agent's result tells the main agent.

use fusebox_core::event::{RunFinished, RunStarted};
use fusebox_core::{check_event, parse_event, Decision, Event, EventBody};
use serde_json::{json, Value};

use crate::common::{Operations, Outcome};
use crate::{claude_code, codex, sub_agent_finished, sub_agent_run, sub_agent_started};

const SESSION: &str = "418b4508-5f3f-48e9-adee-d7dbaac95e56";
const AGENT: &str = "a34c78a2a729c0ecf";

fn fixture(agent: &str, hook: &str) -> Value {
    let text = match (agent, hook) {
        ("claude-code", "SubagentStart") => {
            include_str!("../../../tests/fixtures/claude-code-hooks/payloads/SubagentStart.json")
        }
        ("claude-code", "SubagentStop") => {
            include_str!("../../../tests/fixtures/claude-code-hooks/payloads/SubagentStop.json")
        }
        ("claude-code", "PreToolUse") => {
            include_str!("../../../tests/fixtures/claude-code-hooks/payloads/PreToolUse.json")
        }
        ("claude-code", "PostToolUse") => {
            include_str!("../../../tests/fixtures/claude-code-hooks/payloads/PostToolUse.json")
        }
        ("codex", "SubagentStart") => {
            include_str!("../../../tests/fixtures/codex-hooks/payloads/SubagentStart.json")
        }
        ("codex", "SubagentStop") => {
            include_str!("../../../tests/fixtures/codex-hooks/payloads/SubagentStop.json")
        }
        ("codex", "PreToolUse") => {
            include_str!("../../../tests/fixtures/codex-hooks/payloads/PreToolUse.json")
        }
        other => panic!("no fixture {other:?}"),
    };
    let text = text
        .replace("SESSION", SESSION)
        .replace("TOOL_USE_ID", "t1")
        .replace("TURN_ID", "turn-1")
        .replace("AGENT_ID", AGENT);
    serde_json::from_str(&text).expect("payload fixtures are JSON")
}

fn claude(payload: &Value) -> claude_code::Payload {
    claude_code::Payload::parse(payload.to_string().as_bytes()).unwrap()
}

fn decision(action: &str, message: &str) -> Decision {
    serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
        "action": action, "message": message}))
    .unwrap()
}

fn failed() -> Outcome<'static> {
    Outcome::Failed {
        why: "no fuseboxd is listening".to_owned(),
        allowed: false,
    }
}

#[test]
fn only_an_agent_id_marks_a_sub_agents_hook() {
    let main = fixture("claude-code", "PreToolUse");
    assert_eq!(claude(&main).sub_agent(), None);
    // A main agent run with `--agent Explore` carries agent_type alone.
    let mut named = main.clone();
    named["agent_type"] = json!("Explore");
    assert_eq!(claude(&named).sub_agent(), None);
    let mut sub = main;
    sub["agent_id"] = json!(AGENT);
    assert_eq!(claude(&sub).sub_agent(), Some(AGENT));
    let codex_main = fixture("codex", "PreToolUse");
    let parse = |v: &Value| codex::Payload::parse(v.to_string().as_bytes()).unwrap();
    assert_eq!(parse(&codex_main).sub_agent(), None);
    assert_eq!(
        parse(&fixture("codex", "SubagentStart")).sub_agent(),
        Some(AGENT)
    );
}

#[test]
fn a_sub_agents_start_is_the_callers_and_its_stop_finishes_its_run() {
    let child = sub_agent_run(SESSION, AGENT);
    let ops = Operations::default();
    let start = claude(&fixture("claude-code", "SubagentStart"));
    assert_eq!(start.event(), claude_code::HookEvent::SubagentStart);
    let none = claude_code::event_for(&start, &ops, "t", &child, "claude-code", None, 1);
    assert_eq!(none, Ok(None));
    let stop = claude(&fixture("claude-code", "SubagentStop"));
    let event = claude_code::event_for(&stop, &ops, "t", &child, "claude-code", None, 1)
        .unwrap()
        .unwrap();
    assert_eq!(
        (event.id.as_str(), event.run.as_str()),
        ("cc-subagent-stop", child.as_str())
    );
    assert!(matches!(
        event.body,
        EventBody::RunFinished(RunFinished { .. })
    ));
    // No words of the sub-agent's reach the daemon.
    assert!(!serde_json::to_string(&event)
        .unwrap()
        .contains("sub-agent finished"));

    let cx = |name: &str| codex::Payload::parse(fixture("codex", name).to_string().as_bytes());
    let start = cx("SubagentStart").unwrap();
    assert_eq!(
        codex::event_for(&start, &ops, "t", &child, "codex", None, 1),
        Ok(None)
    );
    let event = codex::event_for(
        &cx("SubagentStop").unwrap(),
        &ops,
        "t",
        &child,
        "codex",
        None,
        1,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (event.id.as_str(), event.run.as_str()),
        ("cx-subagent-stop", child.as_str())
    );
}

#[test]
fn the_start_names_the_session_as_parent_and_the_daemon_takes_it() {
    let child = sub_agent_run(SESSION, AGENT);
    let events: [Event; 2] = [
        sub_agent_started("cc", "t", &child, SESSION, "claude-code", 7),
        sub_agent_finished("cx", "t", &child, "session ended", 8),
    ];
    match &events[0].body {
        EventBody::RunStarted(RunStarted { agent, parent, .. }) => {
            assert_eq!(agent.as_deref(), Some("claude-code"));
            assert_eq!(parent.as_deref(), Some(SESSION));
        }
        other => panic!("{other:?}"),
    }
    for event in events {
        check_event(&event, 1 << 20).unwrap();
        let wire = serde_json::to_vec(&event).unwrap();
        assert_eq!(parse_event(&wire).unwrap(), event);
    }
}

#[test]
fn a_refused_start_is_told_to_the_sub_agent_and_its_end_is_never_blocked() {
    use claude_code::HookEvent::{SubagentStart, SubagentStop};
    let refused = decision(
        "stop",
        "run stopped (STOPPED_LOOP_GUARD): sub-agent not started",
    );
    let told = claude_code::answer(SubagentStart, &Outcome::Decided(&refused));
    let specific = &told["hookSpecificOutput"];
    assert_eq!(specific["hookEventName"], "SubagentStart");
    let words = specific["additionalContext"].as_str().unwrap();
    assert!(
        words.starts_with("fusebox: run stopped") && words.contains("End now"),
        "{words}"
    );
    assert!(told.get("continue").is_none(), "{told}");
    let ok = decision("continue", "fine");
    for outcome in [Outcome::Decided(&ok), failed()] {
        assert_eq!(claude_code::answer(SubagentStart, &outcome), json!({}));
    }
    for outcome in [Outcome::Decided(&refused), Outcome::Decided(&ok), failed()] {
        assert_eq!(claude_code::answer(SubagentStop, &outcome), json!({}));
    }

    let told = codex::answer_as(
        codex::HookEvent::SubagentStart,
        &Outcome::Decided(&refused),
        codex::Whose::SubAgent,
    );
    assert_eq!(told["hookSpecificOutput"]["hookEventName"], "SubagentStart");
    for outcome in [Outcome::Decided(&refused), failed()] {
        let answer = codex::answer_as(
            codex::HookEvent::SubagentStop,
            &outcome,
            codex::Whose::SubAgent,
        );
        assert_eq!(answer, json!({}));
    }
}

#[test]
fn a_stopped_sub_agents_calls_are_denied_as_a_sub_agents() {
    let mut call = fixture("codex", "PreToolUse");
    call["agent_id"] = json!(AGENT);
    let payload = codex::Payload::parse(call.to_string().as_bytes()).unwrap();
    let answer = codex::kept_stop_answer(&payload, "fusebox: run stopped").unwrap();
    let reason = answer["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("This sub-agent's run is stopped"),
        "{reason}"
    );
    let stop = decision("stop", "run stopped (STOPPED_LOOP_GUARD)");
    let answer = codex::answer_as(
        codex::HookEvent::PreToolUse,
        &Outcome::Decided(&stop),
        codex::Whose::SubAgent,
    );
    assert!(answer.get("continue").is_none(), "{answer}");
    // Claude Code's stop of a sub-agent's call: deny and continue: false, which ends
    // the sub-agent alone.
    let answer = claude_code::answer(claude_code::HookEvent::PreToolUse, &Outcome::Decided(&stop));
    assert_eq!(answer["hookSpecificOutput"]["permissionDecision"], "deny");
    assert_eq!(answer["continue"], false);
}

#[test]
fn the_result_of_an_agent_call_names_the_sub_agent_it_ran() {
    let mut result = fixture("claude-code", "PostToolUse");
    result["tool_name"] = json!("Agent");
    result["tool_response"] = json!({"status": "completed", "agentId": AGENT, "content": []});
    assert_eq!(claude(&result).ran_sub_agent(), Some(AGENT));
    // A background launch: the sub-agent has not run yet.
    result["tool_response"] =
        json!({"isAsync": true, "status": "async_launched", "agentId": AGENT});
    assert_eq!(claude(&result).ran_sub_agent(), None);
    // Another tool, or a sub-agent's own call.
    result["tool_response"] = json!({"status": "completed", "agentId": AGENT});
    result["tool_name"] = json!("Bash");
    assert_eq!(claude(&result).ran_sub_agent(), None);
    result["tool_name"] = json!("Agent");
    result["agent_id"] = json!("other");
    assert_eq!(claude(&result).ran_sub_agent(), None);
}

#[test]
fn the_stop_note_joins_the_guards_own_words() {
    use claude_code::HookEvent::PostToolUse;
    let note = claude_code::sub_agent_stopped_context(AGENT, "fusebox: run stopped");
    let warned = decision("warn", "slow down");
    let answer = claude_code::answer(PostToolUse, &Outcome::Decided(&warned));
    let joined = claude_code::with_context(answer, PostToolUse, &note);
    let context = joined["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert_eq!(context, format!("fusebox: slow down\n{note}"));
    let alone = claude_code::with_context(json!({}), PostToolUse, &note);
    assert_eq!(alone["hookSpecificOutput"]["hookEventName"], "PostToolUse");
    assert_eq!(
        alone["hookSpecificOutput"]["additionalContext"],
        json!(note)
    );
}
