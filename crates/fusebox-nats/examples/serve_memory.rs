//! The guard service over [`MemoryStore`] instead of the durable log, for profiling the
//! NATS side alone: `fusebox bench gate` against this shows what everything but the log commit
//! costs. Not a daemon (nothing survives it); `fuseboxd` always runs the durable log.
//!
//! `cargo run --release -p fusebox-nats --example serve_memory -- nats://127.0.0.1:4222`

use std::sync::Arc;

use fusebox_nats::{MemoryStore, NoopObserver, Service, ServiceOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await?;
    let service = Service::start(
        client.clone(),
        MemoryStore::default(),
        ServiceOptions::default(),
        Arc::new(NoopObserver),
    )
    .await?;
    eprintln!("serving {url} over the memory store; Ctrl-C stops");
    service
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    client.flush().await?;
    Ok(())
}
