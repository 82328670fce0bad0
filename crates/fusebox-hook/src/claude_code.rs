//! The Claude Code hook protocol, both ways: a hook payload (JSON on stdin) becomes a
//! guard event, and the guard's decision becomes the hook's answer (JSON on stdout).
//! Pure functions: no I/O, no clock (the caller passes `ts_ms`), so every mapping is
//! tested by fixture.
//!
//! Every invocation is a fresh process, so the events carry no `seq` and their ids are
//! derived from the payload (the tool use id, the event name): a hook that Claude Code
//! runs again for the same moment sends the same id, and the daemon answers it from its
//! dedup with the original decision instead of counting the call twice.
//!
//! A prompt the user submits (UserPromptSubmit) is a `prompt` event: the session's next
//! task. Its words never leave the hook — the guard needs the moment, not the text.
//!
//! A sub-agent (the Agent tool) is a child run of the session's run: every hook of a
//! sub-agent carries its `agent_id` (the main agent's none; `agent_type` alone also marks
//! a main agent run with `--agent`), and its events go to the sub-agent's run, which the
//! caller resolves ([`crate::sub_agent_run`]) and opens with [`crate::sub_agent_started`]
//! at its SubagentStart, or at its first call when that was missed. A stop of the
//! sub-agent's run answers its call with a deny **and** `continue: false`, which ends the
//! sub-agent alone (2.1.327: the main agent goes on, reading "Subagent completed but
//! returned no output"), so the caller adds the stop to the sub-agent's result
//! ([`sub_agent_stopped_context`]).

use fusebox_core::{Action, Event};

use crate::common::{
    checked, message_of, observe_context, sub_agent_refused, sub_agent_stopped_note,
};
pub use crate::common::{run_id, Operations, Outcome};
use crate::protocol::{before_call, before_prompt, Answers, Protocol, Step};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

/// Claude Code's names: `fusebox-hook claude-code`, event ids `cc-…`; a stop's answer
/// ends the session (or a sub-agent alone).
pub const PROTOCOL: Protocol = Protocol {
    agent: "claude-code",
    prefix: "cc",
    stop_ends_run: true,
};

/// The hook events fusebox acts on. Anything else is answered with no opinion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    SessionStart,
    PreToolUse,
    PostToolUse,
    PostToolUseFailure,
    PreCompact,
    /// A prompt submitted: the user's, or one Claude Code submits itself (see
    /// [`Payload::users_prompt`]). UserPromptExpansion, which follows a slash command's,
    /// is the same prompt and not listened to.
    UserPromptSubmit,
    /// Fired at the end of every answer; an interactive session goes on with the next
    /// prompt under the same session id, so this does not close the run.
    Stop,
    /// A sub-agent starts (again, when the main agent continues it with SendMessage):
    /// its run is opened by the caller. Its answer can give the sub-agent words, not
    /// prevent it.
    SubagentStart,
    /// A sub-agent ended: its run is finished. Never answered with a block, which would
    /// make the sub-agent go on.
    SubagentStop,
    SessionEnd,
    Other,
}

impl HookEvent {
    fn parse(name: &str) -> HookEvent {
        match name {
            "SessionStart" => HookEvent::SessionStart,
            "PreToolUse" => HookEvent::PreToolUse,
            "PostToolUse" => HookEvent::PostToolUse,
            "PostToolUseFailure" => HookEvent::PostToolUseFailure,
            "PreCompact" => HookEvent::PreCompact,
            "UserPromptSubmit" => HookEvent::UserPromptSubmit,
            "Stop" => HookEvent::Stop,
            "SubagentStart" => HookEvent::SubagentStart,
            "SubagentStop" => HookEvent::SubagentStop,
            "SessionEnd" => HookEvent::SessionEnd,
            _ => HookEvent::Other,
        }
    }
}

