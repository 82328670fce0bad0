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
//! - **Sub-agents** (the `task` tool, sync or background, several at once, nested: a
//!   sub-agent has `task` too) are child runs, as Claude Code's and Codex's. Every hook
//!   of a sub-agent carries its `agentId` (a UUID), `agentType` and `parentAgentId` (the
//!   session's id, or the sub-agent that started it); the main agent's carry none. Its
//!   own hooks (`userPromptSubmitted` with its task, `preToolUse`, `postToolUse`,
//!   `agentStop`) have `sessionId` = its `agentId`; `subagentStart` (before its first
//!   turn, `agentName`, `transcriptPath`) and `subagentStop` (after its turn,
//!   `response`, `stopReason`) have the parent's session id (an id of no other hook for
//!   a nested one). The caller resolves the session and the run
//!   ([`Payload::sub_agent`], [`Payload::parent_agent`]) and opens the run with
//!   [`crate::sub_agent_started`] at `subagentStart` (or the first hook of a sub-agent
//!   whose start was missed); `subagentStop` finishes it. Neither can refuse a sub-agent:
//!   `subagentStart`'s `additionalContext` is put before its prompt (a refused start is
//!   told there), `subagentStop`'s `modifiedResponse` replaces what the parent reads (a
//!   stopped sub-agent's says so, [`sub_agent_stopped_answer`]).

use fusebox_core::event::hex_sha256;
use fusebox_core::{Action, Event};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use crate::common::{
    checked, lines_in_one_order, message_of, sub_agent_refused, sub_agent_stopped_note,
};
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
    /// A sub-agent is about to take its first turn: the caller opens its run.
    SubagentStart,
    /// A sub-agent finished its turn: its run is finished.
    SubagentStop,
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
            "subagentStart" => HookEvent::SubagentStart,
            "subagentStop" => HookEvent::SubagentStop,
            "sessionEnd" => HookEvent::SessionEnd,
            _ => HookEvent::Other,
        }
    }

    /// The settings' names of the events fusebox listens to.
    pub const NAMES: [&'static str; 7] = [
        "sessionStart",
        "userPromptSubmitted",
        "preToolUse",
        "postToolUse",
        "subagentStart",
        "subagentStop",
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
    /// Set on every hook of a sub-agent, on none of the main agent's.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// The session's id, or the sub-agent that started this one.
    #[serde(default)]
    pub parent_agent_id: Option<String>,
    /// A sub-agent's last message (`subagentStop`): what its parent reads.
    #[serde(default)]
    pub response: Option<String>,
    /// userPromptSubmitted: whether the prompt is the runtime's notice (a background
    /// sub-agent went idle), which Copilot CLI submits as a prompt of the session's. Only
    /// that is read of the text: the words are not kept.
    #[serde(default, rename = "prompt", deserialize_with = "system_notification")]
    pub system_notification: bool,
}

/// How the runtime's notices begin (1.0.102: `<system_notification>\nAgent "b" (task)
/// has finished processing and is now idle.\n</system_notification>`).
const SYSTEM_NOTIFICATION: &str = "<system_notification>";

fn system_notification<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.is_some_and(|text| text.starts_with(SYSTEM_NOTIFICATION)))
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

    /// The sub-agent whose hook this is; `None` for the main agent's.
    pub fn sub_agent(&self) -> Option<&str> {
        self.agent_id.as_deref().filter(|id| !id.is_empty())
    }

    /// A userPromptSubmitted of the user's: the main agent's, not the runtime's notice.
    pub fn users_prompt(&self) -> bool {
        self.event() == HookEvent::UserPromptSubmitted
            && self.sub_agent().is_none()
            && !self.system_notification
    }

    /// Who started the sub-agent whose hook this is: the session's id, or another
    /// sub-agent's `agentId`. `None` for the main agent's hooks.
    pub fn parent_agent(&self) -> Option<&str> {
        self.sub_agent()?;
        self.parent_agent_id.as_deref().filter(|id| !id.is_empty())
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
/// about. `call_id` is the book's id for a preToolUse or postToolUse. `run` is the run
/// the payload is of: the session's, or for a sub-agent's payload the sub-agent's. A
/// `subagentStart` is `None` (the caller opens the sub-agent's run), and so is a prompt
/// that is not the user's: a sub-agent's (its task as its parent wrote it), the
/// runtime's notice.
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
        HookEvent::UserPromptSubmitted if !payload.users_prompt() => return Ok(None),
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
        HookEvent::SubagentStop => Step::SubAgentEnd,
        HookEvent::SessionEnd => Step::SessionEnd {
            reason: payload.reason.as_deref(),
        },
        HookEvent::SubagentStart | HookEvent::Other => return Ok(None),
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

/// Whose run a hook's payload is of: the words of a stop say what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    Session,
    SubAgent,
}

impl Whose {
    pub fn of(payload: &Payload) -> Whose {
        match payload.sub_agent() {
            Some(_) => Whose::SubAgent,
            None => Whose::Session,
        }
    }
}

