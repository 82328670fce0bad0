//! Passive mode (JetStream ingest), the kill switch, and ordering across the two paths.

use std::time::Duration;

use fusebox_client::Gate;
use fusebox_core::{Action, Decision};
use fusebox_e2e::*;
use serde_json::json;

async fn next_stop(watch: &mut fusebox_client::StopWatch) -> Decision {
    tokio::time::timeout(Duration::from_secs(15), watch.next())
        .await
        .expect("a stop within 15 s")
        .expect("watch open")
        .expect("a stop decision")
}

#[tokio::test]
async fn a_passive_loop_is_stopped_on_the_kill_switch_and_a_late_subscriber_sees_it() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let events = fixture("exact-repeat.jsonl");
    let want = expected(&setup.config, &events);
    let want_stop = want
        .iter()
        .find(|d| d.action == Action::Stop)
        .expect("the fixture stops")
        .clone();
    let mut watch = client.watch_stop("demo", "exact-repeat").await.unwrap();
    for event in &events {
        client.report(event).await.unwrap();
    }
    assert_eq!(next_stop(&mut watch).await, want_stop);

    // A worker that starts watching after the stop still learns it at once.
    let mut late = client.watch_stop("demo", "exact-repeat").await.unwrap();
    let kept = next_stop(&mut late).await;
    assert_eq!(kept.action, Action::Stop);
    assert_eq!(kept.report, want_stop.report);

    // Every event was applied once, acked after the commit, in order.
    let status = client.run_status("demo", "exact-repeat").await.unwrap();
    assert_eq!(status.counters.events, events.len() as u64);
    assert!(!status.summary.open);
}

#[tokio::test]
async fn gate_and_stream_events_of_a_run_are_applied_in_seq_order() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    // The whole pagination fixture, odd seqs by JetStream, even by the gate, sent in
    // reverse pairs so every gate request arrives before the event it must follow.
    let events = fixture("pagination-ok.jsonl");
    let want = expected(&setup.config, &events);
    for pair in events.chunks(2) {
        let mut pending = None;
        if let Some(gated) = pair.get(1).cloned() {
            let client = client.clone();
            pending = Some(tokio::spawn(async move { client.gate(&gated).await }));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        client.report(&pair[0]).await.unwrap();
        if let Some(pending) = pending {
            match pending.await.unwrap() {
                Gate::Decided(decision) => {
                    let index = events
                        .iter()
                        .position(|e| e.id == decision.event_id)
                        .unwrap();
                    assert_eq!(decision, want[index]);
                }
                other => panic!("not decided: {other:?}"),
            }
        }
    }
    // The last event went through JetStream alone: acknowledged when stored, applied
    // a moment later by the daemon's consumer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = client.run_status("demo", "pagination-ok").await.unwrap();
        if status.counters.events == events.len() as u64 || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.counters.events, events.len() as u64);
    assert_eq!(status.summary.terminal_state.as_deref(), Some("COMPLETED"));
}

#[tokio::test]
async fn a_gap_that_never_fills_is_released_after_the_timeout() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let t = now_ms();
    let first = event(
        json!({"v":1,"id":"g1","tenant":"acme","run":"gap","seq":1,"ts_ms":t,"type":"run_started"}),
    );
    let third = event(
        json!({"v":1,"id":"g3","tenant":"acme","run":"gap","seq":3,"ts_ms":t,
        "type":"tool_call","call_id":"c1","tool":"search","args":{"q":"x"}}),
    );
    assert!(client.gate(&first).await.decision().is_some());
    let started = std::time::Instant::now();
    let gate = client.gate(&third).await;
    // Held for seq 2 until the 1 s gap timeout of the test config, then decided.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(gate.may_run(), "{gate:?}");
    // seq 2 arriving late goes backwards now: refused, not applied.
    let second = event(
        json!({"v":1,"id":"g2","tenant":"acme","run":"gap","seq":2,"ts_ms":t,"type":"progress","version":1}),
    );
    match client.gate(&second).await {
        Gate::Refused(error) => assert_eq!(error.reason, "seq_regression"),
        other => panic!("late seq accepted: {other:?}"),
    }
}
