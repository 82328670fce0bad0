//! Pipelined group commit: a guard whose flushes are made by another thread.
//!
//! With [`Guard::defer_flushes`], a batch is decided and written on the guard's thread
//! and made durable by a [`Flusher`] on a thread of its own, so the guard decides the
//! next batch while the disk syncs the last one. Nothing changes in what is durable
//! when: a batch's decisions must not leave the process before a flush that *started*
//! after the batch was submitted has returned, exactly as they must not before
//! `submit_batch` returns without deferral. One flush covers every batch written
//! before it (the log is one sequence of writes), so under load one sync serves the
//! batches decided during the previous one.
//!
//! A failed flush poisons the guard from the flusher's side: every later batch is
//! refused, since what memory holds may be ahead of the disk.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::LogError;
use crate::guard::Guard;
use crate::store::{EventLog, SideWriter};

/// Makes a deferring guard's written batches durable (see the module's doc).
pub struct Flusher {
    log: Box<dyn SideWriter>,
    path: PathBuf,
    failed: Arc<AtomicBool>,
}

impl Flusher {
    /// Makes every batch written before this call durable. After an error the guard
    /// refuses every later batch, and this refuses every later flush.
    pub fn flush(&self) -> Result<(), LogError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(LogError::Poisoned {
                path: self.path.clone(),
            });
        }
        let flushed = self.log.flush();
        if flushed.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        flushed
    }
}

impl<L: EventLog> Guard<L> {
    /// From now on a batch is written but not flushed when `submit_batch` (or
    /// `release_gap`) returns: its decisions may be acted on only once a
    /// [`Flusher::flush`] called after it has returned. `checkpoint` still flushes.
    pub fn defer_flushes(&mut self) -> Flusher {
        let failed = self
            .flush_failed
            .get_or_insert_with(|| Arc::new(AtomicBool::new(false)))
            .clone();
        Flusher {
            log: self.log.side_writer(),
            path: self.log.path().to_owned(),
            failed,
        }
    }

    /// Whether this guard's flushes are made by a [`Flusher`].
    pub(crate) fn defers_flushes(&self) -> bool {
        self.flush_failed.is_some()
    }

    /// Whether a [`Flusher`] of this guard failed.
    pub(crate) fn flusher_failed(&self) -> bool {
        self.flush_failed
            .as_ref()
            .is_some_and(|failed| failed.load(Ordering::Acquire))
    }
}
