//! Snapshots off the commit path. A batch that takes a snapshot keeps a view of the
//! state (a clone, nearly free: runs, their orders and ids and each tenant's ledger are
//! shared `Arc`s, copied only when they change while the view lives) and hands it to this
//! thread once the batch is durable, so nothing written here holds a record that is not
//! on disk. The thread encodes the view, brings the ledger tree to the view's position
//! and writes the snapshot; only then, with the new snapshot durable, does it remove the
//! snapshots beyond `snapshots_kept`, so there is never a moment without a snapshot.
//!
//! The ledger tree says which position it holds (`keys::LEDGER_POSITION_KEY`). Its
//! entries are written one by one (see [`SideWriter`]), so that key is removed first and
//! written last: a tree cut short by a crash says no position, and the next open
//! rewrites it whole (`Guard::reconcile_ledger`), as it does after any crash.
//!
//! A snapshot that fails or never lands costs start-up time only: start-up takes an
//! older one, or replays the whole log. Jobs are done in order and none is skipped (a
//! hand-over waits while one job is queued behind the one being written), so which
//! positions have a snapshot does not depend on timing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use fusebox_core::fixed_hash::FixedHasher;
use tracing::warn;

use crate::error::LogError;
use crate::keys;
use crate::record;
use crate::snapshot;
use crate::state::LogState;
use crate::store::{SideWriter, Tree};

/// Snapshot pieces written between two flushes of the writer. Whatever the writer has
/// not flushed rides on the guard's next commit, so this bounds what a commit can be
/// held up by: 128 pieces of 4 KiB, half a MiB (a 36 MB snapshot would otherwise make
/// one commit write all of it).
const PIECES_PER_FLUSH: u32 = 128;

/// Ledger keys (tenant, op_key).
pub(crate) type LedgerKeys = HashSet<(String, String), FixedHasher>;

/// A snapshot to write: the state at a durable position, and the ledger keys changed
/// since the previous job.
pub(crate) struct SnapshotJob {
    pub(crate) view: LogState,
    pub(crate) ledger_changed: LedgerKeys,
}

