//! The Gemini CLI hook protocol (0.61, seen with the real CLI), both ways. Pure
//! functions, as for Claude Code, plus [`CallBook`]: the one piece of session state the
//! protocol forces on a hook, kept by the caller beside the session.
//!
//! - **BeforeTool carries no tool-call id.** The book numbers the session's calls
//!   (`g1`, `g2` …): a call is known by its moment (tool, input and the payload's
//!   `timestamp`, which every hook of one event shares), so a hook run twice for one call
//!   gets the same id and the daemon applies it once; an AfterTool pairs with the oldest
//!   call of the same tool and input that ran and has no result yet.
//! - **Answers:** deny is `{"decision": "deny", "reason": …}` (the model reads "Tool
//!   execution blocked: …"); a stop is `continue: false` with the report, which ends the
//!   agent; a warn cannot ride on BeforeTool, so the book keeps it and it reaches the
//!   model as added context on the call's AfterTool.
//! - **PreCompress is not a compaction.** Gemini CLI fires it before every model request
//!   whether anything is compressed or not (0.61), so counting it would stop every
//!   session at `max_compactions`; it is answered with no opinion.
//! - **Gemini CLI fails open** (exit 1, timeout, bad JSON): the caller must always print
//!   one of these answers.
//! - **BeforeAgent is the prompt hook** (there is no UserPromptSubmit): once per prompt
//!   of the user's (the CLI fires it once per prompt id; sub-agents fire none), a
//!   `prompt` event without the prompt's words. A stopped session's prompt ends the agent
//!   before the model is asked.

use fusebox_core::event::hex_sha256;
use fusebox_core::{Action, Event};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::common::{checked, lines_in_one_order, message_of, observe_context, unguarded_note};
pub use crate::common::{run_id, Operations, Outcome};
use crate::protocol::{before_call, before_prompt, Answers, Protocol, Step};

/// Gemini CLI's names: `fusebox-hook gemini-cli`, event ids `gm-…`; a stop's answer
/// ends the agent.
pub const PROTOCOL: Protocol = Protocol {
    agent: "gemini-cli",
    prefix: "gm",
    stop_ends_run: true,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    SessionStart,
    /// A prompt submitted, before the agent plans.
    BeforeAgent,
    BeforeTool,
    AfterTool,
    SessionEnd,
    Other,
}

impl HookEvent {
    fn parse(name: &str) -> HookEvent {
        match name {
            "SessionStart" => HookEvent::SessionStart,
            "BeforeAgent" => HookEvent::BeforeAgent,
            "BeforeTool" => HookEvent::BeforeTool,
            "AfterTool" => HookEvent::AfterTool,
            "SessionEnd" => HookEvent::SessionEnd,
            _ => HookEvent::Other,
        }
    }
}

/// The fields of a Gemini CLI hook payload fusebox reads.
#[derive(Debug, Deserialize)]
pub struct Payload {
    pub session_id: String,
    pub hook_event_name: String,
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub tool_input: Option<Value>,
    #[serde(default)]
    pub tool_response: Option<Value>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
}

impl Payload {
    pub fn parse(bytes: &[u8]) -> Result<Payload, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a Gemini CLI hook payload: {e}"))
    }

    pub fn event(&self) -> HookEvent {
        HookEvent::parse(&self.hook_event_name)
    }

    /// A session continued (`gemini --resume`) in a new process.
    pub fn resumes(&self) -> bool {
        self.event() == HookEvent::SessionStart && self.source.as_deref() == Some("resume")
    }

    fn tool(&self) -> Result<&str, String> {
        self.tool_name
            .as_deref()
            .ok_or_else(|| format!("{} payload without tool_name", self.hook_event_name))
    }

    /// Which call this is, whatever the moment: the tool and its input.
    fn call_key(&self) -> Result<String, String> {
        let input = self.tool_input.as_ref().unwrap_or(&Value::Null);
        let text = format!("{}\0{}", self.tool()?, input);
        Ok(hex_sha256(text.as_bytes())[..32].to_owned())
    }

    /// The event's timestamp: every hook of one event gets the same.
    fn timestamp(&self) -> Result<&str, String> {
        self.timestamp
            .as_deref()
            .ok_or_else(|| format!("{} payload without timestamp", self.hook_event_name))
    }

    /// This very hook event: the call and the event's timestamp.
    fn moment(&self) -> Result<String, String> {
        Ok(format!("{}@{}", self.call_key()?, self.timestamp()?))
    }
}

