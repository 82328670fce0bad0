//! A private moto_server (an EC2-compatible API) on a free loopback port.

use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::paths::require_tool;
use crate::ports::free_port;
use crate::proc::Proc;

pub struct Moto {
    pub port: u16,
    _proc: Proc,
    _dir: TempDir,
}

impl Moto {
    pub fn start() -> Moto {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let mut cmd = Command::new(require_tool("moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut proc = Proc::spawn("moto_server", cmd, &dir.path().join("moto.log"));
        // moto imports its whole service catalogue before it listens: slow on a busy VM.
        proc.wait_listening(port, Duration::from_secs(60));
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
