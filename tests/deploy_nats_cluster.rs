//! deploy/nats/cluster-{a,b,c}.conf on three real nats-server processes: the cluster
//! forms, the daemon's FUSEBOX_EVENTS stream is created with 3 replicas, and it keeps
//! every acknowledged event and stays writable after its leader's node is SIGKILLed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_e2e::deploy_nats::{self, connect, NatsConfigDir};
use fusebox_e2e::NatsServer;
use futures_util::StreamExt;

const NODES: [&str; 3] = ["a", "b", "c"];

/// The three node files in one temp dir, every loopback port (client 422x, route 622x,
/// monitoring 822x) moved to a free one and each store dir moved into the temp dir.
fn start_cluster() -> (NatsConfigDir, Vec<NatsServer>) {
    let conf = NatsConfigDir::copy();
    let mut free = fusebox_e2e::free_ports(9).into_iter();
    let mut ports = HashMap::new();
    for i in 0..3u16 {
        for base in [4222u16, 6222, 8222] {
            ports.insert(base + i, free.next().expect("nine ports"));
        }
    }
    for node in NODES {
        let name = format!("cluster-{node}.conf");
        let store = conf.dir.path().join(format!("store-{node}"));
        conf.edit(&name, |text| {
            let text = deploy_nats::remap_addresses(text, "127.0.0.1", &ports);
            assert!(
                !text.contains(":4222") && !text.contains(":6222"),
                "{name}: an address the test did not rewrite is left"
            );
            deploy_nats::replace_required(
                &text,
                &format!("\"/tmp/fusebox-nats-cluster/{node}\""),
                &format!("{:?}", store.display().to_string()),
                &name,
            )
        });
    }
    let servers = NODES
        .iter()
        .enumerate()
        .map(|(i, node)| {
            NatsServer::with_config(
                &format!("fusebox-nats-{node}"),
                &conf.path(&format!("cluster-{node}.conf")),
                ports[&(4222 + i as u16)],
            )
        })
        .collect();
    (conf, servers)
}

/// Retries `f` until it succeeds or `within` passes (cluster formation and leader
/// elections take a few seconds; their exact length is not what is tested).
async fn retry<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match f().await {
            Ok(value) => return value,
            Err(err) if Instant::now() < deadline => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(err) => panic!("{what}: still failing after {within:?}: {err}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_stream_survives_losing_a_node() {
    let (_conf, mut servers) = start_cluster();
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();

    // The daemon's own stream definition, with three replicas.
    let (daemon, _) = connect(&urls, "fuseboxd", None).await;
    let js = jetstream::new(daemon.clone());
    let mut config = fusebox_nats::setup::events_stream_config();
    config.num_replicas = 3;
    let mut stream = retry(
        "creating FUSEBOX_EVENTS with 3 replicas",
        Duration::from_secs(20),
        || js.get_or_create_stream(config.clone()),
    )
    .await;
    let info = stream.info().await.expect("stream info").clone();
    assert_eq!(info.config.num_replicas, 3);
    let cluster = info.cluster.clone().expect("clustered stream");
    assert_eq!(cluster.name.as_deref(), Some("fusebox"));
    assert_eq!(cluster.replicas.len(), 2, "a leader and two replicas");

    // A tenant's events, acknowledged by JetStream (= stored on a quorum).
    let (acme, _) = connect(&urls, "tenant-acme", Some("_INBOX.acme")).await;
    let acme_js = jetstream::new(acme.clone());
    for i in 0..50 {
        acme_js
            .publish("fusebox.events.acme.r1", format!("{{\"n\":{i}}}").into())
            .await
            .expect("publish")
            .await
            .expect("acked by the R3 stream");
    }

    // Kill the stream leader's node: the hardest loss (a new leader must be elected).
    let leader = cluster.leader.expect("a leader");
    let victim = servers
        .iter()
        .position(|s| s.name == leader)
        .unwrap_or_else(|| panic!("leader {leader} is one of the three nodes"));
    servers[victim].kill();

    // Still writable on the two survivors (once they elect a new leader) ...
    retry(
        "publishing after the leader died",
        Duration::from_secs(20),
        || {
            let acme_js = acme_js.clone();
            async move {
                acme_js
                    .publish("fusebox.events.acme.r1", "{\"n\":50}".into())
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    // ... with a new leader among them and nothing acknowledged lost.
    let info = retry(
        "stream info after failover",
        Duration::from_secs(20),
        || {
            let (js, leader) = (js.clone(), leader.clone());
            async move {
                let mut stream = js
                    .get_stream(fusebox_nats::subjects::EVENTS_STREAM)
                    .await
                    .map_err(|e| e.to_string())?;
                let info = stream.info().await.map_err(|e| e.to_string())?.clone();
                match info.cluster.as_ref().and_then(|c| c.leader.clone()) {
                    Some(new) if new != leader => Ok(info),
                    other => Err(format!("leader is {other:?}")),
                }
            }
        },
    )
    .await;
    assert!(
        info.state.messages >= 51,
        "every acknowledged event is still there: {}",
        info.state.messages
    );

    // The daemon-side read path works too: a pull consumer gets all of them back.
    // The consumer is a cluster-wide (meta) change, and the meta group may still be
    // electing its own leader after the kill: retried like the writes above.
    let consumer = retry(
        "a consumer on the surviving nodes",
        Duration::from_secs(20),
        || {
            let js = js.clone();
            async move {
                js.get_stream(fusebox_nats::subjects::EVENTS_STREAM)
                    .await
                    .map_err(|e| e.to_string())?
                    .create_consumer(jetstream::consumer::pull::Config {
                        durable_name: Some("deploy-test".to_owned()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    let mut messages = consumer
        .fetch()
        .max_messages(100)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .expect("fetch");
    let mut read = 0;
    while let Some(message) = messages.next().await {
        message.expect("message").ack().await.expect("ack");
        read += 1;
    }
    assert_eq!(read as u64, info.state.messages);
}
