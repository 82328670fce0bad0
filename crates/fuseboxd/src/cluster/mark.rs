//! How far a partition's local log is known to reach into `FUSEBOX_APPLIED`: the stream
//! sequence of a batch the log holds, with the log position it was written at, in
//! `<partition dir>/applied.seq`. A new owner with such a log starts its catch-up right
//! after that batch, instead of reading the partition's whole history (days of
//! batches) before it may serve.
//!
//! The mark is a lower bound, never more: it is written only after the batch it names
//! is committed (so flushed), and without an fsync of its own. A mark that a crash left
//! stale, empty or torn only costs a longer catch-up (the catch-up skips batches the
//! log already holds), and so does a log behind the mark's position (a log replaced
//! or wiped beside it): either is read as "from the beginning".

use std::path::{Path, PathBuf};

/// Batches between two writes of the mark while serving (plus one at every clean stop
/// and after every catch-up).
const WRITE_EVERY: u32 = 1_000;

pub struct AppliedMark {
    path: PathBuf,
    since_written: u32,
    /// An outcome of a batch after the mark on disk is not in the shared ledger yet:
    /// the mark stays there, so the next catch-up reads that batch again and writes
    /// the outcome back.
    held: bool,
}

impl AppliedMark {
    pub fn new(partition_dir: &Path) -> Self {
        AppliedMark {
            path: partition_dir.join("applied.seq"),
            since_written: 0,
            held: false,
        }
    }

    /// The stream sequence a log now at `log_position` is known to hold, or 0
    /// (unknown: read the stream from the start).
    pub fn read(&self, log_position: u64) -> u64 {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return 0;
        };
        let mut fields = text.split_whitespace().map(str::parse::<u64>);
        match (fields.next(), fields.next(), fields.next()) {
            (Some(Ok(sequence)), Some(Ok(written_at)), None) if written_at <= log_position => {
                sequence
            }
            _ => 0,
        }
    }

    /// After a committed batch: writes the mark now and then.
    pub fn committed(&mut self, sequence: u64, log_position: u64) {
        self.since_written += 1;
        if self.since_written >= WRITE_EVERY {
            self.write(sequence, log_position);
        }
    }

    /// Keeps the mark where it is (see `held`) until [`AppliedMark::release_hold`].
    pub fn hold(&mut self) {
        self.held = true;
    }

    /// Every outcome owed is in the shared ledger now: the mark may move again.
    pub fn release_hold(&mut self) {
        self.held = false;
    }

    /// Writes the mark (write-then-rename, so a reader sees the old or the new one).
    /// A failure is only logged: the next owner then reads more of the stream.
    pub fn write(&mut self, sequence: u64, log_position: u64) {
        self.since_written = 0;
        if self.held {
            return;
        }
        let temporary = self.path.with_extension("seq.tmp");
        let written = std::fs::write(&temporary, format!("{sequence} {log_position}\n"))
            .and_then(|()| std::fs::rename(&temporary, &self.path));
        if let Err(err) = written {
            tracing::warn!(path = %self.path.display(), %err, "cannot write the catch-up mark");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_and_anything_doubtful_means_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut mark = AppliedMark::new(dir.path());
        assert_eq!(mark.read(100), 0, "no mark yet");
        mark.write(42, 90);
        assert_eq!(mark.read(90), 42);
        assert_eq!(mark.read(100), 42, "the log grew since");
        assert_eq!(
            mark.read(10),
            0,
            "a log behind the mark is not the one it was written for"
        );
        for _ in 0..WRITE_EVERY - 1 {
            mark.committed(43, 95);
        }
        assert_eq!(
            mark.read(100),
            42,
            "written only every {WRITE_EVERY} batches"
        );
        mark.committed(44, 99);
        assert_eq!(mark.read(100), 44);
        mark.hold();
        mark.write(45, 100);
        for _ in 0..WRITE_EVERY {
            mark.committed(46, 100);
        }
        assert_eq!(mark.read(100), 44, "a held mark is not moved");
        mark.release_hold();
        mark.write(47, 100);
        assert_eq!(mark.read(100), 47, "a released hold lets it move again");
        let file = dir.path().join("applied.seq");
        for damaged in ["", "44", "4x 99", "44 99 1"] {
            std::fs::write(&file, damaged).unwrap();
            assert_eq!(mark.read(100), 0, "{damaged:?} was trusted");
        }
    }
}
