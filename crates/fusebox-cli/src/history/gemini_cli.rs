//! Gemini CLI's chats (`~/.gemini/tmp/<project>/chats/session-*.jsonl`), read as
//! written by 0.61.0: a first line with the session (`sessionId`, `kind`), then messages
//! (`{id, timestamp, type: user|gemini, content, toolCalls}`, a message written again
//! as it grows) and `$set` updates. What the hook is sent comes from:
//!
//! - the first line → `SessionStart` (a `main` session; a sub-agent's chat is not one);
//! - a `user` message of text, not Gemini CLI's own `<session_context>` → `BeforeAgent`
//!   (the prompt);
//! - each tool call of a `gemini` message, the first time it is written → `BeforeTool`,
//!   numbered `g1`, `g2` … in session order as the hook's call book numbers them (a call
//!   the hook refused was numbered too: it was asked);
//! - a `user` message's `functionResponse` → `AfterTool`, its `output` as the
//!   `llmContent` the hook reads (without the `<hook_context>` a hook's words added
//!   after it), its `error` as the error;
//!
//! and the end of the file → `SessionEnd`. Each is mapped by
//! `fusebox_hook::gemini_cli::event_for`, the hook's own function. A call a hook refused
//! (`Tool execution blocked: …`) never ran and gets no result.
//!
//! The prompt's event id differs from the live one (the hook names a prompt by its
//! payload's timestamp, which the chat does not keep); a prompt's id is only its dedup
//! key, so its decision does not change.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use fusebox_core::Event;
use fusebox_hook::gemini_cli::{event_for, run_id, Operations, Payload};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{iso_ms, ImportSummary, SessionReader};

const AGENT: &str = "gemini-cli";

/// `~/.gemini/tmp`: one directory per project, its chats under `chats/`.
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".gemini").join("tmp"))
}

pub fn is_session_file(path: &Path) -> bool {
    let in_chats = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|n| n == "chats");
    in_chats && path.extension().is_some_and(|ext| ext == "jsonl")
}

#[derive(Deserialize)]
struct Record {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
    kind: Option<String>,
    #[serde(rename = "type")]
    message: Option<String>,
    timestamp: Option<String>,
    content: Option<Value>,
    #[serde(rename = "toolCalls")]
    tool_calls: Option<Vec<Value>>,
    #[serde(rename = "$set")]
    set: Option<Value>,
}

pub struct Reader {
    tenant: String,
    session: Option<String>,
    /// Tool call id → (book id, tool, input): calls asked and not answered yet.
    calls: HashMap<String, (String, String, Value)>,
    seen: HashSet<String>,
    booked: u64,
    /// This file is not a main session's chat: every line of it is ignored.
    other_chat: bool,
    last_ms: u64,
    operations: Operations,
}

impl Reader {
    pub fn new(tenant: &str) -> Reader {
        Reader {
            tenant: tenant.to_owned(),
            session: None,
            calls: HashMap::new(),
            seen: HashSet::new(),
            booked: 0,
            other_chat: false,
            last_ms: 0,
            operations: Operations::default(),
        }
    }

    fn send(
        &self,
        payload: Value,
        call_id: Option<&str>,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let Some(session) = &self.session else {
            return Err("a message before the session's first line".to_owned());
        };
        let payload: Payload = serde_json::from_value(payload).map_err(|e| e.to_string())?;
        if let Some(event) = event_for(
            &payload,
            &self.operations,
            &self.tenant,
            &run_id(session),
            AGENT,
            call_id,
            self.last_ms,
        )? {
            out.push(event);
        }
        Ok(())
    }

    fn results(
        &mut self,
        blocks: &[Value],
        timestamp: &str,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        for block in blocks {
            let Some(response) = block.get("functionResponse") else {
                continue;
            };
            let id = response.get("id").and_then(Value::as_str).unwrap_or("");
            let Some((book_id, tool, input)) = self.calls.remove(id) else {
                summary.skipped_results += 1;
                continue;
            };
            let answer = response.get("response").cloned().unwrap_or(Value::Null);
            let error = answer.get("error").and_then(Value::as_str);
            if error.is_some_and(|e| e.starts_with(BLOCKED)) {
                summary.skipped_results += 1;
                continue;
            }
            let output = answer
                .get("output")
                .and_then(Value::as_str)
                .map(without_hook_context);
            let tool_response = match error {
                Some(error) => json!({"llmContent": output.unwrap_or(error), "error": error}),
                None => json!({"llmContent": output.map_or(answer.clone(), |o| json!(o))}),
            };
            summary.results += 1;
            self.send(
                json!({"session_id": self.session, "hook_event_name": "AfterTool",
                    "timestamp": timestamp, "tool_name": tool, "tool_input": input,
                    "tool_response": tool_response}),
                Some(&book_id),
                out,
            )?;
        }
        Ok(())
    }
}

/// What Gemini CLI tells the model of a call a BeforeTool hook denied.
const BLOCKED: &str = "Tool execution blocked:";

/// A result as the tool gave it: Gemini CLI appends a hook's words after it
/// (`<hook_context>…</hook_context>`), which the hook itself never read.
fn without_hook_context(text: &str) -> &str {
    match text.find("\n\n<hook_context>") {
        Some(at) => &text[..at],
        None => text,
    }
}

