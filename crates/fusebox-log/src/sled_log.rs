//! [`EventLog`] on sled 0.34: one `sled::Db`, one tree per [`Tree`].

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sled::{Batch, IVec};

use crate::error::LogError;
use crate::keys::{FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::store::{Entry, EventLog, Scan, SideWriter, Tree, WriteBatch};
use crate::wal::{self, CommitFile, Record};

/// File in the data directory that says a fusebox log lives here.
const MARKER: &str = "FUSEBOX_LOG";
const MARKER_TEXT: &str = "This directory holds a fusebox event log (sled). Inspect it with \
`fusebox log stats|verify|export --data-dir <this directory>`.\n";
/// sled 0.34's one database file in its directory.
const DATA_FILE: &str = "db";
/// How long opening waits for a lock held by a handle that is closing.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// sled settings an operator may want to tune.
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's page cache, in bytes.
    pub cache_capacity: u64,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity: 256 << 20,
        }
    }
}

pub struct SledLog {
    path: PathBuf,
    db: sled::Db,
    trees: Vec<sled::Tree>,
    blobs: Arc<BlobSync>,
    /// sled's database file, opened again for `fdatasync` (see [`flush`]).
    data_file: Arc<File>,
    /// The log's own handle commits new frames through the commit file (`wal.rs`); a
    /// shared handle has none, and its flushes are full ones.
    commits: Option<Mutex<Commits>>,
}

/// The commit file and what the writes since the last flush put in it.
struct Commits {
    file: CommitFile,
    staged: Record,
    /// A write since the last flush was not a new frame (a snapshot repair, the ledger,
    /// the format version): the next flush is a full sync of sled.
    needs_full_sync: bool,
    /// Frame bytes committed since sled's file was last synced in full, and when that was.
    since_sled_synced: usize,
    sled_synced_at: Instant,
}

/// sled's file is synced in full at least every this many frame bytes, so that what it
/// writes between (`sync_file_range` alone, no `fdatasync`: not durable on a disk with a
/// volatile write cache) never decides the reuse of one of its segments. sled reuses a
/// segment only once its log has gone a whole segment (512 KiB) past everything moved
/// out of it; frames plus the tree nodes they rewrite are well under that in 64 KiB of
/// frames, so a sync always falls between a move and the overwrite, as when every
/// commit synced sled.
const SYNC_SLED_EVERY_BYTES: usize = 64 << 10;
/// ... and at least this often while frames come: a disk that filled up (sled's own
/// writes fail, the commit file's never do, it is allocated) is noticed within this
/// long, not only after 64 KiB more of frames, and sled's unsynced writes span no more.
const SYNC_SLED_EVERY: Duration = Duration::from_millis(200);

