//! Operating the daemon: restarts, NATS outages, operator commands, time, start-up
//! errors. Real processes throughout.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::{Action, Decision, Event};
use fusebox_e2e::*;
use serde_json::json;

async fn gate(client: &FuseboxClient, event: &Event) -> Decision {
    match client.gate(event).await {
        Gate::Decided(decision) => decision,
        other => panic!("event {} not decided: {other:?}", event.id),
    }
}

#[tokio::test]
async fn a_restarted_daemon_rebuilds_the_run_and_decides_the_same() {
    let mut setup = Setup::start().await;
    let events = fixture("ping-pong.jsonl");
    let want = expected(&setup.config, &events);
    let (first, rest) = events.split_at(events.len() / 2);
    {
        let client = client(&setup.nats.url()).await;
        for (event, want) in first.iter().zip(&want) {
            assert_eq!(&gate(&client, event).await, want);
        }
    }
    // Clean stop (SIGTERM: drain, snapshot, exit 0) and a new process on the same log.
    setup.restart_daemon().await;
    let client = client(&setup.nats.url()).await;
    let (second, third) = rest.split_at(rest.len() / 2);
    for (event, want) in second.iter().zip(&want[first.len()..]) {
        assert_eq!(&gate(&client, event).await, want);
    }
    // A crash (SIGKILL) loses nothing that was answered either.
    setup.daemon.kill();
    setup.daemon = Daemon::start(&setup.nats.url(), &setup.config, &setup.data_dir()).await;
    for (event, want) in third.iter().zip(&want[first.len() + second.len()..]) {
        assert_eq!(&gate(&client, event).await, want);
    }
    // Retries of events decided by earlier processes get their original decisions.
    for (event, want) in events.iter().zip(&want) {
        assert_eq!(&gate(&client, event).await, want);
    }
}

