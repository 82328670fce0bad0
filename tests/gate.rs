//! The gate over request/reply against a real nats-server and fuseboxd process.

use fusebox_client::Gate;
use fusebox_core::Decision;
use fusebox_e2e::*;

async fn gate(client: &fusebox_client::FuseboxClient, event: &fusebox_core::Event) -> Decision {
    match client.gate(event).await {
        Gate::Decided(decision) => decision,
        other => panic!("event {} not decided: {other:?}", event.id),
    }
}

#[tokio::test]
async fn fixture_traces_get_the_offline_engines_decisions() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    for name in FIXTURES {
        let events = fixture(name);
        let want = expected(&setup.config, &events);
        for (event, want) in events.iter().zip(want) {
            assert_eq!(
                gate(&client, event).await,
                want,
                "{name}: event {}",
                event.id
            );
        }
    }
}

#[tokio::test]
async fn a_retried_gate_request_gets_the_identical_decision() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let events = fixture("exact-repeat.jsonl");
    let mut first = Vec::new();
    for event in &events {
        let decision = gate(&client, event).await;
        // Immediately retried: same answer, nothing applied twice.
        assert_eq!(gate(&client, event).await, decision);
        first.push(decision);
    }
    // Retried long after, when the run is stopped: still the original answer.
    for (event, decision) in events.iter().zip(&first) {
        assert_eq!(&gate(&client, event).await, decision);
    }
    assert_eq!(first, expected(&setup.config, &events));
    let status = client.run_status("demo", "exact-repeat").await.unwrap();
    assert_eq!(status.counters.events, events.len() as u64);
}
