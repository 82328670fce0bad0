//! `watchdog.journal` in the data directory: an append-only JSON-lines file, one record per
//! line, each append made durable (fsync) before it counts as done.
//!
//! It holds the watchdog's inputs (the `instance_launched` / run-end facts taken from the
//! applied events) so that timers are rebuilt on start without replaying the guard log, and
//! its outputs (terminations, protected instances, blast-radius stops) as the audit trail.
//! Only facts are read back; a torn last line from a crash is skipped with a warning.
//!
//! **Compaction.** Facts of instances long gone and runs long verified would otherwise pile
//! up for ever (and be replayed into the timers on every start). Once the journal has grown
//! to twice its size after the last compaction (and at least `compact_min_lines`), it is
//! rewritten to: a `compacted` header (running totals), the facts that rebuild the
//! watchdog's timers as they are now, and the latest [`KEEP_OUTCOMES`] outcome records.
//! Crash-safe the usual way: the new journal is written beside the old one
//! (`watchdog.journal.new`), fsynced, renamed over it, and the directory fsynced; a crash
//! before the rename leaves the old journal whole (the `.new` file is removed at open), a
//! crash after it the new one. Appends wait while it runs, and a fact is journaled and
//! handed to the watchdog under the same lock, so the rewrite never misses one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use fusebox_watchdog::{BlastRadiusAlert, Fact, ProtectedInstance, Termination};
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "watchdog.journal";
/// Where a compaction writes before the rename.
const NEW_FILE_NAME: &str = "watchdog.journal.new";
/// Outcome records (the audit trail) a compaction keeps; older ones are dropped (they were
/// logged and published on `fusebox.watchdog.<tenant>.terminated` when they happened).
pub const KEEP_OUTCOMES: usize = 1_000;
/// The journal is not compacted below this many lines.
pub const COMPACT_MIN_LINES: usize = 10_000;

/// One line of the journal.
#[derive(Debug, Serialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Entry<'a> {
    Fact {
        fact: &'a Fact,
    },
    Termination {
        termination: &'a Termination,
    },
    Protected {
        protected: &'a ProtectedInstance,
    },
    BlastRadius {
        alert: &'a BlastRadiusAlert,
    },
    /// The first line of a compacted journal.
    Compacted {
        header: &'a Header,
    },
}

/// What a compaction dropped, carried forward so totals survive it.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Header {
    /// Termination records in the journal's history before this header's journal.
    pub terminations_dropped: usize,
    /// Outcome records of every kind dropped so far.
    pub outcomes_dropped: usize,
    /// Compactions so far.
    pub compactions: usize,
}

/// The part of a line that is read back.
#[derive(Deserialize)]
struct StoredLine {
    record: String,
    fact: Option<Fact>,
    header: Option<Header>,
    /// Kept as it was written: a record of an older shape must not make the line unreadable.
    termination: Option<serde_json::Value>,
}

/// A journal's lines, sorted out.
#[derive(Default)]
struct Contents {
    facts: Vec<Fact>,
    header: Header,
    /// Outcome lines (anything but facts and the header), verbatim.
    outcomes: Vec<String>,
    terminations: usize,
    /// The termination records, oldest first.
    termination_records: Vec<serde_json::Value>,
    lines: usize,
}

fn read_contents(path: &Path, text: &str) -> Contents {
    let mut c = Contents::default();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        c.lines += 1;
        match serde_json::from_str::<StoredLine>(line) {
            Ok(StoredLine {
                record,
                fact: Some(fact),
                ..
            }) if record == "fact" => c.facts.push(fact),
            Ok(StoredLine {
                record,
                header: Some(header),
                ..
            }) if record == "compacted" => c.header = header,
            Ok(stored) => {
                if stored.record == "termination" {
                    c.terminations += 1;
                    c.termination_records.extend(stored.termination);
                }
                c.outcomes.push(line.to_owned());
            }
            Err(err) => tracing::warn!(
                path = %path.display(), line = n + 1, %err,
                "skipping an unreadable watchdog journal line (torn by a crash?)"
            ),
        }
    }
    c
}

struct Appender {
    file: File,
    /// Lines in the file.
    lines: usize,
    /// Compact once `lines` reaches this.
    compact_at: usize,
}

pub struct Journal {
    dir: PathBuf,
    path: PathBuf,
    min_lines: usize,
    appender: Mutex<Appender>,
}

/// What the journal held when it was opened.
pub struct Opened {
    pub journal: Journal,
    pub facts: Vec<Fact>,
    /// Termination records in its whole history, compacted ones included.
    pub terminations: usize,
    /// The termination records still in it, oldest first (for `fusebox.control.watchdog`).
    pub termination_records: Vec<serde_json::Value>,
}

/// What one compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub lines_before: usize,
    pub lines_after: usize,
    pub facts_kept: usize,
    pub outcomes_kept: usize,
}

