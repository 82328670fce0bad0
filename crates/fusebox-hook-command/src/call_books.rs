//! Gemini CLI's call books (`fusebox_hook::gemini_cli::CallBook`), one file per run,
//! changed under an exclusive lock: Gemini CLI may run the hooks of parallel tool calls
//! at the same time, and two of them must not take the same number.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::PathBuf;

use fusebox_hook::gemini_cli::CallBook;

use super::state_dir::write_atomically;

pub struct CallBooks {
    dir: Option<PathBuf>,
}

impl CallBooks {
    pub fn new(dir: Option<PathBuf>) -> CallBooks {
        CallBooks { dir }
    }

    /// Runs `change` on the run's book and saves it, holding the run's lock throughout.
    /// A damaged book starts afresh (numbers restart: the daemon's dedup then answers a
    /// reused id with that call's decision, so the worst case is one call not counted).
    pub fn with<T>(
        &self,
        tenant: &str,
        run: &str,
        change: impl FnOnce(&mut CallBook) -> T,
    ) -> io::Result<T> {
        let dir = self.dir.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
        })?;
        fs::create_dir_all(dir)?;
        let lock: File = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{tenant}.{run}.lock")))?;
        lock.lock()?;
        let file = dir.join(format!("{tenant}.{run}.calls"));
        let mut book: CallBook = fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        let before = book.clone();
        let result = change(&mut book);
        if book != before {
            let bytes = serde_json::to_vec(&book).expect("JSON values serialise");
            write_atomically(&file, &bytes)?;
        }
        Ok(result)
    }
}
