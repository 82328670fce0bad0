//! MCP ↔ guard contract, both ways, as pure functions: what a `tools/call` tells the
//! guard (effect, op_key), what the guard's answer does to the call, and what the
//! upstream's answer tells the guard. No I/O here, so every rule is a unit test.

use fusebox_client::Gate;
use fusebox_core::decision::{Action, Decision, StopReport};
use fusebox_core::event::{
    op_key_from_arg, Args, Effect, Output, ResultKind, ToolCall, ToolResult,
};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ToolAnnotations};
use serde_json::Value;

use crate::config::ToolConfig;

/// A call's effect: the gateway's config first, then the tool's annotations, else none
/// (the daemon's per-tool policy, then its defaults, decide).
///
/// `readOnlyHint: true` is a read. A tool that says it is not read-only, or that it is
/// destructive, is a write. `idempotentHint` only qualifies a write (repeating it changes
/// nothing more), so it does not make a read of it.
pub fn effect_of(
    config: Option<&ToolConfig>,
    annotations: Option<&ToolAnnotations>,
) -> Option<Effect> {
    if let Some(effect) = config.and_then(|c| c.effect) {
        return Some(effect);
    }
    let annotations = annotations?;
    match (annotations.read_only_hint, annotations.destructive_hint) {
        (Some(true), _) => Some(Effect::Read),
        (Some(false), _) | (None, Some(true)) => Some(Effect::Write),
        (None, _) => None,
    }
}

/// The call's business-operation identity: `<tool>:<value of the configured argument>`
/// (a string as is, anything else as compact JSON). No configured argument, or the call
/// does not carry it → no op_key.
pub fn op_key_of(
    tool: &str,
    config: Option<&ToolConfig>,
    arguments: Option<&JsonObject>,
) -> Option<String> {
    let name = config?.op_key_arg.as_deref()?;
    op_key_from_arg(tool, arguments?.get(name)?)
}

/// The `tool_call` the gateway gates: the call's arguments inline, or as their hash when
/// they are large (a file written whole), so a big call is gated rather than refused.
pub fn tool_call(
    call_id: &str,
    tool: &str,
    arguments: Option<&JsonObject>,
    op_key: Option<String>,
    effect: Option<Effect>,
) -> ToolCall {
    let args = Value::Object(arguments.cloned().unwrap_or_default());
    ToolCall {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        args: Args::inline_or_hash(args),
        op_key,
        effect,
    }
}

/// What the gateway does with a `tools/call` once the guard answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Send it upstream; `note` (a warning, or why an unanswered guard let it through)
    /// is added to the result the model reads.
    Forward { note: Option<String> },
    /// Do not send it; answer the agent with this result.
    Answer(CallToolResult),
    /// Do not send it; the run is over: answer with the report, and refuse every later
    /// call of the session the same way.
    Stop(CallToolResult),
}

/// Maps the daemon's answer to what happens to the call. The gateway decides nothing
/// here: every branch is the daemon's decision, or the configured policy for a daemon
/// that did not answer.
pub fn verdict(gate: &Gate) -> Verdict {
    match gate {
        Gate::Decided(decision) => decided(decision),
        Gate::Refused(error) => Verdict::Answer(error_result(format!(
            "fusebox refused to gate this call ({}): {}. The tool was not run.",
            error.reason, error.message
        ))),
        Gate::Unanswered {
            error,
            allowed: true,
        } => Verdict::Forward {
            note: Some(format!(
                "fusebox: the guard did not answer ({error}); this call ran unguarded."
            )),
        },
        Gate::Unanswered {
            error,
            allowed: false,
        } => Verdict::Answer(error_result(format!(
            "fusebox: the guard did not answer ({error}), so this call was not run. \
             Retrying will not help until fuseboxd is reachable; tell the user."
        ))),
    }
}

