//! The hook's one answer, closed on failure. Every agent lets the tool run when a hook
//! exits 1, times out or prints garbage, so the process must always print *something*
//! the agent reads as "do not run" when it cannot do better: a panic, a hang anywhere
//! (stdin, a state file's lock, the connect, the runtime) or an error becomes the
//! fallback answer — set as soon as the event is known — printed before the agent's
//! own timeout, with an exit status the agent honours.

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// An answer: what goes to stdout (if anything), the stderr line, the exit status.
#[derive(Clone)]
pub struct Answer {
    pub stdout: Option<Value>,
    pub stderr: Option<String>,
    pub code: u8,
}

impl Answer {
    /// A JSON answer, exit 0.
    pub fn json(value: Value) -> Answer {
        Answer {
            stdout: Some(value),
            stderr: None,
            code: 0,
        }
    }

    /// Exit 2 with the reason on stderr: every agent's "blocking error" (the call does
    /// not run and the reason reaches the model), for when the event is not known.
    pub fn blocking(why: &str) -> Answer {
        Answer {
            stdout: None,
            stderr: Some(format!("fusebox: {why}")),
            code: 2,
        }
    }

    pub fn with_stderr(mut self, line: String) -> Answer {
        self.stderr = Some(line);
        self
    }
}

struct State {
    sent: bool,
    fallback: Answer,
}

pub struct Reply {
    state: Mutex<State>,
}

impl Reply {
    /// Starts the guard rails: after `deadline`, or on a panic, `fallback` (as refined
    /// since by [`Reply::fallback`]) is printed and the process exits.
    pub fn install(fallback: Answer, deadline: Duration) -> Arc<Reply> {
        let reply = Arc::new(Reply {
            state: Mutex::new(State {
                sent: false,
                fallback,
            }),
        });
        let on_panic = Arc::clone(&reply);
        std::panic::set_hook(Box::new(move |info| {
            let code = on_panic.emit_fallback(&format!("fusebox: internal error: {info}"));
            std::process::exit(code.into());
        }));
        let on_deadline = Arc::clone(&reply);
        std::thread::spawn(move || {
            std::thread::sleep(deadline);
            let code = on_deadline.emit_fallback(&format!(
                "fusebox: no answer within {} ms; the fallback answer was given",
                deadline.as_millis()
            ));
            std::process::exit(code.into());
        });
        reply
    }

    /// What to answer if nothing better comes in time.
    pub fn fallback(&self, answer: Answer) {
        if let Ok(mut state) = self.state.lock() {
            state.fallback = answer;
        }
    }

    /// Prints `answer` unless an answer was already given; the process's exit status.
    pub fn send(&self, answer: Answer) -> ExitCode {
        let Ok(mut state) = self.state.lock() else {
            return ExitCode::from(2);
        };
        if state.sent {
            return ExitCode::from(state.fallback.code);
        }
        state.sent = true;
        match write(&answer) {
            Ok(()) => ExitCode::from(answer.code),
            // Nobody reads our answer any more; the status still says "blocking".
            Err(_) => ExitCode::from(2),
        }
    }

    /// Prints the fallback (once), from the deadline thread or the panic hook.
    fn emit_fallback(&self, why: &str) -> u8 {
        // try_lock: a panic inside `send` holds the lock; nothing more can be printed.
        let Ok(mut state) = self.state.try_lock() else {
            return 2;
        };
        if state.sent {
            return state.fallback.code;
        }
        state.sent = true;
        let answer = state.fallback.clone().with_stderr(why.to_owned());
        let _ = write(&answer);
        answer.code
    }
}

fn write(answer: &Answer) -> io::Result<()> {
    if let Some(line) = &answer.stderr {
        eprintln!("{line}");
    }
    if let Some(value) = &answer.stdout {
        let mut out = io::stdout().lock();
        serde_json::to_writer(&mut out, value)?;
        writeln!(out)?;
        out.flush()?;
    }
    Ok(())
}