impl SessionReader for Reader {
    fn line(
        &mut self,
        line: &[u8],
        _offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let record: Record = serde_json::from_slice(line)
            .map_err(|e| format!("not a Gemini CLI chat record: {e}"))?;
        if let Some(ms) = record.timestamp.as_deref().and_then(iso_ms) {
            self.last_ms = ms;
        }
        if record.set.is_some() {
            *summary.ignored.entry("$set".to_owned()).or_default() += 1;
            return Ok(());
        }
        if let (Some(_), None) = (&record.session_id, &record.message) {
            if self.session.is_some() {
                *summary.ignored.entry("session".to_owned()).or_default() += 1;
                return Ok(());
            }
            if record.kind.as_deref().is_some_and(|k| k != "main") {
                // A sub-agent's chat: its calls are the session's live (Gemini CLI's
                // sub-agents stay in their session's run), not read yet.
                self.other_chat = true;
            }
        }
        if self.other_chat {
            *summary
                .ignored
                .entry("sub-agent chat".to_owned())
                .or_default() += 1;
            return Ok(());
        }
        if let (Some(session), None) = (&record.session_id, &record.message) {
            self.session = Some(session.clone());
            summary.sessions += 1;
            return self.send(
                json!({"session_id": session, "hook_event_name": "SessionStart",
                    "source": "startup"}),
                None,
                out,
            );
        }
        let Some(kind) = record.message.as_deref() else {
            return Err("a record that is neither the session, a message nor an update".to_owned());
        };
        let timestamp = record.timestamp.clone().unwrap_or_default();
        match kind {
            "user" => {
                let blocks = record
                    .content
                    .as_ref()
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if blocks.iter().any(|b| b.get("functionResponse").is_some()) {
                    return self.results(&blocks, &timestamp, summary, out);
                }
                let text: String = blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect();
                if text.starts_with("<session_context>") {
                    *summary
                        .ignored
                        .entry("session_context".to_owned())
                        .or_default() += 1;
                    return Ok(());
                }
                summary.prompts += 1;
                self.send(
                    json!({"session_id": self.session, "hook_event_name": "BeforeAgent",
                        "timestamp": timestamp}),
                    None,
                    out,
                )
            }
            "gemini" => {
                for call in record.tool_calls.iter().flatten() {
                    let id = call.get("id").and_then(Value::as_str).unwrap_or("");
                    if !self.seen.insert(id.to_owned()) {
                        continue;
                    }
                    let tool = call.get("name").and_then(Value::as_str).unwrap_or("");
                    let input = call.get("args").cloned().unwrap_or(Value::Null);
                    self.booked += 1;
                    let book_id = format!("g{}", self.booked);
                    summary.calls += 1;
                    self.send(
                        json!({"session_id": self.session, "hook_event_name": "BeforeTool",
                            "timestamp": timestamp, "tool_name": tool, "tool_input": input}),
                        Some(&book_id),
                        out,
                    )?;
                    self.calls
                        .insert(id.to_owned(), (book_id, tool.to_owned(), input));
                }
                Ok(())
            }
            other => {
                *summary.ignored.entry(other.to_owned()).or_default() += 1;
                Ok(())
            }
        }
    }

    fn end(&mut self, _summary: &mut ImportSummary, out: &mut Vec<Event>) {
        if self.session.is_some() {
            let payload = json!({"session_id": self.session, "hook_event_name": "SessionEnd",
                "reason": "exit"});
            // A SessionEnd payload always maps; an error here would be the hook's.
            let _ = self.send(payload, None, out);
        }
        self.session = None;
        self.calls.clear();
        self.seen.clear();
        self.booked = 0;
        self.other_chat = false;
    }
}

#[cfg(test)]
mod tests {
    //! Against a chat Gemini CLI 0.61.0 wrote in the hook suite's runaway
    //! (tests/py/gemini_cli/test_gemini_cli_history_import.py's scenario, hook-gated:
    //! the calls refused are in it as `Tool execution blocked` errors).

    use std::path::PathBuf;
    use std::sync::mpsc;

    use fusebox_core::{Engine, PolicySet};

    use crate::history::{read_and_admit, Agent, Import};
    use crate::replay::Admitted;

    #[test]
    fn a_chat_becomes_the_hooks_events_and_decisions() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemini-cli");
        let (sender, batches) = mpsc::sync_channel::<Admitted>(1024);
        let (_, spent) = mpsc::channel();
        let import = Import {
            agent: Agent::GeminiCli,
            paths: vec![dir],
            tenant: "t".to_owned(),
        };
        let summary = read_and_admit(import, sender, spent).unwrap();
        let events: Vec<_> = batches.into_iter().flat_map(|b| b.events).collect();
        assert_eq!(
            (
                summary.sessions,
                summary.calls,
                summary.results,
                summary.prompts
            ),
            (1, 6, 3, 1)
        );
        let mut engine = Engine::new(PolicySet::default());
        let got: Vec<(String, &str)> = events
            .iter()
            .map(|e| (e.id.clone(), engine.apply(e).action.as_str()))
            .collect();
        let call = |n: u32, action| (format!("gm-g{n}-call"), action);
        let result = |n: u32| (format!("gm-g{n}-result"), "continue");
        let expected = vec![
            ("gm-session-start".to_owned(), "continue"),
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
            ("gm-session-end".to_owned(), "continue"),
        ];
        assert_eq!(got, expected);
        assert!(got[1].0.starts_with("gm-prompt-"), "{got:?}");
        assert!(events
            .iter()
            .all(|e| e.run == "cc31dfdf-9b49-476d-b688-96937a3b1060"));
    }

    #[test]
    fn a_hooks_words_after_a_result_are_not_the_result() {
        for (text, result) in [
            (
                "Output: running\n\n<hook_context>fusebox: warned</hook_context>",
                "Output: running",
            ),
            ("Output: running", "Output: running"),
        ] {
            assert_eq!(super::without_hook_context(text), result);
        }
    }
}