/// The fields of a hook payload fusebox reads (Claude Code sends more).
#[derive(Debug, Deserialize)]
pub struct Payload {
    pub session_id: String,
    pub hook_event_name: String,
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
    pub error: Option<Value>,
    #[serde(default)]
    pub is_interrupt: Option<bool>,
    #[serde(default)]
    pub trigger: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    /// SessionStart: how the session began (`resume` …). UserPromptSubmit: who wrote the
    /// prompt, where Claude Code says so (a field it is rolling out).
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub prompt_id: Option<String>,
    /// Set on every hook of a sub-agent, on none of the main agent's.
    #[serde(default)]
    pub agent_id: Option<String>,
    /// UserPromptSubmit: whether the prompt is a background task's completion notice,
    /// which Claude Code submits as a prompt of its own. Only that is read of the text:
    /// the words are not kept.
    #[serde(default, rename = "prompt", deserialize_with = "task_notification")]
    pub task_notification: bool,
}

/// How a background task's completion notice begins (2.1.327 submits it as a prompt,
/// sometimes under the prompt id of the user's prompt that started the task).
const TASK_NOTIFICATION: &str = "<task-notification>";

fn task_notification<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.is_some_and(|text| text.starts_with(TASK_NOTIFICATION)))
}

/// Who wrote a prompt (`source`) when it is the user: typed in the session, or given to
/// `claude -p` and the Agent SDK. The others (`system`: notices, messages of peers,
/// auto-continuation; `loop_wakeup`, `schedule_wakeup`: a wakeup the model itself may
/// have scheduled; `poll_event`) go on the task of the user's last prompt: a new task
/// per wakeup would give a runaway fresh budgets whenever it asked for one.
const USER_SOURCES: [&str; 2] = ["user", "sdk"];

impl Payload {
    pub fn parse(bytes: &[u8]) -> Result<Payload, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a Claude Code hook payload: {e}"))
    }

    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }

    /// A session continued (`--resume`, `--continue`) in a new process.
    pub fn resumes(&self) -> bool {
        self.event() == HookEvent::SessionStart && self.source.as_deref() == Some("resume")
    }

    /// The sub-agent whose hook this is; `None` for the main agent's.
    pub fn sub_agent(&self) -> Option<&str> {
        self.agent_id.as_deref().filter(|id| !id.is_empty())
    }

    /// The sub-agent a main agent's Agent call ran, when its result is the sub-agent's
    /// end (`tool_response.agentId`; not a background launch, whose end comes later).
    pub fn ran_sub_agent(&self) -> Option<&str> {
        let ran = self.event() == HookEvent::PostToolUse
            && self.sub_agent().is_none()
            && matches!(self.tool_name.as_deref(), Some("Agent" | "Task"));
        let response = self.tool_response.as_ref().filter(|_| ran)?;
        let launched = response.get("isAsync") == Some(&Value::Bool(true))
            || response.get("status").and_then(Value::as_str) == Some("async_launched");
        response
            .get("agentId")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty() && !launched)
    }

    /// A UserPromptSubmit of the user's: the main agent's, not a task's completion notice,
    /// and from the user where the payload says who wrote it.
    pub fn users_prompt(&self) -> bool {
        self.agent_id.is_none()
            && !self.task_notification
            && self
                .source
                .as_deref()
                .is_none_or(|source| USER_SOURCES.contains(&source))
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
/// about. `ts_ms` is the event time (the caller's clock); `operations` says which calls
/// carry an op_key. `run` is the run the payload is of: the session's, or for a
/// sub-agent's payload the sub-agent's. A SubagentStart is `None`: the caller opens the
/// sub-agent's run ([`crate::sub_agent_started`]), as it does when the first hook it sees
/// of a sub-agent is another.
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
    // A payload the daemon would refuse is this hook's error, said here, not a refusal
    // from the guard.
    checked(event, &payload.hook_event_name).map(Some)
}

