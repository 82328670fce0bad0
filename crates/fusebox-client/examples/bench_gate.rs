//! `fusebox bench gate` as an example binary: runs [`fusebox_client::bench::run`]
//! against a running nats-server + fuseboxd and prints the figures beside raw NATS.
//!
//! `cargo run --release -p fusebox-client --example bench_gate -- --nats nats://127.0.0.1:4222`

use clap::Parser;
use fusebox_client::bench::{self, BenchOptions};
use fusebox_client::{ClientOptions, FuseboxClient};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[arg(long, default_value_t = 5_000)]
    serial: usize,
    #[arg(long, default_value_t = 100_000)]
    parallel: usize,
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    #[arg(long, default_value_t = 100_000)]
    ingest: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = FuseboxClient::connect(&args.nats, ClientOptions::default()).await?;
    let options = BenchOptions {
        serial: args.serial,
        parallel: args.parallel,
        in_flight: args.in_flight,
        ingest: args.ingest,
        ..BenchOptions::default()
    };
    println!("{}", bench::run(&client, &options).await?);
    Ok(())
}
