//! GitHub Copilot CLI (`@github/copilot` 1.0.102) command hooks (`.github/hooks/*.json`,
//! or `hooks` in ~/.copilot/settings.json), both ways. Payloads recorded with the real
//! binary in BYOK mode (a custom OpenAI-compatible provider, no GitHub account):
//!
//! - Every payload: `sessionId` (a UUID), `timestamp` (epoch ms, shared by every hook of
//!   one event), `cwd`. `sessionStart` adds `source` (`new` …) and `initialPrompt`;
//!   `userPromptSubmitted` `prompt`; `preToolUse` `toolName`, `toolArgs`; `postToolUse`
//!   also `toolResult {resultType, textResultForLlm}`; `agentStop` `stopReason`,
//!   `transcriptPath`; `sessionEnd` `reason` (`complete` …).
//! - **No tool-call id**, as with Gemini CLI: the session's [`CallBook`] numbers the
//!   calls by tool, input and timestamp.
//! - **Deny** is `permissionDecision: "deny"` with `permissionDecisionReason`, which the
//!   model reads. No answer ends the agent, so a stop is a deny that tells the model to
//!   end the turn, and every later call is refused by the daemon's latch (a stopped run
//!   answers `stop` to each), as Codex's are.
//! - `agentStop` fires at the end of each answer and `errorOccurred` on an error: neither
//!   is a guard event (the run ends at `sessionEnd`).

use fusebox_core::event::hex_sha256;
use fusebox_core::{Action, Event};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::common::{checked, lines_in_one_order, message_of};
pub use crate::common::{run_id, Operations, Outcome};
pub use crate::gemini_cli::CallBook;
use crate::protocol::{before_call, before_prompt, Answers, Protocol, Step};

/// Copilot CLI's names: `fusebox-hook copilot-cli`, event ids `cp-…`; no answer ends
/// the agent.
pub const PROTOCOL: Protocol = Protocol {
    agent: "copilot-cli",
    prefix: "cp",
    stop_ends_run: false,
};

/// Copilot CLI's shell tool.
const SHELL_TOOL: &str = "bash";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    SessionStart,
    UserPromptSubmitted,
    PreToolUse,
    PostToolUse,
    SessionEnd,
    Other,
}

impl HookEvent {
    fn parse(name: &str) -> HookEvent {
        match name {
            "sessionStart" => HookEvent::SessionStart,
            "userPromptSubmitted" => HookEvent::UserPromptSubmitted,
            "preToolUse" => HookEvent::PreToolUse,
            "postToolUse" => HookEvent::PostToolUse,
            "sessionEnd" => HookEvent::SessionEnd,
            _ => HookEvent::Other,
        }
    }

    /// The settings' names of the events fusebox listens to.
    pub const NAMES: [&'static str; 5] = [
        "sessionStart",
        "userPromptSubmitted",
        "preToolUse",
        "postToolUse",
        "sessionEnd",
    ];
}

/// The fields of a Copilot CLI hook payload fusebox reads. The payload does not name its
/// event: the printed settings pass it as the command's argument (`--event`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    #[serde(skip)]
    pub hook_event_name: String,
    pub session_id: String,
    #[serde(default)]
    pub timestamp: Option<Value>,
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub tool_args: Option<Value>,
    #[serde(default)]
    pub tool_result: Option<Value>,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

impl Payload {
    pub fn parse(bytes: &[u8], event: &str) -> Result<Payload, String> {
        let mut payload: Payload = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a Copilot CLI hook payload: {e}"))?;
        payload.hook_event_name = event.to_owned();
        Ok(payload)
    }

    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }

    /// A session continued (`copilot --resume`) in a new process.
    pub fn resumes(&self) -> bool {
        self.event() == HookEvent::SessionStart && self.source.as_deref() == Some("resume")
    }

    fn tool(&self) -> Result<&str, String> {
        self.tool_name
            .as_deref()
            .ok_or_else(|| format!("{} payload without toolName", self.hook_event_name))
    }

    fn timestamp(&self) -> Result<String, String> {
        match &self.timestamp {
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(format!(
                "{} payload without timestamp",
                self.hook_event_name
            )),
        }
    }

    /// Which call this is, whatever the moment: the tool and its input.
    pub fn call_key(&self) -> Result<String, String> {
        let input = self.tool_args.as_ref().unwrap_or(&Value::Null);
        let text = format!("{}\0{}", self.tool()?, input);
        Ok(hex_sha256(text.as_bytes())[..32].to_owned())
    }

    /// This very hook event: the call and the event's timestamp.
    pub fn moment(&self) -> Result<String, String> {
        Ok(format!("{}@{}", self.call_key()?, self.timestamp()?))
    }
}