/// Copilot CLI's answers before a call (preToolUse), for a run of `whose`.
impl Answers for Whose {
    fn deny(&self, reason: &str) -> Value {
        json!({"permissionDecision": "deny", "permissionDecisionReason": reason})
    }

    /// No field of preToolUse's answer reaches the model without refusing the call.
    fn warn(&self, _words: &str) -> Value {
        json!({})
    }

    /// No answer ends the agent: the deny tells the model to end the turn (a sub-agent:
    /// to end and say why), and every later call is refused with the daemon's latch.
    fn stop(&self, report: &str) -> Value {
        self.deny(&match self {
            Whose::Session => format!(
                "{report}\nThis session's run is stopped: every further tool call is refused. \
                 End the turn and tell the user."
            ),
            Whose::SubAgent => format!(
                "{report}\nThis sub-agent's run is stopped: every further tool call is refused. \
                 End now, and say in your answer that the guard stopped you and why."
            ),
        })
    }
}

/// The hook's answer on stdout for `event` of the session's run.
pub fn answer(event: HookEvent, outcome: &Outcome) -> Value {
    answer_as(event, outcome, Whose::Session)
}

/// The hook's answer on stdout for `event` of a run of `whose`.
pub fn answer_as(event: HookEvent, outcome: &Outcome, whose: Whose) -> Value {
    match (event, outcome) {
        (HookEvent::PreToolUse, outcome) => before_call(&whose, outcome),
        (HookEvent::UserPromptSubmitted, outcome) => before_prompt(&whose, outcome),
        // The sub-agent's start, refused (a cap, a stopped session): the sub-agent reads
        // it before its prompt; its calls are refused with the same report.
        (HookEvent::SubagentStart, Outcome::Decided(decision))
            if decision.action == Action::Stop =>
        {
            json!({"additionalContext": sub_agent_refused(&message_of(decision))})
        }
        // A sub-agent's end is never blocked (`decision: "block"` would make it go on).
        (HookEvent::SubagentStart | HookEvent::SubagentStop, _) => json!({}),
        (_, Outcome::Decided(decision)) if decision.action == Action::Stop => {
            json!({"systemMessage": message_of(decision)})
        }
        _ => json!({}),
    }
}

