//! One HTTP request per connection relayed to a loopback upstream (moto_server), the
//! plumbing of the test proxies in front of it: this suite's `ec2_proxy` and the
//! watchdog crate's fault proxy. Every message relayed says `Connection: close`, so a
//! proxy sees each request on a connection of its own.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One whole request (head and `Content-Length` body) from `conn`.
pub async fn read_request(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok(buf);
            }
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `request` sent to the upstream on a connection of its own; its whole response.
pub async fn forward(request: &[u8], upstream_port: u16) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect(("127.0.0.1", upstream_port)).await?;
    up.write_all(&with_connection_close(request)).await?;
    let mut response = Vec::new();
    up.read_to_end(&mut response).await?;
    Ok(with_connection_close(&response))
}

/// Replaces any Connection header of an HTTP message with `Connection: close`.
fn with_connection_close(msg: &[u8]) -> Vec<u8> {
    let Some(end) = find(msg, b"\r\n\r\n") else {
        return msg.to_vec();
    };
    let head = String::from_utf8_lossy(&msg[..end]);
    let mut out: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&msg[end + 4..]);
    bytes
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
