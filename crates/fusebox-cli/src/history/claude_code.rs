//! Claude Code's project transcripts (`~/.claude/projects/<project>/<session>.jsonl`,
//! or under `$CLAUDE_CONFIG_DIR`), read as written by 2.1.327: one JSON record a line,
//! `type` saying which. What the hook is sent comes from four of them:
//!
//! - the session's first record → `SessionStart` (its run's `run_started`);
//! - a `user` record whose content is the prompt's text → `UserPromptSubmit` (its
//!   `promptId`, and `promptSource` as the payload's `source`);
//! - an `assistant` record's `tool_use` blocks → `PreToolUse`;
//! - a `user` record's `tool_result` blocks → `PostToolUse` with `toolUseResult` as the
//!   `tool_response` (the same object the hook gets), or `PostToolUseFailure` with the
//!   block's text as the `error` when `is_error`;
//! - a `system` record of subtype `compact_boundary` → `PreCompact` (its trigger; its
//!   byte offset stands for the transcript's length the live hook reads);
//!
//! and the end of the file → `SessionEnd`: a `claude -p` run fires it as it exits, and
//! `tune` calibrates only on runs that ended.
//!
//! Each is built as the hook payload and mapped by `fusebox_hook::claude_code::event_for`,
//! the hook's own function. A call a PreToolUse hook refused never ran and fired no
//! PostToolUse, but the transcript holds its refusal as an error result
//! (`PreToolUse:Bash hook error: …`): that result is not sent, or an imported hook-gated
//! session would count errors the live one never saw.
//!
//! A sub-agent the main agent waited for (an Agent call whose result names it) is read
//! from its own transcript (`<session>/subagents/agent-<id>.jsonl`) between that call
//! and its result, in a child run of the session's, as its hooks reached the guard.
//!
//! Not read yet: background sub-agents, sub-agents kept inline (`isSidechain`) by older
//! versions, and model usage, which the hook is never told either.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use fusebox_core::Event;
use fusebox_hook::claude_code::{event_for, run_id, Operations, Payload};
use fusebox_hook::{sub_agent_run, sub_agent_started};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{iso_ms, ImportSummary, SessionReader};

/// Claude Code's agent name: the runs' agent, so `[agents.claude-code.policy]` and the
/// built-in tool knowledge apply as they do to the hook's runs.
const AGENT: &str = "claude-code";

/// `$CLAUDE_CONFIG_DIR/projects`, else `~/.claude/projects`.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("projects"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".claude").join("projects"))
}

/// A session's own directory holds its sub-agents' transcripts (`subagents/`) and tool
/// results kept aside; they are not sessions.
pub fn skip_dir(dir: &Path) -> bool {
    dir.file_name().is_some_and(|name| name == "subagents")
}

pub fn is_session_file(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == "jsonl")
}

/// What every record is first read as: its kind and time, everything else skipped
/// without being built (most lines — attachments, API request shapes — are large and
/// say nothing the hook would have said, so this pass is most of an import's time).
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: Option<String>,
    timestamp: Option<String>,
    subtype: Option<String>,
}

/// The fields of a record the import reads, read only for the kinds that matter; serde
/// skips the rest.
#[derive(Deserialize)]
struct Record {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
    #[serde(rename = "isSidechain", default)]
    is_sidechain: bool,
    #[serde(rename = "isMeta", default)]
    is_meta: bool,
    #[serde(rename = "promptId")]
    prompt_id: Option<String>,
    #[serde(rename = "promptSource")]
    prompt_source: Option<String>,
    message: Option<Message>,
    #[serde(rename = "toolUseResult")]
    tool_use_result: Option<Value>,
    #[serde(rename = "compactMetadata")]
    compact_metadata: Option<Value>,
    /// A sub-agent's records carry its id.
    #[serde(rename = "agentId")]
    agent_id: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    content: Option<Value>,
}

