//! Which run each sub-agent of a session is in (Claude Code's Agent tool, Codex's
//! `spawn_agent`). A sub-agent is a child run of its session's run,
//! `<session run>-<agent id>`; one continued after it ended (Claude Code's SendMessage:
//! its SubagentStart fires again with the same `agent_id`) goes on in a run of its own,
//! `<that>-2`, `-3` …, as a resumed session does — unless the guard stopped it: a stop
//! holds until an operator resumes the run.
//!
//! Kept per session in a directory of the state directory,
//! `<tenant>.<session run>.sub-agents/`: one small file per sub-agent (its run, and
//! whether it finished), and the stop reports of its stopped runs (Codex denies a
//! stopped sub-agent's later calls with it; Claude Code's main agent reads it with the
//! sub-agent's result). The session's end removes the directory. Writes are atomic and
//! the state is idempotent, so the hooks of a sub-agent's parallel calls need no lock:
//! two that both find it not started both send its `run_started`, which the daemon
//! applies once (one event id per run).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use fusebox_hook::{run_id, sub_agent_run};

use super::state_dir::write_atomically;

/// The sub-agents of the sessions of one agent protocol.
pub struct SubAgents {
    dir: Option<PathBuf>,
}

/// What the hooks know of one sub-agent of a session.
pub struct SubAgent {
    /// The session's directory of sub-agents.
    dir: Option<PathBuf>,
    file: Option<PathBuf>,
    /// Its first run, `<session run>-<agent id>`.
    base: String,
    /// Its latest run and whether that finished, as recorded; `None`: never seen.
    recorded: Option<(String, bool)>,
}

const FINISHED: &str = "finished";

impl SubAgents {
    /// Kept in `dir` (see `state_dir::resolve`); without one (no HOME) nothing is kept:
    /// each hook of a sub-agent sends its start first (applied once) and a continued
    /// sub-agent stays in its first run.
    pub fn new(dir: Option<PathBuf>) -> SubAgents {
        SubAgents { dir }
    }

    fn session_dir(&self, tenant: &str, session_run: &str) -> Option<PathBuf> {
        Some(
            self.dir
                .as_ref()?
                .join(format!("{tenant}.{session_run}.sub-agents")),
        )
    }

    /// Sub-agent `agent_id` of the session whose run is `session_run`.
    pub fn of(&self, tenant: &str, session_run: &str, agent_id: &str) -> SubAgent {
        let dir = self.session_dir(tenant, session_run);
        let base = sub_agent_run(session_run, agent_id);
        let file = dir.as_ref().map(|dir| dir.join(&base));
        let recorded = file.as_deref().and_then(read_record);
        SubAgent {
            dir,
            file,
            base,
            recorded,
        }
    }

    /// The session's sub-agents whose run is open as far as the hooks know (started, not
    /// finished, not stopped): what the session's end finishes.
    pub fn open(&self, tenant: &str, session_run: &str) -> Vec<String> {
        let Some(dir) = self.session_dir(tenant, session_run) else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut open: Vec<String> = entries
            .filter_map(Result::ok)
            // Records only: stop reports and half-written files have a dot in their name.
            .filter(|entry| !entry.file_name().to_string_lossy().contains('.'))
            .filter_map(|entry| read_record(&entry.path()))
            .filter(|(run, finished)| !finished && read_stop(&dir, run).is_none())
            .map(|(run, _)| run)
            .collect();
        open.sort();
        open
    }

    /// Forgets the session's sub-agents (at its end).
    pub fn forget(&self, tenant: &str, session_run: &str) -> io::Result<()> {
        match self.session_dir(tenant, session_run) {
            Some(dir) if dir.exists() => fs::remove_dir_all(dir),
            _ => Ok(()),
        }
    }
}

impl SubAgent {
    /// The run its hooks go to now: the latest one recorded, else its first.
    pub fn current(&self) -> &str {
        self.recorded.as_ref().map_or(&self.base, |(run, _)| run)
    }

