//! `fusebox hook opencode`: one OpenCode plugin hook per process, as the fusebox plugin
//! (`assets/opencode-plugin.js`, printed by `--print-plugin`) forwards it. The plugin
//! only carries: it sends the hook's fields here and does what the answer says; when
//! this process cannot answer (missing, crashed, no JSON) the plugin refuses the call
//! itself, unless the user chose `--on-error allow`.

use std::process::ExitCode;

use fusebox_hook::opencode::{self, HookEvent, Outcome, Payload};
use fusebox_hook::protocol::Step;
use serde_json::json;

use super::reply::{Answer, Reply};
use super::{log_failure, now_ms, read_stdin, Hook};

/// The plugin, with `{{COMMAND}}` and `{{ON_ERROR_ALLOW}}` to fill in.
const PLUGIN: &str = include_str!("../assets/opencode-plugin.js");

/// The plugin file for `~/.config/opencode/plugin/` running `command` (argv, as JSON)
/// for every hook; `allow`: what the plugin does when the hook cannot answer at all.
pub fn plugin(command: &[String], allow: bool) -> String {
    PLUGIN
        .replace(
            "{{COMMAND}}",
            &serde_json::to_string(command).expect("strings serialise"),
        )
        .replace("{{ON_ERROR_ALLOW}}", if allow { "true" } else { "false" })
}

pub fn hook(hook: &Hook) -> ExitCode {
    let reply = Reply::install(
        Answer::json(opencode::answer(
            HookEvent::ToolExecuteBefore,
            &Outcome::Failed {
                why: "no answer in time".to_owned(),
                allowed: false,
            },
        )),
        hook.deadline(),
    );
    let payload = match read_stdin().and_then(|input| Payload::parse(&input)) {
        Ok(payload) => payload,
        Err(why) => {
            let refused = Outcome::Failed {
                why: why.clone(),
                allowed: false,
            };
            let answer = opencode::answer(HookEvent::ToolExecuteBefore, &refused);
            return reply.send(Answer::json(answer).with_stderr(format!("fusebox: {why}")));
        }
    };
    let failed = |why: String, allowed: bool| {
        Answer::json(opencode::answer(
            payload.event(),
            &Outcome::Failed { why, allowed },
        ))
    };
    reply.fallback(failed("no answer in time".to_owned(), hook.allowed()));
    let runs = hook.runs();
    let run = runs.current(hook.tenant(), &payload.session_id);
    let parent_run = payload
        .parent()
        .map(|parent| runs.current(hook.tenant(), parent));
    let event = opencode::event_for(
        &payload,
        &hook.operations,
        hook.tenant(),
        &run,
        parent_run.as_deref(),
        &hook.agent,
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
    // The user's prompt may continue a session whose run was closed at its last idle
    // (`opencode run --session`, the TUI's next prompt): the session's start goes first
    // (answered from the dedup while its run is open), and moves a closed run on to the
    // session's next run, which the prompt then goes to.
    if payload.users_prompt() {
        let started = opencode::PROTOCOL.event(
            Step::SessionStart,
            &hook.operations,
            hook.tenant(),
            &run,
            &hook.agent,
            now_ms(),
        );
        let mut started = started;
        let gate = hook.ask(&mut started, Some(payload.session_id.as_str()));
        let outcome = hook.outcome(&gate);
        log_failure(&payload.hook, &started.id, &outcome);
        event.run = started.run;
    }
    // A sub-agent's event goes on its tree's subject, naming the root session's run, so a
    // cluster serves the whole tree on one daemon and its budgets stay exact.
    let root_run = payload.root().map(|root| runs.current(hook.tenant(), root));
    let gate = hook.ask_in_tree(&mut event, root_run.as_deref());
    let outcome = hook.outcome(&gate);
    log_failure(&payload.hook, &event.id, &outcome);
    reply.send(Answer::json(opencode::answer(payload.event(), &outcome)))
}