impl SledLog {
    /// Opens (or creates) the sled database at `path`. Damage, a directory that is not a
    /// sled database, or a lock held by another process is a [`LogError::Open`] naming the
    /// path and the recovery command; sled panics on some damaged files, and those are
    /// turned into the same error rather than taking the daemon down.
    pub fn open(path: &Path, options: &SledOptions) -> Result<SledLog, LogError> {
        let open_error = |source| LogError::open(path, source);
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(options.cache_capacity)
            // The guard flushes every batch itself (group commit); a background flusher
            // would only add fsyncs competing with it.
            .flush_every_ms(None);
        let db = open_db(&config).map_err(open_error)?;
        let trees = Tree::ALL
            .iter()
            .map(|tree| db.open_tree(tree.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(open_error)?;
        let data_file =
            File::open(path.join(DATA_FILE)).map_err(|e| open_error(sled::Error::Io(e)))?;
        let (file, replay) =
            CommitFile::open(path, wal::CAPACITY).map_err(|e| open_error(sled::Error::Io(e)))?;
        let mut log = SledLog {
            path: path.to_owned(),
            db,
            trees,
            blobs: BlobSync::new(path),
            data_file: Arc::new(data_file),
            commits: None,
        };
        // What the last run committed after sled's last full flush: applied again (the
        // frames sled already holds are rewritten with the same bytes), made durable in
        // sled, and the commit file started over.
        let mut commits = Commits {
            file,
            staged: Record::default(),
            needs_full_sync: false,
            since_sled_synced: 0,
            sled_synced_at: Instant::now(),
        };
        if !replay.is_empty() {
            let frames: usize = replay.iter().map(Vec::len).sum();
            for record in replay {
                let mut batch = WriteBatch::default();
                for (key, value) in record {
                    batch.insert(Tree::Events, key, value);
                }
                log.apply(batch, None)?;
            }
            tracing::info!(path = %path.display(), frames, "applied the commit file's frames to sled");
        }
        if !commits.file.is_empty() {
            log.checkpoint(&mut commits)?;
        }
        log.commits = Some(Mutex::new(commits));
        log.check_marker()?;
        Ok(log)
    }

    /// Writes a batch to sled, staging its new frames in `commits` when there are any.
    fn apply(&self, batch: WriteBatch, mut commits: Option<&mut Commits>) -> Result<(), LogError> {
        for (tree, writes) in batch.into_trees() {
            if writes.is_empty() {
                continue;
            }
            if let Some(commits) = commits.as_deref_mut() {
                for (key, value) in &writes {
                    match (value, tree) {
                        (Some(value), Tree::Events) => commits.staged.push(key, value),
                        _ => commits.needs_full_sync = true,
                    }
                }
            }
            let sled_tree = self.tree(tree);
            let written = match <[_; 1]>::try_from(writes) {
                // One key is atomic as it is. A sled batch is not free: to make it atomic
                // in recovery, sled writes out its I/O buffer before and after it (two
                // writes, each waited on by one of its I/O threads, woken all seven at a
                // time), which a commit through the commit file would pay for nothing.
                Ok([(key, Some(value))]) => sled_tree.insert(key, value).map(drop),
                Ok([(key, None)]) => sled_tree.remove(key).map(drop),
                Err(writes) => {
                    let mut sled_batch = Batch::default();
                    for (key, value) in writes {
                        match value {
                            Some(value) => sled_batch.insert(key, value),
                            None => sled_batch.remove(key),
                        }
                    }
                    sled_tree.apply_batch(sled_batch)
                }
            };
            written.map_err(|e| self.storage(e))?;
        }
        Ok(())
    }

    /// Makes every write so far durable in sled itself: what is staged needs the commit
    /// file no more.
    fn sync_sled(&self, commits: &mut Commits) -> Result<(), LogError> {
        flush(&self.db, &self.blobs, &self.data_file).map_err(|e| self.storage(e))?;
        commits.staged.clear();
        commits.needs_full_sync = false;
        commits.since_sled_synced = 0;
        commits.sled_synced_at = Instant::now();
        Ok(())
    }

    /// Syncs sled, then empties the commit file (whose records it now holds).
    fn checkpoint(&self, commits: &mut Commits) -> Result<(), LogError> {
        self.sync_sled(commits)?;
        if !commits.file.is_empty() {
            commits
                .file
                .start_over()
                .map_err(|e| self.storage(sled::Error::Io(e)))?;
        }
        Ok(())
    }

    /// A commit: the staged frames appended to the commit file with one `fdatasync`; a
    /// full sync of sled instead when something else was written or one is due (the
    /// commit file keeps its records, applied again at open, harmlessly, until it is
    /// full); a checkpoint when they do not fit.
    fn commit(&self, commits: &mut Commits) -> Result<(), LogError> {
        commits.since_sled_synced += commits.staged.len();
        let due = commits.since_sled_synced >= SYNC_SLED_EVERY_BYTES
            || (commits.since_sled_synced > 0
                && commits.sled_synced_at.elapsed() >= SYNC_SLED_EVERY);
        if commits.needs_full_sync || due {
            return self.sync_sled(commits);
        }
        if commits.staged.is_empty() {
            return Ok(());
        }
        let appended = commits
            .file
            .append(&mut commits.staged)
            .map_err(|e| self.storage(sled::Error::Io(e)))?;
        if !appended {
            return self.checkpoint(commits);
        }
        commits.staged.clear();
        Ok(())
    }

    /// sled reads garbage segments as a torn tail and opens them as an empty database,
    /// which would silently start a new, empty log over a damaged one. A marker file,
    /// written once the log's format version is durable, tells "new" from "lost".
    fn check_marker(&mut self) -> Result<(), LogError> {
        let marker = self.path.join(MARKER);
        let has_version = self.get(Tree::Meta, FORMAT_VERSION_KEY)?.is_some();
        if !has_version && marker.exists() {
            return Err(LogError::Corrupt {
                path: self.path.clone(),
                what: "the whole log".to_owned(),
                detail: "sled finds no fusebox data in files that held a log (garbage or \
                         truncated files)"
                    .to_owned(),
            });
        }
        if !has_version && self.last(Tree::Events)?.is_none() {
            let mut batch = WriteBatch::default();
            batch.insert(
                Tree::Meta,
                FORMAT_VERSION_KEY,
                FORMAT_VERSION.to_string().into_bytes(),
            );
            self.write(batch)?;
            self.flush()?;
        }
        if !marker.exists() {
            std::fs::write(&marker, MARKER_TEXT).map_err(|e| self.storage(sled::Error::Io(e)))?;
        }
        Ok(())
    }

    /// Another handle on the same open database (not `Clone`: the log's own handle is
    /// its one writer of batches).
    fn share(&self) -> SledLog {
        SledLog {
            path: self.path.clone(),
            db: self.db.clone(),
            trees: self.trees.clone(),
            blobs: self.blobs.clone(),
            data_file: self.data_file.clone(),
            commits: None,
        }
    }

    fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree as usize]
    }

