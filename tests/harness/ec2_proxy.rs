//! An HTTP proxy in front of moto_server that can hold TerminateInstances calls: a held
//! call is never forwarded and never answered (its caller waits, as on a call in flight
//! when its daemon dies), and is dropped when the hold is lifted. Every other request is
//! forwarded, and the TerminateInstances that reach moto are counted. One request per
//! connection (every response says `Connection: close`), as in the watchdog crate's
//! fault proxy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Default)]
pub struct Held {
    /// Hold TerminateInstances calls (not their DryRun checks) while true.
    pub holding: AtomicBool,
    /// TerminateInstances calls held so far.
    pub held: AtomicUsize,
    /// TerminateInstances calls (not DryRun) forwarded to moto.
    pub forwarded: AtomicUsize,
    lifted: Notify,
}

pub struct Ec2Proxy {
    pub port: u16,
    pub state: Arc<Held>,
    task: tokio::task::JoinHandle<()>,
}

impl Ec2Proxy {
    pub async fn start(upstream_port: u16) -> Ec2Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Held::default());
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(conn, upstream_port, state).await;
                });
            }
        });
        Ec2Proxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Holds every TerminateInstances call from now on.
    pub fn hold(&self) {
        self.state.holding.store(true, Ordering::SeqCst);
    }

    /// Forwards TerminateInstances again; the held ones are dropped unanswered.
    pub fn lift(&self) {
        self.state.holding.store(false, Ordering::SeqCst);
        self.state.lifted.notify_waiters();
    }
}

impl Drop for Ec2Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut conn: TcpStream, upstream_port: u16, state: Arc<Held>) -> std::io::Result<()> {
    let request = read_request(&mut conn).await?;
    let text = String::from_utf8_lossy(&request);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let terminate = body.split('&').any(|kv| kv == "Action=TerminateInstances")
        && !body.split('&').any(|kv| kv == "DryRun=true");
    if terminate {
        let lifted = state.lifted.notified();
        if state.holding.load(Ordering::SeqCst) {
            state.held.fetch_add(1, Ordering::SeqCst);
            lifted.await;
            return Ok(());
        }
        state.forwarded.fetch_add(1, Ordering::SeqCst);
    }
    let response = forward(&request, upstream_port).await?;
    conn.write_all(&response).await?;
    conn.shutdown().await
}

async fn read_request(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
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

async fn forward(request: &[u8], upstream_port: u16) -> std::io::Result<Vec<u8>> {
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