fn decided(decision: &Decision) -> Verdict {
    match decision.action {
        Action::Execute => Verdict::Forward {
            note: decision.message.clone(),
        },
        Action::Warn => Verdict::Forward {
            note: Some(format!(
                "fusebox warning: {}",
                decision
                    .message
                    .as_deref()
                    .unwrap_or("this call looks like a loop")
            )),
        },
        Action::UseCompletedResult => Verdict::Answer(completed_result(decision)),
        Action::Block => Verdict::Answer(error_result(format!(
            "fusebox blocked this call: {}",
            decision
                .message
                .as_deref()
                .unwrap_or("the guard refused it; change approach")
        ))),
        Action::Stop => Verdict::Stop(stop_result(decision)),
        // An observe action on a gate is not something the contract answers; refusing
        // is the safe reading.
        other => Verdict::Answer(error_result(format!(
            "fusebox answered {:?} to a tool call; the call was not run.",
            other.as_str()
        ))),
    }
}

/// The stop, in the words the model (and the user reading its transcript) sees.
pub fn stop_result(decision: &Decision) -> CallToolResult {
    let mut text = String::from("fusebox stopped this run");
    if let Some(report) = decision.report.as_deref() {
        text.push_str(&format!(
            " ({}, {})",
            report.terminal_state.as_str(),
            report.reason.as_str()
        ));
    }
    text.push_str(". No further tool calls will run in this session.");
    if let Some(message) = &decision.message {
        text.push(' ');
        text.push_str(message);
    }
    if let Some(report) = decision.report.as_deref() {
        text.push_str(&format!("\nstop report: {}", report_json(report)));
    }
    error_result(text)
}

fn report_json(report: &StopReport) -> String {
    serde_json::to_string(report).expect("reports serialise")
}

/// `use_completed_result`: the stored output rebuilt as a tool result, with the guard's
/// note first so the model knows the operation already happened. A result too large to
/// have been stored is the note alone (which says where the result is), as an error
/// result: the call gets no tool result, and no placeholder is passed off as the tool's
/// content or `structuredContent` (which an `outputSchema` would have to validate).
fn completed_result(decision: &Decision) -> CallToolResult {
    let note = decision.message.clone().unwrap_or_else(|| {
        "fusebox: this operation already completed; here is its result.".to_owned()
    });
    let not_stored = |stored: &Value| {
        stored
            .get(fusebox_core::ledger::RESULT_NOT_STORED)
            .is_some()
    };
    let mut result = match &decision.result {
        Some(stored) if not_stored(stored) => return error_result(format!("fusebox: {note}")),
        Some(stored) => result_from_output(stored),
        None => CallToolResult::success(Vec::new()),
    };
    result.content.insert(0, ContentBlock::text(note));
    result
}

/// Inverse of [`output_of`]: a content array is the content; anything else was
/// `structuredContent`, which is also given as text (as the MCP spec asks servers to).
pub fn result_from_output(stored: &Value) -> CallToolResult {
    if let Ok(content) = serde_json::from_value::<Vec<ContentBlock>>(stored.clone()) {
        if stored.is_array() {
            return CallToolResult::success(content);
        }
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(stored.to_string())]);
    result.structured_content = Some(stored.clone());
    result
}

/// What the guard is told of the upstream's answer: its `structuredContent` when it
/// has one (JSON the volatile-key masking can see into), else its content blocks.
pub fn output_of(result: &CallToolResult) -> Value {
    match &result.structured_content {
        Some(structured) => structured.clone(),
        None => serde_json::to_value(&result.content).expect("content serialises"),
    }
}

/// The `tool_result` for the upstream's answer. `isError` is `error_kind`
/// (RETRYABLE unless configured), so a failing tool counts against the error budget
/// and is never progress. The output goes whole up to `inline_limit` bytes of JSON, else
/// as its hash: `max_stored_result_bytes` for a call with an op_key (the ledger keeps
/// it for a repeat), [`INLINE_LIMIT`](fusebox_core::event::INLINE_LIMIT) for the rest.
pub fn tool_result(
    call_id: &str,
    tool: &str,
    result: &CallToolResult,
    error_kind: ResultKind,
    inline_limit: usize,
) -> ToolResult {
    let failed = result.is_error == Some(true);
    ToolResult {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        kind: if failed {
            error_kind
        } else {
            ResultKind::Success
        },
        code: failed.then(|| "tool_error".to_owned()),
        retry_after_ms: None,
        terminal: None,
        output: Some(Output::inline_up_to(output_of(result), inline_limit)),
        progress: None,
    }
}

