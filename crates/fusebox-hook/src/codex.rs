//! The OpenAI Codex CLI hook protocol (0.169–0.171, seen with the real binary), both
//! ways: a hook payload (JSON on stdin) becomes a guard event, the guard's decision
//! becomes the hook's answer (JSON on stdout). Pure functions, as for Claude Code.
//!
//! Two things differ from Claude Code and shape this module:
//! - **No answer ends a Codex turn.** `continue: false` on PreToolUse is taken for a
//!   failed hook (the tool runs), on PostToolUse the model simply goes on. So a stop is
//!   kept by the caller ([`stop_kept`]) and every later call of the session is denied with
//!   the stop report as the reason, without asking the daemon again.
//! - **Codex fails open.** Exit 1, a timeout or non-JSON output lets the tool run; the
//!   caller must always print one of these answers (or exit 2, which Codex takes as a
//!   deny with stderr as the reason).
//!
//! A prompt the user submits (UserPromptSubmit) is a `prompt` event, without its words;
//! a stopped session's prompt is blocked. Codex fires the hook in every sub-agent too,
//! with the spawn message as the prompt: that one is not the user's.
//!
//! A sub-agent (`spawn_agent`) is a child run of the session's run, as for Claude Code:
//! its hooks carry its `agent_id` (its thread id; `session_id` is the parent's, while
//! `transcript_path` and `turn_id` are the sub-agent's own), SubagentStart opens its run
//! and SubagentStop finishes it (the caller resolves which run). A stopped sub-agent's
//! later calls are denied with its kept stop report, as a session's are.

use fusebox_core::{Action, Event};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::common::{
    checked, lines_in_one_order, message_of, observe_context, prompt_refused, sub_agent_refused,
};
pub use crate::common::{run_id, Operations, Outcome};
use crate::protocol::{before_call, before_prompt, Answers, Protocol, Step};

/// Codex's names: `fusebox-hook codex`, event ids `cx-…`; no answer ends a Codex turn,
/// so the hook keeps a stop.
pub const PROTOCOL: Protocol = Protocol {
    agent: "codex",
    prefix: "cx",
    stop_ends_run: false,
};

/// Codex's shell tool, as its hooks name it.
const SHELL_TOOL: &str = "Bash";

/// The hook events fusebox acts on. Anything else is answered with no opinion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    /// Also fired again after a compaction (`source: "compact"`): the same event id, so
    /// the daemon answers it from its dedup.
    SessionStart,
    /// A prompt submitted: the user's, or a sub-agent's spawn message.
    UserPromptSubmit,
    PreToolUse,
    PostToolUse,
    /// A compaction. Its PostCompact twin is not counted again (one compaction, one
    /// event).
    PreCompact,
    /// A sub-agent starts: the caller opens its run. Its answer can give the sub-agent
    /// words (`additionalContext`), not prevent it (0.171 ignores `continue: false`).
    SubagentStart,
    /// A sub-agent ended (in place of its Stop): its run is finished. Never answered with
    /// a block, which would make the sub-agent go on.
    SubagentStop,
    /// Not Stop: that fires at the end of every turn of an interactive session.
    SessionEnd,
    Other,
}

impl HookEvent {
    fn parse(name: &str) -> HookEvent {
        match name {
            "SessionStart" => HookEvent::SessionStart,
            "UserPromptSubmit" => HookEvent::UserPromptSubmit,
            "PreToolUse" => HookEvent::PreToolUse,
            "PostToolUse" => HookEvent::PostToolUse,
            "PreCompact" => HookEvent::PreCompact,
            "SubagentStart" => HookEvent::SubagentStart,
            "SubagentStop" => HookEvent::SubagentStop,
            "SessionEnd" => HookEvent::SessionEnd,
            _ => HookEvent::Other,
        }
    }
}

/// The fields of a Codex hook payload fusebox reads (Codex sends more).
#[derive(Debug, Deserialize)]
pub struct Payload {
    pub session_id: String,
    pub hook_event_name: String,
    #[serde(default)]
    pub turn_id: Option<String>,
    #[serde(default)]
    pub transcript_path: Option<String>,
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub tool_input: Option<Value>,
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub tool_response: Option<Value>,
    #[serde(default)]
    pub trigger: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
    /// Set on every hook of a sub-agent, on none of the main agent's.
    #[serde(default)]
    pub agent_id: Option<String>,
}

