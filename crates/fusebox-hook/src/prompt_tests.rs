//! Prompts, per agent: each agent's recorded prompt payload
//! (tests/fixtures/<agent>-hooks/payloads) with fields set or removed, in; the `prompt`
//! event (named by the prompt's moment, without its words), no event, or the hook's own
//! error out. Then the answer to each outcome: only a stopped run blocks a prompt.

use fusebox_core::{Decision, Event, EventBody};
use serde_json::{json, Value};

use crate::common::{prompt_refused, Operations};
use crate::{claude_code, codex, gemini_cli};

#[derive(Clone, Copy, Debug)]
enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
}

const AGENTS: [Agent; 3] = [Agent::ClaudeCode, Agent::Codex, Agent::GeminiCli];

/// The recorded prompt's words: they must never reach the daemon.
const WORDS: &str = "do it";
/// The recorded Claude Code prompt's event: its prompt id names it.
const CC_SENT: &str = "cc-prompt-5e8c91e8-24c0-4da6-bbd2-97376c11214e";
const TURN: &str = "turn-1";
const TIMESTAMP: &str = "2026-12-04T17:40:34.220Z";
/// A background task's completion, as Claude Code 2.1.327 submits it.
const NOTICE: &str = "<task-notification>\n<task-id>beb1vwy1h</task-id>\n<status>completed</status>\n</task-notification>";

impl Agent {
    /// The recorded prompt payload, placeholders filled.
    fn payload(self) -> Value {
        let text = match self {
            Agent::ClaudeCode => include_str!(
                "../../../tests/fixtures/claude-code-hooks/payloads/UserPromptSubmit.json"
            ),
            Agent::Codex => {
                include_str!("../../../tests/fixtures/codex-hooks/payloads/UserPromptSubmit.json")
            }
            Agent::GeminiCli => {
                include_str!("../../../tests/fixtures/gemini-cli-hooks/payloads/BeforeAgent.json")
            }
        };
        let text = text
            .replace("SESSION", "s1")
            .replace("TURN_ID", TURN)
            .replace("TIMESTAMP", TIMESTAMP);
        serde_json::from_str(&text).expect("payload fixtures are JSON")
    }

    fn event(self, payload: &Value) -> Result<Option<Event>, String> {
        let bytes = payload.to_string().into_bytes();
        let operations = Operations::default();
        match self {
            Agent::ClaudeCode => claude_code::event_for(
                &claude_code::Payload::parse(&bytes)?,
                &operations,
                "t",
                "r",
                "a",
                None,
                1,
            ),
            Agent::Codex => codex::event_for(
                &codex::Payload::parse(&bytes)?,
                &operations,
                "t",
                "r",
                "a",
                None,
                1,
            ),
            Agent::GeminiCli => gemini_cli::event_for(
                &gemini_cli::Payload::parse(&bytes)?,
                &operations,
                "t",
                "r",
                "a",
                None,
                1,
            ),
        }
    }

    fn answer(self, outcome: &claude_code::Outcome) -> Value {
        match self {
            Agent::ClaudeCode => {
                claude_code::answer(claude_code::HookEvent::UserPromptSubmit, outcome)
            }
            Agent::Codex => codex::answer(codex::HookEvent::UserPromptSubmit, outcome),
            Agent::GeminiCli => {
                gemini_cli::answer(gemini_cli::HookEvent::BeforeAgent, outcome, None)
            }
        }
    }

    /// The protocol's blocked prompt, with `reason` said to the user.
    fn blocked(self, reason: &str) -> Value {
        match self {
            Agent::ClaudeCode | Agent::Codex => json!({"decision": "block", "reason": reason}),
            // `continue: false` ends the agent ("Agent execution stopped: …").
            Agent::GeminiCli => json!({"continue": false, "stopReason": reason,
                "decision": "deny", "reason": reason, "systemMessage": reason}),
        }
    }
}

