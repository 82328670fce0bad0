//! Where the hooks keep what must outlive one process (each hook event is a fresh one):
//! a session's current run, Codex's kept stops, Gemini CLI's call books. One directory
//! per agent protocol, small files per session.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// `dir`, else `$XDG_STATE_HOME/fusebox/<protocol>`, else
/// `~/.local/state/fusebox/<protocol>`; `None` without HOME.
pub fn resolve(dir: Option<PathBuf>, protocol: &str) -> Option<PathBuf> {
    dir.or_else(|| {
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
        Some(state.join("fusebox").join(protocol))
    })
}

/// Write-then-rename: a hook killed halfway leaves the old content, never half of it.
pub fn write_atomically(file: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut partial = file.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    fs::write(&partial, bytes)?;
    fs::rename(&partial, file)
}
