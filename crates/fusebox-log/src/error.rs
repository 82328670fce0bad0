//! What can go wrong with the log, worded for the operator who has to fix it.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LogError {
    /// sled refused to open the data directory: damaged files, a directory that is not a
    /// sled database, permissions, or another process holding the lock.
    #[error(
        "cannot open the fusebox log at {path}: {source}. If no other fuseboxd uses this \
         directory, the data may be damaged: check it with `fusebox log verify --data-dir {path}` \
         and restore the directory from a backup (or move it aside to start with an empty log)"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    /// The directory holds a log written by an incompatible version of fusebox.
    #[error(
        "the fusebox log at {path} has format version {found}, this build reads version \
         {expected}; use a matching fusebox build or export the log with that build"
    )]
    FormatVersion {
        path: PathBuf,
        found: String,
        expected: u32,
    },
    /// A stored record does not decode (a bug or bit rot that sled's checksums missed).
    #[error(
        "the fusebox log at {path} is damaged at {what}: {detail}. Run `fusebox log verify \
         --data-dir {path}` for a full report and restore the directory from a backup"
    )]
    Corrupt {
        path: PathBuf,
        what: String,
        detail: String,
    },
    /// The disk is full: nothing is damaged, and nothing can be decided until there is
    /// room again (the open question at 3 a.m. is whether to restore a backup: no).
    #[error(
        "the disk holding the fusebox log at {path} is full ({source}): free space or grow \
         the volume, then start fuseboxd again; everything it acknowledged is on disk and \
         the log reopens where it stopped (no restore needed)"
    )]
    DiskFull {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    /// A read or write failed after the log was opened.
    #[error("fusebox log I/O failed at {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error("cannot encode {what} for the log: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: rmp_serde::encode::Error,
    },
    /// An earlier append or flush failed: memory is ahead of the disk, so nothing more
    /// may be decided until the guard is reopened (which rebuilds from what is durable).
    #[error(
        "the fusebox log at {path} failed an earlier write; reopen it to rebuild the state \
         from what is durable before deciding anything else"
    )]
    Poisoned { path: PathBuf },
    /// The `before_commit` hook of `Guard::submit_batch_then` refused the batch (a
    /// cluster daemon could not replicate it, e.g. it no longer owns the partition).
    #[error("the batch was not committed: {0}")]
    BeforeCommit(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The thread that writes snapshots could not be started, or stopped (a panic).
    #[error("the snapshot writer of the fusebox log at {path} failed: {detail}")]
    SnapshotWriter { path: PathBuf, detail: String },
    #[error("cannot write the export: {0}")]
    Export(#[source] std::io::Error),
}

impl LogError {
    /// sled refused to open `path`: a full disk, or one of [`LogError::Open`]'s causes.
    pub(crate) fn open(path: &std::path::Path, source: sled::Error) -> LogError {
        unless_disk_full(path, source, |path, source| LogError::Open { path, source })
    }

    /// A read or write of the open log at `path` failed.
    pub(crate) fn storage(path: &std::path::Path, source: sled::Error) -> LogError {
        unless_disk_full(path, source, |path, source| LogError::Storage {
            path,
            source,
        })
    }
}

fn unless_disk_full(
    path: &std::path::Path,
    source: sled::Error,
    otherwise: impl FnOnce(PathBuf, sled::Error) -> LogError,
) -> LogError {
    let path = path.to_owned();
    match disk_full(&source) {
        true => LogError::DiskFull { path, source },
        false => otherwise(path, source),
    }
}

/// ENOSPC: 28 on Linux, macOS and the BSDs (`ErrorKind::StorageFull` is newer than the
/// workspace's minimum Rust).
const ENOSPC: i32 = 28;

/// sled 0.34 re-wraps some I/O errors (a failed flush of its write buffer) as a custom
/// error whose message is the original's `Debug`: found by tests/faults.rs on a full tmpfs.
const WRAPPED_ENOSPC: &str = "Os { code: 28,";

fn disk_full(err: &sled::Error) -> bool {
    matches!(err, sled::Error::Io(io) if io.raw_os_error() == Some(ENOSPC)
        || io.get_ref().is_some_and(|inner| inner.to_string().starts_with(WRAPPED_ENOSPC)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_apart_from_damage() {
        let path = std::path::Path::new("/var/lib/fusebox");
        let full = || sled::Error::Io(std::io::Error::from_raw_os_error(ENOSPC));
        // The form sled's flush of its write buffer gives.
        let wrapped = || {
            let os = std::io::Error::from_raw_os_error(ENOSPC);
            sled::Error::Io(std::io::Error::new(os.kind(), format!("{os:?}")))
        };
        for err in [
            LogError::open(path, full()),
            LogError::storage(path, full()),
            LogError::storage(path, wrapped()),
        ] {
            let text = err.to_string();
            assert!(matches!(err, LogError::DiskFull { .. }), "{text}");
            assert!(text.contains("/var/lib/fusebox is full"), "{text}");
            assert!(!text.contains("backup (or"), "{text}");
        }
        let denied = sled::Error::Io(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(matches!(
            LogError::open(path, denied),
            LogError::Open { .. }
        ));
        let torn = sled::Error::Corruption { at: None, bt: () };
        assert!(matches!(
            LogError::storage(path, torn),
            LogError::Storage { .. }
        ));
    }
}
