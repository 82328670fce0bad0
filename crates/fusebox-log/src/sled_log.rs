//! [`EventLog`] on sled 0.34: one `sled::Db`, one tree per [`Tree`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use sled::{Batch, IVec};

use crate::error::LogError;
use crate::store::{Entry, EventLog, Scan, Tree, WriteBatch};

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
        let open_error = |source| LogError::Open {
            path: path.to_owned(),
            source,
        };
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(options.cache_capacity)
            // The guard flushes every batch itself (group commit); a background flusher
            // would only add fsyncs competing with it.
            .flush_every_ms(None);
        let db = catch_unwind(AssertUnwindSafe(|| config.open()))
            .unwrap_or_else(|panic| Err(sled::Error::Unsupported(panic_text(&*panic))))
            .map_err(open_error)?;
        let trees = Tree::ALL
            .iter()
            .map(|tree| db.open_tree(tree.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(open_error)?;
        Ok(SledLog {
            path: path.to_owned(),
            db,
            trees,
        })
    }

    fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree as usize]
    }

    fn storage(&self, source: sled::Error) -> LogError {
        LogError::Storage {
            path: self.path.clone(),
            source,
        }
    }

    fn boxed<'a>(&'a self, iter: sled::Iter) -> Scan<'a, IVec> {
        Box::new(iter.map(move |item| item.map_err(|e| self.storage(e))))
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
}