/// Which step of the one shape ([`Step`]) a payload is; `None` for hook events fusebox
/// has nothing to say about.
fn step(payload: &Payload, transcript_len: Option<u64>) -> Result<Option<Step<'_>>, String> {
    Ok(Some(match payload.event() {
        // The run's agent name selects `[agents.<name>.policy]`. A session resumed while
        // its run is open starts again under the same id, answered from the dedup.
        HookEvent::SessionStart => Step::SessionStart,
        HookEvent::PreToolUse => {
            let (id, tool) = payload.tool_use()?;
            Step::Call {
                id,
                tool,
                input: payload.tool_input.as_ref(),
            }
        }
        HookEvent::PostToolUse | HookEvent::PostToolUseFailure => {
            let (id, tool) = payload.tool_use()?;
            let (failure, output) = if payload.event() == HookEvent::PostToolUseFailure {
                let code = if payload.is_interrupt == Some(true) {
                    "interrupted"
                } else {
                    "tool_error"
                };
                (Some(code), payload.error.clone().unwrap_or(Value::Null))
            } else {
                (None, payload.tool_response.clone().unwrap_or(Value::Null))
            };
            Step::Result {
                id,
                tool,
                input: payload.tool_input.as_ref(),
                failure,
                output,
            }
        }
        // No id names a compaction; the transcript's length at that moment does (it
        // grows between two compactions, and not while the CLI waits for the hook).
        HookEvent::PreCompact => Step::Compaction {
            moment: format!(
                "{}:{}:{}",
                payload.trigger.as_deref().unwrap_or(""),
                transcript_len.unwrap_or(0),
                payload.session_id
            ),
            trigger: payload.trigger.as_deref(),
        },
        // A prompt id names the user's prompt; a notice that shares it is not sent.
        HookEvent::UserPromptSubmit if payload.users_prompt() => Step::Prompt {
            id: payload
                .prompt_id
                .as_deref()
                .ok_or_else(|| format!("{} payload without prompt_id", payload.hook_event_name))?,
        },
        HookEvent::SubagentStop => Step::SubAgentEnd,
        HookEvent::SessionEnd => Step::SessionEnd {
            reason: payload.reason.as_deref(),
        },
        HookEvent::UserPromptSubmit
        | HookEvent::Stop
        | HookEvent::SubagentStart
        | HookEvent::Other => return Ok(None),
    }))
}

/// The hook's answer on stdout for `event`.
pub fn answer(event: HookEvent, outcome: &Outcome) -> Value {
    match (event, outcome) {
        (HookEvent::PreToolUse, outcome) => before_call(&ClaudeCode, outcome),
        (HookEvent::UserPromptSubmit, outcome) => before_prompt(&ClaudeCode, outcome),
        // The sub-agent's start, refused (a cap, a stopped session): the sub-agent is
        // told at once; its calls are refused with the same report.
        (HookEvent::SubagentStart, Outcome::Decided(decision))
            if decision.action == Action::Stop =>
        {
            json!({"hookSpecificOutput": {
                "hookEventName": "SubagentStart",
                "additionalContext": sub_agent_refused(&message_of(decision)),
            }})
        }
        (HookEvent::SubagentStart | HookEvent::SubagentStop, _) => json!({}),
        (_, Outcome::Decided(decision)) if decision.action == Action::Stop => json!({
            "continue": false,
            "stopReason": message_of(decision),
            "systemMessage": message_of(decision),
        }),
        (HookEvent::PostToolUse | HookEvent::PostToolUseFailure, Outcome::Decided(decision)) => {
            match observe_context(decision) {
                Some(context) => json!({"hookSpecificOutput": {
                    "hookEventName": name(event),
                    "additionalContext": context,
                }}),
                None => json!({}),
            }
        }
        _ => json!({}),
    }
}

/// `answer` with `words` added to what the model reads after the call (PostToolUse
/// `additionalContext`), after the guard's own.
pub fn with_context(mut answer: Value, event: HookEvent, words: &str) -> Value {
    let specific = &mut answer["hookSpecificOutput"];
    let context = match specific.get("additionalContext").and_then(Value::as_str) {
        Some(said) => format!("{said}\n{words}"),
        None => words.to_owned(),
    };
    specific["hookEventName"] = json!(name(event));
    specific["additionalContext"] = json!(context);
    answer
}

