//! `fusebox hook claude-code`: one Claude Code hook event per process. The payload's
//! events and the answer are planned here for `fusebox hook serve` too.

use std::process::ExitCode;

use fusebox_core::Event;
use fusebox_hook::claude_code::{self, HookEvent, Outcome, Payload};
use fusebox_hook::Operations;
use serde_json::{json, Value};

use super::reply::{Answer, Reply};
use super::routes::{Moment, Protocol, Route};
use super::sub_agents::SubAgents;
use super::{log_failure, now_ms, read_stdin, transcript_len, Hook};

/// What one payload sends, where, in order.
pub struct Planned {
    pub route: Route,
    /// The sub-agent's start (if it goes first), then the payload's own event; empty
    /// when there is nothing to send.
    pub events: Vec<Event>,
}

/// The events of `payload`, of the session now in `session_run`: its own (see
/// `claude_code::event_for`) on its session's run or its sub-agent's, after the
/// sub-agent's start when the sub-agent's run is not open yet; at the session's end,
/// after the finish of each sub-agent still open. An error is the payload's: it cannot
/// be guarded.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    payload: &Payload,
    operations: &Operations,
    agents: &SubAgents,
    tenant: &str,
    session_run: &str,
    agent: &str,
    transcript_len: Option<u64>,
    ts_ms: u64,
) -> Result<Planned, String> {
    let moment = match payload.event() {
        HookEvent::SubagentStart => Moment::SubAgentStart,
        HookEvent::SubagentStop => Moment::SubAgentStop,
        HookEvent::SessionEnd => Moment::SessionEnd,
        _ => Moment::Other,
    };
    let protocol = Protocol {
        prefix: claude_code::PROTOCOL.prefix,
        agent,
    };
    let route = Route::new(
        agents,
        &protocol,
        tenant,
        session_run,
        payload.sub_agent(),
        moment,
        ts_ms,
    );
    let own = claude_code::event_for(
        payload,
        operations,
        tenant,
        &route.run,
        agent,
        transcript_len,
        ts_ms,
    )?;
    // A hook Claude Code fires for a sub-agent that maps to nothing (its Stop) opens
    // nothing either.
    if own.is_none() && moment == Moment::Other {
        return Ok(Planned {
            route,
            events: Vec::new(),
        });
    }
    let events = route.events(own);
    Ok(Planned { route, events })
}

/// The hook's answer to `payload` for `outcome` (the last event's). The result of an
/// Agent call whose sub-agent the guard stopped carries the stop: Claude Code ends a
/// sub-agent on `continue: false` without its words, so its result alone would not say.
pub fn answer_for(
    payload: &Payload,
    outcome: &Outcome,
    agents: &SubAgents,
    tenant: &str,
    session_run: &str,
) -> Value {
    let answer = claude_code::answer(payload.event(), outcome);
    let Some(agent_id) = payload.ran_sub_agent() else {
        return answer;
    };
    match agents.of(tenant, session_run, agent_id).stop() {
        Some(report) => claude_code::with_context(
            answer,
            payload.event(),
            &claude_code::sub_agent_stopped_context(agent_id, &report),
        ),
        None => answer,
    }
}

/// The exit status is 0 with the answer on stdout, except for a payload that cannot be
/// read or guarded: exit 2, which Claude Code treats as a blocking error (the tool call
/// does not run) and shows our stderr to the model. A prompt is never blocked for the
/// hook's own trouble: only a stopped run blocks one.
pub(crate) fn hook(hook: &Hook) -> ExitCode {
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
    let session_run = hook.runs().current(hook.tenant(), &payload.session_id);
    let agents = hook.sub_agents();
    let planned = plan(
        &payload,
        &hook.operations,
        &agents,
        hook.tenant(),
        &session_run,
        &hook.agent,
        transcript_len,
        now_ms(),
    );
    let Planned {
        mut route,
        mut events,
    } = match planned {
        Ok(planned) if planned.events.is_empty() => return reply.send(Answer::json(json!({}))),
        Ok(planned) => planned,
        Err(why) if payload.event() == HookEvent::UserPromptSubmit => {
            return reply.send(Answer::json(json!({})).with_stderr(format!("fusebox: {why}")))
        }
        // A sub-agent's end is never blocked (exit 2 would make it go on).
        Err(why) if payload.event() == HookEvent::SubagentStop => {
            return reply.send(Answer::json(json!({})).with_stderr(format!("fusebox: {why}")))
        }
        Err(why) => return reply.send(Answer::blocking(&why)),
    };
    let resumed = payload.resumes().then_some(payload.session_id.as_str());
    let gates = hook.ask_in_order(&mut events, resumed, Some(&route.session_run));
    route.settle(&agents, hook.tenant(), &events, &gates);
    let last = gates.len() - 1;
    let outcome = hook.outcome(&gates[last]);
    log_failure(&payload.hook_event_name, &events[last].id, &outcome);
    reply.send(Answer::json(answer_for(
        &payload,
        &outcome,
        &agents,
        hook.tenant(),
        &session_run,
    )))
}
