//! [`EventLog`] on sled 0.34: one `sled::Db`, one tree per [`Tree`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sled::{Batch, IVec};

use crate::error::LogError;
use crate::keys::{FORMAT_VERSION, FORMAT_VERSION_KEY};
use crate::store::{Entry, EventLog, Scan, SideWriter, Tree, WriteBatch};

/// File in the data directory that says a fusebox log lives here.
const MARKER: &str = "FUSEBOX_LOG";
const MARKER_TEXT: &str = "This directory holds a fusebox event log (sled). Inspect it with \
`fusebox log stats|verify|export --data-dir <this directory>`.\n";
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
}

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
        let mut log = SledLog {
            path: path.to_owned(),
            db,
            trees,
        };
        log.check_marker()?;
        Ok(log)
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
        for (tree, writes) in batch.into_trees() {
            if writes.is_empty() {
                continue;
            }
            let mut sled_batch = Batch::default();
            for (key, value) in writes {
                match value {
                    Some(value) => sled_batch.insert(key, value),
                    None => sled_batch.remove(key),
                }
            }
            self.tree(tree)
                .apply_batch(sled_batch)
                .map_err(|e| self.storage(e))?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), LogError> {
        self.db.flush().map(drop).map_err(|e| self.storage(e))
    }

    fn size_on_disk(&self) -> Result<u64, LogError> {
        self.db.size_on_disk().map_err(|e| self.storage(e))
    }

    fn side_writer(&self) -> Box<dyn SideWriter> {
        Box::new(SledSide {
            path: self.path.clone(),
            db: self.db.clone(),
            trees: self.trees.clone(),
        })
    }
}

/// sled's handles are shared references to one database, so another thread writes
/// through its own.
struct SledSide {
    path: PathBuf,
    db: sled::Db,
    trees: Vec<sled::Tree>,
}

impl SideWriter for SledSide {
    fn put(&self, tree: Tree, key: &[u8], value: Option<Vec<u8>>) -> Result<(), LogError> {
        let tree = &self.trees[tree as usize];
        match value {
            Some(value) => tree.insert(key, value).map(drop),
            None => tree.remove(key).map(drop),
        }
        .map_err(|source| LogError::storage(&self.path, source))
    }

    fn flush(&self) -> Result<(), LogError> {
        self.db
            .flush()
            .map(drop)
            .map_err(|source| LogError::storage(&self.path, source))
    }
}