/// The record types this version writes that say nothing the hook would have said.
/// Any other type is counted as ignored too, under its own name, so a new kind shows
/// in the summary instead of passing unseen.
pub struct Reader {
    tenant: String,
    /// The session's directory beside its transcript (`<session>/subagents/…`).
    session_dir: PathBuf,
    /// Reading a sub-agent's transcript: its id, its run; the session's run is
    /// its parent.
    sub_agent: Option<(String, String)>,
    /// Bad lines of sub-agents' transcripts, with their places.
    rejected: Vec<String>,
    /// Sessions of this file whose start was sent, in order of first sight.
    started: Vec<String>,
    started_set: HashSet<String>,
    /// Calls seen and not answered yet: tool use id → (tool, input), for the result's
    /// payload, which carries both.
    calls: HashMap<String, (String, Value)>,
    /// The last time seen, for records that carry none.
    last_ms: u64,
    operations: Operations,
}

impl Reader {
    pub fn new(tenant: &str, file: &Path) -> Reader {
        Reader {
            tenant: tenant.to_owned(),
            session_dir: file.with_extension(""),
            sub_agent: None,
            rejected: Vec::new(),
            started: Vec::new(),
            started_set: HashSet::new(),
            calls: HashMap::new(),
            last_ms: 0,
            operations: Operations::default(),
        }
    }

    /// The hook's mapping of `payload` for the session `session`.
    /// (While a sub-agent's transcript is read: for its run, the payload carrying its id
    /// as the hook's does.)
    fn send(
        &self,
        mut payload: Value,
        session: &str,
        offset: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let run = match &self.sub_agent {
            Some((agent_id, run)) => {
                payload["agent_id"] = json!(agent_id);
                run.clone()
            }
            None => run_id(session),
        };
        let payload: Payload = serde_json::from_value(payload).map_err(|e| e.to_string())?;
        if let Some(event) = event_for(
            &payload,
            &self.operations,
            &self.tenant,
            &run,
            AGENT,
            Some(offset),
            self.last_ms,
        )? {
            out.push(event);
        }
        Ok(())
    }

    fn start(
        &mut self,
        session: &str,
        offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        if self.started_set.insert(session.to_owned()) {
            self.started.push(session.to_owned());
            summary.sessions += 1;
            let payload = json!({"session_id": session, "hook_event_name": "SessionStart",
                "source": "startup"});
            self.send(payload, session, offset, out)?;
        }
        Ok(())
    }

    fn user(
        &mut self,
        record: &Record,
        session: &str,
        offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let Some(content) = record.message.as_ref().and_then(|m| m.content.as_ref()) else {
            return Ok(());
        };
        let results: Vec<&Value> = match content {
            Value::Array(blocks) => blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                .collect(),
            _ => Vec::new(),
        };
        if results.is_empty() {
            // The prompt's text (a string, or text blocks). Meta records (a slash
            // command's expansion, caveats) are Claude Code's own, not a prompt.
            if record.is_meta {
                return Ok(());
            }
            let Some(prompt_id) = record.prompt_id.as_deref() else {
                return Ok(());
            };
            // A sub-agent's task is no prompt of the user's (the hook sends none for it).
            if self.sub_agent.is_none() {
                summary.prompts += 1;
            }
            let payload = json!({"session_id": session, "hook_event_name": "UserPromptSubmit",
                "prompt_id": prompt_id, "source": record.prompt_source,
                "prompt": text_of(content)});
            return self.send(payload, session, offset, out);
        }
        for block in results {
            let id = block
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some((tool, input)) = self.calls.remove(id) else {
                summary.skipped_results += 1;
                continue;
            };
            let is_error = block.get("is_error").and_then(Value::as_bool) == Some(true);
            let text = block.get("content").map(text_of).unwrap_or_default();
            if is_error && refused_by_hook(&text) {
                summary.skipped_results += 1;
                continue;
            }
            if !is_error && self.sub_agent.is_none() {
                if let Some(agent_id) = ran_sub_agent(&tool, record.tool_use_result.as_ref()) {
                    self.sub_agent_transcript(session, &agent_id, summary, out);
                }
            }
            summary.results += 1;
            let payload = if is_error {
                json!({"session_id": session, "hook_event_name": "PostToolUseFailure",
                    "tool_name": tool, "tool_use_id": id, "tool_input": input,
                    "error": text, "is_interrupt": text.contains(INTERRUPTED)})
            } else {
                // The structured response the hook is sent; a record without one (older
                // versions) has the block's content.
                let response = record
                    .tool_use_result
                    .clone()
                    .unwrap_or_else(|| block.get("content").cloned().unwrap_or(Value::Null));
                json!({"session_id": session, "hook_event_name": "PostToolUse",
                    "tool_name": tool, "tool_use_id": id, "tool_input": input,
                    "tool_response": response})
            };
            self.send(payload, session, offset, out)?;
        }
        Ok(())
    }
}

