//! Which run a hook payload of Claude Code or Codex goes to, and what must reach the
//! daemon before it: the session's run, or a sub-agent's (a child of the session's run,
//! opened by its `run_started` before anything else of it, however the hooks reached
//! it), and at the session's end the sub-agents still open, finished before the session.
//! Shared by the command hooks and `fusebox hook serve`.

use fusebox_client::Gate;
use fusebox_core::{Action, Event};
use fusebox_hook::{message_of, sub_agent_finished, sub_agent_started};

use super::sub_agents::{SubAgent, SubAgents};

/// What kind of hook a payload is, as far as the runs are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// A sub-agent starts: its run is opened, nothing else is sent.
    SubAgentStart,
    /// A sub-agent ended: its open run is finished.
    SubAgentStop,
    /// The session ended: its open sub-agents are finished first.
    SessionEnd,
    /// Anything else (a call, a result, a compaction, a prompt …).
    Other,
}

/// One payload's place among the session's runs.
pub struct Route {
    /// The session's run.
    pub session_run: String,
    /// The run the payload's own event goes to.
    pub run: String,
    /// Sent before the payload's own event, each after the one before was decided.
    pub before: Vec<Event>,
    /// The sub-agent the payload is of.
    pub sub_agent: Option<SubAgent>,
    /// The sub-agent run `before` opens.
    starting: Option<String>,
    moment: Moment,
}

/// The protocol's prefix of the event ids and its agent name.
pub struct Protocol<'a> {
    pub prefix: &'a str,
    pub agent: &'a str,
}

