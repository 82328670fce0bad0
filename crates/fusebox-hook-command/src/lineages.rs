//! Which session a sub-agent is of, for an agent whose sub-agents' hooks name only who
//! started them (Copilot CLI's `parentAgentId`: the session's id, or the id of the
//! sub-agent that ran `task`). A sub-agent starts only after a hook of its parent (the
//! parent's `task` call), so the parent's lineage is recorded before the child's first
//! hook asks for it: a parent with no lineage is the session itself.
//!
//! Kept per tenant in `<tenant>.sub-agent-lineages/` of the state directory, one small
//! file per sub-agent: its session's id and the sub-agent that started it (empty: the
//! session did). Writes are atomic and every hook of a sub-agent finds the same answer,
//! so two hooks racing to record one write the same bytes. The session's end removes its
//! sub-agents' files.

use std::fs;
use std::io;
use std::path::PathBuf;

use fusebox_hook::run_id;

use super::state_dir::write_atomically;

/// The lineages of one agent protocol's sub-agents.
pub struct Lineages {
    dir: Option<PathBuf>,
}

/// Whose a sub-agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// The id of the session it is of (the tree's root).
    pub session: String,
    /// The sub-agent that started it; `None`: the session's main agent did.
    pub started_by: Option<String>,
}

impl Lineages {
    /// Kept in `dir` (see `state_dir::resolve`); without one every sub-agent is taken
    /// for its parent session's (right for all but a sub-agent's sub-agents).
    pub fn new(dir: Option<PathBuf>) -> Lineages {
        Lineages { dir }
    }

    fn tenant_dir(&self, tenant: &str) -> Option<PathBuf> {
        Some(
            self.dir
                .as_ref()?
                .join(format!("{tenant}.sub-agent-lineages")),
        )
    }

    fn read(&self, tenant: &str, agent_id: &str) -> Option<Lineage> {
        let file = self.tenant_dir(tenant)?.join(run_id(agent_id));
        let text = fs::read_to_string(file).ok()?;
        let mut lines = text.lines();
        let session = lines.next()?.trim().to_owned();
        let started_by = lines
            .next()
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .map(str::to_owned);
        (!session.is_empty()).then_some(Lineage {
            session,
            started_by,
        })
    }

    /// The lineage of sub-agent `agent_id`, started by `parent` (its hooks'
    /// `parentAgentId`), recorded at its first hook. What cannot be recorded is said on
    /// `Err`, with the lineage found regardless.
    pub fn of(&self, tenant: &str, agent_id: &str, parent: &str) -> (Lineage, io::Result<()>) {
        if let Some(known) = self.read(tenant, agent_id) {
            return (known, Ok(()));
        }
        let lineage = match self.read(tenant, parent) {
            Some(of_parent) => Lineage {
                session: of_parent.session,
                started_by: Some(parent.to_owned()),
            },
            None => Lineage {
                session: parent.to_owned(),
                started_by: None,
            },
        };
        let recorded = match self.tenant_dir(tenant) {
            Some(dir) => write_atomically(
                &dir.join(run_id(agent_id)),
                format!(
                    "{}\n{}\n",
                    lineage.session,
                    lineage.started_by.as_deref().unwrap_or("")
                )
                .as_bytes(),
            ),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no state directory (HOME unset)",
            )),
        };
        (lineage, recorded)
    }

    /// Forgets the sub-agents of `session` (at its end).
    pub fn forget(&self, tenant: &str, session: &str) -> io::Result<()> {
        let Some(dir) = self.tenant_dir(tenant) else {
            return Ok(());
        };
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(());
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains('.') {
                continue; // half-written
            }
            if self
                .read(tenant, &name)
                .is_some_and(|lineage| lineage.session == session)
            {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = "ee25e323-5dbc-4a74-b10e-5b98a43e4db4";

    #[test]
    fn a_sub_agents_sub_agent_is_of_the_same_session() {
        // Recorded (1.0.102): sub-agent A started by the session, A's `task` started B.
        let dir = tempfile::tempdir().unwrap();
        let lineages = Lineages::new(Some(dir.path().to_owned()));
        let (a, recorded) = lineages.of("t", "2a46b471", SESSION);
        recorded.unwrap();
        assert_eq!(
            a,
            Lineage {
                session: SESSION.to_owned(),
                started_by: None
            }
        );
        let (b, _) = lineages.of("t", "75d44ac4", "2a46b471");
        assert_eq!(
            b,
            Lineage {
                session: SESSION.to_owned(),
                started_by: Some("2a46b471".to_owned())
            }
        );
        // Every later hook of B finds the same; other tenants are apart.
        assert_eq!(lineages.of("t", "75d44ac4", "2a46b471").0, b);
        assert_eq!(
            lineages.of("u", "75d44ac4", "2a46b471").0.session,
            "2a46b471"
        );
        // Another session's sub-agents outlive this one's end.
        lineages.of("t", "c1", "other-session").1.unwrap();
        lineages.forget("t", SESSION).unwrap();
        assert_eq!(lineages.read("t", "75d44ac4"), None);
        assert_eq!(lineages.read("t", "2a46b471"), None);
        assert_eq!(lineages.read("t", "c1").unwrap().session, "other-session");
    }

    #[test]
    fn without_a_state_directory_the_parent_is_the_session() {
        let lineages = Lineages::new(None);
        let (found, recorded) = lineages.of("t", "a1", SESSION);
        assert_eq!(found.session, SESSION);
        assert!(recorded.is_err());
        assert!(lineages.forget("t", SESSION).is_ok());
    }
}
