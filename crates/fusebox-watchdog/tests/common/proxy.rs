//! A fault-injecting HTTP proxy in front of moto: throttles the first N requests, fails one
//! region, or denies one action's dry run, and counts every request by action.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fusebox_e2e::relay::{forward, read_request};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Answer this many requests (any region) with 503 RequestLimitExceeded.
    pub throttle_next: u32,
    /// Answer every request for this region with 503 ServiceUnavailable.
    pub fail_region: Option<String>,
    /// Answer a DryRun of this action with 403 UnauthorizedOperation.
    pub deny_dry_run: Option<String>,
}

#[derive(Debug, Default)]
pub struct Counts {
    /// Requests that reached moto, by action.
    pub forwarded: BTreeMap<String, u64>,
    /// Requests answered with an injected fault, by action.
    pub faulted: BTreeMap<String, u64>,
    /// Requests by region.
    pub by_region: BTreeMap<String, u64>,
}

pub struct FaultProxy {
    pub port: u16,
    pub faults: Arc<Mutex<Faults>>,
    pub counts: Arc<Mutex<Counts>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream_port: u16, faults: Faults) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Mutex::new(faults));
        let counts = Arc::new(Mutex::new(Counts::default()));
        let (f, c) = (faults.clone(), counts.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (f, c) = (f.clone(), c.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, upstream_port, f, c).await;
                });
            }
        });
        FaultProxy {
            port,
            faults,
            counts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request per connection: every response says `Connection: close`.
async fn serve(
    mut conn: TcpStream,
    upstream_port: u16,
    faults: Arc<Mutex<Faults>>,
    counts: Arc<Mutex<Counts>>,
) -> std::io::Result<()> {
    let request = read_request(&mut conn).await?;
    let text = String::from_utf8_lossy(&request).into_owned();
    let action = form_value(&text, "Action").unwrap_or_default();
    let region = credential_region(&text).unwrap_or_default();
    let dry_run = form_value(&text, "DryRun").is_some_and(|v| v == "true");
    let fault = {
        let mut f = faults.lock().unwrap();
        if f.fail_region.as_deref() == Some(region.as_str()) {
            Some((503, "ServiceUnavailable"))
        } else if dry_run && f.deny_dry_run.as_deref() == Some(action.as_str()) {
            Some((403, "UnauthorizedOperation"))
        } else if f.throttle_next > 0 {
            f.throttle_next -= 1;
            Some((503, "RequestLimitExceeded"))
        } else {
            None
        }
    };
    {
        let mut c = counts.lock().unwrap();
        *c.by_region.entry(region).or_default() += 1;
        let map = if fault.is_some() {
            &mut c.faulted
        } else {
            &mut c.forwarded
        };
        *map.entry(action).or_default() += 1;
    }
    let response = match fault {
        Some((status, code)) => error_response(status, code),
        None => forward(&request, upstream_port).await?,
    };
    conn.write_all(&response).await?;
    conn.shutdown().await
}

fn error_response(status: u16, code: &str) -> Vec<u8> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>injected by the test proxy</Message></Error></Errors><RequestID>fault</RequestID></Response>"
    );
    format!(
        "HTTP/1.1 {status} Injected\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A value of the form-encoded body (EC2's query protocol).
fn form_value(request: &str, key: &str) -> Option<String> {
    let body = request.split("\r\n\r\n").nth(1)?;
    body.split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

/// The region of the SigV4 credential scope: `Credential=AKID/20240101/us-east-1/ec2/aws4_request`.
fn credential_region(request: &str) -> Option<String> {
    let scope = request.split("Credential=").nth(1)?;
    scope.split('/').nth(2).map(str::to_owned)
}