    fn storage(&self, source: sled::Error) -> LogError {
        LogError::storage(&self.path, source)
    }

    fn boxed<'a>(&'a self, iter: sled::Iter) -> Scan<'a, IVec> {
        Box::new(iter.map(move |item| item.map_err(|e| self.storage(e))))
    }
}

/// Opens sled, retrying briefly while the lock is held: a handle this process just
/// dropped releases it only when sled's background threads let go of the files.
fn open_db(config: &sled::Config) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let result = catch_unwind(AssertUnwindSafe(|| config.open()))
            .unwrap_or_else(|panic| Err(sled::Error::Unsupported(panic_text(&*panic))));
        match result {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown failure");
    format!("sled failed while reading its files ({text})")
}

impl EventLog for SledLog {
    type Bytes = IVec;

    fn path(&self) -> &Path {
        &self.path
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<IVec>, LogError> {
        self.tree(tree).get(key).map_err(|e| self.storage(e))
    }

    fn scan(&self, tree: Tree, from: &[u8]) -> Scan<'_, IVec> {
        self.boxed(self.tree(tree).range(from..))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Scan<'_, IVec> {
        self.boxed(self.tree(tree).scan_prefix(prefix))
    }

    fn last(&self, tree: Tree) -> Result<Option<Entry<IVec>>, LogError> {
        self.tree(tree).last().map_err(|e| self.storage(e))
    }

    fn floor(&self, tree: Tree, key: &[u8]) -> Result<Option<Entry<IVec>>, LogError> {
        self.tree(tree)
            .range(..=key)
            .next_back()
            .transpose()
            .map_err(|e| self.storage(e))
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), LogError> {
        let mut commits = self.commits.take();
        let applied = self.apply(
            batch,
            commits
                .as_mut()
                .map(|c| c.get_mut().unwrap_or_else(|p| p.into_inner())),
        );
        self.commits = commits;
        applied
    }

    fn flush(&self) -> Result<(), LogError> {
        match &self.commits {
            Some(commits) => self.commit(&mut commits.lock().unwrap_or_else(|p| p.into_inner())),
            None => flush(&self.db, &self.blobs, &self.data_file).map_err(|e| self.storage(e)),
        }
    }

    fn size_on_disk(&self) -> Result<u64, LogError> {
        self.db.size_on_disk().map_err(|e| self.storage(e))
    }

    fn side_writer(&self) -> Box<dyn SideWriter> {
        Box::new(SledSide(self.share()))
    }
}

