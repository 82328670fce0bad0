//! The storage the log needs, as a trait so sled stays replaceable: named ordered trees,
//! batches that are atomic per tree, and one flush that makes everything before it
//! durable. Any embedded ordered key-value store (sled, redb, RocksDB column families)
//! fits; the log's own logic (`log.rs`, `guard.rs`) only speaks this trait.

use std::path::Path;

use crate::error::LogError;

/// The trees of the log. A batch of the guard writes `events` only (records and their
/// decisions, in frames); `ledger` and `snapshots` are written by the snapshot writer
/// after the records they reflect are durable, and checked on open (see
/// `log::repair_tail` and `Guard::reconcile_ledger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tree {
    Meta,
    Ledger,
    Snapshots,
    Events,
}

impl Tree {
    pub const ALL: [Tree; 4] = [Tree::Meta, Tree::Ledger, Tree::Snapshots, Tree::Events];

    pub fn name(self) -> &'static str {
        use crate::keys::*;
        match self {
            Tree::Meta => META,
            Tree::Ledger => LEDGER,
            Tree::Snapshots => SNAPSHOTS,
            Tree::Events => EVENTS,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One write: an insert (`Some` value) or a removal (`None`).
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// Inserts (`Some`) and removals (`None`) for several trees, applied tree by tree in
/// [`Tree::ALL`] order.
#[derive(Debug, Default)]
pub struct WriteBatch {
    writes: [Vec<Write>; Tree::ALL.len()],
}

impl WriteBatch {
    pub fn insert(&mut self, tree: Tree, key: impl Into<Vec<u8>>, value: Vec<u8>) {
        self.writes[tree.index()].push((key.into(), Some(value)));
    }

    pub fn remove(&mut self, tree: Tree, key: impl Into<Vec<u8>>) {
        self.writes[tree.index()].push((key.into(), None));
    }

    pub fn is_empty(&self) -> bool {
        self.writes.iter().all(Vec::is_empty)
    }

    /// The writes per tree, in commit order.
    pub fn into_trees(self) -> impl Iterator<Item = (Tree, Vec<Write>)> {
        Tree::ALL.into_iter().zip(self.writes)
    }
}

pub type Entry<B> = (B, B);
pub type Scan<'a, B> = Box<dyn Iterator<Item = Result<Entry<B>, LogError>> + 'a>;

/// `Sync` and `Send` bytes: a replay reads and decodes on one thread while another
/// applies.
pub trait EventLog: Sync {
    /// Stored bytes, without a copy where the store allows it.
    type Bytes: AsRef<[u8]> + Send;

    /// Where the data lives, for error messages and recovery commands.
    fn path(&self) -> &Path;
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Self::Bytes>, LogError>;
    /// Entries with keys `>= from`, in key order.
    fn scan(&self, tree: Tree, from: &[u8]) -> Scan<'_, Self::Bytes>;
    /// Entries whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Scan<'_, Self::Bytes>;
    fn last(&self, tree: Tree) -> Result<Option<Entry<Self::Bytes>>, LogError>;
    /// The entry with the greatest key `<= key`: the frame that holds a position.
    fn floor(&self, tree: Tree, key: &[u8]) -> Result<Option<Entry<Self::Bytes>>, LogError>;
    /// Applies the batch (each tree atomically, in commit order). Not yet durable.
    fn write(&mut self, batch: WriteBatch) -> Result<(), LogError>;
    /// Makes every write before it durable.
    fn flush(&self) -> Result<(), LogError>;
    /// Bytes the store occupies on disk.
    fn size_on_disk(&self) -> Result<u64, LogError>;
    /// The store for the thread that writes snapshots and the ledger tree off the
    /// commit path.
    fn side_writer(&self) -> Box<dyn SideWriter>;
}

/// The snapshots and ledger trees, written from a thread of their own while the log goes
/// on appending. Single keys, not batches: sled makes a batch atomic with a process-wide
/// lock, so a long batch here would hold up the log's commits for its whole length.
pub trait SideWriter: Send {
    /// Inserts (`Some`) or removes (`None`) one key, atomically; durable after `flush`.
    fn put(&self, tree: Tree, key: &[u8], value: Option<Vec<u8>>) -> Result<(), LogError>;
    /// Removes every key that starts with `prefix`, one by one in key order (a snapshot
    /// cut short this way has lost its piece 0 first, so no reader lists it).
    fn remove_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<(), LogError>;
    /// Makes every write before it durable (the log's own writes too: harmless, since
    /// a batch's frames, its commit point, go in one atomic write).
    fn flush(&self) -> Result<(), LogError>;
}
