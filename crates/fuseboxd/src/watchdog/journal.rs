//! `watchdog.journal` in the data directory: an append-only JSON-lines file, one record per
//! line, each append made durable (fsync) before it counts as done.
//!
//! It holds the watchdog's inputs (the `instance_launched` / run-end facts taken from the
//! applied events) so that timers are rebuilt on start without replaying the guard log, and
//! its outputs (terminations, protected instances, blast-radius stops) as the audit trail.
//! Only facts are read back; a torn last line from a crash is skipped with a warning.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fusebox_watchdog::{BlastRadiusAlert, Fact, ProtectedInstance, Termination};
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "watchdog.journal";

/// One line of the journal.
#[derive(Debug, Serialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Entry<'a> {
    Fact { fact: &'a Fact },
    Termination { termination: &'a Termination },
    Protected { protected: &'a ProtectedInstance },
    BlastRadius { alert: &'a BlastRadiusAlert },
}

/// The part of a line that is read back.
#[derive(Deserialize)]
struct StoredLine {
    record: String,
    fact: Option<Fact>,
}

pub struct Journal {
    path: PathBuf,
    file: Mutex<File>,
}

/// What the journal held when it was opened.
pub struct Opened {
    pub journal: Journal,
    pub facts: Vec<Fact>,
    pub terminations: usize,
}

impl Journal {
    /// Opens (or creates) `dir/watchdog.journal` and reads its facts back.
    pub fn open(dir: &Path) -> io::Result<Opened> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE_NAME);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let mut facts = Vec::new();
        let mut terminations = 0;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<StoredLine>(line) {
                Ok(StoredLine {
                    record,
                    fact: Some(fact),
                }) if record == "fact" => facts.push(fact),
                Ok(line) if line.record == "termination" => terminations += 1,
                Ok(_) => {}
                Err(err) => tracing::warn!(
                    path = %path.display(), line = n + 1, %err,
                    "skipping an unreadable watchdog journal line (torn by a crash?)"
                ),
            }
        }
        // A line torn by a crash must not swallow the next append.
        if !text.is_empty() && !text.ends_with('\n') {
            file.seek(SeekFrom::End(0))?;
            file.write_all(b"\n")?;
            file.sync_data()?;
        }
        Ok(Opened {
            journal: Journal {
                path,
                file: Mutex::new(file),
            },
            facts,
            terminations,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the entries with one write and one fsync.
    pub fn append(&self, entries: &[Entry<'_>]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for entry in entries {
            serde_json::to_writer(&mut buf, entry)?;
            buf.push(b'\n');
        }
        // A poisoned lock only means another append panicked; the file is still usable.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&buf)?;
        file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use fusebox_watchdog::{InstanceLaunched, RunEnded};

    use super::*;

    #[test]
    fn facts_survive_a_reopen_and_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let launched: Fact = InstanceLaunched {
            tenant: "t".into(),
            run: "r".into(),
            provider: "ec2".into(),
            region: "us-east-1".into(),
            instance_id: "i-1".into(),
            max_lifetime_s: Some(60),
            ts_ms: 1,
        }
        .into();
        let ended: Fact = RunEnded {
            tenant: "t".into(),
            run: "r".into(),
            ts_ms: 2,
        }
        .into();
        let opened = Journal::open(dir.path()).unwrap();
        assert!(opened.facts.is_empty());
        opened
            .journal
            .append(&[Entry::Fact { fact: &launched }])
            .unwrap();
        drop(opened);
        // A crash mid-append leaves half a line behind.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE_NAME))
            .unwrap();
        file.write_all(br#"{"record":"fact","fact":{"type":"run_en"#)
            .unwrap();
        drop(file);
        let opened = Journal::open(dir.path()).unwrap();
        assert_eq!(opened.facts, vec![launched.clone()]);
        opened
            .journal
            .append(&[Entry::Fact { fact: &ended }])
            .unwrap();
        drop(opened);
        let opened = Journal::open(dir.path()).unwrap();
        assert_eq!(opened.facts, vec![launched, ended]);
    }
}