/// The `tool_result` for a call that got no tool answer (the upstream failed, timed out,
/// answered with a JSON-RPC error, or the agent cancelled it): never a success, so an
/// op_key is released for a retry and the error counts.
pub fn failed_result(call_id: &str, tool: &str, code: &str, detail: &str) -> ToolResult {
    ToolResult {
        call_id: call_id.to_owned(),
        tool: tool.to_owned(),
        kind: ResultKind::Retryable,
        code: Some(code.to_owned()),
        retry_after_ms: None,
        terminal: None,
        output: Some(Output::inline_or_hash(Value::String(detail.to_owned()))),
        progress: None,
    }
}

/// A tool result with `isError: true` and one text block.
pub fn error_result(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Adds the gateway's note to a forwarded result, after the tool's own content. Agents
/// that show the model `structuredContent` when there is one (Claude Code does) would
/// never show a note in `content`, so an object there gets it as `fusebox_note` too,
/// unless the tool's `outputSchema` forbids extra properties (clients validate it).
pub fn with_note(
    mut result: CallToolResult,
    note: Option<String>,
    output_schema: Option<&JsonObject>,
) -> CallToolResult {
    if let Some(note) = note {
        let extra_allowed = output_schema
            .is_none_or(|schema| schema.get("additionalProperties") != Some(&Value::Bool(false)));
        if let (Some(Value::Object(structured)), true) =
            (result.structured_content.as_mut(), extra_allowed)
        {
            structured.insert(NOTE_KEY.to_owned(), Value::String(note.clone()));
        }
        result.content.push(ContentBlock::text(note));
    }
    result
}

/// Where a note goes in a structured result.
pub const NOTE_KEY: &str = "fusebox_note";

#[cfg(test)]
mod tests {
    use fusebox_client::{ClientError, WireError};
    use fusebox_core::event::INLINE_LIMIT;
    use fusebox_core::parse::MAX_OP_KEY_LEN;
    use serde_json::json;

    use super::*;

    fn decision(value: Value) -> Decision {
        let mut base = json!({"v":1,"tenant":"t","run":"r","event_id":"e1","call_id":"c1"});
        base.as_object_mut()
            .unwrap()
            .extend(value.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    fn text_of(result: &CallToolResult) -> String {
        result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn annotations(
        read_only: Option<bool>,
        destructive: Option<bool>,
        idempotent: Option<bool>,
    ) -> ToolAnnotations {
        let mut a = ToolAnnotations::default();
        a.read_only_hint = read_only;
        a.destructive_hint = destructive;
        a.idempotent_hint = idempotent;
        a
    }

    #[test]
    fn effect_comes_from_config_then_annotations() {
        let table = [
            (None, None, None, None, None),
            (None, Some(true), None, None, Some(Effect::Read)),
            (None, Some(true), Some(true), None, Some(Effect::Read)),
            (None, Some(false), None, None, Some(Effect::Write)),
            (
                None,
                Some(false),
                Some(false),
                Some(true),
                Some(Effect::Write),
            ),
            (None, None, Some(true), None, Some(Effect::Write)),
            (None, None, Some(false), None, None),
            (None, None, None, Some(true), None),
            (
                Some(Effect::Write),
                Some(true),
                None,
                None,
                Some(Effect::Write),
            ),
            (
                Some(Effect::Read),
                Some(false),
                Some(true),
                None,
                Some(Effect::Read),
            ),
        ];
        for (configured, read_only, destructive, idempotent, expected) in table {
            let config = ToolConfig {
                effect: configured,
                ..ToolConfig::default()
            };
            let a = annotations(read_only, destructive, idempotent);
            assert_eq!(
                effect_of(Some(&config), Some(&a)),
                expected,
                "config {configured:?}, readOnly {read_only:?}, destructive {destructive:?}, idempotent {idempotent:?}"
            );
        }
        assert_eq!(effect_of(None, None), None);
    }

    #[test]
    fn op_key_comes_from_the_named_argument() {
        let config = ToolConfig {
            op_key_arg: Some("path".to_owned()),
            ..ToolConfig::default()
        };
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            op_key_of(
                "write_file",
                Some(&config),
                Some(&args(json!({"path":"/a","content":"x"})))
            ),
            Some("write_file:/a".to_owned())
        );
        assert_eq!(
            op_key_of("w", Some(&config), Some(&args(json!({"path":7})))),
            Some("w:7".to_owned())
        );
        assert_eq!(
            op_key_of("w", Some(&config), Some(&args(json!({"path":null})))),
            None
        );
        assert_eq!(
            op_key_of("w", Some(&config), Some(&args(json!({"other":1})))),
            None
        );
        assert_eq!(op_key_of("w", Some(&config), None), None);
        assert_eq!(
            op_key_of("w", None, Some(&args(json!({"path":"/a"})))),
            None
        );
    }

    #[test]
    fn a_large_call_is_gated_by_hash_not_refused() {
        let config = ToolConfig {
            op_key_arg: Some("body".to_owned()),
            ..ToolConfig::default()
        };
        let body = "x".repeat(fusebox_core::event::INLINE_LIMIT);
        let args = json!({"body": body}).as_object().unwrap().clone();
        let op_key = op_key_of("send", Some(&config), Some(&args)).unwrap();
        assert!(op_key.starts_with("sha256:") && op_key.len() <= MAX_OP_KEY_LEN);
        assert_eq!(
            op_key_of("send", Some(&config), Some(&args)),
            Some(op_key.clone())
        );
        let call = tool_call("c1", "send", Some(&args), Some(op_key), None);
        assert!(matches!(call.args, Args::Hash(_)));
        let event = fusebox_core::Event {
            v: 1,
            id: "e1".to_owned(),
            tenant: "t".to_owned(),
            run: "r".to_owned(),
            seq: None,
            ts_ms: 1,
            body: fusebox_core::EventBody::ToolCall(call),
        };
        fusebox_core::check_event(&event, fusebox_core::parse::DEFAULT_MAX_EVENT_BYTES).unwrap();
    }

    #[test]
    fn every_gate_answer_maps_to_one_verdict() {
        assert_eq!(
            verdict(&Gate::Decided(decision(json!({"action":"execute"})))),
            Verdict::Forward { note: None }
        );
        let Verdict::Forward { note: Some(note) } = verdict(&Gate::Decided(decision(
            json!({"action":"warn","message":"twice already"}),
        ))) else {
            panic!("warn forwards with a note")
        };
        assert!(note.contains("twice already"));

        let Verdict::Answer(blocked) = verdict(&Gate::Decided(decision(
            json!({"action":"block","message":"use that result"}),
        ))) else {
            panic!("block answers")
        };
        assert_eq!(blocked.is_error, Some(true));
        assert!(text_of(&blocked).contains("use that result"));

        let Verdict::Answer(stored) = verdict(&Gate::Decided(decision(
            json!({"action":"use_completed_result","result":[{"type":"text","text":"sent"}]}),
        ))) else {
            panic!("use_completed_result answers")
        };
        assert_ne!(stored.is_error, Some(true));
        assert!(text_of(&stored).ends_with("sent"));

        // Too large to have been stored: the guard's note alone, as an error result,
        // nothing passed off as the tool's content.
        let Verdict::Answer(elsewhere) = verdict(&Gate::Decided(decision(json!({
            "action":"use_completed_result","message":"completed (run r, call c1), not attached",
            "result":{"fusebox_result_not_stored":{"output_hash":"ab","run":"r","call_id":"c1","completed_at_ms":1}}
        })))) else {
            panic!("use_completed_result answers")
        };
        assert_eq!(
            text_of(&elsewhere),
            "fusebox: completed (run r, call c1), not attached"
        );
        assert_eq!(elsewhere.is_error, Some(true));
        assert_eq!(elsewhere.structured_content, None);

        let report = json!({"terminal_state":"STOPPED_LOOP_GUARD","reason":"no_progress","completed_steps":3,
            "progress_version":null,"completed_operations":[],"last_safe_checkpoint":null,
            "unmet_precondition":null,"resume_condition":"verified_precondition_change","fired_guards":[]});
        let Verdict::Stop(stopped) = verdict(&Gate::Decided(decision(
            json!({"action":"stop","reason":"no_progress","report":report}),
        ))) else {
            panic!("stop stops")
        };
        assert_eq!(stopped.is_error, Some(true));
        let text = text_of(&stopped);
        assert!(
            text.contains("STOPPED_LOOP_GUARD") && text.contains("no_progress"),
            "{text}"
        );

        let refused = Gate::Refused(WireError {
            reason: "bad_event".to_owned(),
            message: "nope".to_owned(),
            event_id: None,
        });
        assert!(matches!(verdict(&refused), Verdict::Answer(r) if r.is_error == Some(true)));

        let unanswered = |allowed| Gate::Unanswered {
            error: ClientError::NoResponders {
                subject: "fusebox.gate.t.r".to_owned(),
            },
            allowed,
        };
        assert!(
            matches!(verdict(&unanswered(false)), Verdict::Answer(r) if r.is_error == Some(true))
        );
        assert!(matches!(
            verdict(&unanswered(true)),
            Verdict::Forward { note: Some(_) }
        ));
    }

    #[test]
    fn upstream_answers_become_tool_results() {
        let ok = CallToolResult::success(vec![ContentBlock::text("a\nb")]);
        let reported = tool_result("c1", "list", &ok, ResultKind::Retryable, INLINE_LIMIT);
        assert_eq!(reported.kind, ResultKind::Success);
        assert_eq!(
            reported.output,
            Some(Output::Json(json!([{"type":"text","text":"a\nb"}])))
        );

        let mut structured = CallToolResult::success(vec![ContentBlock::text("{\"n\":1}")]);
        structured.structured_content = Some(json!({"n":1}));
        assert_eq!(
            tool_result("c1", "t", &structured, ResultKind::Retryable, INLINE_LIMIT).output,
            Some(Output::Json(json!({"n":1})))
        );

        let failed = CallToolResult::error(vec![ContentBlock::text("ENOENT")]);
        let reported = tool_result(
            "c1",
            "read",
            &failed,
            ResultKind::Precondition,
            INLINE_LIMIT,
        );
        assert_eq!(reported.kind, ResultKind::Precondition);
        assert_eq!(reported.code.as_deref(), Some("tool_error"));

        let lost = failed_result("c1", "read", "upstream_unavailable", "gone");
        assert!(lost.kind.is_error());
    }

    #[test]
    fn stored_outputs_round_trip() {
        let content = CallToolResult::success(vec![ContentBlock::text("done")]);
        let back = result_from_output(&output_of(&content));
        assert_eq!(back.content, content.content);
        assert_eq!(back.structured_content, None);

        let structured = json!({"id": 42});
        let back = result_from_output(&structured);
        assert_eq!(back.structured_content, Some(structured));
        assert_eq!(text_of(&back), "{\"id\":42}");
    }

    #[test]
    fn notes_follow_the_tool_content() {
        let result = with_note(
            CallToolResult::success(vec![ContentBlock::text("x")]),
            Some("fusebox warning: w".to_owned()),
            None,
        );
        assert_eq!(text_of(&result), "x\nfusebox warning: w");

        let mut structured = CallToolResult::success(vec![ContentBlock::text("{}")]);
        structured.structured_content = Some(json!({"n": 1}));
        let open = json!({"type": "object"});
        let noted = with_note(
            structured.clone(),
            Some("careful".to_owned()),
            open.as_object(),
        );
        assert_eq!(
            noted.structured_content,
            Some(json!({"n": 1, NOTE_KEY: "careful"}))
        );
        assert_eq!(with_note(noted.clone(), None, None), noted);
        let closed = json!({"type": "object", "additionalProperties": false});
        let kept = with_note(structured, Some("careful".to_owned()), closed.as_object());
        assert_eq!(kept.structured_content, Some(json!({"n": 1})));
    }
}