impl Payload {
    pub fn parse(bytes: &[u8]) -> Result<Payload, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a Codex hook payload: {e}"))
    }

    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }

    /// A session continued (`codex resume`) in a new process.
    pub fn resumes(&self) -> bool {
        self.event() == HookEvent::SessionStart && self.source.as_deref() == Some("resume")
    }

    /// The sub-agent whose hook this is; `None` for the main agent's.
    pub fn sub_agent(&self) -> Option<&str> {
        self.agent_id.as_deref().filter(|id| !id.is_empty())
    }

    /// A UserPromptSubmit of the user's, not a sub-agent's.
    pub fn users_prompt(&self) -> bool {
        self.event() == HookEvent::UserPromptSubmit && self.agent_id.is_none()
    }

    fn tool_use(&self) -> Result<(&str, &str), String> {
        let missing = |field: &str| format!("{} payload without {field}", self.hook_event_name);
        let id = self
            .tool_use_id
            .as_deref()
            .ok_or_else(|| missing("tool_use_id"))?;
        let tool = self
            .tool_name
            .as_deref()
            .ok_or_else(|| missing("tool_name"))?;
        Ok((id, tool))
    }
}

/// The guard event for a payload; `None` for hook events fusebox has nothing to say
/// about. Ids come from the payload (`tool_use_id`, `turn_id`), so a hook run twice is
/// applied once. `transcript_len` is the size of the payload's `transcript_path` when
/// the hook ran: it tells one compaction from the next (see PreCompact below). `run` is
/// the run the payload is of: the session's, or for a sub-agent's payload the
/// sub-agent's. A SubagentStart is `None`: the caller opens the sub-agent's run
/// ([`crate::sub_agent_started`]).
pub fn event_for(
    payload: &Payload,
    operations: &Operations,
    tenant: &str,
    run: &str,
    agent: &str,
    transcript_len: Option<u64>,
    ts_ms: u64,
) -> Result<Option<Event>, String> {
    let Some(step) = step(payload, transcript_len)? else {
        return Ok(None);
    };
    let event = PROTOCOL.event(step, operations, tenant, run, agent, ts_ms);
    checked(event, &payload.hook_event_name).map(Some)
}

/// Which step of the one shape ([`Step`]) a payload is; `None` for hook events fusebox
/// has nothing to say about.
fn step(payload: &Payload, transcript_len: Option<u64>) -> Result<Option<Step<'_>>, String> {
    Ok(Some(match payload.event() {
        HookEvent::SessionStart => Step::SessionStart,
        // Each prompt of the user's starts a turn of its own.
        HookEvent::UserPromptSubmit if payload.users_prompt() => Step::Prompt {
            id: payload
                .turn_id
                .as_deref()
                .ok_or_else(|| format!("{} payload without turn_id", payload.hook_event_name))?,
        },
        HookEvent::PreToolUse => {
            let (id, tool) = payload.tool_use()?;
            Step::Call {
                id,
                tool,
                input: payload.tool_input.as_ref(),
            }
        }
        // Codex reports a failed command as its output (the exit code is in the text),
        // so every result is a SUCCESS with that output: repetition is judged by it.
        HookEvent::PostToolUse => {
            let (id, tool) = payload.tool_use()?;
            Step::Result {
                id,
                tool,
                input: payload.tool_input.as_ref(),
                failure: None,
                output: tool_output(tool, payload.tool_response.as_ref()),
            }
        }
        // PreCompact carries no id of its own, and one turn may compact more than once
        // (`codex exec` is one turn: seen twice in one, 0.171). The transcript has grown
        // by the next compaction and not between the hooks of one event (every hook of
        // it saw the same size), so turn and size name the moment.
        HookEvent::PreCompact => Step::Compaction {
            moment: format!(
                "{}:{}:{}:{}",
                payload.turn_id.as_deref().unwrap_or(""),
                payload.trigger.as_deref().unwrap_or(""),
                transcript_len.unwrap_or(0),
                payload.session_id
            ),
            trigger: payload.trigger.as_deref(),
        },
        HookEvent::SubagentStop => Step::SubAgentEnd,
        HookEvent::SessionEnd => Step::SessionEnd {
            reason: payload.reason.as_deref(),
        },
        HookEvent::UserPromptSubmit | HookEvent::SubagentStart | HookEvent::Other => {
            return Ok(None)
        }
    }))
}