    /// Whether its run is known to be open (started, not finished).
    pub fn is_open(&self) -> bool {
        matches!(self.recorded, Some((_, false)))
    }

    /// The run a hook of it that may start it must open first, if any: its first run
    /// when it was never seen, the next one when its last finished (a continuation), none
    /// when its run is open or was stopped by the guard (the stop holds; the daemon
    /// answers its calls with it).
    pub fn to_start(&self) -> Option<String> {
        match &self.recorded {
            None => Some(self.base.clone()),
            Some((_, false)) => None,
            Some((run, true)) if self.stop_of(run).is_some() => None,
            Some((run, true)) => {
                let segment = run
                    .strip_prefix(&self.base)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .and_then(|n| n.parse::<u32>().ok())
                    .unwrap_or(1);
                Some(run_id(&format!("{}-{}", self.base, segment + 1)))
            }
        }
    }

    /// Records that `run` is its run now, open.
    pub fn started(&mut self, run: &str) -> io::Result<()> {
        self.record(run, false)
    }

    /// Records that its current run finished.
    pub fn finished(&mut self) -> io::Result<()> {
        let run = self.current().to_owned();
        self.record(&run, true)
    }

    fn record(&mut self, run: &str, finished: bool) -> io::Result<()> {
        let file = self.file.as_ref().ok_or_else(no_state_dir)?;
        let text = if finished {
            format!("{run}\n{FINISHED}\n")
        } else {
            format!("{run}\n")
        };
        write_atomically(file, text.as_bytes())?;
        self.recorded = Some((run.to_owned(), finished));
        Ok(())
    }

    fn stop_of(&self, run: &str) -> Option<String> {
        read_stop(self.dir.as_ref()?, run)
    }

    /// The report the guard stopped its current run with, as the hooks kept it.
    pub fn stop(&self) -> Option<String> {
        self.stop_of(self.current())
    }

    /// Keeps the report the guard stopped `run` with.
    pub fn keep_stop(&self, run: &str, report: &str) -> io::Result<()> {
        let dir = self.dir.as_ref().ok_or_else(no_state_dir)?;
        write_atomically(&dir.join(format!("{run}.stop")), report.as_bytes())
    }
}

impl SubAgents {
    /// The report kept for a stopped sub-agent run of the session, if any.
    pub fn stop_of(&self, tenant: &str, session_run: &str, run: &str) -> Option<String> {
        read_stop(&self.session_dir(tenant, session_run)?, run)
    }
}

/// A sub-agent's record: its latest run, and whether that finished.
fn read_record(file: &Path) -> Option<(String, bool)> {
    let text = fs::read_to_string(file).ok()?;
    let mut lines = text.lines();
    let run = lines.next()?.trim().to_owned();
    let finished = lines.next().is_some_and(|l| l.trim() == FINISHED);
    (run == run_id(&run)).then_some((run, finished))
}

fn read_stop(dir: &Path, run: &str) -> Option<String> {
    let text = fs::read_to_string(dir.join(format!("{run}.stop"))).ok()?;
    (!text.trim().is_empty()).then_some(text)
}

