//! `fusebox hook codex`: one Codex hook event per process. Codex fails open (exit 1, a
//! timeout, non-JSON output let the tool run), so every path ends in an answer that
//! refuses the call, and a stop is kept here because no answer can end a Codex turn: a
//! stopped session's later calls are denied, and its user's prompts blocked, with it; a
//! stopped sub-agent's later calls likewise.

use std::process::ExitCode;

use fusebox_hook::codex::{self, HookEvent, Outcome, Payload, Whose};
use serde_json::json;

use super::kept_stops::KeptStops;
use super::reply::{Answer, Reply};
use super::routes::{Moment, Protocol, Route};
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
    let whose = Whose::of(&payload);
    let failed = |why: String, allowed: bool| {
        Answer::json(codex::answer_as(
            payload.event(),
            &Outcome::Failed { why, allowed },
            whose,
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let stops = KeptStops::new(hook.state_dir.clone());
    let session_run = hook.runs().current(hook.tenant(), &payload.session_id);
    let agents = hook.sub_agents();
    let moment = match payload.event() {
        HookEvent::SubagentStart => Moment::SubAgentStart,
        HookEvent::SubagentStop => Moment::SubAgentStop,
        HookEvent::SessionEnd => Moment::SessionEnd,
        _ => Moment::Other,
    };
    let protocol = Protocol {
        prefix: codex::PROTOCOL.prefix,
        agent: &hook.agent,
    };
    let mut route = Route::new(
        &agents,
        &protocol,
        hook.tenant(),
        &session_run,
        payload.sub_agent(),
        moment,
        now_ms(),
    );
    // A sub-agent of a stopped session is stopped too (the daemon closes it).
    let kept = route
        .sub_agent
        .as_ref()
        .and_then(|sub_agent| sub_agent.stop())
        .or_else(|| stops.get(hook.tenant(), &session_run));
    if let Some(report) = kept {
        if let Some(answer) = codex::kept_stop_answer(&payload, &report) {
            return reply.send(Answer::json(answer));
        }
    }
    let transcript_len = transcript_len(payload.transcript_path.as_deref());
    let own = codex::event_for(
        &payload,
        &hook.operations,
        hook.tenant(),
        &route.run,
        &hook.agent,
        transcript_len,
        now_ms(),
    );
    let own = match own {
        Ok(own) => own,
        Err(why) => {
            eprintln!("fusebox: {why}");
            return reply.send(failed(why, false));
        }
    };
    // A sub-agent's prompt (its spawn message) is not an event; its start is sent by its
    // SubagentStart or its first call.
    if own.is_none() && moment == Moment::Other {
        return reply.send(Answer::json(json!({})));
    }
    let mut events = route.events(own);
    if events.is_empty() {
        return reply.send(Answer::json(json!({})));
    }
    let resumed = payload.resumes().then_some(payload.session_id.as_str());
    let gates = hook.ask_in_order(&mut events, resumed, Some(&route.session_run));
    route.settle(&agents, hook.tenant(), &events, &gates);
    let last = gates.len() - 1;
    let outcome = hook.outcome(&gates[last]);
    log_failure(&payload.hook_event_name, &events[last].id, &outcome);
    if route.sub_agent.is_none() {
        if let Some(report) = codex::stop_kept(&outcome) {
            let run = &events[last].run;
            if let Err(e) = stops.keep(hook.tenant(), run, &report) {
                // The daemon still answers `stop` for every later call of the run.
                eprintln!("fusebox: cannot keep the stop of {run}: {e}");
            }
        }
    }
    reply.send(Answer::json(codex::answer_as(
        payload.event(),
        &outcome,
        whose,
    )))
}
