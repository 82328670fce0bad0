//! Plain HTTP/1.0 GETs on loopback: enough for /metrics, /readyz and Prometheus's API,
//! without an HTTP client crate in every suite.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::proc::Proc;

/// `GET path` on `127.0.0.1:port`: (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// `POST path` on `127.0.0.1:port` with a JSON body and extra header lines
/// (`"Authorization: Bearer …"`): (status, body).
pub fn http_post(
    port: u16,
    path: &str,
    headers: &[&str],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for line in headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Waits until `GET path` on `port` answers 200; `proc` exiting first, or the time
/// running out, fails the test with its log.
pub fn wait_http_ok(proc: &mut Proc, port: u16, path: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if matches!(http_get(port, path), Ok((200, _))) {
            return;
        }
        if let Some(status) = proc.exit_status() {
            panic!("{} exited with {status}:\n{}", proc.name(), proc.logs());
        }
        assert!(
            Instant::now() < deadline,
            "{} did not answer {path} on {port}:\n{}",
            proc.name(),
            proc.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `s` percent-encoded for a query string.
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
