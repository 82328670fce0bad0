//! OpenCode (`opencode-ai` 1.18, read in the installed binary): its plugin hooks, as the
//! fusebox plugin forwards them to `fusebox-hook opencode`, both ways. OpenCode runs
//! plugins in its own process and has no command hooks, so the plugin (printed by
//! `fusebox-hook opencode --print-plugin`) only carries: it sends each hook's fields as
//! one JSON payload to the hook binary and does what the answer says. The decision is
//! fuseboxd's, as for every agent.
//!
//! What OpenCode gives a plugin, and so what differs here:
//! - `tool.execute.before` (`{tool, sessionID, callID}`, `{args}`) runs inside the tool's
//!   `execute`: a plugin that throws fails the call, and the model reads the error's
//!   message. `tool.execute.after` (`{tool, sessionID, callID, args}`, the result
//!   `{title, output, metadata}`) fires only for a call that returned; a thrown one has
//!   none. The plugin may change the result before the model reads it: that is where a
//!   warning, and a stop report after a result, reach the model.
//! - A stop is refused like a block and then ends the session: the plugin aborts it
//!   (`client.session.abort`), which ends `opencode run`.
//! - Sub-agents (the `task` tool) are child sessions (`session.created` with a
//!   `parentID`): a child run of the parent session's run, under the child session's
//!   own id; its end is its `session.idle`.
//! - The session's end: OpenCode fires `session.idle` when an answer is done (then
//!   `opencode run` exits) and `session.deleted`; the run is closed at either, and a
//!   session continued later (`--session`, `--continue`, the next prompt in the TUI)
//!   goes on in its next run (`<session>-2`), as a resumed Claude Code session does.
//! - A prompt (`chat.message`) names itself by its message id; a child session's prompt
//!   is the task it was given, not the user's, and is not an event.

use fusebox_core::{Action, Event};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::common::{checked, lines_in_one_order, message_of, observe_context};
pub use crate::common::{run_id, Operations, Outcome};
use crate::protocol::{before_call, before_prompt, Answers, Protocol, Step};

/// OpenCode's names: `fusebox-hook opencode`, event ids `oc-…`; a stop aborts the
/// session.
pub const PROTOCOL: Protocol = Protocol {
    agent: "opencode",
    prefix: "oc",
    stop_ends_run: true,
};

/// OpenCode's shell tool.
const SHELL_TOOL: &str = "bash";

/// The plugin hooks the fusebox plugin forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    /// A session (or a sub-agent's child session) was created.
    SessionCreated,
    /// A prompt reached a session.
    ChatMessage,
    ToolExecuteBefore,
    ToolExecuteAfter,
    /// The session's answer is done.
    SessionIdle,
    SessionDeleted,
    Other,
}

impl HookEvent {
    fn parse(name: &str) -> HookEvent {
        match name {
            "session.created" => HookEvent::SessionCreated,
            "chat.message" => HookEvent::ChatMessage,
            "tool.execute.before" => HookEvent::ToolExecuteBefore,
            "tool.execute.after" => HookEvent::ToolExecuteAfter,
            "session.idle" => HookEvent::SessionIdle,
            "session.deleted" => HookEvent::SessionDeleted,
            _ => HookEvent::Other,
        }
    }
}

/// What the plugin sends: the hook's name and OpenCode's own fields, as OpenCode names
/// them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    pub hook: String,
    #[serde(rename = "sessionID")]
    pub session_id: String,
    /// The parent session of a sub-agent's child session (from its `session.created`,
    /// which the plugin keeps).
    #[serde(default, rename = "parentID")]
    pub parent_id: Option<String>,
    /// The root session of a sub-agent's tree (the top of its parents, which the plugin
    /// keeps): its run is the tree's root, which a cluster routes the whole tree by.
    #[serde(default, rename = "rootID")]
    pub root_id: Option<String>,
    #[serde(default, rename = "messageID")]
    pub message_id: Option<String>,
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(default, rename = "callID")]
    pub call_id: Option<String>,
    #[serde(default)]
    pub args: Option<Value>,
    /// `tool.execute.after`: the result's `output`, the text the model reads.
    #[serde(default)]
    pub output: Option<Value>,
}

impl Payload {
    pub fn parse(bytes: &[u8]) -> Result<Payload, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not an OpenCode plugin payload: {e}"))
    }

    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook)
    }

    /// The parent session, when this is a sub-agent's child session.
    pub fn parent(&self) -> Option<&str> {
        self.parent_id.as_deref().filter(|id| !id.is_empty())
    }

    /// The root session of a sub-agent's tree: `rootID`, else the parent (a plugin of
    /// before `rootID`, right for a child of a root session). `None` for a root session.
    pub fn root(&self) -> Option<&str> {
        let parent = self.parent()?;
        Some(
            self.root_id
                .as_deref()
                .filter(|id| !id.is_empty())
                .unwrap_or(parent),
        )
    }

    /// A prompt of the user's: a root session's (a child's is its task).
    pub fn users_prompt(&self) -> bool {
        self.event() == HookEvent::ChatMessage && self.parent().is_none()
    }

    fn call(&self) -> Result<(&str, &str), String> {
        let missing = |field: &str| format!("{} payload without {field}", self.hook);
        let id = self.call_id.as_deref().ok_or_else(|| missing("callID"))?;
        let tool = self.tool.as_deref().ok_or_else(|| missing("tool"))?;
        Ok((id, tool))
    }
}