pub(crate) struct Snapshotter {
    path: PathBuf,
    jobs: Option<mpsc::SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

enum Job {
    Write(Box<SnapshotJob>),
    /// Answered once the jobs before it are done, with the outcome of the last write.
    Wait(mpsc::Sender<Result<(), LogError>>),
}

impl Snapshotter {
    /// Starts the writer; `positions` are the snapshots the tree holds, newest first.
    pub(crate) fn spawn(
        path: &Path,
        store: Box<dyn SideWriter>,
        positions: Vec<u64>,
        kept: usize,
    ) -> Result<Self, LogError> {
        let (jobs, receive) = mpsc::sync_channel(1);
        let writer = Writer {
            store,
            positions,
            kept: kept.max(1),
            unwritten: LedgerKeys::default(),
            last: Ok(()),
        };
        let thread = std::thread::Builder::new()
            .name("fusebox-snapshots".to_owned())
            .spawn(move || writer.run(receive))
            .map_err(|e| LogError::SnapshotWriter {
                path: path.to_owned(),
                detail: format!("cannot start its thread: {e}"),
            })?;
        Ok(Snapshotter {
            path: path.to_owned(),
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Hands over a job whose records are all durable. Waits while another job is
    /// queued. A writer that is gone is only warned about: the batch is committed, and
    /// a missing snapshot costs start-up time, not correctness.
    pub(crate) fn write(&self, job: SnapshotJob) {
        if self.send(Job::Write(Box::new(job))).is_err() {
            warn!(path = %self.path.display(), "the snapshot writer is gone; no snapshot taken");
        }
    }

    /// Waits until every job handed over is done; the outcome of the last one.
    pub(crate) fn wait(&self) -> Result<(), LogError> {
        let (reply, answer) = mpsc::channel();
        self.send(Job::Wait(reply))?;
        answer.recv().map_err(|_| self.gone())?
    }

    fn send(&self, job: Job) -> Result<(), LogError> {
        let jobs = self.jobs.as_ref().expect("jobs close only on drop");
        jobs.send(job).map_err(|_| self.gone())
    }

    fn gone(&self) -> LogError {
        LogError::SnapshotWriter {
            path: self.path.clone(),
            detail: "its thread stopped".to_owned(),
        }
    }
}

impl Drop for Snapshotter {
    /// Finishes the jobs handed over, so a closed guard leaves its snapshots on disk.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!(path = %self.path.display(), "the snapshot writer panicked");
            }
        }
    }
}

struct Writer {
    store: Box<dyn SideWriter>,
    /// Snapshots in the tree, newest first (only this thread writes the tree).
    positions: Vec<u64>,
    kept: usize,
    /// Ledger keys changed before a job that failed: written with the next one.
    unwritten: LedgerKeys,
    last: Result<(), LogError>,
}

impl Writer {
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Write(job) => {
                    self.last = self.write(*job);
                    if let Err(why) = &self.last {
                        warn!(%why, "a snapshot was not written; start-up uses an older one");
                    }
                }
                Job::Wait(reply) => {
                    let last = std::mem::replace(&mut self.last, Ok(()));
                    // The guard may have stopped waiting (it is being dropped).
                    let _ = reply.send(last);
                }
            }
        }
    }

    fn write(&mut self, job: SnapshotJob) -> Result<(), LogError> {
        let SnapshotJob {
            view,
            ledger_changed,
        } = job;
        let pos = view.position;
        self.unwritten.extend(ledger_changed);
        let mut ledger = Vec::with_capacity(self.unwritten.len());
        for (tenant, op_key) in &self.unwritten {
            let entry = match view.engine.ledger().get(tenant, op_key) {
                Some(entry) => Some(record::encode(entry, "a ledger entry")?),
                None => None,
            };
            ledger.push((keys::ledger(tenant, op_key), entry));
        }
        let bytes = snapshot::encode(&view)?;
        // Released before the writes, so the guard stops copying what it changes.
        drop(view);

        self.store
            .put(Tree::Ledger, keys::LEDGER_POSITION_KEY, None)?;
        for (key, entry) in ledger {
            self.store.put(Tree::Ledger, &key, entry)?;
        }
        let position = keys::position(pos).to_vec();
        self.store
            .put(Tree::Ledger, keys::LEDGER_POSITION_KEY, Some(position))?;
        self.unwritten.clear();

        if self.positions.contains(&pos) {
            // A snapshot at this position already (a checkpoint with nothing new since
            // the last one, maybe written by an older build in one piece): its pieces
            // would mix with these, so they go first.
            self.store
                .remove_prefix(Tree::Snapshots, &keys::position(pos))?;
        }
        // Piece 0 last: it is the snapshot's commit point (`log::snapshot_positions`
        // lists only snapshots that have it), so a crash in between leaves pieces no
        // reader sees, removed at the next open.
        let pieces: Vec<&[u8]> = bytes.chunks(keys::SNAPSHOT_PIECE_BYTES).collect();
        for (index, piece) in pieces.iter().enumerate().skip(1) {
            let index = u32::try_from(index).expect("a snapshot under 16 TiB");
            let key = keys::snapshot_piece(pos, index);
            self.store
                .put(Tree::Snapshots, &key, Some(piece.to_vec()))?;
            if index % PIECES_PER_FLUSH == 0 {
                self.store.flush()?;
            }
        }
        self.store.flush()?;
        let first = pieces.first().map_or_else(Vec::new, |piece| piece.to_vec());
        self.store
            .put(Tree::Snapshots, &keys::snapshot_piece(pos, 0), Some(first))?;
        self.store.flush()?;
        let mut older: Vec<u64> = self
            .positions
            .iter()
            .copied()
            .filter(|&p| p != pos)
            .collect();
        older.insert(0, pos);
        let removed = older.split_off(self.kept.min(older.len()));
        self.positions = older;
        for old in &removed {
            self.store
                .remove_prefix(Tree::Snapshots, &keys::position(*old))?;
        }
        if !removed.is_empty() {
            self.store.flush()?;
        }
        Ok(())
    }
}
