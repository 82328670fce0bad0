//! Codex CLI's rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<session>.jsonl`,
//! or under `$CODEX_HOME`), read as written by codex-cli 0.171.0: one JSON record a
//! line, `{timestamp, type, payload}`. What the hook is sent comes from:
//!
//! - `session_meta` → `SessionStart` (the session id is `payload.id`);
//! - `event_msg` / `item_completed` of a `UserMessage` → `UserPromptSubmit` (the turn's
//!   id names the prompt, as the hook's `turn_id` does);
//! - `response_item` / `function_call` → `PreToolUse`. Codex's hooks name its shell
//!   tool `Bash` with `{"command": …}` where the rollout has `exec_command` with
//!   `{"cmd": …}`; any other tool goes by its rollout name and arguments;
//! - `response_item` / `function_call_output` → `PostToolUse`, its output without the
//!   header Codex adds for the model (`Chunk ID`, `Wall time`, … up to `Output:`), which
//!   the hook's `tool_response` does not carry;
//!
//! and the end of the file → `SessionEnd`. Each is mapped by
//! `fusebox_hook::codex::event_for`, the hook's own function. A call the hook refused
//! (`Command blocked by PreToolUse hook: …`) never ran: its output is not sent.
//!
//! Not read yet: sub-agents' rollouts (a child run each, live), compactions, usage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fusebox_core::Event;
use fusebox_hook::codex::{
    as_hooks_name_it, command_output, event_for, run_id, Operations, Payload,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{iso_ms, ImportSummary, SessionReader};

const AGENT: &str = "codex";

/// `$CODEX_HOME/sessions`, else `~/.codex/sessions`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CODEX_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("sessions"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".codex").join("sessions"))
}

pub fn is_session_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("rollout-") && n.ends_with(".jsonl"))
}

#[derive(Deserialize)]
struct Record {
    #[serde(rename = "type")]
    kind: Option<String>,
    timestamp: Option<String>,
    payload: Option<Value>,
}

pub struct Reader {
    tenant: String,
    session: Option<String>,
    /// Calls not answered yet: call id → (tool, input).
    calls: HashMap<String, (String, Value)>,
    last_ms: u64,
    operations: Operations,
}

impl Reader {
    pub fn new(tenant: &str) -> Reader {
        Reader {
            tenant: tenant.to_owned(),
            session: None,
            calls: HashMap::new(),
            last_ms: 0,
            operations: Operations::default(),
        }
    }

    fn send(&self, payload: Value, offset: u64, out: &mut Vec<Event>) -> Result<(), String> {
        let Some(session) = &self.session else {
            return Err("a record before the session's session_meta".to_owned());
        };
        let payload: Payload = serde_json::from_value(payload).map_err(|e| e.to_string())?;
        if let Some(event) = event_for(
            &payload,
            &self.operations,
            &self.tenant,
            &run_id(session),
            AGENT,
            Some(offset),
            self.last_ms,
        )? {
            out.push(event);
        }
        Ok(())
    }
}

/// What Codex answers the model for a call a PreToolUse hook denied.
const BLOCKED: &str = "Command blocked by PreToolUse hook:";