/// A clean close leaves nothing for the next open to apply again.
impl Drop for SledLog {
    fn drop(&mut self) {
        let Some(commits) = self.commits.take() else {
            return;
        };
        let mut commits = commits.into_inner().unwrap_or_else(|p| p.into_inner());
        if commits.file.is_empty() && !commits.needs_full_sync {
            return;
        }
        if let Err(err) = self.checkpoint(&mut commits) {
            tracing::warn!(%err, "checkpoint on close failed; the next open applies the commit file again");
        }
    }
}

/// sled's handles are shared references to one database, so another thread writes
/// through a second handle.
struct SledSide(SledLog);

impl SideWriter for SledSide {
    fn put(&self, tree: Tree, key: &[u8], value: Option<Vec<u8>>) -> Result<(), LogError> {
        let log = &self.0;
        let tree = log.tree(tree);
        match value {
            Some(value) => tree.insert(key, value).map(drop),
            None => tree.remove(key).map(drop),
        }
        .map_err(|e| log.storage(e))
    }

    fn remove_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<(), LogError> {
        let log = &self.0;
        let tree = log.tree(tree);
        for key in tree.scan_prefix(prefix).keys() {
            tree.remove(key.map_err(|e| log.storage(e))?)
                .map_err(|e| log.storage(e))?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), LogError> {
        EventLog::flush(&self.0)
    }
}

/// Makes every write before it durable, which sled 0.34's flush alone does not on
/// Linux:
/// - the blob files sled writes but never fsyncs (values or nodes above a quarter
///   segment, see `keys::SNAPSHOT_PIECE_BYTES`) are synced first; otherwise a power loss
///   before the kernel wrote one back makes sled's recovery stop at it and drop every
///   flushed write after it. Snapshot pieces and normal frames are too small to make
///   blobs; a frame of a very large event (up to `max_event_bytes`) is not;
/// - sled writes its log with `sync_file_range`, which writes the pages but neither
///   the file's size and block allocation nor the disk's write cache (its man page: "no
///   guarantees that the data will be available after a crash" for a file that grows,
///   as sled's does). An `fdatasync` of the database file after sled's flush covers both.
fn flush(db: &sled::Db, blobs: &BlobSync, data_file: &File) -> sled::Result<()> {
    blobs.sync()?;
    db.flush()?;
    Ok(data_file.sync_data()?)
}

/// The blob files (named by their log sequence number) synced so far.
struct BlobSync {
    dir: PathBuf,
    synced_through: Mutex<u64>,
}

impl BlobSync {
    fn new(db_path: &Path) -> Arc<BlobSync> {
        Arc::new(BlobSync {
            dir: db_path.join("blobs"),
            synced_through: Mutex::new(0),
        })
    }

    /// Fsyncs the blob files newer than the last call's, then their directory; the
    /// number of files synced. Blob numbers only grow, so one directory listing (a few
    /// microseconds for the usually empty directory) finds the new ones.
    fn sync(&self) -> std::io::Result<usize> {
        let mut synced_through = self
            .synced_through
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut newest = *synced_through;
        let mut synced = 0;
        for entry in entries {
            let entry = entry?;
            let Some(number) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if number > *synced_through {
                match std::fs::File::open(entry.path()) {
                    Ok(file) => file.sync_all()?,
                    // Collected by sled since the listing: nothing left to keep.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                newest = newest.max(number);
                synced += 1;
            }
        }
        if synced > 0 {
            std::fs::File::open(&self.dir)?.sync_all()?;
        }
        *synced_through = newest;
        Ok(synced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;

    fn synced_through(log: &SledLog) -> u64 {
        *log.blobs.synced_through.lock().unwrap()
    }

    #[test]
    fn a_full_flush_syncs_the_blob_files_sled_leaves_unsynced() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        assert_eq!(synced_through(&log), 0);

        // One frame of a very large event: above a quarter segment, sled writes a blob.
        let mut batch = WriteBatch::default();
        batch.insert(Tree::Events, keys::position(1), vec![7; 300_000]);
        log.write(batch).unwrap();
        let newest_blob = std::fs::read_dir(dir.path().join("blobs"))
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.parse::<u64>().ok())
            .max()
            .expect("sled wrote the value as a blob file");
        // The frame's commit goes to the commit file; a full flush (the snapshot
        // writer's, a checkpoint's) is the one that must sync the blob.
        log.flush().unwrap();
        log.side_writer().flush().unwrap();
        assert_eq!(synced_through(&log), newest_blob);
        assert_eq!(log.blobs.sync().unwrap(), 0, "each file is synced once");
    }

    /// The directory as a crash would leave it: what reached the files, nothing of what
    /// sled holds only in memory.
    fn crash_copy(from: &Path, to: &Path, with_commit_file: bool) {
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if entry.file_type().unwrap().is_file() && (with_commit_file || name != wal::FILE) {
                std::fs::copy(entry.path(), to.join(name)).unwrap();
            }
        }
    }

