//! `fusebox hook codex`: one Codex hook event per process. Codex fails open (exit 1, a
//! timeout, non-JSON output let the tool run), so every path ends in an answer that
//! refuses the call, and a stop is kept here because no answer can end a Codex turn: a
//! stopped session's later calls are denied, and its user's prompts blocked, with it.

use std::process::ExitCode;

use fusebox_hook::codex::{self, Outcome, Payload};
use serde_json::json;

use super::kept_stops::KeptStops;
use super::reply::{Answer, Reply};
use super::{log_failure, now_ms, read_stdin, transcript_len, Hook};

pub fn hook(hook: &Hook) -> ExitCode {
    // Before the event is known, exit 2: Codex reads it as a deny with stderr as the
    // reason (and lets a non-call event go on).
    let reply = Reply::install(
        Answer::blocking("no answer in time; the call is refused"),
        hook.deadline(),
    );
    let payload = match read_stdin().and_then(|input| Payload::parse(&input)) {
        Ok(payload) => payload,
        Err(why) => return reply.send(Answer::blocking(&why)),
    };
    let failed = |why: String, allowed: bool| {
        Answer::json(codex::answer(
            payload.event(),
            &Outcome::Failed { why, allowed },
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let stops = KeptStops::new(hook.state_dir.clone());
    let run = hook.runs().current(hook.tenant(), &payload.session_id);
    if let Some(report) = stops.get(hook.tenant(), &run) {
        if let Some(answer) = codex::kept_stop_answer(&payload, &report) {
            return reply.send(Answer::json(answer));
        }
    }
    let transcript_len = transcript_len(payload.transcript_path.as_deref());
    let event = codex::event_for(
        &payload,
        &hook.operations,
        hook.tenant(),
        &run,
        &hook.agent,
        transcript_len,
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
    if let Some(report) = codex::stop_kept(&outcome) {
        if let Err(e) = stops.keep(hook.tenant(), &event.run, &report) {
            // The daemon still answers `stop` for every later call of the run.
            eprintln!("fusebox: cannot keep the stop of {}: {e}", event.run);
        }
    }
    reply.send(Answer::json(codex::answer(payload.event(), &outcome)))
}