impl Route {
    /// Where a payload of the session in `session_run` goes; `agent_id` is the
    /// sub-agent's whose hook it is, a child of the session's run.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        agents: &SubAgents,
        protocol: &Protocol,
        tenant: &str,
        session_run: &str,
        agent_id: Option<&str>,
        moment: Moment,
        ts_ms: u64,
    ) -> Route {
        Route::under(
            agents,
            protocol,
            tenant,
            session_run,
            agent_id.map(|id| (id, None)),
            moment,
            ts_ms,
        )
    }

    /// [`Route::new`] for an agent whose sub-agents start sub-agents (Copilot CLI):
    /// `sub_agent` is the sub-agent's id and the one that started it, `None` when the
    /// session did. Its run is a child of that sub-agent's current run; every sub-agent
    /// of the session is kept with the session's, and the tree's root is the session's
    /// run.
    #[allow(clippy::too_many_arguments)]
    pub fn under(
        agents: &SubAgents,
        protocol: &Protocol,
        tenant: &str,
        session_run: &str,
        sub_agent: Option<(&str, Option<&str>)>,
        moment: Moment,
        ts_ms: u64,
    ) -> Route {
        let mut route = Route {
            session_run: session_run.to_owned(),
            run: session_run.to_owned(),
            before: Vec::new(),
            sub_agent: None,
            starting: None,
            moment,
        };
        let Some((agent_id, started_by)) = sub_agent else {
            if moment == Moment::SessionEnd {
                route.before = agents
                    .open(tenant, session_run)
                    .iter()
                    .map(|run| {
                        sub_agent_finished(protocol.prefix, tenant, run, "session ended", ts_ms)
                    })
                    .collect();
            }
            return route;
        };
        let sub_agent = agents.of(tenant, session_run, agent_id);
        route.run = sub_agent.current().to_owned();
        if moment != Moment::SubAgentStop {
            if let Some(run) = sub_agent.to_start() {
                let parent = match started_by {
                    Some(id) => agents.of(tenant, session_run, id).current().to_owned(),
                    None => session_run.to_owned(),
                };
                route.before.push(sub_agent_started(
                    protocol.prefix,
                    tenant,
                    &run,
                    &parent,
                    protocol.agent,
                    ts_ms,
                ));
                route.run.clone_from(&run);
                route.starting = Some(run);
            }
        }
        route.sub_agent = Some(sub_agent);
        route
    }

    /// Whether the payload's own event goes to the daemon: a sub-agent's end only when
    /// its run is open (one never seen, or finished already, has nothing to finish).
    pub fn sends_own(&self) -> bool {
        match (&self.sub_agent, self.moment) {
            (Some(sub_agent), Moment::SubAgentStop) => sub_agent.is_open(),
            _ => true,
        }
    }

    /// The events to send, in order: `before`, then `own` (the payload's own, on
    /// [`Route::run`]) if it goes.
    pub fn events(&self, own: Option<Event>) -> Vec<Event> {
        let mut events = self.before.clone();
        events.extend(own.filter(|_| self.sends_own()));
        events
    }

    /// Records what the daemon decided about `events` (`gates`: as far as they went):
    /// a sub-agent's run opened, finished or stopped (its stop report kept), the
    /// session's sub-agents forgotten at its end. State that cannot be written is said on
    /// stderr: the daemon holds every decision regardless.
    pub fn settle(&mut self, agents: &SubAgents, tenant: &str, events: &[Event], gates: &[Gate]) {
        let sends_own = self.sends_own();
        if let Some(sub_agent) = self.sub_agent.as_mut() {
            let decided = |i: usize| match gates.get(i) {
                Some(Gate::Decided(decision)) => Some(decision),
                _ => None,
            };
            let mut noted = Ok(());
            if let (Some(run), Some(_)) = (&self.starting, decided(0)) {
                noted = sub_agent.started(run);
            }
            for (i, event) in events.iter().enumerate() {
                let Some(decision) = decided(i) else { break };
                if event.run == sub_agent.current() && decision.action == Action::Stop {
                    noted = noted.and(sub_agent.keep_stop(&event.run, &message_of(decision)));
                }
            }
            let own_decided = sends_own && decided(events.len().saturating_sub(1)).is_some();
            if self.moment == Moment::SubAgentStop && own_decided {
                noted = noted.and(sub_agent.finished());
            }
            if let Err(e) = noted {
                eprintln!("fusebox: cannot record sub-agent run {}: {e}", self.run);
            }
        }
        if self.moment == Moment::SessionEnd && self.sub_agent.is_none() {
            if let Err(e) = agents.forget(tenant, &self.session_run) {
                eprintln!(
                    "fusebox: cannot forget the sub-agents of {}: {e}",
                    self.session_run
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusebox_core::EventBody;

    const SESSION: &str = "ee25e323-5dbc-4a74-b10e-5b98a43e4db4";

    fn parent_of(event: &Event) -> Option<&str> {
        match &event.body {
            EventBody::RunStarted(started) => started.parent.as_deref(),
            _ => None,
        }
    }

    #[test]
    fn a_sub_agents_sub_agent_is_a_child_of_its_run() {
        let dir = tempfile::tempdir().unwrap();
        let agents = SubAgents::new(Some(dir.path().to_owned()));
        let protocol = Protocol {
            prefix: "cp",
            agent: "copilot-cli",
        };
        // (sub-agent, started by, moment) → (run its event goes to, parent its start
        // names; None: nothing to start).
        let a = format!("{SESSION}-a");
        let b = format!("{SESSION}-b");
        let cases = [
            (("a", None), Moment::SubAgentStart, &a, Some(SESSION)),
            (
                ("b", Some("a")),
                Moment::SubAgentStart,
                &b,
                Some(a.as_str()),
            ),
            (("b", Some("a")), Moment::Other, &b, None),
            (("b", Some("a")), Moment::SubAgentStop, &b, None),
        ];
        for ((agent, started_by), moment, run, parent) in cases {
            let mut route = Route::under(
                &agents,
                &protocol,
                "t",
                SESSION,
                Some((agent, started_by)),
                moment,
                1,
            );
            assert_eq!((&route.run, route.session_run.as_str()), (run, SESSION));
            assert_eq!(route.before.first().and_then(parent_of), parent, "{agent}");
            // As the daemon took them.
            let events = route.events(None);
            let gates: Vec<Gate> = events
                .iter()
                .map(|e| {
                    Gate::Decided(
                        serde_json::from_value(serde_json::json!({"v": 1, "tenant": "t",
                            "run": e.run, "event_id": e.id, "action": "continue"}))
                        .unwrap(),
                    )
                })
                .collect();
            route.settle(&agents, "t", &events, &gates);
        }
    }
}