/// The guard event for a payload; `None` for hook events fusebox has nothing to say
/// about. `call_id` is the book's id for a preToolUse or postToolUse.
pub fn event_for(
    payload: &Payload,
    operations: &Operations,
    tenant: &str,
    run: &str,
    agent: &str,
    call_id: Option<&str>,
    ts_ms: u64,
) -> Result<Option<Event>, String> {
    let call = || call_id.ok_or_else(|| format!("{} without a call id", payload.hook_event_name));
    let timestamp = payload.timestamp();
    let step = match payload.event() {
        HookEvent::SessionStart => Step::SessionStart,
        // The prompt carries no id: its timestamp names it.
        HookEvent::UserPromptSubmitted => Step::Prompt {
            id: timestamp.as_deref().map_err(Clone::clone)?,
        },
        HookEvent::PreToolUse => Step::Call {
            id: call()?,
            tool: payload.tool()?,
            input: payload.tool_args.as_ref(),
        },
        HookEvent::PostToolUse => {
            let result = payload.tool_result.as_ref().unwrap_or(&Value::Null);
            // `resultType` says whether the tool did its job; a shell command's exit
            // code is part of its text.
            let failed = result
                .get("resultType")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind != "success");
            Step::Result {
                id: call()?,
                tool: payload.tool()?,
                input: payload.tool_args.as_ref(),
                failure: failed.then_some("tool_error"),
                output: model_output(payload.tool()?, result),
            }
        }
        HookEvent::SessionEnd => Step::SessionEnd {
            reason: payload.reason.as_deref(),
        },
        HookEvent::Other => return Ok(None),
    };
    let event = PROTOCOL.event(step, operations, tenant, run, agent, ts_ms);
    checked(event, &payload.hook_event_name).map(Some)
}

/// What the model read of a result (`textResultForLlm`), as the loop detector must
/// compare it: the shell's closing `<shellId: N completed with exit code X>` without
/// `N` (a new number for every command, 1.0.102), and a command's lines in one order.
fn model_output(tool: &str, result: &Value) -> Value {
    match result.get("textResultForLlm") {
        Some(Value::String(text)) if tool == SHELL_TOOL => {
            Value::String(lines_in_one_order(text.lines().map(without_shell_id)))
        }
        Some(other) => other.clone(),
        None => result.clone(),
    }
}

fn without_shell_id(line: &str) -> &str {
    match line.strip_prefix("<shellId: ") {
        Some(rest) => rest.trim_start_matches(|c: char| c.is_ascii_digit()),
        None => line,
    }
}

/// Copilot CLI's answers before a call (preToolUse).
struct CopilotCli;

impl Answers for CopilotCli {
    fn deny(&self, reason: &str) -> Value {
        json!({"permissionDecision": "deny", "permissionDecisionReason": reason})
    }

    /// No field of preToolUse's answer reaches the model without refusing the call.
    fn warn(&self, _words: &str) -> Value {
        json!({})
    }

    /// No answer ends the agent: the deny tells the model to end the turn, and every
    /// later call is refused with the daemon's latch.
    fn stop(&self, report: &str) -> Value {
        self.deny(&format!(
            "{report}\nThis session's run is stopped: every further tool call is refused. \
             End the turn and tell the user."
        ))
    }
}

