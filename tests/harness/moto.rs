//! A private moto_server (an EC2-compatible API) on a free loopback port.

use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::paths::require_tool;
use crate::proc::Proc;

pub struct Moto {
    pub port: u16,
    _proc: Proc,
    _dir: TempDir,
}

/// moto imports its whole service catalogue before it listens: slow on a busy VM.
const START_WAIT: Duration = Duration::from_secs(60);

/// What moto (werkzeug) prints once it listens, before the port it was given.
const LISTENING: &str = " * Running on http://127.0.0.1:";

impl Moto {
    /// Starts moto on a port the OS gives it (`-p 0`), read back from its log. A port
    /// picked here and handed over would be free only until moto binds it: under the
    /// test command's parallel suites another process took one in between, moto exited
    /// "Address already in use", and the test talked to whoever held the port.
    pub fn start() -> Moto {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(require_tool("moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", "0"]);
        let mut proc = Proc::spawn("moto_server", cmd, &dir.path().join("moto.log"));
        let port = listening_port(&mut proc);
        proc.wait_listening(port, START_WAIT);
        Moto {
            port,
            _proc: proc,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The port moto says it listens on, once it says so.
fn listening_port(proc: &mut Proc) -> u16 {
    let deadline = Instant::now() + START_WAIT;
    loop {
        let logs = proc.logs();
        let port = logs
            .split_once(LISTENING)
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse().ok());
        if let Some(port) = port {
            return port;
        }
        if let Some(status) = proc.exit_status() {
            panic!("moto_server exited ({status}) at start-up:\n{logs}");
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not say where it listens within {START_WAIT:?}:\n{logs}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
