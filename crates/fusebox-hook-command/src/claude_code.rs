//! `fusebox hook claude-code`: one Claude Code hook event per process.

use std::process::ExitCode;

use fusebox_hook::claude_code::{self, HookEvent, Outcome, Payload};
use serde_json::json;

use super::reply::{Answer, Reply};
use super::{log_failure, now_ms, read_stdin, transcript_len, Hook};

/// The exit status is 0 with the answer on stdout, except for a payload that cannot be
/// read or guarded: exit 2, which Claude Code treats as a blocking error (the tool call
/// does not run) and shows our stderr to the model. A prompt is never blocked for the
/// hook's own trouble: only a stopped run blocks one.
pub fn hook(hook: &Hook) -> ExitCode {
    let reply = Reply::install(
        Answer::blocking("no answer in time; the call is refused"),
        hook.deadline(),
    );
    let payload = match read_stdin().and_then(|input| Payload::parse(&input)) {
        Ok(payload) => payload,
        Err(why) => return reply.send(Answer::blocking(&why)),
    };
    let unanswered = Outcome::Failed {
        why: "no answer in time".to_owned(),
        allowed: hook.allowed(),
    };
    reply.fallback(Answer::json(claude_code::answer(
        payload.event(),
        &unanswered,
    )));
    let transcript_len = transcript_len(payload.transcript_path.as_deref());
    let run = hook.runs().current(hook.tenant(), &payload.session_id);
    let event = claude_code::event_for(
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
        Err(why) if payload.event() == HookEvent::UserPromptSubmit => {
            return reply.send(Answer::json(json!({})).with_stderr(format!("fusebox: {why}")))
        }
        Err(why) => return reply.send(Answer::blocking(&why)),
    };
    let resumed = payload.resumes().then_some(payload.session_id.as_str());
    let gate = hook.ask(&mut event, resumed);
    let outcome = hook.outcome(&gate);
    log_failure(&payload.hook_event_name, &event.id, &outcome);
    reply.send(Answer::json(claude_code::answer(payload.event(), &outcome)))
}