#[tokio::test]
async fn a_nats_server_restart_mid_load_loses_no_event() {
    let mut setup = Setup::start().await;
    let url = setup.nats.url();
    const RUNS: u64 = 8;
    const PER_RUN: u64 = 150;
    let publisher = tokio::spawn(async move {
        let client = client(&url).await;
        let t = now_ms();
        for seq in 1..=PER_RUN {
            for run in 0..RUNS {
                let id = format!("l{run}-{seq}");
                let body = json!({"v":1,"id":id,"tenant":"load","run":format!("r{run}"),"seq":seq,
                    "ts_ms":t + seq,"type":"progress","version":seq})
                .to_string()
                .into_bytes();
                // While the server is down publishing fails; the same id is re-sent
                // until stored (JetStream and the daemon both deduplicate it).
                while client
                    .report_bytes("load", &format!("r{run}"), &id, body.clone())
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    setup.nats.restart(Duration::from_millis(500));
    publisher.await.unwrap();
    let client = client(&setup.nats.url()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let runs = client.runs().await.unwrap_or_default();
        let applied: u64 = runs
            .iter()
            .filter(|r| r.tenant == "load")
            .map(|r| r.events)
            .sum();
        if applied == RUNS * PER_RUN {
            for run in &runs {
                assert_eq!(run.last_seq, Some(PER_RUN), "{run:?}");
                assert_eq!(run.events, PER_RUN, "{run:?}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{applied} of {} events applied",
            RUNS * PER_RUN
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The gate works on the re-established connection too.
    let t = now_ms();
    let probe = event(
        json!({"v":1,"id":"after","tenant":"load","run":"probe","ts_ms":t,"type":"run_started"}),
    );
    assert_eq!(gate(&client, &probe).await.action, Action::Continue);
}

#[tokio::test]
async fn cancel_stops_the_run_on_the_kill_switch_and_resume_needs_evidence() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let events = fixture("no-progress.jsonl");
    let (tenant, run) = (events[0].tenant.clone(), events[0].run.clone());
    for event in &events[..3] {
        gate(&client, event).await;
    }
    let mut watch = client.watch_stop(&tenant, &run).await.unwrap();
    let cancelled = client
        .cancel(&tenant, &run, Some("ops"), Some("runaway"))
        .await
        .unwrap();
    assert_eq!(cancelled.action, Action::Stop);
    let report = cancelled.report.clone().unwrap();
    assert_eq!(report.terminal_state.as_str(), "CANCELLED");
    let stop = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stop, cancelled);
    // The next call is refused before it runs.
    assert!(!client.gate(&events[3]).await.may_run());
    // No evidence of a change: refused. An approval: accepted, and the run is open.
    let refused = client
        .resume(&tenant, &run, Some("ops"), json!({}))
        .await
        .unwrap();
    assert_eq!(refused.action, Action::Stop);
    let accepted = client
        .resume(&tenant, &run, Some("ops"), json!({"approval_id": "CHG-1"}))
        .await
        .unwrap();
    assert_eq!(accepted.action, Action::Continue, "{accepted:?}");
    let status = client.run_status(&tenant, &run).await.unwrap();
    assert!(status.summary.open);
    assert!(status
        .last_decisions
        .iter()
        .any(|d| d.event_id == cancelled.event_id));
    // The kept stop is cleared (right after the commit, by the stop publisher): a
    // worker joining now is not halted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut late = client.watch_stop(&tenant, &run).await.unwrap();
    let kept = tokio::time::timeout(Duration::from_millis(500), late.next()).await;
    assert!(kept.is_err(), "{kept:?}");
    let runs = client.runs().await.unwrap();
    assert!(runs
        .iter()
        .any(|r| r.tenant == tenant && r.run == run && r.open));
}

#[tokio::test]
async fn an_idle_run_whose_time_budget_expires_is_stopped_by_a_tick() {
    let setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let t = now_ms();
    let started = event(
        json!({"v":1,"id":"h1","tenant":"acme","run":"hung","ts_ms":t,
        "type":"run_started","policy":{"max_duration_s":1}}),
    );
    let call = event(
        json!({"v":1,"id":"h2","tenant":"acme","run":"hung","ts_ms":t + 10,
        "type":"tool_call","call_id":"c1","tool":"fetch","args":{"url":"x"}}),
    );
    gate(&client, &started).await;
    assert!(gate(&client, &call).await.action.lets_tool_run());
    // The tool hangs: nothing more arrives. The daemon's tick stops the run.
    let mut watch = client.watch_stop("acme", "hung").await.unwrap();
    let stop = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("stopped by a tick")
        .unwrap()
        .unwrap();
    assert_eq!(stop.reason.map(|r| r.as_str()), Some("time_budget"));
    assert_eq!(stop.event_id, format!("tick-{}", t + 1000));
}

/// The start-up errors that need a server (the others are fuseboxd's own crate test).
#[test]
fn a_conflicting_stream_is_a_clear_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let run = |args: &[&str]| {
        let output = Command::new(bin("fuseboxd"))
            .args(args)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--metrics-listen", "127.0.0.1:0"])
            .output()
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // A conflicting stream someone else created.
    let nats = NatsServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "FUSEBOX_STOPS".to_owned(),
            subjects: vec!["fusebox.stop.>".to_owned()],
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let (status, stderr) = run(&[
        "--config",
        config.to_str().unwrap(),
        "--nats-url",
        &nats.url(),
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("FUSEBOX_STOPS") && stderr.contains("conflicting"),
        "{stderr}"
    );
}

/// The single-daemon twin of partitions.rs's SIGTERM-during-outage test: stopping must
/// not wait for NATS to come back (`terminate` allows 30 s).
#[tokio::test]
async fn a_daemon_stops_on_sigterm_while_nats_is_unreachable() {
    let mut setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let events = fixture("ping-pong.jsonl");
    gate(&client, &events[0]).await;
    setup.nats.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = setup.daemon.terminate();
    assert!(status.success(), "exit {status}:\n{}", setup.daemon.logs());
}

/// A store whose commits never return, as sled's did after a write error on a full
/// disk: the service must give up on it (and the daemon exit) rather than hang.
struct StuckStore(fusebox_nats::MemoryStore);

impl fusebox_nats::GuardStore for StuckStore {
    fn submit_batch(
        &mut self,
        _: Vec<Event>,
    ) -> Result<Vec<fusebox_nats::Submitted>, fusebox_nats::StoreError> {
        loop {
            std::thread::park();
        }
    }

    fn release_gap(
        &mut self,
        tenant: &str,
        run: &str,
    ) -> Result<Vec<Decision>, fusebox_nats::StoreError> {
        self.0.release_gap(tenant, run)
    }

    fn waiting(&self) -> Vec<(String, String, u64)> {
        self.0.waiting()
    }

    fn engine(&self) -> &fusebox_core::Engine {
        self.0.engine()
    }
}

/// Whether the log gets stuck before or after a shutdown signal: either way the service
/// gives up on it within its stall limit.
#[tokio::test]
async fn a_stuck_log_stops_the_service_instead_of_hanging_it() {
    let nats = NatsServer::start();
    for signalled in [false, true] {
        let service = fusebox_nats::Service::start(
            client(&nats.url()).await.nats().clone(),
            StuckStore(fusebox_nats::MemoryStore::default()),
            fusebox_nats::ServiceOptions {
                stall_limit: Duration::from_millis(300),
                ..Default::default()
            },
            Arc::new(fusebox_nats::NoopObserver),
        )
        .await
        .unwrap();
        let agent = client(&nats.url()).await;
        let events = fixture("ping-pong.jsonl");
        let asked = tokio::spawn(async move { agent.gate(&events[0]).await });
        // The signal comes once the request is in the stuck commit.
        let signal = async move {
            match signalled {
                true => tokio::time::sleep(Duration::from_millis(100)).await,
                false => std::future::pending().await,
            }
        };
        let ended = tokio::time::timeout(Duration::from_secs(30), service.run_until(signal))
            .await
            .expect("the service hung on its stuck log");
        assert!(
            matches!(ended, Err(fusebox_nats::ServiceError::Stalled { .. })),
            "signalled: {signalled}: {ended:?}"
        );
        assert!(
            !matches!(asked.await.unwrap(), Gate::Decided(_)),
            "nothing stuck may be answered"
        );
    }
}

/// An event JetStream acknowledged but the daemon's consumer never delivers (here: the
/// consumer made anew past it, as consumers were seen to behave after a network split
/// healed) is not lost: the gap it leaves is asked of the stream itself, and the
/// event is applied from the stream's copy before the run goes on.
#[tokio::test]
async fn an_acknowledged_event_the_consumer_skips_is_applied_from_the_stream() {
    use async_nats::jetstream::consumer::{pull, DeliverPolicy};
    let mut setup = Setup::start().await;
    let client = client(&setup.nats.url()).await;
    let t = now_ms();
    let ev = |seq: u64, body: serde_json::Value| {
        let mut value = json!({"v":1,"id":format!("skipped-{seq}"),"tenant":"acme",
            "run":"skipped","seq":seq,"ts_ms":t + seq});
        value
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        event(value)
    };
    let started = ev(1, json!({"type":"run_started","agent":"a"}));
    gate(&client, &started).await;
    setup.daemon.terminate();

    // Acknowledged by JetStream while the daemon is down...
    let call = ev(
        2,
        json!({"type":"tool_call","call_id":"c1","tool":"search","args":{"q":"x"}}),
    );
    client.report(&call).await.unwrap();
    // ...and skipped by the daemon's consumer, made anew just past it.
    let js = async_nats::jetstream::new(async_nats::connect(setup.nats.url()).await.unwrap());
    let stream = js.get_stream("FUSEBOX_EVENTS").await.unwrap();
    let stored = stream
        .get_last_raw_message_by_subject("fusebox.events.acme.skipped")
        .await
        .unwrap();
    let mut consumer: async_nats::jetstream::consumer::Consumer<pull::Config> =
        stream.get_consumer("fuseboxd").await.unwrap();
    let config = consumer.info().await.unwrap().config.clone();
    stream.delete_consumer("fuseboxd").await.unwrap();
    stream
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: stored.sequence + 1,
            },
            durable_name: config.durable_name,
            filter_subject: config.filter_subject,
            ack_policy: config.ack_policy,
            ack_wait: config.ack_wait,
            max_ack_pending: config.max_ack_pending,
            ..Default::default()
        })
        .await
        .unwrap();
    setup.daemon = Daemon::start(&setup.nats.url(), &setup.config, &setup.data_dir()).await;

    // The next event waits out the gap; then the stream's copy of seq 2 comes first.
    let result = ev(
        3,
        json!({"type":"tool_result","call_id":"c1","tool":"search",
        "kind":"SUCCESS","output":{"hits":1}}),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.gate(&result).await {
            Gate::Decided(_) => break,
            Gate::Refused(err) => panic!("refused: {err:?}"),
            Gate::Unanswered { .. } => assert!(
                Instant::now() < deadline,
                "never answered:\n{}",
                setup.daemon.logs()
            ),
        }
    }
    let status = client.run_status("acme", "skipped").await.unwrap();
    assert_eq!(
        (status.counters.events, status.summary.last_seq),
        (3, Some(3)),
        "the acknowledged event was not applied:\n{}",
        setup.daemon.logs()
    );
}
