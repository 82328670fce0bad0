//! `fusebox hook copilot-cli --event <name>`: one Copilot CLI hook event per process.
//! Copilot CLI's payloads do not name their event, so the printed hooks pass it. Its
//! calls carry no id: the run's call book numbers them, as for Gemini CLI. Every path
//! prints a JSON answer that refuses the call when the guard could not be asked.

use std::process::ExitCode;

use fusebox_hook::copilot_cli::{self, HookEvent, Outcome, Payload};
use serde_json::json;

use super::call_books::CallBooks;
use super::reply::{Answer, Reply};
use super::{log_failure, now_ms, read_stdin, Hook};

pub fn hook(hook: &Hook, event: &str) -> ExitCode {
    let refused = |why: String| {
        Answer::json(copilot_cli::answer(
            HookEvent::PreToolUse,
            &Outcome::Failed {
                why,
                allowed: false,
            },
        ))
    };
    let reply = Reply::install(refused("no answer in time".to_owned()), hook.deadline());
    let payload = match read_stdin().and_then(|input| Payload::parse(&input, event)) {
        Ok(payload) => payload,
        Err(why) => return reply.send(refused(why.clone()).with_stderr(format!("fusebox: {why}"))),
    };
    let failed = |why: String, allowed: bool| {
        Answer::json(copilot_cli::answer(
            payload.event(),
            &Outcome::Failed { why, allowed },
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let run = hook.runs().current(hook.tenant(), &payload.session_id);
    let books = CallBooks::new(hook.state_dir.clone());
    let booked = match payload.event() {
        HookEvent::PreToolUse => payload
            .call_key()
            .and_then(|key| Ok((key, payload.moment()?)))
            .and_then(|(key, moment)| {
                books
                    .with(hook.tenant(), &run, |book| book.before_call(key, moment))
                    .map_err(|e| format!("cannot number the call: {e}"))
            })
            .map(Some),
        HookEvent::PostToolUse => payload
            .call_key()
            .and_then(|key| Ok((key, payload.moment()?)))
            .and_then(|(key, moment)| {
                books
                    .with(hook.tenant(), &run, |book| book.after_call(&key, moment))
                    .map_err(|e| format!("cannot pair the result with its call: {e}"))
            })
            .map(|found| found.map(|(id, _)| id)),
        _ => Ok(None),
    };
    let call_id = match booked {
        Ok(id) => id,
        Err(why) => {
            eprintln!("fusebox: {why}");
            return reply.send(failed(why, false));
        }
    };
    // A result of a call this hook never saw: nothing to pair it with.
    if payload.event() == HookEvent::PostToolUse && call_id.is_none() {
        return reply.send(Answer::json(json!({})));
    }
    let event = copilot_cli::event_for(
        &payload,
        &hook.operations,
        hook.tenant(),
        &run,
        &hook.agent,
        call_id.as_deref(),
        now_ms(),
    );
    let mut event = match event {
        Ok(Some(event)) => event,
        Ok(None) => return reply.send(Answer::json(json!({}))),
        Err(why) => {
            eprintln!("fusebox: {why}");
            return reply.send(failed(why, false));
        }
    };
    let resumed = payload.resumes().then_some(payload.session_id.as_str());
    let gate = hook.ask(&mut event, resumed);
    let outcome = hook.outcome(&gate);
    log_failure(&payload.hook_event_name, &event.id, &outcome);
    if let (HookEvent::PreToolUse, Some(id)) = (payload.event(), &call_id) {
        let noted = books.with(hook.tenant(), &event.run, |book| {
            book.answered(id, &outcome)
        });
        if let Err(e) = noted {
            eprintln!("fusebox: cannot note the answer of call {id}: {e}");
        }
    }
    reply.send(Answer::json(copilot_cli::answer(payload.event(), &outcome)))
}
