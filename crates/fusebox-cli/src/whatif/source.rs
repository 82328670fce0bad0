//! Where recorded runs come from: JSONL files (`fusebox log export`, traces, stdin) or a
//! fuseboxd data directory, live or not. Either way the caller gets the same thing: the
//! records in the order they were applied, through a callback.
//!
//! A data directory is never opened in place. sled 0.34 takes an exclusive lock on its
//! files (a running daemon's directory cannot be opened twice) and writes on open (its
//! own recovery, the log's format marker), so this copies the directory into a private
//! temporary one and reads the copy. With the daemon stopped the copy is exact. With the
//! daemon running the copy is not one instant of the files; the log then reads as sled
//! recovers it — a prefix of what the daemon acknowledged, or damage — and the copy is
//! accepted only when its positions run without a gap from 1 to its end and every record
//! decodes; otherwise it is taken again, a few times, before giving up with advice.

use std::io::{self, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fusebox_core::Event;
use fusebox_log::log::{decode_frame, frames, last_position, records};
use fusebox_log::{inspect, LogOp, Record, SledLog};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::InputRules;
use crate::history::{Import, ImportSummary};
use crate::replay::{spawn_reader, Admitted, Input};
use crate::whatif::compare::Compact;

/// One applied record.
pub enum Item {
    Event(Box<Event>),
    /// Only a data directory has these: policy changes, retention, cluster adoptions.
    Op(LogOp),
}

pub enum Source {
    Files(Vec<String>),
    DataDir(PathBuf),
    /// An agent's own session history (`--from`).
    History(Import),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Files(files) => files.join(" "),
            Source::DataDir(dir) => format!("data dir {}", dir.display()),
            Source::History(import) => import.describe(),
        }
    }

    pub fn is_data_dir(&self) -> bool {
        matches!(self, Source::DataDir(_))
    }
}

/// What reading saw besides the records.
#[derive(Debug, Default)]
pub struct ReadTally {
    pub rejected: u64,
    pub duplicates: u64,
    /// For a data directory: the last position read.
    pub position: Option<u64>,
    /// For an agent's history: what was imported.
    pub imported: Option<ImportSummary>,
}

/// Where a record goes: with, for a data directory's events, the decision the daemon
/// recorded for it.
pub type Sink<'a> = dyn FnMut(Item, Option<Compact>) + 'a;

/// Reads every record of `source` in applied order into `sink`.
pub fn read(source: &Source, input: &InputRules, sink: &mut Sink<'_>) -> Result<ReadTally, String> {
    match source {
        Source::Files(files) => {
            read_files(&Input::Files(files.clone()), input, sink).map_err(|e| e.to_string())
        }
        Source::History(import) => {
            read_files(&Input::History(import.clone()), input, sink).map_err(|e| e.to_string())
        }
        Source::DataDir(dir) => read_data_dir(dir, sink),
    }
}

/// JSONL (or an agent's history) through the same reader thread and sequencer as
/// `fusebox replay`, so the two apply the same events in the same order.
fn read_files(source: &Input, input: &InputRules, sink: &mut Sink<'_>) -> io::Result<ReadTally> {
    let mut tally = ReadTally::default();
    let (sender, batches) = mpsc::sync_channel::<Admitted>(8);
    // The events go on to the sink, none comes back to the reader.
    let (_, spent) = mpsc::channel();
    let reader = spawn_reader(source, input.clone(), sender, spent);
    for admitted in batches {
        tally.duplicates += admitted.duplicates;
        for refused in admitted.rejected {
            tally.rejected += 1;
            eprintln!("{refused}");
        }
        for event in admitted.events {
            sink(Item::Event(Box::new(event)), None);
        }
    }
    tally.imported = reader
        .join()
        .map_err(|_| io::Error::other("the reader thread panicked"))??;
    Ok(tally)
}

/// The file fusebox-log writes into every data directory it holds a log in.
const LOG_MARKER: &str = "FUSEBOX_LOG";

/// How many times a copy of a live directory is taken before giving up.
const COPY_ATTEMPTS: usize = 3;