impl SessionReader for Reader {
    fn line(
        &mut self,
        line: &[u8],
        offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let record: Record =
            serde_json::from_slice(line).map_err(|e| format!("not a Codex rollout record: {e}"))?;
        let Some(kind) = record.kind.as_deref() else {
            return Err("a record without a \"type\"".to_owned());
        };
        if let Some(ms) = record.timestamp.as_deref().and_then(iso_ms) {
            self.last_ms = ms;
        }
        let payload = record.payload.unwrap_or(Value::Null);
        let sub = payload.get("type").and_then(Value::as_str).unwrap_or("");
        let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        match (kind, sub) {
            ("session_meta", _) if self.session.is_none() => {
                let id = str_of(&payload, "id")
                    .or_else(|| str_of(&payload, "session_id"))
                    .ok_or("a session_meta without an id")?;
                self.session = Some(id.clone());
                summary.sessions += 1;
                self.send(
                    json!({"session_id": id, "hook_event_name": "SessionStart", "source": "startup"}),
                    offset,
                    out,
                )
            }
            ("event_msg", "item_completed")
                if payload.pointer("/item/type").and_then(Value::as_str) == Some("UserMessage") =>
            {
                let turn = str_of(&payload, "turn_id").ok_or("a user message without a turn_id")?;
                summary.prompts += 1;
                self.send(
                    json!({"session_id": self.session, "hook_event_name": "UserPromptSubmit",
                        "turn_id": turn}),
                    offset,
                    out,
                )
            }
            ("response_item", "function_call") => {
                let id = str_of(&payload, "call_id").ok_or("a function_call without a call_id")?;
                let name = str_of(&payload, "name").unwrap_or_default();
                let args: Value = payload
                    .get("arguments")
                    .and_then(Value::as_str)
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or(Value::Null);
                let (tool, input) = as_hooks_name_it(&name, args);
                summary.calls += 1;
                self.send(
                    json!({"session_id": self.session, "hook_event_name": "PreToolUse",
                        "tool_name": tool, "tool_use_id": id, "tool_input": input}),
                    offset,
                    out,
                )?;
                self.calls.insert(id, (tool, input));
                Ok(())
            }
            ("response_item", "function_call_output") => {
                let id = str_of(&payload, "call_id").unwrap_or_default();
                let text = str_of(&payload, "output").unwrap_or_default();
                let Some((tool, input)) = self.calls.remove(&id) else {
                    summary.skipped_results += 1;
                    return Ok(());
                };
                if text.starts_with(BLOCKED) {
                    summary.skipped_results += 1;
                    return Ok(());
                }
                summary.results += 1;
                self.send(
                    json!({"session_id": self.session, "hook_event_name": "PostToolUse",
                        "tool_name": tool, "tool_use_id": id, "tool_input": input,
                        "tool_response": command_output(&text)}),
                    offset,
                    out,
                )
            }
            _ => {
                let name = if sub.is_empty() {
                    kind.to_owned()
                } else {
                    format!("{kind}/{sub}")
                };
                *summary.ignored.entry(name).or_default() += 1;
                Ok(())
            }
        }
    }

    fn end(&mut self, _summary: &mut ImportSummary, out: &mut Vec<Event>) {
        if self.session.is_some() {
            let payload = json!({"session_id": self.session, "hook_event_name": "SessionEnd",
                "reason": "other"});
            // A SessionEnd payload always maps; an error here would be the hook's.
            let _ = self.send(payload, 0, out);
        }
        self.session = None;
        self.calls.clear();
    }
}

#[cfg(test)]
mod tests {
    //! Against a rollout codex-cli 0.171.0 wrote in the hook suite's runaway
    //! (tests/py/codex/test_codex_history_import.py's scenario, hook-gated: the calls
    //! refused are in it as `Command blocked by PreToolUse hook` outputs).

    use std::path::PathBuf;
    use std::sync::mpsc;

    use fusebox_core::{Engine, EventBody, PolicySet};

    use crate::history::{read_and_admit, Agent, Import};
    use crate::replay::Admitted;

    #[test]
    fn a_rollout_becomes_the_hooks_events_and_decisions() {
        let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/codex/rollout-runaway.jsonl");
        let (sender, batches) = mpsc::sync_channel::<Admitted>(1024);
        let (_, spent) = mpsc::channel();
        let import = Import {
            agent: Agent::Codex,
            paths: vec![file],
            tenant: "t".to_owned(),
        };
        let summary = read_and_admit(import, sender, spent).unwrap();
        let events: Vec<_> = batches.into_iter().flat_map(|b| b.events).collect();
        assert_eq!(
            (summary.sessions, summary.calls, summary.results),
            (1, 10, 3)
        );
        assert_eq!(summary.skipped_results, 7);
        let mut engine = Engine::new(PolicySet::default());
        let got: Vec<(String, &str)> = events
            .iter()
            .map(|e| (e.id.clone(), engine.apply(e).action.as_str()))
            .collect();
        let call = |n: u32, action| (format!("cx-call_{n}-call"), action);
        let result = |n: u32| (format!("cx-call_{n}-result"), "continue");
        let mut expected = vec![
            ("cx-session-start".to_owned(), "continue"),
            (got[1].0.clone(), "continue"),
            call(1, "execute"),
            result(1),
            call(2, "execute"),
            result(2),
            call(3, "warn"),
            result(3),
            call(4, "block"),
            call(5, "block"),
            call(6, "stop"),
        ];
        // The calls after the stop, which the live hook denied on its own.
        expected.extend((7..=10).map(|n| call(n, "stop")));
        expected.push(("cx-session-end".to_owned(), "continue"));
        assert_eq!(got, expected);
        assert!(got[1].0.starts_with("cx-prompt-"), "{got:?}");
        // The shell call as Codex's hooks name it, not as the rollout does.
        let EventBody::ToolCall(first) = &events[2].body else {
            panic!("{:?}", events[2]);
        };
        assert_eq!(first.tool, "Bash");
        assert_eq!(events[0].run, "01a24308-7848-7bc1-b4e2-83963ba026dd");
    }
}
