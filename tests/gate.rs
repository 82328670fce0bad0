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

/// Run-id reuse (issue 25 §3): a restarted worker that starts a run id the daemon already
/// has is refused at `start_run` with `RunExists` naming the run — inline or passive —
/// instead of being answered the old process's decisions from the deduplication.
#[tokio::test]
async fn a_restarted_worker_reusing_a_run_id_is_told_the_run_exists() {
    use fusebox_client::{ClientError, Delivery, RunOptions};
    let setup = Setup::start().await;
    let old = client(&setup.nats.url()).await;
    let run = old
        .start_run("demo", "reused-1", RunOptions::default())
        .await
        .expect("the first process starts the run");
    let (_, gate) = run.call("search", serde_json::json!({"q": "x"})).await;
    assert!(gate.may_run());
    drop(run);
    drop(old);
    for delivery in [Delivery::Inline, Delivery::Passive] {
        let restarted = client(&setup.nats.url()).await;
        let options = RunOptions {
            delivery,
            ..RunOptions::default()
        };
        match restarted.start_run("demo", "reused-1", options).await {
            Err(ClientError::RunExists {
                tenant,
                run,
                message,
            }) => {
                assert_eq!((tenant.as_str(), run.as_str()), ("demo", "reused-1"));
                assert!(
                    message.contains("demo/reused-1 already exists"),
                    "{message}"
                );
            }
            Err(other) => panic!("{delivery:?}: not RunExists: {other}"),
            Ok(_) => panic!("{delivery:?}: a second process started run demo/reused-1"),
        }
    }
    // Nothing of the refused starts was applied.
    let status = client(&setup.nats.url())
        .await
        .run_status("demo", "reused-1")
        .await
        .unwrap();
    assert_eq!(status.counters.events, 2);
}
