//! The one harness of fusebox's end-to-end suites (`tests/*.rs`, the Python suites under
//! `tests/py/` through `fusebox-stack`, and crate tests that need a real server): real
//! nats-server (single, or the deploy's 3-node cluster), fuseboxd, moto_server and
//! prometheus on free loopback ports with temporary state, each killed on drop.
//!
//! Nothing here fakes a server; everything starts the binaries `scripts/setup.sh`
//! installs and the workspace builds, and a missing one fails with the command to run.

pub mod cluster;
pub mod cluster_watchdog;
pub mod daemon;
pub mod deploy_nats;
pub mod ec2_proxy;
pub mod engine;
pub mod fleet;
pub mod hooks;
pub mod http;
pub mod moto;
pub mod nats;
pub mod netns;
pub mod paths;
pub mod ports;
pub mod proc;
pub mod prometheus;
pub mod relay;
pub mod secured;

pub use cluster::{ClusterDaemon, NatsCluster};
pub use daemon::{client, write_config, Daemon, Setup};
pub use engine::{event, expected, fixture, now_ms, offline_engine, FIXTURES};
pub use moto::Moto;
pub use nats::NatsServer;
pub use paths::{bin, deploy_dir, on_path, read, repo_dir};
pub use ports::{free_port, free_ports};
pub use proc::Proc;
pub use prometheus::Prometheus;
pub use secured::SecuredStack;