impl Reader {
    /// The sub-agent an Agent call ran reaches the guard between the call and its
    /// result, as live: its start (SubagentStart), its transcript's calls and results in
    /// its own run, a child of the session's, and its end (SubagentStop).
    fn sub_agent_transcript(
        &mut self,
        session: &str,
        agent_id: &str,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) {
        let file = self
            .session_dir
            .join("subagents")
            .join(format!("agent-{agent_id}.jsonl"));
        let Ok(text) = std::fs::read(&file) else {
            // Not kept (an older version kept sub-agents inline, as sidechain records of
            // the session's file, which are not read): the Agent call alone is sent.
            *summary
                .ignored
                .entry("sub-agent not found".to_owned())
                .or_default() += 1;
            return;
        };
        let parent = run_id(session);
        let run = sub_agent_run(&parent, agent_id);
        // The sub-agent ran before the result that reports it was written: its start is
        // its transcript's first time, and the result keeps its own.
        let result_ms = self.last_ms;
        let began = iso_ms(&super::began(&file)).unwrap_or(result_ms);
        out.push(sub_agent_started(
            PREFIX,
            &self.tenant,
            &run,
            &parent,
            AGENT,
            began,
        ));
        let outer_calls = std::mem::take(&mut self.calls);
        self.sub_agent = Some((agent_id.to_owned(), run));
        let mut offset = 0u64;
        for (number, line) in text.split_inclusive(|b| *b == b'\n').enumerate() {
            summary.lines += 1;
            summary.bytes += line.len() as u64;
            if !line.iter().all(u8::is_ascii_whitespace) {
                if let Err(why) = self.line(line, offset, summary, out) {
                    summary.bad_lines += 1;
                    self.rejected
                        .push(format!("{}:{}: {why}", file.display(), number + 1));
                }
            }
            offset += line.len() as u64;
        }
        let stop = json!({"session_id": session, "hook_event_name": "SubagentStop"});
        if let Err(why) = self.send(stop, session, offset, out) {
            self.rejected.push(format!("{}: {why}", file.display()));
        }
        self.sub_agent = None;
        self.calls = outer_calls;
        self.last_ms = result_ms;
    }
}

/// The event id prefix of Claude Code's hook (`cc-…`).
const PREFIX: &str = "cc";