enum Expect {
    /// A `prompt` event with this id.
    Sent(&'static str),
    NotSent,
    /// The hook's own error, naming this field.
    HooksError(&'static str),
}

struct Case {
    agent: Agent,
    what: &'static str,
    set: Value,
    removed: &'static [&'static str],
    expect: Expect,
}

fn cases() -> Vec<Case> {
    use Agent::*;
    use Expect::*;
    let case = |agent, what, set: Value, removed, expect| Case {
        agent,
        what,
        set,
        removed,
        expect,
    };
    vec![
        case(
            ClaudeCode,
            "the user's prompt",
            json!({}),
            &[],
            Sent(CC_SENT),
        ),
        case(
            ClaudeCode,
            "another prompt, another moment",
            json!({"prompt_id": "8d1f0b22-0c39-4f7e-9e1f-5b2f7d9d2a10"}),
            &[],
            Sent("cc-prompt-8d1f0b22-0c39-4f7e-9e1f-5b2f7d9d2a10"),
        ),
        case(
            ClaudeCode,
            "a background task's completion (the user's prompt id)",
            json!({"prompt": NOTICE}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "a prompt that only mentions a notice",
            json!({"prompt": format!("why did this come? {NOTICE}")}),
            &[],
            Sent(CC_SENT),
        ),
        case(
            ClaudeCode,
            "a sub-agent's",
            json!({"agent_id": "a34c78a2a729c0ecf", "agent_type": "general-purpose"}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "the main thread of `claude --agent Explore`",
            json!({"agent_type": "Explore"}),
            &[],
            Sent(CC_SENT),
        ),
        case(
            ClaudeCode,
            "typed in the session",
            json!({"source": "user"}),
            &[],
            Sent(CC_SENT),
        ),
        case(
            ClaudeCode,
            "given to claude -p",
            json!({"source": "sdk"}),
            &[],
            Sent(CC_SENT),
        ),
        case(
            ClaudeCode,
            "a notice, said by its source",
            json!({"source": "system"}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "a /loop wakeup",
            json!({"source": "loop_wakeup"}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "a scheduled wakeup",
            json!({"source": "schedule_wakeup"}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "a polled event",
            json!({"source": "poll_event"}),
            &[],
            NotSent,
        ),
        case(
            ClaudeCode,
            "no prompt id",
            json!({}),
            &["prompt_id"],
            HooksError("prompt_id"),
        ),
        case(
            Codex,
            "the user's prompt",
            json!({}),
            &[],
            Sent("cx-prompt-turn-1"),
        ),
        case(
            Codex,
            "the next turn's",
            json!({"turn_id": "turn-2"}),
            &[],
            Sent("cx-prompt-turn-2"),
        ),
        case(
            Codex,
            "a sub-agent's spawn message",
            json!({"agent_id": "01a24223-b348-77c3-8a39-9996fb074da6", "agent_type": "default",
                "prompt": "SUBAGENT-PROMPT: run echo"}),
            &[],
            NotSent,
        ),
        case(
            Codex,
            "no turn id",
            json!({}),
            &["turn_id"],
            HooksError("turn_id"),
        ),
        case(
            GeminiCli,
            "the user's prompt",
            json!({}),
            &[],
            Sent("gm-prompt-2026-12-04T17:40:34.220Z"),
        ),
        case(
            GeminiCli,
            "the next prompt",
            json!({"timestamp": "2026-12-04T17:52:01.003Z"}),
            &[],
            Sent("gm-prompt-2026-12-04T17:52:01.003Z"),
        ),
        case(
            GeminiCli,
            "no timestamp",
            json!({}),
            &["timestamp"],
            HooksError("timestamp"),
        ),
    ]
}

#[test]
fn the_users_prompts_are_prompt_events_and_the_harness_s_are_not() {
    for Case {
        agent,
        what,
        set,
        removed,
        expect,
    } in cases()
    {
        let at = format!("{agent:?}, {what}");
        let mut payload = agent.payload();
        for (key, value) in set.as_object().expect("fields to set") {
            payload[key] = value.clone();
        }
        for key in removed {
            payload.as_object_mut().unwrap().remove(*key);
        }
        match (agent.event(&payload), expect) {
            (Ok(Some(event)), Expect::Sent(id)) => {
                assert_eq!(event.id, id, "{at}");
                assert!(matches!(event.body, EventBody::Prompt(_)), "{at}");
                let wire = serde_json::to_string(&event).unwrap();
                assert!(!wire.contains(WORDS), "{at}: the words travel: {wire}");
            }
            (Ok(None), Expect::NotSent) => {}
            (Err(err), Expect::HooksError(field)) => assert!(err.contains(field), "{at}: {err}"),
            (made, _) => panic!("{at}: {made:?}"),
        }
    }
}

fn decision(action: &str, message: &str) -> Decision {
    serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
        "action": action, "message": message}))
    .unwrap()
}

#[test]
fn only_a_stopped_run_blocks_a_prompt() {
    let report = "run stopped (STOPPED_LOOP_GUARD): the same call kept failing";
    let stopped = decision("stop", report);
    let goes_on = decision("continue", "ok");
    let down = |allowed| claude_code::Outcome::Failed {
        why: "no fuseboxd is listening".to_owned(),
        allowed,
    };
    for agent in AGENTS {
        let said = prompt_refused(&format!("fusebox: {report}"));
        assert!(said.contains("did not reach the model"), "{said}");
        let answers = [
            (
                "stop",
                agent.answer(&claude_code::Outcome::Decided(&stopped)),
                agent.blocked(&said),
            ),
            (
                "continue",
                agent.answer(&claude_code::Outcome::Decided(&goes_on)),
                json!({}),
            ),
            ("guard down, deny", agent.answer(&down(false)), json!({})),
            ("guard down, allow", agent.answer(&down(true)), json!({})),
        ];
        for (what, answer, expected) in answers {
            assert_eq!(answer, expected, "{agent:?}, {what}");
        }
    }
}

/// Codex cannot end a turn from a tool hook, so a stop is kept by the command; what it
/// answers with the kept report, per hook.
#[test]
fn a_kept_codex_stop_blocks_the_users_prompt_and_denies_calls() {
    let report = "fusebox: run stopped (CANCELLED): wrong branch";
    let payload = |set: Value| {
        let mut payload = Agent::Codex.payload();
        for (key, value) in set.as_object().unwrap() {
            payload[key] = value.clone();
        }
        codex::Payload::parse(payload.to_string().as_bytes()).unwrap()
    };
    let prompt = payload(json!({}));
    assert_eq!(
        codex::kept_stop_answer(&prompt, report),
        Some(Agent::Codex.blocked(&prompt_refused(report)))
    );
    let sub_agent = payload(json!({"agent_id": "a1"}));
    assert_eq!(codex::kept_stop_answer(&sub_agent, report), None);
    let call = payload(json!({"hook_event_name": "PreToolUse", "tool_name": "Bash"}));
    let denied = codex::kept_stop_answer(&call, report).unwrap();
    assert_eq!(denied["hookSpecificOutput"]["permissionDecision"], "deny");
    for other in ["PostToolUse", "SessionStart", "SessionEnd"] {
        let quiet = payload(json!({"hook_event_name": other}));
        assert_eq!(codex::kept_stop_answer(&quiet, report), None, "{other}");
    }
}