/// A call's result as the guard compares it: the shell's lines in one order (its stdout
/// and stderr come joined in arrival order), anything else as it is. Also what Codex's
/// rollouts and its telemetry give of a result, once [`command_output`] has taken off
/// the header Codex adds for the model.
pub fn tool_output(tool: &str, response: Option<&Value>) -> Value {
    match response {
        Some(Value::String(text)) if tool == SHELL_TOOL => {
            Value::String(lines_in_one_order(text.lines()))
        }
        other => other.cloned().unwrap_or(Value::Null),
    }
}

/// A call as Codex's model makes it (what its rollouts and its telemetry record:
/// `exec_command` with `{"cmd": …}`) as its hooks name it (`Bash` with
/// `{"command": …}`), so every path hashes the same call the same way; any other tool
/// goes by its own name and arguments.
pub fn as_hooks_name_it(name: &str, arguments: Value) -> (String, Value) {
    match (name, arguments.get("cmd")) {
        ("exec_command", Some(cmd)) => (SHELL_TOOL.to_owned(), json!({"command": cmd})),
        _ => (name.to_owned(), arguments),
    }
}

/// A command's own output: what follows the header Codex puts before it for the model
/// (`Chunk ID`, `Wall time`, … up to `Output:`), which its rollouts and its telemetry
/// record and the hook's `tool_response` does not carry. Any other text is left whole.
pub fn command_output(text: &str) -> &str {
    const MARK: &str = "\nOutput:\n";
    match text.find(MARK) {
        Some(at) if text.starts_with("Chunk ID:") || text.starts_with("Exit code:") => {
            &text[at + MARK.len()..]
        }
        _ => text,
    }
}

/// The report to keep when `outcome` stops the run: every later call of the session is
/// denied with it, because Codex cannot be made to end the turn.
pub fn stop_kept(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Decided(decision) if decision.action == Action::Stop => Some(message_of(decision)),
        _ => None,
    }
}

/// The answer to a hook of a session whose run was stopped earlier, said with the kept
/// stop report without asking the daemon again: a call is denied, the user's prompt
/// blocked; `None` for the hooks a stop does not answer.
pub fn kept_stop_answer(payload: &Payload, report: &str) -> Option<Value> {
    let whose = Whose::of(payload);
    match payload.event() {
        HookEvent::PreToolUse => Some(whose.stop(report)),
        HookEvent::UserPromptSubmit if payload.users_prompt() => {
            Some(whose.prompt_stopped(&prompt_refused(report)))
        }
        _ => None,
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

/// Codex's answers before a call (PreToolUse), for a run of `whose`.
impl Answers for Whose {
    fn deny(&self, reason: &str) -> Value {
        json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }})
    }

    fn warn(&self, words: &str) -> Value {
        context("PreToolUse", words)
    }

    /// A deny whose words say what to do next: no answer ends the turn, so the model
    /// must be told to end it, and every later call is refused with the kept report.
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

    // The turn ends before the model is asked (`codex exec` 0.171 prints only
    // `hook: UserPromptSubmit Blocked`; the reason is for the interactive CLI): the
    // default block.
}

/// The hook's answer on stdout for `event` of the session's run.
pub fn answer(event: HookEvent, outcome: &Outcome) -> Value {
    answer_as(event, outcome, Whose::Session)
}

/// The hook's answer on stdout for `event` of a run of `whose`.
pub fn answer_as(event: HookEvent, outcome: &Outcome, whose: Whose) -> Value {
    match (event, outcome) {
        (HookEvent::PreToolUse, outcome) => before_call(&whose, outcome),
        (HookEvent::UserPromptSubmit, outcome) => before_prompt(&whose, outcome),
        // The sub-agent's start, refused (a cap, a stopped session): the sub-agent is told
        // at once; its calls are refused with the same report.
        (HookEvent::SubagentStart, Outcome::Decided(decision))
            if decision.action == Action::Stop =>
        {
            context("SubagentStart", &sub_agent_refused(&message_of(decision)))
        }
        // The model goes on after a result whatever the hook says; the stop report is
        // what it reads, and the next call is denied with it.
        (HookEvent::PostToolUse, Outcome::Decided(decision)) => match observe_context(decision) {
            Some(words) => context("PostToolUse", &words),
            None => json!({}),
        },
        _ => json!({}),
    }
}