fn read_data_dir(dir: &Path, sink: &mut Sink<'_>) -> Result<ReadTally, String> {
    if !dir.is_dir() {
        return Err(format!("{}: no such directory", dir.display()));
    }
    // Opening a directory without a log would make an empty one (in the copy), and an
    // empty report for a mistyped path.
    if !dir.join(LOG_MARKER).is_file() {
        return Err(format!(
            "{}: not a fusebox data dir (no {LOG_MARKER} file; it is fuseboxd's [storage] data_dir)",
            dir.display()
        ));
    }
    let mut last_error = String::new();
    for _ in 0..COPY_ATTEMPTS {
        let copy = tempfile::Builder::new()
            .prefix("fusebox-whatif-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        copy_tree(dir, copy.path()).map_err(|e| format!("copying {}: {e}", dir.display()))?;
        // The whole copy is checked before any record reaches the sink, so a copy found
        // damaged half way through is taken again without the caller having seen half a
        // log; then it is read a second time, streaming (a week of events need not fit
        // in memory).
        let log = match inspect::open(copy.path()) {
            Ok(log) => log,
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        match check_records(&log) {
            Ok(last) => {
                let bar = position_bar(last);
                stream(&log, &bar, sink)?;
                if let Some(bar) = bar {
                    bar.finish_and_clear();
                }
                return Ok(ReadTally {
                    position: Some(last),
                    ..ReadTally::default()
                });
            }
            Err(e) => last_error = e,
        }
    }
    Err(format!(
        "could not read a consistent copy of {} in {COPY_ATTEMPTS} attempts ({last_error}). \
         Stop fuseboxd and run again, or pass a filesystem snapshot of the directory \
         (btrfs/zfs/LVM), or the JSONL of `fusebox log export` taken with fuseboxd stopped",
        dir.display()
    ))
}

/// Every record of a checked copy with the decision recorded for it.
fn stream(log: &SledLog, bar: &Option<ProgressBar>, sink: &mut Sink<'_>) -> Result<(), String> {
    for stored in frames(log, 1) {
        let (first, bytes) = stored.map_err(|e| e.to_string())?;
        let frame = decode_frame(log, first, bytes.as_ref()).map_err(|e| e.to_string())?;
        for (pos, entry) in (first..).zip(frame.entries()) {
            let record = entry.decode().map_err(|e| format!("position {pos}: {e}"))?;
            if let Some(bar) = bar {
                bar.inc(1);
            }
            match record {
                Record::Event(event) => {
                    let recorded = entry.decode_decision().ok().map(|d| Compact::of(&d));
                    sink(Item::Event(event), recorded);
                }
                Record::Op(op) => sink(Item::Op(op), None),
            }
        }
    }
    Ok(())
}

/// What a copy of a live directory can get wrong: a gap in positions, a record that
/// does not decode, an end that does not read. Returns the last position.
fn check_records(log: &SledLog) -> Result<u64, String> {
    let last = last_position(log).map_err(|e| e.to_string())?;
    let mut expected = 1u64;
    for record in records(log, 1) {
        let (pos, _) = record.map_err(|e| e.to_string())?;
        if pos != expected {
            return Err(format!("position {expected} is missing (next is {pos})"));
        }
        expected += 1;
    }
    if expected != last + 1 {
        return Err(format!(
            "the log ends at position {last} but reads only to {}",
            expected - 1
        ));
    }
    Ok(last)
}

fn position_bar(positions: u64) -> Option<ProgressBar> {
    if positions < 100_000 || !io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(positions);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} records {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// A plain recursive copy: files that grow while being read are copied as far as they
/// were read, which sled's recovery treats as a torn tail. The commit file goes first
/// (see [`fusebox_log::COMMIT_FILE`]).
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let mut entries = std::fs::read_dir(from)?.collect::<io::Result<Vec<_>>>()?;
    entries.sort_by_key(|entry| entry.file_name() != fusebox_log::COMMIT_FILE);
    for entry in entries {
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            match std::fs::copy(entry.path(), &target) {
                Ok(_) => {}
                // A file the daemon removed between listing and copying (a blob
                // sled collected) was not part of the state the copy can show.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