/// The session's tool calls, numbered, as the hook keeps them between its processes
/// (serialised beside the session). Bounded: the last [`CallBook::KEPT`] calls.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallBook {
    next: u64,
    calls: Vec<BookedCall>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookedCall {
    id: String,
    key: String,
    before: String,
    #[serde(default)]
    after: Option<String>,
    /// It ran (or may run) and its result has not come yet.
    open: bool,
    #[serde(default)]
    warning: Option<String>,
}

impl CallBook {
    /// Calls kept: far more than can be open at once in one session.
    pub const KEPT: usize = 64;

    /// The call id of a BeforeTool: the one it already has if this hook event was seen,
    /// else the session's next number.
    pub fn before(&mut self, payload: &Payload) -> Result<String, String> {
        Ok(self.before_call(payload.call_key()?, payload.moment()?))
    }

    /// [`CallBook::before`] for any agent whose calls carry no id: `key` names the call
    /// (its tool and input), `moment` this very hook event (the key and the event's
    /// timestamp, which every hook of one event shares). Copilot CLI's hooks are such.
    pub fn before_call(&mut self, key: String, moment: String) -> String {
        if let Some(call) = self.calls.iter().find(|c| c.before == moment) {
            return call.id.clone();
        }
        self.next += 1;
        let id = format!("g{}", self.next);
        self.calls.push(BookedCall {
            id: id.clone(),
            key,
            before: moment,
            after: None,
            open: true,
            warning: None,
        });
        if self.calls.len() > Self::KEPT {
            self.calls.remove(0);
        }
        id
    }

    /// What the guard answered a call: a refused call gets no AfterTool; a warned one
    /// keeps its warning for it.
    pub fn answered(&mut self, id: &str, outcome: &Outcome) {
        let Some(call) = self.calls.iter_mut().find(|c| c.id == id) else {
            return;
        };
        match outcome {
            Outcome::Decided(decision) if decision.action.lets_tool_run() => {
                if decision.action == Action::Warn {
                    call.warning = Some(message_of(decision));
                }
            }
            Outcome::Failed { allowed: true, why } => call.warning = Some(unguarded_note(why)),
            _ => call.open = false,
        }
    }

    /// The call an AfterTool reports, with the warning its BeforeTool got; `None` for a
    /// result of no call the book knows (the hook was installed mid-session).
    pub fn after(&mut self, payload: &Payload) -> Result<Option<(String, Option<String>)>, String> {
        Ok(self.after_call(&payload.call_key()?, payload.moment()?))
    }

    /// [`CallBook::after`] by the call's key and the hook event's moment.
    pub fn after_call(&mut self, key: &str, moment: String) -> Option<(String, Option<String>)> {
        if let Some(call) = self
            .calls
            .iter()
            .find(|c| c.after.as_ref() == Some(&moment))
        {
            return Some((call.id.clone(), call.warning.clone()));
        }
        let call = self.calls.iter_mut().find(|c| c.open && c.key == key)?;
        call.open = false;
        call.after = Some(moment);
        Some((call.id.clone(), call.warning.clone()))
    }
}