    #[test]
    fn a_commit_is_durable_in_the_commit_file_before_sled_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        let mut batch = WriteBatch::default();
        batch.insert(Tree::Events, keys::position(1), b"frame one".to_vec());
        batch.insert(Tree::Events, keys::position(2), b"frame two".to_vec());
        log.write(batch).unwrap();
        log.flush().unwrap();

        let crashed = tempfile::tempdir().unwrap();
        crash_copy(dir.path(), crashed.path(), true);
        let reopened = SledLog::open(crashed.path(), &SledOptions::default()).unwrap();
        let frames: Vec<_> = reopened
            .scan(Tree::Events, &[])
            .map(|item| item.unwrap().1.to_vec())
            .collect();
        assert_eq!(frames, [b"frame one".to_vec(), b"frame two".to_vec()]);
        drop(reopened);
        // Opened again: the first open made them durable in sled and emptied the file.
        let reopened = SledLog::open(crashed.path(), &SledOptions::default()).unwrap();
        assert_eq!(reopened.scan(Tree::Events, &[]).count(), 2);
        let (file, replay) = CommitFile::open(crashed.path(), wal::CAPACITY).unwrap();
        assert!(file.is_empty() && replay.is_empty());
        drop(reopened);

        // Without the commit file the same crash loses them: sled had not written them.
        let lost = tempfile::tempdir().unwrap();
        crash_copy(dir.path(), lost.path(), false);
        let reopened = SledLog::open(lost.path(), &SledOptions::default()).unwrap();
        assert_eq!(reopened.scan(Tree::Events, &[]).count(), 0);
    }

    #[test]
    fn sled_is_synced_in_full_every_so_many_frame_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        let frame = vec![5u8; 4096];
        let frames = SYNC_SLED_EVERY_BYTES / frame.len() + 1;
        for pos in 1..=frames as u64 {
            let mut batch = WriteBatch::default();
            batch.insert(Tree::Events, keys::position(pos), frame.clone());
            log.write(batch).unwrap();
            log.flush().unwrap();
        }
        // Without the commit file, sled's files alone hold the frames up to the sync.
        let crashed = tempfile::tempdir().unwrap();
        crash_copy(dir.path(), crashed.path(), false);
        let reopened = SledLog::open(crashed.path(), &SledOptions::default()).unwrap();
        let held = reopened.scan(Tree::Events, &[]).count();
        assert!(
            held >= SYNC_SLED_EVERY_BYTES / (frame.len() + 16),
            "sled's files hold {held} of {frames} frames"
        );
    }

    #[test]
    fn sled_is_synced_in_full_while_frames_come_even_slowly() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = SledLog::open(dir.path(), &SledOptions::default()).unwrap();
        for pos in 1..=2 {
            let mut batch = WriteBatch::default();
            batch.insert(Tree::Events, keys::position(pos), b"small".to_vec());
            log.write(batch).unwrap();
            log.flush().unwrap();
            std::thread::sleep(SYNC_SLED_EVERY + Duration::from_millis(50));
        }
        let crashed = tempfile::tempdir().unwrap();
        crash_copy(dir.path(), crashed.path(), false);
        let reopened = SledLog::open(crashed.path(), &SledOptions::default()).unwrap();
        assert_eq!(
            reopened.scan(Tree::Events, &[]).count(),
            2,
            "the second commit came after the interval and synced sled"
        );
    }
}
