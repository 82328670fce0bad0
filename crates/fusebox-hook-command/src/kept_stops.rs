//! Codex's stops, kept by the hook: no hook answer can end a Codex turn, so once the
//! guard stops a session's run, every later call of the session is denied with the stop
//! report — read from here, without asking the daemon again (which would say the same;
//! this also holds while the daemon or NATS is away).

use std::fs;
use std::io;
use std::path::PathBuf;

use super::state_dir::write_atomically;

pub struct KeptStops {
    dir: Option<PathBuf>,
}

impl KeptStops {
    pub fn new(dir: Option<PathBuf>) -> KeptStops {
        KeptStops { dir }
    }

    fn file(&self, tenant: &str, run: &str) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("{tenant}.{run}.stop")))
    }

    /// The stop report of `run`, if the guard stopped it.
    pub fn get(&self, tenant: &str, run: &str) -> Option<String> {
        let text = fs::read_to_string(self.file(tenant, run)?).ok()?;
        (!text.trim().is_empty()).then_some(text)
    }

    pub fn keep(&self, tenant: &str, run: &str, report: &str) -> io::Result<()> {
        let file = self.file(tenant, run).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no state directory (HOME unset)")
        })?;
        write_atomically(&file, report.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_stop_is_found_again_by_its_run_only() {
        let dir = tempfile::tempdir().unwrap();
        let stops = KeptStops::new(Some(dir.path().to_owned()));
        assert_eq!(stops.get("t", "r1"), None);
        stops.keep("t", "r1", "fusebox: stopped").unwrap();
        assert_eq!(stops.get("t", "r1").as_deref(), Some("fusebox: stopped"));
        assert_eq!(stops.get("t", "r2"), None);
        assert_eq!(stops.get("u", "r1"), None);
    }
}
