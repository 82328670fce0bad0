//! Which run a coding agent's session is in. Normally the session id itself; but a
//! session continued with `claude --resume` (or Codex's and Gemini CLI's resume) after
//! it ended keeps its id, and its run was closed (COMPLETED) by that SessionEnd, so the
//! continuation becomes a run of its own, `<session>-2`, `-3` …, remembered in one small
//! file per session. A run the guard *stopped* is not continued this way: a stop holds
//! until an operator resumes it.
//!
//! A session may also go on after its end in the same process: `copilot -p` fires
//! sessionEnd each time the main agent's turn ends, and then goes on when a background
//! sub-agent is still to finish. The hook notes the end it saw the daemon complete
//! ([`SessionRuns::ended`]); the session's next hook moves it on to its next run
//! ([`SessionRuns::went_on`]).

use std::fs;
use std::io;
use std::path::PathBuf;

use fusebox_hook::claude_code::run_id;

use super::state_dir::write_atomically;

pub struct SessionRuns {
    dir: Option<PathBuf>,
}

impl SessionRuns {
    /// Runs recorded in `dir` (see `state_dir::resolve`); none at all (no HOME) keeps
    /// every session in its first run.
    pub fn new(dir: Option<PathBuf>) -> SessionRuns {
        SessionRuns { dir }
    }

    fn file(&self, tenant: &str, session: &str) -> Option<PathBuf> {
        Some(
            self.dir
                .as_ref()?
                .join(format!("{tenant}.{}", run_id(session))),
        )
    }

    /// The session's current run.
    pub fn current(&self, tenant: &str, session: &str) -> String {
        self.file(tenant, session)
            .and_then(|file| fs::read_to_string(file).ok())
            .map(|text| text.trim().to_owned())
            .filter(|run| *run == run_id(run))
            .unwrap_or_else(|| run_id(session))
    }

    /// Moves the session on to its next run and returns it.
    pub fn advance(&self, tenant: &str, session: &str) -> io::Result<String> {
        let current = self.current(tenant, session);
        self.advance_from(tenant, session, &current)
    }

    fn advance_from(&self, tenant: &str, session: &str, current: &str) -> io::Result<String> {
        let base = run_id(session);
        let segment = current
            .strip_prefix(&base)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(1);
        let next = run_id(&format!("{base}-{}", segment + 1));
        let file = self.file(tenant, session).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
        })?;
        write_atomically(&file, next.as_bytes())?;
        Ok(next)
    }

    fn ended_file(&self, tenant: &str, session: &str) -> Option<PathBuf> {
        let mut file = self.file(tenant, session)?.into_os_string();
        file.push(".ended");
        Some(PathBuf::from(file))
    }

    /// Notes that the session's run `run` ended (the daemon completed it at the
    /// session's end).
    pub fn ended(&self, tenant: &str, session: &str, run: &str) -> io::Result<()> {
        let file = self.ended_file(tenant, session).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
        })?;
        write_atomically(&file, run.as_bytes())
    }

    /// The run a session that went on after its noted end goes on in: the one after the
    /// run that ended, `None` when no end is noted. Nothing changes until [`Self::moved_on`].
    pub fn went_on(&self, tenant: &str, session: &str) -> Option<String> {
        let file = self.ended_file(tenant, session)?;
        let ended = fs::read_to_string(file).ok()?;
        let ended = ended.trim();
        if ended != run_id(ended) || ended != self.current(tenant, session) {
            return None;
        }
        let base = run_id(session);
        let segment = ended
            .strip_prefix(&base)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(1);
        Some(run_id(&format!("{base}-{}", segment + 1)))
    }

    /// Moves the session on to `next` ([`Self::went_on`]) and forgets its end. Two hooks
    /// that race here write the same run.
    pub fn moved_on(&self, tenant: &str, session: &str, next: &str) -> io::Result<()> {
        let file = self.file(tenant, session).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
        })?;
        write_atomically(&file, next.as_bytes())?;
        self.forget_end(tenant, session)
    }

    /// Forgets the session's noted end (a resumed session goes on by its status).
    pub fn forget_end(&self, tenant: &str, session: &str) -> io::Result<()> {
        match self.ended_file(tenant, session) {
            Some(file) => match fs::remove_file(file) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_advances_through_numbered_runs() {
        let dir = tempfile::tempdir().unwrap();
        let runs = SessionRuns::new(Some(dir.path().to_owned()));
        let session = "418b4508-5f3f-48e9-adee-d7dbaac95e56";
        assert_eq!(runs.current("t", session), session);
        assert_eq!(runs.advance("t", session).unwrap(), format!("{session}-2"));
        assert_eq!(runs.current("t", session), format!("{session}-2"));
        assert_eq!(runs.advance("t", session).unwrap(), format!("{session}-3"));
        // Tenants are apart.
        assert_eq!(runs.current("u", session), session);
    }

    #[test]
    fn a_session_that_goes_on_after_its_end_goes_on_in_its_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let runs = SessionRuns::new(Some(dir.path().to_owned()));
        let session = "839f656e-22f9-4668-ae91-806174b493e2";
        assert_eq!(runs.went_on("t", session), None);
        runs.ended("t", session, session).unwrap();
        let next = format!("{session}-2");
        // Every hook finds the same next run until one moves the session on.
        assert_eq!(runs.went_on("t", session).as_deref(), Some(next.as_str()));
        assert_eq!(runs.went_on("t", session).as_deref(), Some(next.as_str()));
        assert_eq!(runs.current("t", session), session);
        runs.moved_on("t", session, &next).unwrap();
        runs.moved_on("t", session, &next).unwrap();
        assert_eq!(runs.current("t", session), next);
        assert_eq!(runs.went_on("t", session), None);
        // Its next end, the same way.
        runs.ended("t", session, &next).unwrap();
        assert_eq!(runs.went_on("t", session), Some(format!("{session}-3")));
        // An end of a run the session is no longer in is stale.
        runs.advance("t", session).unwrap();
        assert_eq!(runs.went_on("t", session), None);
        runs.forget_end("t", session).unwrap();
        runs.forget_end("t", session).unwrap();
    }

    #[test]
    fn a_damaged_state_file_means_the_first_run() {
        let dir = tempfile::tempdir().unwrap();
        let runs = SessionRuns::new(Some(dir.path().to_owned()));
        fs::write(dir.path().join("t.s1"), "not a run id!").unwrap();
        assert_eq!(runs.current("t", "s1"), "s1");
    }
}
