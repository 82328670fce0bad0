//! Prints the cloud watchdog's announcements (`fusebox.watchdog.<tenant>.terminated`) as
//! they arrive, one `subject json` line each.
//!
//!   cargo run -p fuseboxd --example watchdog_tail -- --nats nats://127.0.0.1:4222 --count 1
//!
//! Exits after `--count` messages (0: never) or `--timeout-s` seconds, whichever is first;
//! a timeout with fewer messages than asked for exits 1.

use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Tenant to watch; all tenants by default.
    #[arg(long, default_value = "*")]
    tenant: String,
    #[arg(long, default_value_t = 0)]
    count: usize,
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = async_nats::connect(&args.nats).await?;
    let subject = format!("fusebox.watchdog.{}.terminated", args.tenant);
    let mut sub = client.subscribe(subject.clone()).await?;
    // The subscription is live once the server has it; tell whoever waits on us.
    client.flush().await?;
    eprintln!("listening on {subject}");
    let mut seen = 0;
    let deadline = tokio::time::sleep(Duration::from_secs(args.timeout_s));
    tokio::pin!(deadline);
    while args.count == 0 || seen < args.count {
        tokio::select! {
            msg = sub.next() => match msg {
                Some(msg) => {
                    seen += 1;
                    println!("{} {}", msg.subject, String::from_utf8_lossy(&msg.payload));
                }
                None => break,
            },
            () = &mut deadline => {
                eprintln!("timed out after {}s with {seen} message(s)", args.timeout_s);
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