/// The words the main agent reads with the result of an Agent call whose sub-agent the
/// guard stopped (`report`: what the sub-agent's refused call was told).
pub fn sub_agent_stopped_context(agent_id: &str, report: &str) -> String {
    sub_agent_stopped_note(agent_id, report)
}

/// Claude Code's answers before a call (PreToolUse).
struct ClaudeCode;

impl Answers for ClaudeCode {
    fn deny(&self, reason: &str) -> Value {
        json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }})
    }

    fn warn(&self, words: &str) -> Value {
        json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "additionalContext": words,
        }})
    }

    /// A stop must deny the call too: `continue: false` alone ends the session only
    /// after the tool has run (seen with Claude Code 2.1.327).
    fn stop(&self, report: &str) -> Value {
        let mut answer = self.deny(report);
        answer["continue"] = json!(false);
        answer["stopReason"] = json!(report);
        answer["systemMessage"] = json!(report);
        answer
    }
}

fn name(event: HookEvent) -> &'static str {
    match event {
        HookEvent::SessionStart => "SessionStart",
        HookEvent::PreToolUse => "PreToolUse",
        HookEvent::PostToolUse => "PostToolUse",
        HookEvent::PostToolUseFailure => "PostToolUseFailure",
        HookEvent::PreCompact => "PreCompact",
        HookEvent::UserPromptSubmit => "UserPromptSubmit",
        HookEvent::Stop => "Stop",
        HookEvent::SubagentStart => "SubagentStart",
        HookEvent::SubagentStop => "SubagentStop",
        HookEvent::SessionEnd => "SessionEnd",
        HookEvent::Other => "Other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::event::{Args, ToolCall};
    use fusebox_core::EventBody;

    fn pre_tool_use(input: Value) -> Result<Option<Event>, String> {
        let payload = json!({"session_id": "s", "hook_event_name": "PreToolUse",
            "tool_name": "Write", "tool_use_id": "toolu_1", "tool_input": input});
        let payload = Payload::parse(payload.to_string().as_bytes()).unwrap();
        event_for(&payload, &Operations::default(), "t", "r", "a", None, 1)
    }

    #[test]
    fn large_inputs_travel_as_hashes() {
        let big = json!({"content": "x".repeat(fusebox_core::event::INLINE_LIMIT + 1)});
        let event = pre_tool_use(big).unwrap().unwrap();
        assert!(
            matches!(event.body, EventBody::ToolCall(ToolCall { args: Args::Hash(h), .. })
            if h.len() == 64)
        );
        let small = pre_tool_use(json!({"command": "ls"})).unwrap().unwrap();
        assert!(matches!(
            small.body,
            EventBody::ToolCall(ToolCall {
                args: Args::Json(_),
                ..
            })
        ));
    }

    #[test]
    fn a_payload_the_daemon_would_refuse_is_the_hooks_error() {
        let payload = Payload::parse(
            br#"{"session_id":"s","hook_event_name":"PreToolUse","tool_name":"","tool_use_id":"t1"}"#,
        )
        .unwrap();
        let err = event_for(&payload, &Operations::default(), "t", "r", "a", None, 1).unwrap_err();
        assert!(
            err.contains("cannot guard this PreToolUse payload") && err.contains("`tool`"),
            "{err}"
        );
    }

    #[test]
    fn compaction_ids_differ_by_moment_and_repeat_for_the_same_one() {
        let payload = Payload::parse(
            br#"{"session_id":"s","hook_event_name":"PreCompact","trigger":"auto"}"#,
        )
        .unwrap();
        let id = |len| {
            event_for(
                &payload,
                &Operations::default(),
                "t",
                "r",
                "a",
                Some(len),
                1,
            )
            .unwrap()
            .unwrap()
            .id
        };
        assert_eq!(id(10), id(10));
        assert_ne!(id(10), id(20));
    }
}