/// The sub-agent a main agent's Agent call ran and waited for (`toolUseResult.agentId`;
/// not a background launch, whose sub-agent runs on beside the session: not read yet).
fn ran_sub_agent(tool: &str, result: Option<&Value>) -> Option<String> {
    if !matches!(tool, "Agent" | "Task") {
        return None;
    }
    let result = result?;
    let launched = result.get("isAsync") == Some(&Value::Bool(true))
        || result.get("status").and_then(Value::as_str) == Some("async_launched");
    result
        .get("agentId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty() && !launched)
        .map(str::to_owned)
}

/// What Claude Code writes for a call the user interrupted.
const INTERRUPTED: &str = "[Request interrupted by user";

/// A result Claude Code made of a PreToolUse hook's refusal (2.1.327:
/// `PreToolUse:<Tool> hook error: <reason>`): the call never ran.
fn refused_by_hook(text: &str) -> bool {
    text.starts_with("PreToolUse:") && text.contains(" hook error: ")
}

/// A content value's text: a string, or its text blocks joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

impl SessionReader for Reader {
    fn line(
        &mut self,
        line: &[u8],
        offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let head: Head = serde_json::from_slice(line)
            .map_err(|e| format!("not a Claude Code transcript record: {e}"))?;
        let Some(kind) = head.kind.as_deref() else {
            return Err("a record without a \"type\"".to_owned());
        };
        if let Some(ms) = head.timestamp.as_deref().and_then(iso_ms) {
            self.last_ms = ms;
        }
        let relevant = matches!(kind, "user" | "assistant")
            || (kind == "system" && head.subtype.as_deref() == Some("compact_boundary"));
        if !relevant {
            *summary.ignored.entry(kind.to_owned()).or_default() += 1;
            return Ok(());
        }
        // The line parsed once already: this second pass cannot fail on its syntax.
        let record: Record = serde_json::from_slice(line)
            .map_err(|e| format!("not a Claude Code transcript record: {e}"))?;
        // A sub-agent's records are sidechain ones: read while its transcript is (and
        // only its own), skipped in the session's file.
        let ours = match &self.sub_agent {
            Some((agent_id, _)) => record.agent_id.as_deref() == Some(agent_id.as_str()),
            None => !record.is_sidechain,
        };
        let session = match (&record.session_id, relevant) {
            (Some(session), true) if ours => session.clone(),
            _ => {
                *summary.ignored.entry(kind.to_owned()).or_default() += 1;
                return Ok(());
            }
        };
        if self.sub_agent.is_none() {
            self.start(&session, offset, summary, out)?;
        }
        match kind {
            "user" => self.user(&record, &session, offset, summary, out),
            "assistant" => {
                let blocks = record
                    .message
                    .as_ref()
                    .and_then(|m| m.content.as_ref())
                    .and_then(Value::as_array);
                for block in blocks.into_iter().flatten() {
                    if block.get("type").and_then(Value::as_str) != Some("tool_use") {
                        continue;
                    }
                    let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                    let tool = block.get("name").and_then(Value::as_str).unwrap_or("");
                    let input = block.get("input").cloned().unwrap_or(Value::Null);
                    summary.calls += 1;
                    let payload = json!({"session_id": session, "hook_event_name": "PreToolUse",
                        "tool_name": tool, "tool_use_id": id, "tool_input": input});
                    self.send(payload, &session, offset, out)?;
                    self.calls.insert(id.to_owned(), (tool.to_owned(), input));
                }
                Ok(())
            }
            _ => {
                summary.compactions += 1;
                let trigger = record
                    .compact_metadata
                    .as_ref()
                    .and_then(|m| m.get("trigger"))
                    .cloned()
                    .unwrap_or(Value::Null);
                let payload = json!({"session_id": session, "hook_event_name": "PreCompact",
                    "trigger": trigger});
                self.send(payload, &session, offset, out)
            }
        }
    }

    fn take_rejected(&mut self) -> Vec<String> {
        std::mem::take(&mut self.rejected)
    }

    fn end(&mut self, _summary: &mut ImportSummary, out: &mut Vec<Event>) {
        for session in std::mem::take(&mut self.started) {
            let payload = json!({"session_id": session, "hook_event_name": "SessionEnd",
                "reason": "other"});
            // A SessionEnd payload always maps; an error here would be the hook's.
            let _ = self.send(payload, &session, 0, out);
        }
        self.started_set.clear();
        self.calls.clear();
    }
}

#[cfg(test)]
mod tests {
    //! Against transcripts the real Claude Code 2.1.327 wrote in the hook suite
    //! (tests/py/claude_code/test_history_import.py's scenarios, hook-gated: the
    //! runaway's refused calls are in it as `PreToolUse:Bash hook error` results).

    use std::path::PathBuf;
    use std::sync::mpsc;

    use fusebox_core::{Engine, Event, EventBody, PolicySet};

    use crate::history::{read_and_admit, Agent, Import, ImportSummary};
    use crate::replay::Admitted;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/claude-code")
            .join(name)
    }

    /// Everything an import of `paths` sends, and what it refused.
    fn import(paths: Vec<PathBuf>) -> (Vec<Event>, Vec<String>, ImportSummary) {
        let (sender, batches) = mpsc::sync_channel::<Admitted>(1024);
        let (_, spent) = mpsc::channel();
        let import = Import {
            agent: Agent::ClaudeCode,
            paths,
            tenant: "t".to_owned(),
        };
        let summary = read_and_admit(import, sender, spent).unwrap();
        let (mut events, mut rejected) = (Vec::new(), Vec::new());
        for batch in batches {
            events.extend(batch.events);
            rejected.extend(batch.rejected);
        }
        (events, rejected, summary)
    }

    /// Each event's type and id, and the engine's action for it (balanced preset).
    fn decided(events: &[Event]) -> Vec<(String, String)> {
        let mut engine = Engine::new(PolicySet::default());
        events
            .iter()
            .map(|event| {
                let decision = engine.apply(event);
                let kind = match &event.body {
                    EventBody::RunStarted(_) => "run_started",
                    EventBody::Prompt(_) => "prompt",
                    EventBody::ToolCall(_) => "tool_call",
                    EventBody::ToolResult(_) => "tool_result",
                    EventBody::RunFinished(_) => "run_finished",
                    _ => "other",
                };
                (
                    format!("{kind} {}", event.id),
                    decision.action.as_str().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_transcript_becomes_the_hooks_events_and_decisions() {
        let session = "c4ce8dbd-e9b9-43d6-9bb3-916ca7f2de6b";
        let cases: [(&str, Vec<(&str, &str)>); 2] = [
            (
                "runaway.jsonl",
                vec![
                    ("run_started cc-session-start", "continue"),
                    ("prompt cc-prompt-", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("tool_call cc-toolu_", "warn"),
                    ("tool_result cc-toolu_", "continue"),
                    // Refused by the hook: no result follows (it never ran).
                    ("tool_call cc-toolu_", "block"),
                    ("tool_call cc-toolu_", "block"),
                    ("tool_call cc-toolu_", "stop"),
                    // The end of a run already stopped changes nothing.
                    ("run_finished cc-session-end", "continue"),
                ],
            ),
            (
                "legitimate.jsonl",
                vec![
                    ("run_started cc-session-start", "continue"),
                    ("prompt cc-prompt-", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    // `false`: a PostToolUseFailure, a retryable tool error.
                    ("tool_result cc-toolu_", "retry_after"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("tool_call cc-toolu_", "execute"),
                    ("tool_result cc-toolu_", "continue"),
                    ("run_finished cc-session-end", "complete"),
                ],
            ),
        ];
        for (file, expected) in cases {
            let (events, rejected, summary) = import(vec![fixture(file)]);
            assert!(rejected.is_empty(), "{file}: {rejected:?}");
            assert_eq!(summary.sessions, 1, "{file}");
            let got = decided(&events);
            assert_eq!(got.len(), expected.len(), "{file}: {got:#?}");
            for ((event, action), (prefix, want)) in got.iter().zip(&expected) {
                assert!(event.starts_with(prefix), "{file}: {event} is not {prefix}");
                assert_eq!(action, want, "{file}: {event}");
            }
            // The hook's run id rule (a UUID session id is the run) and agent name.
            assert!(events.iter().all(|e| e.tenant == "t"));
            match &events[0].body {
                EventBody::RunStarted(started) => {
                    assert_eq!(started.agent.as_deref(), Some("claude-code"))
                }
                other => panic!("{file}: first event {other:?}"),
            }
            // Times are the transcript's, in order.
            assert!(
                events.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms),
                "{file}"
            );
            assert!(events[0].ts_ms > 1_700_000_000_000, "{file}");
            if file == "runaway.jsonl" {
                assert!(events.iter().all(|e| e.run == session));
                assert_eq!(summary.skipped_results, 3);
            }
        }
    }

    /// A sub-agent the main agent waited for (tests/py/claude_code's child-run scenario,
    /// 2.1.327): its transcript is read between the Agent call and its result, in a
    /// child run of the session's, opened and finished as the hook does.
    #[test]
    fn a_sub_agents_transcript_goes_between_its_agent_call_and_result() {
        let session = "c96429e4-725f-4de0-92d2-f4c2648722ae";
        let child = format!("{session}-a3868ca11c1625c6c");
        let file = fixture("sub-agent").join(format!("{session}.jsonl"));
        let (events, rejected, summary) = import(vec![file]);
        assert!(rejected.is_empty(), "{rejected:?}");
        assert_eq!(
            (summary.sessions, summary.calls, summary.prompts),
            (1, 4, 1)
        );
        let runs: Vec<(&str, String)> = events
            .iter()
            .map(|e| {
                (
                    if e.run == session { "main" } else { "child" },
                    e.id.clone(),
                )
            })
            .collect();
        let expected = [
            ("main", "cc-session-start"),
            ("main", "cc-prompt-"),
            ("main", "cc-toolu_5753e306_00001_0-call"),
            ("child", "cc-subagent-start"),
            ("child", "cc-toolu_5753e306_00002_0-call"),
            ("child", "cc-toolu_5753e306_00002_0-result"),
            ("child", "cc-toolu_5753e306_00003_0-call"),
            ("child", "cc-toolu_5753e306_00003_0-result"),
            ("child", "cc-subagent-stop"),
            ("main", "cc-toolu_5753e306_00001_0-result"),
            ("main", "cc-toolu_5753e306_00005_0-call"),
            ("main", "cc-toolu_5753e306_00005_0-result"),
            ("main", "cc-session-end"),
        ];
        assert_eq!(runs.len(), expected.len(), "{runs:#?}");
        for ((run, id), (want_run, want_id)) in runs.iter().zip(expected) {
            assert!(*run == want_run && id.starts_with(want_id), "{run} {id}");
        }
        assert!(events.iter().all(|e| e.run == session || e.run == child));
        match &events[3].body {
            EventBody::RunStarted(started) => {
                assert_eq!(started.parent.as_deref(), Some(session));
                assert_eq!(started.agent.as_deref(), Some("claude-code"));
            }
            other => panic!("{other:?}"),
        }
        // Times never go back: the child starts at its transcript's first record.
        assert!(events.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms));
    }

    /// Damage in a transcript: each bad line is reported with its file and line and
    /// skipped; every other line is applied as if the damage were not there.
    #[test]
    fn bad_lines_are_reported_with_their_place_and_the_rest_is_applied() {
        let clean = std::fs::read_to_string(fixture("runaway.jsonl")).unwrap();
        let lines: Vec<&str> = clean.lines().collect();
        // Line 2 (a queue operation, nothing the hook says) cut in half; a record with
        // no type after line 5; a kind no version wrote yet after line 6; the last line
        // truncated mid-write, as a session still being written leaves it.
        let half = &lines[1][..lines[1].len() / 2];
        let mut damaged: Vec<String> = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            damaged.push(if i == 1 {
                half.to_owned()
            } else {
                (*line).to_owned()
            });
            if i == 4 {
                damaged.push(r#"{"sessionId":"x","uuid":"u"}"#.to_owned());
            }
            if i == 5 {
                damaged.push(r#"{"type":"hologram","sessionId":"x"}"#.to_owned());
            }
        }
        damaged.push(r#"{"type":"assistant","message":{"content":[{"type":"tool_u"#.to_owned());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.jsonl");
        std::fs::write(&path, damaged.join("\n") + "\n").unwrap();

        let (events, rejected, summary) = import(vec![path.clone()]);
        let place = |line: usize| format!("{}:{line}: ", path.display());
        let expected = [
            (place(2), "not a Claude Code transcript record"),
            (place(6), "a record without a \"type\""),
            (place(damaged.len()), "not a Claude Code transcript record"),
        ];
        assert_eq!(rejected.len(), expected.len(), "{rejected:#?}");
        for (got, (at, what)) in rejected.iter().zip(&expected) {
            assert!(got.starts_with(at.as_str()) && got.contains(what), "{got}");
        }
        assert_eq!(summary.bad_lines, 3);
        assert_eq!(summary.ignored.get("hologram"), Some(&1));
        let (clean_events, _, _) = import(vec![fixture("runaway.jsonl")]);
        assert_eq!(decided(&events), decided(&clean_events));
    }

    #[test]
    fn a_directory_is_read_in_session_order_sub_agents_aside() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("-home-dev-work");
        std::fs::create_dir_all(project.join("s/subagents")).unwrap();
        // Named so that name order is the reverse of time order.
        std::fs::copy(fixture("legitimate.jsonl"), project.join("a.jsonl")).unwrap();
        std::fs::copy(fixture("runaway.jsonl"), project.join("b.jsonl")).unwrap();
        std::fs::copy(
            fixture("runaway.jsonl"),
            project.join("s/subagents/agent-1.jsonl"),
        )
        .unwrap();
        std::fs::write(project.join("notes.txt"), "not a session").unwrap();
        let files =
            crate::history::session_files(Agent::ClaudeCode, &[dir.path().to_owned()]).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // The runaway session (b) ran before the legitimate one (a) in the suite.
        let expected = ["b.jsonl", "a.jsonl"];
        assert_eq!(names, expected);
    }
}