/// The hook's answer on stdout for `event`.
pub fn answer(event: HookEvent, outcome: &Outcome) -> Value {
    match (event, outcome) {
        (HookEvent::PreToolUse, outcome) => before_call(&CopilotCli, outcome),
        (HookEvent::UserPromptSubmitted, outcome) => before_prompt(&CopilotCli, outcome),
        (_, Outcome::Decided(decision)) if decision.action == Action::Stop => {
            json!({"systemMessage": message_of(decision)})
        }
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::Decision;

    /// Recorded with 1.0.102 (BYOK, `copilot -p … --allow-all-tools`).
    const SESSION: &str = "00f50c06-9281-4a2a-ba75-289c1800c629";
    fn recorded(event: &str) -> Payload {
        let text = match event {
            "sessionStart" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493487,"cwd":"/w","source":"new","initialPrompt":"do the task"}"#
            }
            "userPromptSubmitted" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493542,"cwd":"/w","prompt":"do the task"}"#
            }
            "preToolUse" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493627,"cwd":"/w","toolName":"bash","toolArgs":{"command":"echo hi","description":"Run the command"}}"#
            }
            "postToolUse" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493697,"cwd":"/w","toolName":"bash","toolArgs":{"command":"echo hi","description":"Run the command"},"toolResult":{"resultType":"success","textResultForLlm":"hi\n<shellId: 0 completed with exit code 0>"}}"#
            }
            "agentStop" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493784,"cwd":"/w","transcriptPath":"/t/events.jsonl","stopReason":"end_turn","stop_hook_active":false}"#
            }
            "sessionEnd" => {
                r#"{"sessionId":"00f50c06-9281-4a2a-ba75-289c1800c629","timestamp":1796418493800,"cwd":"/w","reason":"complete"}"#
            }
            other => panic!("{other}"),
        };
        Payload::parse(text.as_bytes(), event).unwrap()
    }

    #[test]
    fn every_recorded_hook_is_its_step() {
        // (event, call id the book gave, expected id, wire type); None: no event.
        let cases = [
            (
                "sessionStart",
                None,
                Some("cp-session-start"),
                "run_started",
            ),
            (
                "userPromptSubmitted",
                None,
                Some("cp-prompt-1796418493542"),
                "prompt",
            ),
            ("preToolUse", Some("g1"), Some("cp-g1-call"), "tool_call"),
            (
                "postToolUse",
                Some("g1"),
                Some("cp-g1-result"),
                "tool_result",
            ),
            ("agentStop", None, None, ""),
            ("sessionEnd", None, Some("cp-session-end"), "run_finished"),
        ];
        for (name, call, id, kind) in cases {
            let payload = recorded(name);
            assert_eq!(payload.session_id, SESSION);
            let event = event_for(
                &payload,
                &Operations::default(),
                "t",
                "r",
                "copilot-cli",
                call,
                1,
            )
            .unwrap();
            assert_eq!(event.as_ref().map(|e| e.id.as_str()), id, "{name}");
            if let Some(event) = event {
                assert_eq!(
                    serde_json::to_value(&event).unwrap()["type"],
                    kind,
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn the_book_pairs_a_result_with_its_call() {
        let mut book = CallBook::default();
        let before = recorded("preToolUse");
        let after = recorded("postToolUse");
        let id = book.before_call(before.call_key().unwrap(), before.moment().unwrap());
        // The same hook event run twice (repo and user hooks both fire) keeps its id.
        assert_eq!(
            book.before_call(before.call_key().unwrap(), before.moment().unwrap()),
            id
        );
        let paired = book.after_call(&after.call_key().unwrap(), after.moment().unwrap());
        assert_eq!(paired.map(|(id, _)| id), Some(id));
    }

    #[test]
    fn the_shells_id_is_not_part_of_the_output() {
        let result = |n: u32| {
            json!({"resultType": "success",
                "textResultForLlm": format!("running\n<shellId: {n} completed with exit code 0>")})
        };
        assert_eq!(
            model_output(SHELL_TOOL, &result(0)),
            model_output(SHELL_TOOL, &result(7))
        );
        let failed = json!({"resultType": "success",
            "textResultForLlm": "running\n<shellId: 0 completed with exit code 1>"});
        assert_ne!(
            model_output(SHELL_TOOL, &result(0)),
            model_output(SHELL_TOOL, &failed)
        );
    }

    #[test]
    fn answers() {
        let decision = |action: &str| -> Decision {
            serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
                "action": action, "message": "said"}))
            .unwrap()
        };
        let block = decision("block");
        assert_eq!(
            answer(HookEvent::PreToolUse, &Outcome::Decided(&block)),
            json!({"permissionDecision": "deny", "permissionDecisionReason": "fusebox: said"})
        );
        let stop = decision("stop");
        let stopped = answer(HookEvent::PreToolUse, &Outcome::Decided(&stop));
        assert_eq!(stopped["permissionDecision"], "deny");
        assert!(stopped["permissionDecisionReason"]
            .as_str()
            .unwrap()
            .contains("every further tool call is refused"));
        let execute = decision("execute");
        assert_eq!(
            answer(HookEvent::PreToolUse, &Outcome::Decided(&execute)),
            json!({})
        );
        let down = Outcome::Failed {
            why: "no fuseboxd".into(),
            allowed: false,
        };
        assert_eq!(
            answer(HookEvent::PreToolUse, &down)["permissionDecision"],
            "deny"
        );
    }
}