/// The guard event for a payload; `None` for hook events fusebox has nothing to say
/// about. `call_id` is the book's id for a BeforeTool or AfterTool.
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
    let step = match payload.event() {
        HookEvent::SessionStart => Step::SessionStart,
        // The prompt carries no id: its timestamp names it.
        HookEvent::BeforeAgent => Step::Prompt {
            id: payload.timestamp()?,
        },
        HookEvent::BeforeTool => Step::Call {
            id: call()?,
            tool: payload.tool()?,
            input: payload.tool_input.as_ref(),
        },
        HookEvent::AfterTool => {
            let response = payload.tool_response.clone().unwrap_or(Value::Null);
            // A tool that could not do its job (bad parameters, a missing file) says so in
            // `error`; a shell command's exit code is part of its output.
            let failed = response.get("error").is_some_and(|e| !e.is_null());
            Step::Result {
                id: call()?,
                tool: payload.tool()?,
                input: payload.tool_input.as_ref(),
                failure: failed.then_some("tool_error"),
                output: model_output(payload.tool()?, &response),
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

/// What the model read of a result (`llmContent`), as the loop detector must compare it:
/// without the shell's `Process Group PGID: N` line (a new number for every run of the
/// same command), and with the lines of a shell command's `Output:` in one order
/// ([`lines_in_one_order`]: headless Gemini CLI 0.61 joins stdout and stderr in arrival
/// order). Either difference would make a repetition look like a new answer.
fn model_output(tool: &str, response: &Value) -> Value {
    match response.get("llmContent") {
        Some(Value::String(text)) if tool == SHELL_TOOL => Value::String(shell_output(text)),
        Some(Value::String(text)) => Value::String(
            text.lines()
                .filter(|line| !line.starts_with(PGID))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(other) => other.clone(),
        None => response.clone(),
    }
}

const SHELL_TOOL: &str = "run_shell_command";
const PGID: &str = "Process Group PGID:";
/// The sections of the shell tool's answer (`Output:` first), and the wrapper's end.
const SHELL_SECTIONS: [&str; 7] = [
    "Output: ",
    "Error: ",
    "Exit Code: ",
    "Signal: ",
    "Background PIDs: ",
    PGID,
    "</untrusted_context>",
];

fn shell_output(text: &str) -> String {
    let mut kept: Vec<String> = Vec::new();
    let mut output: Option<Vec<&str>> = None;
    let flush = |output: &mut Option<Vec<&str>>, kept: &mut Vec<String>| {
        if let Some(lines) = output.take() {
            kept.push(format!("Output: {}", lines_in_one_order(lines)));
        }
    };
    for line in text.lines() {
        if SHELL_SECTIONS
            .iter()
            .any(|section| line.starts_with(section))
        {
            flush(&mut output, &mut kept);
        }
        if let Some(first) = line.strip_prefix("Output: ") {
            output = Some(vec![first]);
        } else if let Some(lines) = output.as_mut() {
            lines.push(line);
        } else if !line.starts_with(PGID) {
            kept.push(line.to_owned());
        }
    }
    flush(&mut output, &mut kept);
    kept.join("\n")
}

/// The hook's answer on stdout for `event`. `warning` is what the call's BeforeTool was
/// warned (from the book), said on its AfterTool.
pub fn answer(event: HookEvent, outcome: &Outcome, warning: Option<&str>) -> Value {
    match (event, outcome) {
        (HookEvent::BeforeTool, outcome) => before_call(&GeminiCli, outcome),
        // The user reads "Agent execution stopped: …".
        (HookEvent::BeforeAgent, outcome) => before_prompt(&GeminiCli, outcome),
        (_, Outcome::Decided(decision)) if decision.action == Action::Stop => {
            GeminiCli.stop(&message_of(decision))
        }
        (HookEvent::AfterTool, outcome) => {
            let observed = match outcome {
                Outcome::Decided(decision) => observe_context(decision),
                Outcome::Failed { .. } => None,
            };
            let words: Vec<&str> = warning.into_iter().chain(observed.as_deref()).collect();
            if words.is_empty() {
                json!({})
            } else {
                json!({"hookSpecificOutput": {
                    "hookEventName": "AfterTool",
                    "additionalContext": words.join("\n"),
                }})
            }
        }
        _ => json!({}),
    }
}

/// The answer to a payload the hook cannot read: a deny, whatever the event was (Gemini
/// CLI reads a JSON stdout whatever the exit status).
pub fn unreadable_answer(why: &str) -> Value {
    GeminiCli.deny(&format!(
        "fusebox: {why}; the call is refused because the guard could not be asked."
    ))
}

/// Gemini CLI's answers before a call (BeforeTool).
struct GeminiCli;

impl Answers for GeminiCli {
    /// The model reads "Tool execution blocked: <reason>".
    fn deny(&self, reason: &str) -> Value {
        json!({"decision": "deny", "reason": reason})
    }

    /// Words cannot ride on BeforeTool: the book keeps a warning for the call's
    /// AfterTool ([`CallBook::answered`]).
    fn warn(&self, _words: &str) -> Value {
        json!({})
    }

    /// Ends the agent before the tool runs; the deny is for a CLI that would not stop.
    fn stop(&self, report: &str) -> Value {
        json!({
            "continue": false,
            "stopReason": report,
            "decision": "deny",
            "reason": report,
            "systemMessage": report,
        })
    }

    fn prompt_stopped(&self, words: &str) -> Value {
        self.stop(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::Decision;

    fn payload(event: &str, command: &str, timestamp: &str) -> Payload {
        Payload::parse(
            json!({"session_id": "s", "hook_event_name": event, "timestamp": timestamp,
                "tool_name": "run_shell_command", "tool_input": {"command": command},
                "tool_response": {"llmContent": "ok"}})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    fn decision(action: &str, message: Option<&str>) -> Decision {
        serde_json::from_value(json!({"v": 1, "tenant": "t", "run": "r", "event_id": "e",
            "action": action, "message": message}))
        .unwrap()
    }

    #[test]
    fn calls_are_numbered_and_a_rerun_hook_keeps_its_number() {
        let mut book = CallBook::default();
        let first = payload("BeforeTool", "ls", "t1");
        assert_eq!(book.before(&first).unwrap(), "g1");
        assert_eq!(book.before(&first).unwrap(), "g1");
        assert_eq!(
            book.before(&payload("BeforeTool", "ls", "t2")).unwrap(),
            "g2"
        );
    }

    #[test]
    fn a_result_pairs_with_the_oldest_open_call_of_the_same_input() {
        let mut book = CallBook::default();
        let decision = decision("execute", None);
        for (command, at) in [("ls", "t1"), ("pwd", "t2"), ("ls", "t3")] {
            let id = book.before(&payload("BeforeTool", command, at)).unwrap();
            book.answered(&id, &Outcome::Decided(&decision));
        }
        let after = |book: &mut CallBook, command, at| {
            book.after(&payload("AfterTool", command, at))
                .unwrap()
                .map(|(id, _)| id)
        };
        assert_eq!(after(&mut book, "ls", "t4").as_deref(), Some("g1"));
        assert_eq!(
            after(&mut book, "ls", "t4").as_deref(),
            Some("g1"),
            "a re-run"
        );
        assert_eq!(after(&mut book, "ls", "t5").as_deref(), Some("g3"));
        assert_eq!(after(&mut book, "pwd", "t6").as_deref(), Some("g2"));
        assert_eq!(after(&mut book, "pwd", "t7"), None);
    }

    #[test]
    fn a_refused_call_awaits_no_result_and_a_warning_waits_for_it() {
        let mut book = CallBook::default();
        let refused = book.before(&payload("BeforeTool", "ls", "t1")).unwrap();
        book.answered(
            &refused,
            &Outcome::Failed {
                why: "down".into(),
                allowed: false,
            },
        );
        let warned = book.before(&payload("BeforeTool", "ls", "t2")).unwrap();
        let warn = decision("warn", Some("careful"));
        book.answered(&warned, &Outcome::Decided(&warn));
        let (id, warning) = book
            .after(&payload("AfterTool", "ls", "t3"))
            .unwrap()
            .unwrap();
        assert_eq!(id, warned);
        assert_eq!(warning.as_deref(), Some("fusebox: careful"));
    }

    #[test]
    fn the_book_is_bounded() {
        let mut book = CallBook::default();
        for n in 0..(CallBook::KEPT + 10) {
            book.before(&payload("BeforeTool", "ls", &n.to_string()))
                .unwrap();
        }
        assert_eq!(book.calls.len(), CallBook::KEPT);
        assert_eq!(book.next as usize, CallBook::KEPT + 10);
    }

    #[test]
    fn the_shells_process_group_is_not_part_of_the_output() {
        let response = json!({"llmContent": "<untrusted_context>\nOutput: hi\nProcess Group PGID: 13461\n</untrusted_context>"});
        let expected = json!("<untrusted_context>\nOutput: hi\n</untrusted_context>");
        assert_eq!(model_output(SHELL_TOOL, &response), expected);
        assert_eq!(model_output("read_file", &response), expected);
    }

    #[test]
    fn stdout_and_stderr_joined_in_either_order_are_one_answer() {
        // Recorded (0.61, `cat status.txt || echo running`): the two orders of one run.
        let answer = |output: &str| json!({"llmContent": format!("<untrusted_context>\nOutput: {output}\nProcess Group PGID: 23919\n</untrusted_context>")});
        let err_first = answer("cat: status.txt: No such file or directory\nrunning");
        let out_first = answer("running\ncat: status.txt: No such file or directory");
        assert_eq!(
            model_output(SHELL_TOOL, &err_first),
            model_output(SHELL_TOOL, &out_first)
        );
        assert_eq!(
            model_output(SHELL_TOOL, &err_first),
            json!("<untrusted_context>\nOutput: cat: status.txt: No such file or directory\nrunning\n</untrusted_context>")
        );
        // Other output is still other output.
        assert_ne!(
            model_output(SHELL_TOOL, &err_first),
            model_output(SHELL_TOOL, &answer("running"))
        );
    }
}
