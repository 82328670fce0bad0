//! A child process of a test: its output in a log file, killed and reaped on drop, and
//! its log printed when the test is failing.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::ports;

pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stdin closed and stdout + stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {name} ({e}); run `bash scripts/setup.sh`"));
        Proc {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How the process ended, once it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Waits until `127.0.0.1:port` accepts connections; a process that exits first or a
    /// port that stays closed fails the test with the process's log.
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) {
        self.wait_reachable(SocketAddr::from(([127, 0, 0, 1], port)), timeout);
    }

    /// [`Proc::wait_listening`] for any address (one in a test's own network namespace).
    pub fn wait_reachable(&mut self, addr: SocketAddr, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                panic!(
                    "{} exited ({status}) at start-up:\n{}",
                    self.name,
                    self.logs()
                );
            }
            if ports::wait_for_addr(addr, Duration::from_millis(50)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen on {addr} within {timeout:?}:\n{}",
                self.name,
                self.logs()
            );
        }
    }

    /// Sends `signal` (a `kill -s` name: TERM, STOP, CONT …).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -s {signal} {}", self.name);
    }

    /// SIGTERM, then waits up to `within` for the exit.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.exit_status() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not stop within {within:?}:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            let tail = lines[lines.len().saturating_sub(120)..].join("\n");
            eprintln!("--- {} (log tail) ---\n{tail}", self.name);
            keep_whole_log(&self.name, &logs);
        }
    }
}

/// `FUSEBOX_TEST_KEEP_LOGS=<dir>` (the soak scripts set it): a failing test's child logs
/// are copied there whole, since the printed tail rarely reaches back to the cause.
fn keep_whole_log(name: &str, logs: &str) {
    let Some(dir) = std::env::var_os("FUSEBOX_TEST_KEEP_LOGS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let file: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let kept = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(format!("{file}.log")), logs));
    match kept {
        Ok(()) => eprintln!("--- {name}: whole log kept in {} ---", dir.display()),
        Err(err) => eprintln!(
            "--- {name}: cannot keep its log in {}: {err} ---",
            dir.display()
        ),
    }
}