/// The answer to the `subagentStop` of a sub-agent the guard stopped (`report`, as the
/// hooks kept it): its parent reads the sub-agent's last words with the stop after
/// them, since the sub-agent's own answer may not say it.
pub fn sub_agent_stopped_answer(payload: &Payload, report: &str) -> Value {
    let note = sub_agent_stopped_note(payload.sub_agent().unwrap_or("?"), report);
    let response = match payload.response.as_deref() {
        Some(words) if !words.trim().is_empty() => format!("{words}\n\n{note}"),
        _ => note,
    };
    json!({"modifiedResponse": response})
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
            other => return sub_agents(other),
        };
        Payload::parse(text.as_bytes(), event).unwrap()
    }

    /// A sub-agent's hooks, recorded with 1.0.102 (`task` with `agent_type: "task"`,
    /// sync): the sub-agent's own carry its id as `sessionId`, its start and stop the
    /// session's; every one carries `agentId` and `parentAgentId`.
    const AGENT: &str = "22de9e8f-df7b-4862-828c-ffd34d35bf38";
    const PARENT: &str = "ad6688de-eadd-48a8-b8c3-21d7eb542fc9";
    fn sub_agents(name: &str) -> Payload {
        let (event, text) = match name {
            "main: preToolUse task" => (
                "preToolUse",
                r#"{"sessionId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9","timestamp":1796428134963,"cwd":"/w","toolName":"task","toolArgs":{"name":"worker","agent_type":"task","description":"Run the commands","prompt":"SUBTASK: run echo sub","mode":"sync"}}"#,
            ),
            "main: notice" => (
                "userPromptSubmitted",
                r#"{"sessionId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9","timestamp":1796428233035,"cwd":"/w","prompt":"<system_notification>\nAgent \"b\" (task) has finished processing and is now idle.\n</system_notification>"}"#,
            ),
            "subagentStart" => (
                "subagentStart",
                r#"{"sessionId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9","timestamp":1796428135043,"cwd":"/w","transcriptPath":"/h/.copilot/session-state/ad6688de-eadd-48a8-b8c3-21d7eb542fc9/events.jsonl","agentName":"task","agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            "sub: userPromptSubmitted" => (
                "userPromptSubmitted",
                r#"{"sessionId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","timestamp":1796428135063,"cwd":"/w","prompt":"SUBTASK: run echo sub","agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            "sub: preToolUse" => (
                "preToolUse",
                r#"{"sessionId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","timestamp":1796428135091,"cwd":"/w","toolName":"bash","toolArgs":{"command":"echo sub 0","description":"Run the command"},"agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            "sub: postToolUse" => (
                "postToolUse",
                r#"{"sessionId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","timestamp":1796428135176,"cwd":"/w","toolName":"bash","toolArgs":{"command":"echo sub 0","description":"Run the command"},"toolResult":{"resultType":"success","textResultForLlm":"sub 0\n<shellId: 0 completed with exit code 0>"},"agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            "sub: agentStop" => (
                "agentStop",
                r#"{"sessionId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","timestamp":1796428135364,"cwd":"/w","transcriptPath":"/h/.copilot/session-state/ad6688de-eadd-48a8-b8c3-21d7eb542fc9/events.jsonl","stopReason":"end_turn","stop_hook_active":false,"agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            "subagentStop" => (
                "subagentStop",
                r#"{"sessionId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9","timestamp":1796428135373,"cwd":"/w","transcriptPath":"/h/.copilot/session-state/ad6688de-eadd-48a8-b8c3-21d7eb542fc9/events.jsonl","agentId":"22de9e8f-df7b-4862-828c-ffd34d35bf38","agentType":"task","agentName":"task","response":"sub done","stopReason":"end_turn","stop_hook_active":false,"parentAgentId":"ad6688de-eadd-48a8-b8c3-21d7eb542fc9"}"#,
            ),
            other => panic!("{other}"),
        };
        Payload::parse(text.as_bytes(), event).unwrap()
    }

    #[test]
    fn a_sub_agents_hooks_are_its_runs_steps() {
        // (payload, whose, call id the book gave, expected id, wire type); the caller
        // passes the run the payload is of (the sub-agent's for its hooks).
        let cases = [
            (
                "main: preToolUse task",
                None,
                Some("g1"),
                Some("cp-g1-call"),
                "tool_call",
            ),
            // The caller opens the run.
            ("subagentStart", Some(PARENT), None, None, ""),
            // Its task as the parent wrote it: not the user's prompt.
            ("sub: userPromptSubmitted", Some(PARENT), None, None, ""),
            (
                "sub: preToolUse",
                Some(PARENT),
                Some("g1"),
                Some("cp-g1-call"),
                "tool_call",
            ),
            (
                "sub: postToolUse",
                Some(PARENT),
                Some("g1"),
                Some("cp-g1-result"),
                "tool_result",
            ),
            ("sub: agentStop", Some(PARENT), None, None, ""),
            // A background sub-agent went idle: the runtime's notice, not the user's.
            ("main: notice", None, None, None, ""),
            (
                "subagentStop",
                Some(PARENT),
                None,
                Some("cp-subagent-stop"),
                "run_finished",
            ),
        ];
        for (name, parent, call, id, kind) in cases {
            let payload = recorded(name);
            assert_eq!(payload.parent_agent(), parent, "{name}");
            let whose = Whose::of(&payload);
            assert_eq!(whose == Whose::SubAgent, parent.is_some(), "{name}");
            if parent.is_some() {
                assert_eq!(payload.sub_agent(), Some(AGENT), "{name}");
            }
            let run = match whose {
                Whose::Session => PARENT.to_owned(),
                Whose::SubAgent => crate::sub_agent_run(PARENT, AGENT),
            };
            let event = event_for(
                &payload,
                &Operations::default(),
                "t",
                &run,
                "copilot-cli",
                call,
                1,
            )
            .unwrap();
            assert_eq!(event.as_ref().map(|e| e.id.as_str()), id, "{name}");
            if let Some(event) = event {
                assert_eq!(event.run, run, "{name}");
                assert_eq!(
                    serde_json::to_value(&event).unwrap()["type"],
                    kind,
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn a_sub_agent_is_told_its_stop_and_its_parent_reads_it() {
        let decision = |action: &str| -> Decision {
            serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
                "action": action, "message": "run stopped (STOPPED_LOOP_GUARD)"}))
            .unwrap()
        };
        let stop = decision("stop");
        let call = recorded("sub: preToolUse");
        let denied = answer_as(call.event(), &Outcome::Decided(&stop), Whose::of(&call));
        assert_eq!(denied["permissionDecision"], "deny");
        let reason = denied["permissionDecisionReason"].as_str().unwrap();
        assert!(
            reason.contains("This sub-agent's run is stopped"),
            "{reason}"
        );
        // A refused start: the sub-agent reads why before its prompt.
        let start = recorded("subagentStart");
        let refused = answer_as(start.event(), &Outcome::Decided(&stop), Whose::SubAgent);
        assert!(refused["additionalContext"]
            .as_str()
            .unwrap()
            .contains("did not let this sub-agent start"));
        // A sub-agent's end is never blocked, whatever the daemon said.
        let end = recorded("subagentStop");
        assert_eq!(
            answer_as(end.event(), &Outcome::Decided(&stop), Whose::SubAgent),
            json!({})
        );
        // Its parent reads its last words and the stop.
        let told = sub_agent_stopped_answer(&end, "fusebox: run stopped");
        let response = told["modifiedResponse"].as_str().unwrap();
        assert!(response.starts_with("sub done\n\n"), "{response}");
        assert!(response.contains(&format!("the guard stopped sub-agent {AGENT}")));
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
