//! Bad input never crashes anything and never silently vanishes: an error reply (gate),
//! a dead letter with the error text on `fusebox.dlq.<tenant>`, a counter — and the
//! valid events around it are still applied.

use std::time::Duration;

use fusebox_client::Gate;
use fusebox_e2e::*;
use fusebox_nats::wire::DeadLetter;
use futures_util::StreamExt;
use serde_json::json;

async fn next_letter(dlq: &mut async_nats::Subscriber) -> DeadLetter {
    let message = tokio::time::timeout(Duration::from_secs(10), dlq.next())
        .await
        .expect("a dead letter within 10 s")
        .unwrap();
    serde_json::from_slice(&message.payload).unwrap()
}

#[tokio::test]
async fn every_kind_of_bad_gate_input_is_refused_and_dead_lettered() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let mut dlq = client.nats().subscribe("fusebox.dlq.acme").await.unwrap();
    client.nats().flush().await.unwrap();
    let t = now_ms();
    let ok = json!({"v":1,"id":"ok1","tenant":"acme","run":"bad","seq":1,"ts_ms":t,"type":"run_started"});
    assert!(client
        .gate_bytes("acme", "bad", ok.to_string().into_bytes())
        .await
        .decision()
        .is_some());
    let long_id = "x".repeat(300);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed_json", b"{\"v\":1,".to_vec()),
        ("unsupported_version", json!({"v":9,"id":"a","tenant":"acme","run":"bad","ts_ms":t,"type":"progress","version":1}).to_string().into_bytes()),
        ("unknown_type", json!({"v":1,"id":"a","tenant":"acme","run":"bad","ts_ms":t,"type":"teleport"}).to_string().into_bytes()),
        ("unknown_kind", json!({"v":1,"id":"a","tenant":"acme","run":"bad","ts_ms":t,"type":"tool_result","call_id":"c","tool":"x","kind":"MAYBE"}).to_string().into_bytes()),
        ("missing_field", json!({"v":1,"id":"a","tenant":"acme","run":"bad","ts_ms":t,"type":"tool_call","tool":"x","args":{}}).to_string().into_bytes()),
        ("invalid_field", json!({"v":1,"id":long_id,"tenant":"acme","run":"bad","ts_ms":t,"type":"progress","version":1}).to_string().into_bytes()),
        ("invalid_field", json!({"v":1,"id":"a","tenant":"acme","run":"bad","ts_ms":"soon","type":"progress","version":1}).to_string().into_bytes()),
        ("too_large", json!({"v":1,"id":"a","tenant":"acme","run":"bad","ts_ms":t,"type":"progress","version":1,"note":"n".repeat(9000)}).to_string().into_bytes()),
        ("tenant_mismatch", json!({"v":1,"id":"a","tenant":"other","run":"bad","ts_ms":t,"type":"progress","version":1}).to_string().into_bytes()),
        ("seq_regression", json!({"v":1,"id":"late","tenant":"acme","run":"bad","seq":1,"ts_ms":t,"type":"progress","version":1}).to_string().into_bytes()),
    ];
    for (reason, payload) in cases {
        match client.gate_bytes("acme", "bad", payload.clone()).await {
            Gate::Refused(error) => assert_eq!(error.reason, reason, "{}", error.message),
            other => panic!("{reason}: not refused: {other:?}"),
        }
        let letter = next_letter(&mut dlq).await;
        assert_eq!(letter.error.reason, reason);
        assert_eq!(letter.subject, "fusebox.gate.acme.bad");
        assert_eq!(letter.payload.as_bytes(), payload.as_slice());
    }
    // The run goes on: the next valid event is applied.
    let next = json!({"v":1,"id":"ok2","tenant":"acme","run":"bad","seq":2,"ts_ms":t,"type":"progress","version":1});
    assert!(client
        .gate_bytes("acme", "bad", next.to_string().into_bytes())
        .await
        .decision()
        .is_some());
    let status = client.run_status("acme", "bad").await.unwrap();
    assert_eq!(status.counters.events, 2);
}

#[tokio::test]
async fn bad_stream_input_is_dead_lettered_and_the_events_around_it_applied() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let mut dlq = client.nats().subscribe("fusebox.dlq.acme").await.unwrap();
    client.nats().flush().await.unwrap();
    let t = now_ms();
    let good = |id: &str, seq: u64| {
        json!({"v":1,"id":id,"tenant":"acme","run":"s","seq":seq,"ts_ms":t,"type":"progress","version":seq})
            .to_string()
            .into_bytes()
    };
    client
        .report_bytes("acme", "s", "p1", good("p1", 1))
        .await
        .unwrap();
    client
        .report_bytes("acme", "s", "junk", b"not json".to_vec())
        .await
        .unwrap();
    client
        .report_bytes("acme", "s", "p2", good("p2", 2))
        .await
        .unwrap();
    let letter = next_letter(&mut dlq).await;
    assert_eq!(letter.error.reason, "malformed_json");
    assert_eq!(letter.subject, "fusebox.events.acme.s");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(status) = client.run_status("acme", "s").await {
            if status.counters.events == 2 {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "valid events not applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_event_spoofing_another_tenant_is_refused_on_both_paths() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let mut dlq = client
        .nats()
        .subscribe("fusebox.dlq.mallory")
        .await
        .unwrap();
    client.nats().flush().await.unwrap();
    let t = now_ms();
    // Mallory may publish on fusebox.*.mallory.* only, and names acme's run inside.
    let spoof = json!({"v":1,"id":"s1","tenant":"acme","run":"r1","ts_ms":t,"type":"cancel","by":"mallory"})
        .to_string()
        .into_bytes();
    match client.gate_bytes("mallory", "r1", spoof.clone()).await {
        Gate::Refused(error) => assert_eq!(error.reason, "tenant_mismatch"),
        other => panic!("spoof accepted: {other:?}"),
    }
    assert_eq!(next_letter(&mut dlq).await.error.reason, "tenant_mismatch");
    client
        .report_bytes("mallory", "r1", "s1", spoof)
        .await
        .unwrap();
    let letter = next_letter(&mut dlq).await;
    assert_eq!(letter.error.reason, "tenant_mismatch");
    assert_eq!(letter.subject, "fusebox.events.mallory.r1");
    // acme never heard of it.
    assert!(client.run_status("acme", "r1").await.is_err());
}
