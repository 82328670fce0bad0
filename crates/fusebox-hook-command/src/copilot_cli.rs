//! `fusebox hook copilot-cli --event <name>`: one Copilot CLI hook event per process.
//! Copilot CLI's payloads do not name their event, so the printed hooks pass it. Its
//! calls carry no id: the run's call book numbers them, as for Gemini CLI. Every path
//! prints a JSON answer that refuses the call when the guard could not be asked.
//!
//! A sub-agent's hooks carry its `agentId` and who started it (`parentAgentId`): the
//! session, found through the lineages of the sub-agents (`lineages.rs`, for a
//! sub-agent's own sub-agents), and the run, a child of its parent's run (`routes.rs`),
//! asked on the session's tree's subject.
//!
//! `copilot -p` fires sessionEnd each time the main agent's turn ends, and goes on when
//! a background sub-agent is still to finish (its notice becomes the main agent's next
//! prompt): after an end the daemon completed, the session's next hook opens the
//! session's next run, `<session>-2`, and goes on there, as a resumed session does.

use std::process::ExitCode;

use fusebox_core::Action;
use fusebox_hook::copilot_cli::{self, HookEvent, Outcome, Payload, Whose, PROTOCOL};
use fusebox_hook::protocol::Step;
use serde_json::json;

use super::call_books::CallBooks;
use super::lineages::Lineages;
use super::reply::{Answer, Reply};
use super::routes::{Moment, Protocol, Route};
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
    let whose = Whose::of(&payload);
    let failed = |why: String, allowed: bool| {
        Answer::json(copilot_cli::answer_as(
            payload.event(),
            &Outcome::Failed { why, allowed },
            whose,
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let tenant = hook.tenant();
    // A sub-agent's hooks name their own id as `sessionId` (or, for its start and stop,
    // its parent's): the session is found through who started it.
    let lineages = Lineages::new(hook.state_dir.clone());
    let (session, sub_agent) = match (payload.sub_agent(), payload.parent_agent()) {
        (Some(agent), Some(parent)) => {
            let (lineage, recorded) = lineages.of(tenant, agent, parent);
            if let Err(e) = recorded {
                eprintln!("fusebox: cannot record whose sub-agent {agent} is: {e}");
            }
            (lineage.session, Some((agent, lineage.started_by)))
        }
        _ => (payload.session_id.clone(), None),
    };
    let runs = hook.runs();
    // A session that goes on after an end it saw completed goes on in its next run (a
    // resumed one by its run's status, below; its end again is its old run's end).
    let went_on = match payload.event() {
        HookEvent::SessionStart => {
            if let Err(e) = runs.forget_end(tenant, &session) {
                eprintln!("fusebox: cannot forget the end of session {session}: {e}");
            }
            None
        }
        HookEvent::SessionEnd => None,
        _ => runs.went_on(tenant, &session),
    };
    let session_run = went_on
        .clone()
        .unwrap_or_else(|| runs.current(tenant, &session));
    let agents = hook.sub_agents();
    let moment = match payload.event() {
        HookEvent::SubagentStart => Moment::SubAgentStart,
        HookEvent::SubagentStop => Moment::SubAgentStop,
        HookEvent::SessionEnd => Moment::SessionEnd,
        _ => Moment::Other,
    };
    let protocol = Protocol {
        prefix: PROTOCOL.prefix,
        agent: &hook.agent,
    };
    let mut route = Route::under(
        &agents,
        &protocol,
        tenant,
        &session_run,
        sub_agent
            .as_ref()
            .map(|(agent, started_by)| (*agent, started_by.as_deref())),
        moment,
        now_ms(),
    );
    let books = CallBooks::new(hook.state_dir.clone());
    let booked = match payload.event() {
        HookEvent::PreToolUse => payload
            .call_key()
            .and_then(|key| Ok((key, payload.moment()?)))
            .and_then(|(key, moment)| {
                books
                    .with(tenant, &route.run, |book| book.before_call(key, moment))
                    .map_err(|e| format!("cannot number the call: {e}"))
            })
            .map(Some),
        HookEvent::PostToolUse => payload
            .call_key()
            .and_then(|key| Ok((key, payload.moment()?)))
            .and_then(|(key, moment)| {
                books
                    .with(tenant, &route.run, |book| book.after_call(&key, moment))
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
    let own = copilot_cli::event_for(
        &payload,
        &hook.operations,
        tenant,
        &route.run,
        &hook.agent,
        call_id.as_deref(),
        now_ms(),
    );
    let own = match own {
        Ok(own) => own,
        Err(why) => {
            eprintln!("fusebox: {why}");
            return reply.send(failed(why, false));
        }
    };
    // A sub-agent's prompt and its `agentStop` are not events; its start is sent by its
    // subagentStart or its first call.
    if own.is_none() && moment == Moment::Other {
        return reply.send(Answer::json(json!({})));
    }
    let mut events = route.events(own);
    if events.is_empty() {
        return reply.send(Answer::json(json!({})));
    }
    if let Some(next) = &went_on {
        let start = PROTOCOL.event(
            Step::SessionStart,
            &hook.operations,
            tenant,
            next,
            &hook.agent,
            now_ms(),
        );
        events.insert(0, start);
    }
    let resumed = payload.resumes().then_some(payload.session_id.as_str());
    let mut gates = hook.ask_in_order(&mut events, resumed, Some(&route.session_run));
    let opened = went_on.is_some().then(|| gates.remove(0));
    if let (Some(next), Some(fusebox_client::Gate::Decided(_))) = (&went_on, &opened) {
        if let Err(e) = runs.moved_on(tenant, &session, next) {
            eprintln!("fusebox: cannot record the session's next run {next}: {e}");
        }
    }
    if gates.is_empty() {
        // The next run could not be opened: that failure is the answer.
        let outcome = hook.outcome(opened.as_ref().expect("a gate at least"));
        log_failure(&payload.hook_event_name, &events[0].id, &outcome);
        return reply.send(Answer::json(copilot_cli::answer_as(
            payload.event(),
            &outcome,
            whose,
        )));
    }
    // The payload's own events, after the next run's start.
    let events = &events[usize::from(went_on.is_some())..];
    route.settle(&agents, tenant, events, &gates);
    let last = gates.len() - 1;
    let outcome = hook.outcome(&gates[last]);
    log_failure(&payload.hook_event_name, &events[last].id, &outcome);
    if let (HookEvent::PreToolUse, Some(id)) = (payload.event(), &call_id) {
        let noted = books.with(tenant, &events[last].run, |book| {
            book.answered(id, &outcome)
        });
        if let Err(e) = noted {
            eprintln!("fusebox: cannot note the answer of call {id}: {e}");
        }
    }
    if moment == Moment::SessionEnd && route.sub_agent.is_none() {
        if let Err(e) = lineages.forget(tenant, &session) {
            eprintln!("fusebox: cannot forget the sub-agents of {session}: {e}");
        }
        let completed = matches!(&outcome, Outcome::Decided(d) if d.action == Action::Complete);
        if completed {
            if let Err(e) = runs.ended(tenant, &session, &route.session_run) {
                eprintln!("fusebox: cannot note the end of {}: {e}", route.session_run);
            }
        }
    }
    // A sub-agent the guard stopped: its parent reads the stop with its last words.
    let stopped = route
        .sub_agent
        .as_ref()
        .filter(|_| moment == Moment::SubAgentStop)
        .and_then(|sub_agent| sub_agent.stop());
    if let Some(report) = stopped {
        return reply.send(Answer::json(copilot_cli::sub_agent_stopped_answer(
            &payload, &report,
        )));
    }
    reply.send(Answer::json(copilot_cli::answer_as(
        payload.event(),
        &outcome,
        whose,
    )))
}
