//! Which run a coding agent's session is in. Normally the session id itself; but a
//! session continued with `claude --resume` (or Codex's and Gemini CLI's resume) after
//! it ended keeps its id, and its run was closed (COMPLETED) by that SessionEnd, so the
//! continuation becomes a run of its own, `<session>-2`, `-3` …, remembered in one small
//! file per session. A run the guard *stopped* is not continued this way: a stop holds
//! until an operator resumes it.

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
    fn a_damaged_state_file_means_the_first_run() {
        let dir = tempfile::tempdir().unwrap();
        let runs = SessionRuns::new(Some(dir.path().to_owned()));
        fs::write(dir.path().join("t.s1"), "not a run id!").unwrap();
        assert_eq!(runs.current("t", "s1"), "s1");
    }
}
