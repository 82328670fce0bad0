//! The one shape of every agent's hook protocol. An agent's module says only what
//! differs: which of its hook events is which [`Step`] (event names, payload fields, how
//! its ids are made), and how its answers deny, warn and stop ([`Answers`]). What a step
//! becomes on the wire and what a decision means for a call are written here, once, so
//! the agents cannot drift apart on them.

use fusebox_core::event::{
    hex_sha256, Args, Compaction, Prompt, ResultKind, RunFinished, RunStarted, ToolCall, ToolResult,
};
use fusebox_core::{Action, Event, EventBody};
use serde_json::{json, Value};

use crate::common::{
    completed_reason, message_of, prompt_refused, unasked_reason, unguarded_note, Operations,
    Outcome,
};

/// What differs between agents and is data: names and how far a stop reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    /// The agent's name: the runs' default agent name (`[agents.<name>.policy]`), the
    /// hook's subcommand, and what a compaction's reason says it came from.
    pub agent: &'static str,
    /// The prefix of every event id the protocol makes (`cc-toolu_1-call`): two agents'
    /// hooks never share an id, so the daemon's dedup never mixes them up.
    pub prefix: &'static str,
    /// Whether an answer of the hook can end the agent's run. When none can (Codex), the
    /// hook keeps the stop and refuses every later call with it, without asking again.
    pub stop_ends_run: bool,
}

/// A hook payload as the guard sees it, whichever agent sent it. Ids are the agent's
/// own (a tool use id, a prompt id, a book's number), so a hook the agent runs twice for
/// one moment sends one event id and is applied once.
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// The session began (or was resumed): its run's `run_started`.
    SessionStart,
    /// The user submitted a prompt: the session's next task. Its words never leave the
    /// hook; the guard needs the moment, not the text.
    Prompt { id: &'a str },
    /// A tool call, before it runs.
    Call {
        id: &'a str,
        tool: &'a str,
        input: Option<&'a Value>,
    },
    /// A tool call's result. `failure` is the code of a call the tool could not do: a
    /// tool error, not the end of the run (FATAL would stop it), so RETRYABLE with no
    /// wait — repeating it counts as repetition and towards `max_tool_errors`, but an
    /// edit-and-rerun is not refused. `input` is the call's, which names its op_key.
    Result {
        id: &'a str,
        tool: &'a str,
        input: Option<&'a Value>,
        failure: Option<&'a str>,
        output: Value,
    },
    /// A compaction. No id names one: `moment` does (the agent's fields that differ
    /// between two compactions and not between two hooks of one).
    Compaction {
        moment: String,
        trigger: Option<&'a str>,
    },
    /// A sub-agent's end: its run is finished.
    SubAgentEnd,
    /// The session ended: its run is closed.
    SessionEnd { reason: Option<&'a str> },
}

impl Protocol {
    /// The guard event for `step` of run `run` (the session's or a sub-agent's); `agent`
    /// is the runs' configured agent name.
    pub fn event(
        &self,
        step: Step,
        operations: &Operations,
        tenant: &str,
        run: &str,
        agent: &str,
        ts_ms: u64,
    ) -> Event {
        let prefix = self.prefix;
        let (id, body) = match step {
            Step::SessionStart => (
                format!("{prefix}-session-start"),
                EventBody::RunStarted(RunStarted {
                    agent: Some(agent.to_owned()),
                    tools: None,
                    policy: None,
                    parent: None,
                }),
            ),
            Step::Prompt { id } => (
                format!("{prefix}-prompt-{id}"),
                EventBody::Prompt(Prompt {}),
            ),
            Step::Call { id, tool, input } => (
                format!("{prefix}-{id}-call"),
                EventBody::ToolCall(ToolCall {
                    call_id: id.to_owned(),
                    tool: tool.to_owned(),
                    op_key: operations.op_key(tool, input),
                    args: Args::inline_or_hash(input.cloned().unwrap_or(Value::Null)),
                    effect: None,
                }),
            ),
            Step::Result {
                id,
                tool,
                input,
                failure,
                output,
            } => (
                format!("{prefix}-{id}-result"),
                EventBody::ToolResult(ToolResult {
                    call_id: id.to_owned(),
                    tool: tool.to_owned(),
                    kind: match failure {
                        Some(_) => ResultKind::Retryable,
                        None => ResultKind::Success,
                    },
                    code: failure.map(str::to_owned),
                    retry_after_ms: failure.map(|_| 0),
                    terminal: None,
                    output: Some(operations.output(tool, input, output)),
                    progress: None,
                }),
            ),
            Step::Compaction { moment, trigger } => (
                format!("{prefix}-compact-{}", &hex_sha256(moment.as_bytes())[..16]),
                EventBody::Compaction(Compaction {
                    reason: Some(format!(
                        "{}: {}",
                        self.agent,
                        trigger.unwrap_or("compaction")
                    )),
                }),
            ),
            Step::SubAgentEnd => {
                return crate::sub_agent_finished(prefix, tenant, run, "sub-agent ended", ts_ms)
            }
            Step::SessionEnd { reason } => (
                format!("{prefix}-session-end"),
                EventBody::RunFinished(RunFinished {
                    status: Some(format!("session ended ({})", reason.unwrap_or("other"))),
                }),
            ),
        };
        Event {
            v: 1,
            id,
            tenant: tenant.to_owned(),
            run: run.to_owned(),
            seq: None,
            ts_ms,
            body,
        }
    }
}

/// How an agent's hook answers say the three things a guard says before a call.
pub trait Answers {
    /// The call does not run; the model reads `reason`.
    fn deny(&self, reason: &str) -> Value;
    /// The call runs, and the model reads `words` (a warning, the unguarded note) where
    /// the agent lets it; `{}` where words cannot ride on the answer before a call.
    fn warn(&self, words: &str) -> Value;
    /// The call does not run and the run is over: the answer ends what it can end, and
    /// the model and the user read `report`.
    fn stop(&self, report: &str) -> Value;
    /// A stopped session's prompt: it does not reach the model, the user reads why.
    fn prompt_stopped(&self, words: &str) -> Value {
        json!({"decision": "block", "reason": words})
    }
}

/// The answer before a call, for every agent: nothing when it may run ("allow" would
/// skip the user's own permission rules), a warning where the agent can carry one, a
/// deny with the guard's words (with the stored result for a completed operation), a
/// stop; and when the guard could not be asked, a deny saying so, or the call unguarded
/// when the user chose `--on-error allow`.
pub fn before_call(answers: &impl Answers, outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Decided(decision) => match decision.action {
            Action::Execute => json!({}),
            Action::Warn => answers.warn(&message_of(decision)),
            Action::UseCompletedResult => answers.deny(&completed_reason(decision)),
            Action::Stop => answers.stop(&message_of(decision)),
            // Block, and any action that does not let the tool run.
            _ => answers.deny(&message_of(decision)),
        },
        Outcome::Failed { allowed: true, why } => answers.warn(&unguarded_note(why)),
        Outcome::Failed {
            allowed: false,
            why,
        } => answers.deny(&unasked_reason(why)),
    }
}

/// The answer to a user's prompt, for every agent: only a stopped run answers a prompt
/// `stop` (the latch), and then the prompt is blocked and the user reads why, instead of
/// the model being refused call after call. Nothing else blocks a prompt — not a guard
/// that cannot be asked (the calls after it are refused as ever).
pub fn before_prompt(answers: &impl Answers, outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Decided(decision) if decision.action == Action::Stop => {
            answers.prompt_stopped(&prompt_refused(&message_of(decision)))
        }
        _ => json!({}),
    }
}