/// The guard event for a payload of run `run` (the session's current run); `parent_run`
/// is the parent session's current run for a child session. `None` for hooks fusebox
/// has nothing to say about.
pub fn event_for(
    payload: &Payload,
    operations: &Operations,
    tenant: &str,
    run: &str,
    parent_run: Option<&str>,
    agent: &str,
    ts_ms: u64,
) -> Result<Option<Event>, String> {
    let step = match payload.event() {
        // A child session is a sub-agent: a child run, with the session's agent name, so
        // its policy and tool knowledge apply to the sub-agent's calls too.
        HookEvent::SessionCreated => match parent_run {
            Some(parent) => {
                let event =
                    crate::sub_agent_started(PROTOCOL.prefix, tenant, run, parent, agent, ts_ms);
                return checked(event, &payload.hook).map(Some);
            }
            None => Step::SessionStart,
        },
        HookEvent::ChatMessage if payload.users_prompt() => Step::Prompt {
            id: payload
                .message_id
                .as_deref()
                .ok_or_else(|| format!("{} payload without messageID", payload.hook))?,
        },
        HookEvent::ToolExecuteBefore => {
            let (id, tool) = payload.call()?;
            Step::Call {
                id,
                tool,
                input: payload.args.as_ref(),
            }
        }
        // The shell's lines in one order: OpenCode's bash tool joins a command's stdout
        // and stderr in arrival order (seen with `cat status.txt || echo running`: both
        // orders in one run), and a new order would look like a new answer.
        HookEvent::ToolExecuteAfter => {
            let (id, tool) = payload.call()?;
            let output = match &payload.output {
                Some(Value::String(text)) if tool == SHELL_TOOL => {
                    Value::String(lines_in_one_order(text.lines()))
                }
                other => other.clone().unwrap_or(Value::Null),
            };
            Step::Result {
                id,
                tool,
                input: payload.args.as_ref(),
                failure: None,
                output,
            }
        }
        HookEvent::SessionIdle | HookEvent::SessionDeleted if payload.parent().is_some() => {
            Step::SubAgentEnd
        }
        HookEvent::SessionIdle => Step::SessionEnd {
            reason: Some("idle"),
        },
        HookEvent::SessionDeleted => Step::SessionEnd {
            reason: Some("deleted"),
        },
        HookEvent::ChatMessage | HookEvent::Other => return Ok(None),
    };
    let event = PROTOCOL.event(step, operations, tenant, run, agent, ts_ms);
    checked(event, &payload.hook).map(Some)
}

/// The plugin's answers: `action` `allow` (the default when absent), `deny` (throw
/// `reason`) or `stop` (throw `reason`, then abort the session); `context`: words the
/// plugin adds to the call's result for the model.
struct OpenCode;

impl Answers for OpenCode {
    fn deny(&self, reason: &str) -> Value {
        json!({"action": "deny", "reason": reason})
    }

    /// The plugin keeps the words for the call's result (nothing rides on a call that
    /// has not run).
    fn warn(&self, words: &str) -> Value {
        json!({"action": "allow", "context": words})
    }

    fn stop(&self, report: &str) -> Value {
        json!({"action": "stop", "reason": report})
    }

    /// The prompt's hook throws: `opencode run` prints the reason and ends.
    fn prompt_stopped(&self, words: &str) -> Value {
        self.stop(words)
    }
}