fn compact_threshold(lines: usize, min_lines: usize) -> usize {
    lines.saturating_mul(2).max(min_lines)
}

impl Journal {
    /// Opens (or creates) `dir/watchdog.journal` and reads its facts back.
    pub fn open(dir: &Path) -> io::Result<Opened> {
        Journal::open_with(dir, COMPACT_MIN_LINES)
    }

    /// [`Journal::open`] with the line count below which it is never compacted.
    pub fn open_with(dir: &Path, min_lines: usize) -> io::Result<Opened> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE_NAME);
        // A compaction that crashed before its rename: the old journal is the truth.
        match std::fs::remove_file(dir.join(NEW_FILE_NAME)) {
            Ok(()) => tracing::warn!(
                dir = %dir.display(),
                "removed an unfinished watchdog journal compaction (the journal is whole)"
            ),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let contents = read_contents(&path, &text);
        // A line torn by a crash must not swallow the next append.
        if !text.is_empty() && !text.ends_with('\n') {
            file.seek(SeekFrom::End(0))?;
            file.write_all(b"\n")?;
            file.sync_data()?;
        }
        Ok(Opened {
            journal: Journal {
                dir: dir.to_owned(),
                path,
                min_lines,
                appender: Mutex::new(Appender {
                    file,
                    lines: contents.lines,
                    compact_at: compact_threshold(contents.lines / 2, min_lines),
                }),
            },
            facts: contents.facts,
            terminations: contents.header.terminations_dropped + contents.terminations,
            termination_records: contents.termination_records,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Appender> {
        // A poisoned lock only means another append panicked; the file is still usable.
        self.appender.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends the entries with one write and one fsync.
    pub fn append(&self, entries: &[Entry<'_>]) -> io::Result<()> {
        self.append_then(entries, || {})
    }

    /// Appends the entries, then runs `then` before another append or a compaction can
    /// start: what `then` hands the watchdog is in its state when a compaction reads it.
    /// `then` runs whether or not the append succeeded.
    pub fn append_then(&self, entries: &[Entry<'_>], then: impl FnOnce()) -> io::Result<()> {
        let mut appender = self.lock();
        let written = write_entries(&mut appender, entries);
        then();
        written
    }

    /// Whether the journal has grown enough since the last compaction to compact it.
    pub fn compaction_due(&self) -> bool {
        let appender = self.lock();
        appender.lines >= appender.compact_at
    }

    /// Rewrites the journal to `live()` (the facts that rebuild the watchdog as it is now)
    /// and the latest outcome records; see the module docs.
    pub fn compact(&self, live: impl FnOnce() -> Vec<Fact>) -> io::Result<Compaction> {
        let mut appender = self.lock();
        let mut text = String::new();
        File::open(&self.path)?.read_to_string(&mut text)?;
        let old = read_contents(&self.path, &text);
        let facts = live();
        let kept_from = old.outcomes.len().saturating_sub(KEEP_OUTCOMES);
        let dropped = &old.outcomes[..kept_from];
        let header = Header {
            terminations_dropped: old.header.terminations_dropped
                + dropped
                    .iter()
                    .filter(|l| l.contains(r#""record":"termination""#))
                    .count(),
            outcomes_dropped: old.header.outcomes_dropped + dropped.len(),
            compactions: old.header.compactions + 1,
        };
        let mut buf = Vec::new();
        serde_json::to_writer(&mut buf, &Entry::Compacted { header: &header })?;
        buf.push(b'\n');
        for fact in &facts {
            serde_json::to_writer(&mut buf, &Entry::Fact { fact })?;
            buf.push(b'\n');
        }
        for line in &old.outcomes[kept_from..] {
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
        let new_path = self.dir.join(NEW_FILE_NAME);
        let mut new = File::create(&new_path)?;
        new.write_all(&buf)?;
        new.sync_all()?;
        drop(new);
        std::fs::rename(&new_path, &self.path)?;
        File::open(&self.dir)?.sync_all()?;
        let lines_after = 1 + facts.len() + (old.outcomes.len() - kept_from);
        appender.file = OpenOptions::new().append(true).open(&self.path)?;
        appender.lines = lines_after;
        appender.compact_at = compact_threshold(lines_after, self.min_lines);
        Ok(Compaction {
            bytes_before: text.len() as u64,
            bytes_after: buf.len() as u64,
            lines_before: old.lines,
            lines_after,
            facts_kept: facts.len(),
            outcomes_kept: old.outcomes.len() - kept_from,
        })
    }
}

fn write_entries(appender: &mut Appender, entries: &[Entry<'_>]) -> io::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut buf = Vec::new();
    for entry in entries {
        serde_json::to_writer(&mut buf, entry)?;
        buf.push(b'\n');
    }
    appender.file.write_all(&buf)?;
    appender.lines += entries.len();
    appender.file.sync_data()
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

    fn launched(n: u64) -> Fact {
        InstanceLaunched {
            tenant: "t".into(),
            run: format!("r{n}"),
            provider: "ec2".into(),
            region: "us-east-1".into(),
            instance_id: format!("i-{n}"),
            max_lifetime_s: Some(3600),
            ts_ms: n,
        }
        .into()
    }

    fn termination(n: u64) -> Termination {
        Termination {
            tenant: Some("t".into()),
            run: Some(format!("r{n}")),
            provider: "ec2".into(),
            region: "us-east-1".into(),
            instance_id: format!("i-{n}"),
            reason: fusebox_watchdog::Reason::MaxLifetime,
            deadline_ms: n,
            at_ms: n,
            dry_run: false,
            outcome: fusebox_watchdog::Outcome::Terminated,
            error: None,
        }
    }

    fn instance_ids(facts: &[Fact]) -> std::collections::BTreeSet<u64> {
        facts
            .iter()
            .filter_map(|f| match f {
                Fact::InstanceLaunched(l) => l.instance_id[2..].parse().ok(),
                _ => None,
            })
            .collect()
    }

    /// Step `n` of the workload the kill test drives: launch instance `n` and, from step
    /// `LIVE` on, report instance `n - LIVE` terminated. The live set after step `n` is the
    /// last `LIVE` instances.
    const LIVE: u64 = 5;

    fn step(journal: &Journal, n: u64, live: &mut std::collections::BTreeMap<u64, Fact>) {
        let fact = launched(n);
        let gone = n.checked_sub(LIVE).map(termination);
        // The launch last: it is the kill test's progress mark (a restarted child goes on
        // after the last launch journaled), and a SIGKILL can tear an append at a page
        // boundary, keeping a prefix of its lines. A prefix without the launch is done
        // again (its termination counted twice, which the test allows); a launch kept
        // without the termination before it would never be done again.
        let mut entries = Vec::new();
        if let Some(t) = &gone {
            entries.push(Entry::Termination { termination: t });
        }
        entries.push(Entry::Fact { fact: &fact });
        journal
            .append_then(&entries, || {
                live.insert(n, fact.clone());
                if gone.is_some() {
                    live.remove(&(n - LIVE));
                }
            })
            .unwrap();
    }

    #[test]
    fn compaction_keeps_live_facts_the_latest_outcomes_and_the_totals() {
        let dir = tempfile::tempdir().unwrap();
        let opened = Journal::open_with(dir.path(), 100).unwrap();
        let journal = opened.journal;
        let mut live = std::collections::BTreeMap::new();
        for n in 0..(3 * KEEP_OUTCOMES as u64) {
            step(&journal, n, &mut live);
        }
        assert!(journal.compaction_due());
        let c = journal
            .compact(|| live.values().cloned().collect())
            .unwrap();
        assert_eq!(c.facts_kept, LIVE as usize);
        assert_eq!(c.outcomes_kept, KEEP_OUTCOMES);
        assert!(c.bytes_after < c.bytes_before / 2, "{c:?}");
        eprintln!(
            "journal of {} launches and {} terminations: {} -> {} bytes, {} -> {} lines",
            3 * KEEP_OUTCOMES,
            3 * KEEP_OUTCOMES - LIVE as usize,
            c.bytes_before,
            c.bytes_after,
            c.lines_before,
            c.lines_after
        );
        assert!(!journal.compaction_due());
        // Appends after a compaction land in the new file (the launch of the instance this
        // step reported gone stays until the next compaction).
        let last = 3 * KEEP_OUTCOMES as u64;
        step(&journal, last, &mut live);
        drop(journal);
        let opened = Journal::open_with(dir.path(), 100).unwrap();
        assert_eq!(instance_ids(&opened.facts), (last - LIVE..=last).collect());
        // Every termination ever journaled is still counted.
        assert_eq!(opened.terminations, (last + 1 - LIVE) as usize);
        // A second compaction carries the totals forward.
        let c = opened
            .journal
            .compact(|| live.values().cloned().collect())
            .unwrap();
        assert_eq!(c.lines_after, 1 + LIVE as usize + KEEP_OUTCOMES);
        drop(opened);
        let opened = Journal::open_with(dir.path(), 100).unwrap();
        assert_eq!(opened.terminations, (last + 1 - LIVE) as usize);
        assert_eq!(instance_ids(&opened.facts).len(), LIVE as usize);
        // The kept termination records are read back whole, oldest first.
        assert_eq!(opened.termination_records.len(), KEEP_OUTCOMES);
        let newest = opened.termination_records.last().unwrap();
        assert!(newest["instance_id"].is_string(), "{newest}");
    }

    const CHILD: &str = "FUSEBOX_JOURNAL_KILL_CHILD";

    /// The child of the kill test: runs the workload from where the journal stands,
    /// compacting every few steps, and prints each step once it is journaled. Never returns.
    fn child(dir: &Path) -> ! {
        let opened = Journal::open_with(dir, 1).unwrap();
        let next = instance_ids(&opened.facts).last().map_or(0, |n| n + 1);
        let mut live: std::collections::BTreeMap<u64, Fact> = opened
            .facts
            .iter()
            .filter(|f| matches!(f, Fact::InstanceLaunched(l) if l.ts_ms + LIVE >= next))
            .map(|f| match f {
                Fact::InstanceLaunched(l) => (l.ts_ms, f.clone()),
                _ => unreachable!(),
            })
            .collect();
        let journal = opened.journal;
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready").unwrap();
        for n in next.. {
            step(&journal, n, &mut live);
            writeln!(out, "{n}").unwrap();
            out.flush().unwrap();
            if n % 7 == 0 {
                journal
                    .compact(|| live.values().cloned().collect())
                    .unwrap();
            }
        }
        unreachable!()
    }

    /// SIGKILLs a child that appends and compacts, 40 times at pseudo-random moments:
    /// after each kill the journal opens, holds every instance that was live at the last
    /// acknowledged step, and counts every acknowledged termination.
    #[test]
    fn kills_mid_compaction_lose_no_acknowledged_fact() {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        if let Ok(dir) = std::env::var(CHILD) {
            child(Path::new(&dir));
        }
        let dir = tempfile::tempdir().unwrap();
        let mut acked: Option<u64> = None;
        let mut new_files_seen = 0;
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..40 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "watchdog::journal::tests::kills_mid_compaction_lose_no_acknowledged_fact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            // Wait for the child to be past its open, then let it run for 2–40 ms.
            loop {
                match lines.next() {
                    // libtest has written "test <name> ... " without a newline first.
                    Some(Ok(line)) if line.ends_with("ready") => break,
                    Some(Ok(_)) => continue,
                    other => panic!("child did not start: {other:?}"),
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2 + rng % 38));
            child.kill().unwrap();
            child.wait().unwrap();
            for line in lines.map_while(Result::ok) {
                if let Ok(n) = line.parse::<u64>() {
                    acked = Some(n);
                }
            }
            if dir.path().join(NEW_FILE_NAME).exists() {
                new_files_seen += 1;
            }
            let opened = Journal::open_with(dir.path(), 1).unwrap();
            assert!(!dir.path().join(NEW_FILE_NAME).exists());
            let ids = instance_ids(&opened.facts);
            if let Some(a) = acked {
                let must: std::collections::BTreeSet<u64> =
                    (a.saturating_sub(LIVE - 1)..=a).collect();
                assert!(
                    must.is_subset(&ids),
                    "acknowledged live instances {must:?} lost; journal has {ids:?}"
                );
                assert!(
                    opened.terminations as u64 >= (a + 1).saturating_sub(LIVE),
                    "terminations counted {} < acknowledged {}",
                    opened.terminations,
                    (a + 1).saturating_sub(LIVE)
                );
            }
        }
        let a = acked.expect("the children acknowledged steps");
        eprintln!("40 SIGKILLs, {} steps acknowledged, {new_files_seen} kills left an unfinished compaction", a + 1);
        assert!(
            a > 100,
            "too few steps to have compacted under the kills: {a}"
        );
    }

    /// A compaction killed before its rename leaves a partial `.new` file beside the old
    /// journal: the old journal is read whole and the partial file removed.
    #[test]
    fn a_compaction_killed_before_its_rename_leaves_the_old_journal_whole() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open_with(dir.path(), 1).unwrap().journal;
        let mut live = std::collections::BTreeMap::new();
        for n in 0..20 {
            step(&journal, n, &mut live);
        }
        drop(journal);
        std::fs::write(
            dir.path().join(NEW_FILE_NAME),
            br#"{"record":"compacted","header":{"terminations_dropped":0,"outcomes_dropped":0,"compactions":1}}
{"record":"fact","fact":{"type":"instance_lau"#,
        )
        .unwrap();
        let opened = Journal::open_with(dir.path(), 1).unwrap();
        assert!(!dir.path().join(NEW_FILE_NAME).exists());
        assert_eq!(instance_ids(&opened.facts), (0..20).collect());
        assert_eq!(opened.terminations, 20 - LIVE as usize);
        // And a compaction that got past its rename is the journal.
        let c = opened
            .journal
            .compact(|| live.values().cloned().collect())
            .unwrap();
        assert_eq!(c.facts_kept, LIVE as usize);
        drop(opened);
        let opened = Journal::open_with(dir.path(), 1).unwrap();
        assert_eq!(instance_ids(&opened.facts), (20 - LIVE..20).collect());
        assert_eq!(opened.terminations, 20 - LIVE as usize);
    }
}