/// Codex adds it to the conversation as a developer message before the call's output.
fn context(event: &str, words: &str) -> Value {
    json!({"hookSpecificOutput": {
        "hookEventName": event,
        "additionalContext": words,
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::EventBody;

    fn parse(text: &str) -> Payload {
        Payload::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn the_turn_and_the_transcript_name_a_compaction() {
        let id = |turn: &str, transcript_len: u64| {
            let payload = parse(&format!(
                r#"{{"session_id":"s","hook_event_name":"PreCompact","turn_id":"{turn}","trigger":"auto"}}"#
            ));
            event_for(
                &payload,
                &Operations::default(),
                "t",
                "r",
                "codex",
                Some(transcript_len),
                1,
            )
            .unwrap()
            .unwrap()
            .id
        };
        // Recorded (0.171, `codex exec` with a low model_auto_compact_token_limit): two
        // hooks of the first compaction saw 35354 bytes, the second compaction of the
        // same turn 54566.
        assert_eq!(id("turn-1", 35354), id("turn-1", 35354));
        assert_ne!(id("turn-1", 35354), id("turn-1", 54566));
        assert_ne!(id("turn-1", 35354), id("turn-2", 35354));
    }

    #[test]
    fn a_shell_output_in_either_order_is_one_answer() {
        // Recorded (0.171, `cat status.txt || echo running`): both orders of one run.
        let output = |response: &str| {
            let payload = parse(&format!(
                r#"{{"session_id":"s","hook_event_name":"PostToolUse","tool_name":"Bash","tool_use_id":"c1","tool_response":{}}}"#,
                serde_json::to_string(response).unwrap()
            ));
            let event = event_for(&payload, &Operations::default(), "t", "r", "codex", None, 1)
                .unwrap()
                .unwrap();
            match event.body {
                EventBody::ToolResult(result) => result.output,
                other => panic!("{other:?}"),
            }
        };
        let missing = "cat: status.txt: No such file or directory";
        assert_eq!(
            output(&format!("{missing}\nrunning\n")),
            output(&format!("running\n{missing}\n"))
        );
        assert_ne!(
            output("running\n"),
            output(&format!("running\n{missing}\n"))
        );
    }

    #[test]
    fn the_output_header_codex_adds_for_the_model_is_not_the_commands() {
        for (text, output) in [
            (
                "Chunk ID: f47d8b\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 13\nOutput:\nrunning\n",
                "running\n",
            ),
            ("Exit code: 1\nWall time: 0 seconds\nOutput:\nboom\n", "boom\n"),
            // Another tool's output, which merely mentions the marker, is left whole.
            ("see\nOutput:\nthere", "see\nOutput:\nthere"),
        ] {
            assert_eq!(command_output(text), output);
        }
    }

    #[test]
    fn the_models_shell_call_is_the_hooks_bash_call() {
        assert_eq!(
            as_hooks_name_it("exec_command", json!({"cmd": "ls", "yield_time_ms": 1000})),
            ("Bash".to_owned(), json!({"command": "ls"}))
        );
        // Without `cmd` (arguments Codex could not parse), and any other tool: as they are.
        assert_eq!(
            as_hooks_name_it("exec_command", json!({"nope": 1})),
            ("exec_command".to_owned(), json!({"nope": 1}))
        );
        assert_eq!(
            as_hooks_name_it("spawn_agent", json!({"message": "go"})),
            ("spawn_agent".to_owned(), json!({"message": "go"}))
        );
    }

    #[test]
    fn post_compact_and_stop_are_not_events() {
        for name in ["PostCompact", "Stop"] {
            let payload = parse(&format!(
                r#"{{"session_id":"s","hook_event_name":"{name}"}}"#
            ));
            assert!(
                event_for(&payload, &Operations::default(), "t", "r", "codex", None, 1)
                    .unwrap()
                    .is_none()
            );
        }
    }

    #[test]
    fn a_call_without_its_id_is_the_hooks_error() {
        let payload =
            parse(r#"{"session_id":"s","hook_event_name":"PreToolUse","tool_name":"Bash"}"#);
        let err =
            event_for(&payload, &Operations::default(), "t", "r", "codex", None, 1).unwrap_err();
        assert!(err.contains("tool_use_id"), "{err}");
    }
}
