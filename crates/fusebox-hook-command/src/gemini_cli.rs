//! `fusebox hook gemini-cli`: one Gemini CLI hook event per process. Gemini CLI fails
//! open (exit 1, a timeout, bad JSON let the tool run) and reads a JSON stdout whatever
//! the exit status, so every path prints a JSON answer; its calls carry no id, so the
//! run's call book numbers them.

use std::process::ExitCode;

use fusebox_hook::gemini_cli::{self, HookEvent, Outcome, Payload};
use serde_json::json;

use super::call_books::CallBooks;
use super::reply::{Answer, Reply};
use super::{log_failure, now_ms, read_stdin, Hook};

pub fn hook(hook: &Hook) -> ExitCode {
    let unreadable = |why: &str| Answer {
        code: 2,
        ..Answer::json(gemini_cli::unreadable_answer(why))
    };
    let reply = Reply::install(unreadable("no answer in time"), hook.deadline());
    let payload = match read_stdin().and_then(|input| Payload::parse(&input)) {
        Ok(payload) => payload,
        Err(why) => return reply.send(unreadable(&why).with_stderr(format!("fusebox: {why}"))),
    };
    let failed = |why: String, allowed: bool| {
        Answer::json(gemini_cli::answer(
            payload.event(),
            &Outcome::Failed { why, allowed },
            None,
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let run = hook.runs().current(hook.tenant(), &payload.session_id);
    let books = CallBooks::new(hook.state_dir.clone());
    let booked = match payload.event() {
        HookEvent::BeforeTool => books
            .with(hook.tenant(), &run, |book| book.before(&payload))
            .map_err(|e| format!("cannot number the call: {e}"))
            .and_then(|id| id.map(|id| Some((id, None)))),
        HookEvent::AfterTool => books
            .with(hook.tenant(), &run, |book| book.after(&payload))
            .map_err(|e| format!("cannot pair the result with its call: {e}"))
            .and_then(|found| found),
        _ => Ok(None),
    };
    let (call_id, warning) = match booked {
        Ok(Some((id, warning))) => (Some(id), warning),
        // A result of a call this hook never saw: nothing to pair it with.
        Ok(None) if payload.event() == HookEvent::AfterTool => {
            return reply.send(Answer::json(json!({})))
        }
        Ok(None) => (None, None),
        Err(why) => {
            eprintln!("fusebox: {why}");
            return reply.send(failed(why, false));
        }
    };
    let event = gemini_cli::event_for(
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
    if let (HookEvent::BeforeTool, Some(id)) = (payload.event(), &call_id) {
        let noted = books.with(hook.tenant(), &event.run, |book| {
            book.answered(id, &outcome)
        });
        if let Err(e) = noted {
            eprintln!("fusebox: cannot note the answer of call {id}: {e}");
        }
    }
    let answer = gemini_cli::answer(payload.event(), &outcome, warning.as_deref());
    reply.send(Answer::json(answer))
}
