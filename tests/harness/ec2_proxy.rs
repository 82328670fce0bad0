//! An HTTP proxy in front of moto_server that can hold TerminateInstances calls: a held
//! call is never forwarded and never answered (its caller waits, as on a call in flight
//! when its daemon dies), and is dropped when the hold is lifted. Every other request is
//! forwarded, and the TerminateInstances that reach moto are counted. One request per
//! connection (every response says `Connection: close`), as in the watchdog crate's
//! fault proxy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::relay::{forward, read_request};

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