/// The answer the plugin acts on for `event`.
pub fn answer(event: HookEvent, outcome: &Outcome) -> Value {
    match (event, outcome) {
        (HookEvent::ToolExecuteBefore, outcome) => before_call(&OpenCode, outcome),
        (HookEvent::ChatMessage, outcome) => before_prompt(&OpenCode, outcome),
        // A stop after a result: the model reads it with the result, and the session
        // is aborted before its next call.
        (HookEvent::ToolExecuteAfter, Outcome::Decided(decision))
            if decision.action == Action::Stop =>
        {
            json!({"action": "stop", "context": message_of(decision), "reason": message_of(decision)})
        }
        (HookEvent::ToolExecuteAfter, Outcome::Decided(decision)) => {
            match observe_context(decision) {
                Some(words) => json!({"context": words}),
                None => json!({}),
            }
        }
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::{Decision, EventBody};

    fn payload(value: Value) -> Payload {
        Payload::parse(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn a_child_sessions_root_is_its_roots_else_its_parent() {
        // (payload, the tree's root session)
        let cases = [
            (
                json!({"hook": "tool.execute.before", "sessionID": "ses_0"}),
                None,
            ),
            (
                json!({"hook": "tool.execute.before", "sessionID": "ses_2", "parentID": "ses_1", "rootID": "ses_0"}),
                Some("ses_0"),
            ),
            // A plugin from before rootID: the parent stands for the root.
            (
                json!({"hook": "tool.execute.before", "sessionID": "ses_1", "parentID": "ses_0"}),
                Some("ses_0"),
            ),
            (
                json!({"hook": "tool.execute.before", "sessionID": "ses_1", "parentID": "ses_0", "rootID": ""}),
                Some("ses_0"),
            ),
        ];
        for (value, root) in cases {
            assert_eq!(payload(value.clone()).root(), root, "{value}");
        }
    }

    fn event(value: Value, parent_run: Option<&str>) -> Option<Event> {
        event_for(
            &payload(value),
            &Operations::default(),
            "t",
            "ses_1",
            parent_run,
            "opencode",
            1,
        )
        .unwrap()
    }

    fn decision(action: &str) -> Decision {
        serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
            "action": action, "message": "said"}))
        .unwrap()
    }

    #[test]
    fn each_hook_is_its_step_of_the_one_shape() {
        // (payload, parent run, expected event id, expected body kind); None: no event.
        let cases = [
            (
                json!({"hook": "session.created", "sessionID": "ses_1"}),
                None,
                Some("oc-session-start"),
                "run_started",
            ),
            (
                json!({"hook": "session.created", "sessionID": "ses_1", "parentID": "ses_0"}),
                Some("ses_0"),
                Some("oc-subagent-start"),
                "run_started",
            ),
            (
                json!({"hook": "chat.message", "sessionID": "ses_1", "messageID": "msg_1"}),
                None,
                Some("oc-prompt-msg_1"),
                "prompt",
            ),
            (
                json!({"hook": "chat.message", "sessionID": "ses_1", "parentID": "ses_0", "messageID": "msg_2"}),
                Some("ses_0"),
                None,
                "",
            ),
            (
                json!({"hook": "tool.execute.before", "sessionID": "ses_1", "callID": "call_1", "tool": "bash", "args": {"command": "ls"}}),
                None,
                Some("oc-call_1-call"),
                "tool_call",
            ),
            (
                json!({"hook": "tool.execute.after", "sessionID": "ses_1", "callID": "call_1", "tool": "bash", "args": {"command": "ls"}, "output": "a\n"}),
                None,
                Some("oc-call_1-result"),
                "tool_result",
            ),
            (
                json!({"hook": "session.idle", "sessionID": "ses_1"}),
                None,
                Some("oc-session-end"),
                "run_finished",
            ),
            (
                json!({"hook": "session.idle", "sessionID": "ses_1", "parentID": "ses_0"}),
                Some("ses_0"),
                Some("oc-subagent-stop"),
                "run_finished",
            ),
            (
                json!({"hook": "session.deleted", "sessionID": "ses_1"}),
                None,
                Some("oc-session-end"),
                "run_finished",
            ),
            (
                json!({"hook": "session.compacted", "sessionID": "ses_1"}),
                None,
                None,
                "",
            ),
        ];
        for (value, parent, id, kind) in cases {
            let got = event(value.clone(), parent);
            assert_eq!(got.as_ref().map(|e| e.id.as_str()), id, "{value}");
            if let Some(event) = got {
                let wire = serde_json::to_value(&event).unwrap();
                assert_eq!(wire["type"], kind, "{value}");
                if let EventBody::RunStarted(started) = &event.body {
                    assert_eq!(started.parent.as_deref(), parent, "{value}");
                }
            }
        }
    }

    #[test]
    fn a_call_without_its_id_is_the_hooks_error() {
        let err = event_for(
            &payload(json!({"hook": "tool.execute.before", "sessionID": "s", "tool": "bash"})),
            &Operations::default(),
            "t",
            "s",
            None,
            "opencode",
            1,
        )
        .unwrap_err();
        assert!(err.contains("callID"), "{err}");
    }

    #[test]
    fn answers_say_what_the_plugin_does() {
        let cases = [
            ("execute", json!({})),
            (
                "warn",
                json!({"action": "allow", "context": "fusebox: said"}),
            ),
            (
                "block",
                json!({"action": "deny", "reason": "fusebox: said"}),
            ),
            ("stop", json!({"action": "stop", "reason": "fusebox: said"})),
        ];
        for (action, expected) in cases {
            let decision = decision(action);
            assert_eq!(
                answer(HookEvent::ToolExecuteBefore, &Outcome::Decided(&decision)),
                expected,
                "{action}"
            );
        }
        let down = |allowed| Outcome::Failed {
            why: "no fuseboxd".into(),
            allowed,
        };
        let denied = answer(HookEvent::ToolExecuteBefore, &down(false));
        assert_eq!(denied["action"], "deny");
        assert!(denied["reason"]
            .as_str()
            .unwrap()
            .contains("could not be asked"));
        assert_eq!(
            answer(HookEvent::ToolExecuteBefore, &down(true))["action"],
            "allow"
        );
        // Only a stopped run refuses a prompt.
        assert_eq!(answer(HookEvent::ChatMessage, &down(false)), json!({}));
        let stop = decision("stop");
        assert_eq!(
            answer(HookEvent::ChatMessage, &Outcome::Decided(&stop))["action"],
            "stop"
        );
    }
}
