//! Free loopback ports, and waiting until something listens on one.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A port nobody listens on right now (the OS picks it; released before use, which is
/// racy in theory and fine on a test machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding an ephemeral loopback port")
        .port()
}

/// `n` distinct free ports: all bound at once, so no two of them can be the same.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// Whether something accepts connections on `127.0.0.1:port` within `timeout`.
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