fn no_state_dir() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = "418b4508-5f3f-48e9-adee-d7dbaac95e56";

    #[test]
    fn a_sub_agent_starts_once_and_a_continuation_in_its_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let agents = SubAgents::new(Some(dir.path().to_owned()));
        let first = format!("{SESSION}-a34c78a2a729c0ecf");
        let mut agent = agents.of("t", SESSION, "a34c78a2a729c0ecf");
        assert_eq!(agent.current(), first);
        assert_eq!(agent.to_start().as_deref(), Some(first.as_str()));
        agent.started(&first).unwrap();
        // Its next hook, another process: open, nothing to start.
        let mut agent = agents.of("t", SESSION, "a34c78a2a729c0ecf");
        assert!(agent.is_open());
        assert_eq!(agent.to_start(), None);
        assert_eq!(agents.open("t", SESSION), std::slice::from_ref(&first));
        agent.finished().unwrap();
        assert!(agents.open("t", SESSION).is_empty());
        // Continued after its end: the next run.
        let mut agent = agents.of("t", SESSION, "a34c78a2a729c0ecf");
        let second = format!("{first}-2");
        assert_eq!(agent.to_start().as_deref(), Some(second.as_str()));
        agent.started(&second).unwrap();
        agent.finished().unwrap();
        let agent = agents.of("t", SESSION, "a34c78a2a729c0ecf");
        assert_eq!(agent.to_start(), Some(format!("{first}-3")));
        // Other sessions and tenants are apart.
        assert_eq!(
            agents.of("u", SESSION, "a34c78a2a729c0ecf").to_start(),
            Some(first.clone())
        );
        agents.forget("t", SESSION).unwrap();
        assert_eq!(
            agents.of("t", SESSION, "a34c78a2a729c0ecf").to_start(),
            Some(first)
        );
    }

    #[test]
    fn a_stopped_sub_agent_stays_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let agents = SubAgents::new(Some(dir.path().to_owned()));
        let mut agent = agents.of("t", SESSION, "a1");
        let run = agent.to_start().unwrap();
        agent.started(&run).unwrap();
        agent.keep_stop(&run, "fusebox: run stopped").unwrap();
        let mut agent = agents.of("t", SESSION, "a1");
        assert_eq!(agent.stop().as_deref(), Some("fusebox: run stopped"));
        assert_eq!(
            agents.stop_of("t", SESSION, &run).as_deref(),
            Some("fusebox: run stopped")
        );
        // Not open for the session's end to finish; not started again when continued.
        assert!(agents.open("t", SESSION).is_empty());
        agent.finished().unwrap();
        assert_eq!(agents.of("t", SESSION, "a1").to_start(), None);
    }

    #[test]
    fn without_a_state_directory_every_hook_starts_the_first_run() {
        let agents = SubAgents::new(None);
        let mut agent = agents.of("t", SESSION, "a1");
        assert_eq!(agent.to_start(), Some(format!("{SESSION}-a1")));
        assert!(agent.started(&format!("{SESSION}-a1")).is_err());
        assert!(agents.open("t", SESSION).is_empty());
        assert!(agents.forget("t", SESSION).is_ok());
    }

    #[test]
    fn a_damaged_record_is_a_sub_agent_never_seen() {
        let dir = tempfile::tempdir().unwrap();
        let agents = SubAgents::new(Some(dir.path().to_owned()));
        let session_dir = dir.path().join(format!("t.{SESSION}.sub-agents"));
        fs::create_dir_all(&session_dir).unwrap();
        fs::write(session_dir.join(format!("{SESSION}-a1")), "not a run!\n").unwrap();
        assert_eq!(
            agents.of("t", SESSION, "a1").to_start(),
            Some(format!("{SESSION}-a1"))
        );
        assert!(agents.open("t", SESSION).is_empty());
    }

    #[test]
    fn the_sessions_end_finds_every_open_sub_agent_by_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let agents = SubAgents::new(Some(dir.path().to_owned()));
        // A session run long enough that its sub-agents' runs are shortened and hashed.
        let session = "s".repeat(120);
        let mut long = agents.of("t", &session, "a34c78a2a729c0ecf");
        let run = long.to_start().unwrap();
        assert_eq!(run.len(), 128);
        long.started(&run).unwrap();
        let mut done = agents.of("t", &session, "b1");
        let first = done.to_start().unwrap();
        done.started(&first).unwrap();
        done.finished().unwrap();
        let next = agents.of("t", &session, "b1").to_start().unwrap();
        assert_ne!(next, first);
        agents.of("t", &session, "b1").started(&next).unwrap();
        let mut expected = vec![run, next];
        expected.sort();
        assert_eq!(agents.open("t", &session), expected);
    }
}
