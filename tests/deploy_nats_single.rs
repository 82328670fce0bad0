//! deploy/nats/single.conf (+ accounts.conf, partitions.conf) on a real nats-server, as
//! shipped (partition mapping on): the tenant, daemon and operator permissions with the
//! daemon's own service code, the mapping itself, and partition-scoped services as
//! cluster mode runs them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fusebox_e2e::deploy_nats::{self, connect, expect_error, expect_no_error};
use fusebox_e2e::nats::server_has_processed;
use fusebox_e2e::secured::start_single;
use futures_util::StreamExt;

const SHORT: Duration = Duration::from_millis(300);
const ERROR_WAIT: Duration = Duration::from_secs(3);

fn event(id: &str, tenant: &str, run: &str, seq: u64, body: &str) -> String {
    format!(
        r#"{{"v":1,"id":"{id}","tenant":"{tenant}","run":"{run}","seq":{seq},"ts_ms":{},{body}}}"#,
        1_764_500_000_000 + seq * 100
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_hold_with_the_daemons_own_service() {
    let (_conf, server) = start_single();
    let urls = vec![server.url()];

    // The daemon user runs fusebox-nats's real Service as a single fuseboxd does (no
    // cluster mode): it creates FUSEBOX_EVENTS, FUSEBOX_STOPS and the durable consumer,
    // and subscribes to gate and control. Any permission it lacks fails start-up here
    // (or later as a server error). The mapping is on, so everything below also shows
    // that a single daemon serves the mapped subjects.
    let (daemon, mut daemon_errors) = connect(&urls, "fuseboxd", None).await;
    let engine = fusebox_core::Engine::new(fusebox_core::PolicySet::default());
    let service = fusebox_nats::Service::start(
        daemon.clone(),
        fusebox_nats::MemoryStore::new(engine),
        fusebox_nats::ServiceOptions::default(),
        Arc::new(fusebox_nats::NoopObserver),
    )
    .await
    .expect("fuseboxd user: the service starts (JetStream streams + consumer created)");
    let js = async_nats::jetstream::new(daemon.clone());
    for name in [
        fusebox_nats::subjects::EVENTS_STREAM,
        fusebox_nats::subjects::STOPS_STREAM,
    ] {
        js.get_stream(name)
            .await
            .unwrap_or_else(|e| panic!("stream {name} exists after start-up: {e}"));
    }

    // A tenant with its own inbox prefix: inline gate request/reply works end to end.
    let (acme, mut acme_errors) = connect(&urls, "tenant-acme", Some("_INBOX.acme")).await;
    let mut acme_stops = acme
        .subscribe("fusebox.stop.acme.>")
        .await
        .expect("subscribe own stops");
    let mut acme_decisions = acme
        .subscribe("fusebox.decisions.acme.>")
        .await
        .expect("subscribe own decisions");
    // A copy of what the service receives: the request travels on the mapped subject.
    let mut gate_copy = daemon
        .subscribe("fusebox.gate.acme.*.r1")
        .await
        .expect("daemon may subscribe anywhere under fusebox.>");
    server_has_processed(&daemon).await;
    let started = event("e1", "acme", "r1", 1, r#""type":"run_started""#);
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        acme.request("fusebox.gate.acme.r1", started.into()),
    )
    .await
    .expect("gate reply within 10 s")
    .expect("tenant-acme: gate request to its own subject is answered");
    let decision: serde_json::Value =
        serde_json::from_slice(&reply.payload).expect("the gate reply is JSON");
    assert!(
        decision.get("action").is_some(),
        "a decision, not an error: {decision}"
    );
    // A message that must come gets a generous wait (SHORT is for those that must not:
    // 300 ms flaked here under a loaded CI machine).
    let seen = tokio::time::timeout(Duration::from_secs(10), gate_copy.next())
        .await
        .expect("the gate request went out on the mapped subject")
        .expect("open");
    let p = deploy_nats::fnv1a32(b"acmer1") % partitions_n();
    assert_eq!(seen.subject.as_str(), format!("fusebox.gate.acme.{p}.r1"));
    let call = event(
        "e2",
        "acme",
        "r1",
        2,
        r#""type":"tool_call","call_id":"c1","tool":"search","args":{"q":"x"}"#,
    );
    let reply = acme
        .request("fusebox.gate.acme.r1", call.into())
        .await
        .expect("tool_call gated");
    let decision: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(decision["action"], "execute", "{decision}");

    // Passive mode: a JetStream publish to its own events subject is stored and acked
    // (the ack comes back on the tenant's own inbox).
    let acme_js = async_nats::jetstream::new(acme.clone());
    let ack = acme_js
        .publish(
            "fusebox.events.acme.r2",
            event("e3", "acme", "r2", 1, r#""type":"run_started""#).into(),
        )
        .await
        .expect("publish")
        .await
        .expect("tenant-acme: JetStream ack for its own events subject");
    assert_eq!(ack.stream, fusebox_nats::subjects::EVENTS_STREAM);
    expect_no_error(&mut acme_errors, SHORT).await;

    // Another tenant's subjects: publishing and subscribing are refused by the server.
    let mut globex_gate = daemon
        .subscribe("fusebox.gate.globex.>")
        .await
        .expect("daemon may subscribe anywhere under fusebox.>");
    // Registered before acme publishes, or "must not reach" below proves nothing.
    server_has_processed(&daemon).await;
    acme.publish(
        "fusebox.gate.globex.r1",
        event("x1", "globex", "r1", 1, r#""type":"run_started""#).into(),
    )
    .await
    .expect("queued");
    acme.flush().await.expect("flush");
    // The server judges (and names) the mapped subject.
    expect_error(
        &mut acme_errors,
        &["Permissions Violation", &mapped("fusebox.gate.globex.r1")],
        ERROR_WAIT,
    )
    .await;
    assert!(
        tokio::time::timeout(SHORT, globex_gate.next())
            .await
            .is_err(),
        "a refused publish must not reach another tenant's subject"
    );
    for forbidden in [
        "fusebox.events.globex.r1",
        "fusebox.decisions.acme.r1",
        "fusebox.control.acme.r1.cancel",
    ] {
        acme.publish(forbidden, "{}".into()).await.expect("queued");
        expect_error(
            &mut acme_errors,
            &["Permissions Violation", &mapped(forbidden)],
            ERROR_WAIT,
        )
        .await;
    }
    for forbidden in ["fusebox.stop.globex.>", "_INBOX.>", "fusebox.gate.acme.>"] {
        let _sub = acme.subscribe(forbidden).await.expect("queued");
        expect_error(
            &mut acme_errors,
            &["Permissions Violation", "Subscription", forbidden],
            ERROR_WAIT,
        )
        .await;
    }

    // A tenant using the default _INBOX prefix cannot even get its replies: the allow-
    // list pins each tenant to _INBOX.<tenant>, so none can read another's replies.
    let (plain, mut plain_errors) = connect(&urls, "tenant-globex", None).await;
    let refused = plain
        .request(
            "fusebox.gate.globex.r9",
            event("g1", "globex", "r9", 1, r#""type":"run_started""#).into(),
        )
        .await;
    assert!(refused.is_err(), "default inbox must not be readable");
    expect_error(
        &mut plain_errors,
        &["Permissions Violation", "Subscription", "_INBOX."],
        ERROR_WAIT,
    )
    .await;

    // The operator: control requests reach the daemon and the reply comes back.
    let (operator, mut operator_errors) = connect(&urls, "operator", None).await;
    let runs = operator
        .request(fusebox_nats::subjects::CONTROL_RUNS, "".into())
        .await
        .expect("operator: fusebox.control.runs answered");
    let runs: serde_json::Value = serde_json::from_slice(&runs.payload).expect("JSON");
    assert!(
        runs.to_string().contains("r1"),
        "the daemon knows acme/r1: {runs}"
    );
    operator
        .request("fusebox.control.acme.r1.status", "".into())
        .await
        .expect("operator: run status answered");
    let mut tail = operator
        .subscribe("fusebox.decisions.>")
        .await
        .expect("operator may tail every decision");
    expect_no_error(&mut operator_errors, SHORT).await;
    // ... but cannot forge an agent's events.
    operator
        .publish(
            "fusebox.gate.acme.r1",
            event("o1", "acme", "r1", 3, r#""type":"run_started""#).into(),
        )
        .await
        .expect("queued");
    expect_error(
        &mut operator_errors,
        &["Permissions Violation", &mapped("fusebox.gate.acme.r1")],
        ERROR_WAIT,
    )
    .await;

    // Cancelling through the operator path reaches the tenant's stop subscription: the
    // daemon may publish stops/decisions, the tenant may read its own.
    operator
        .request("fusebox.control.acme.r1.cancel", "{}".into())
        .await
        .expect("operator: cancel answered");
    let stop = tokio::time::timeout(Duration::from_secs(5), acme_stops.next())
        .await
        .expect("tenant-acme sees its run's stop within 5 s")
        .expect("subscription open");
    assert_eq!(stop.subject.as_str(), "fusebox.stop.acme.r1");
    let _ = tokio::time::timeout(SHORT, acme_decisions.next()).await;
    let _ = tokio::time::timeout(SHORT, tail.next()).await;

    expect_no_error(&mut daemon_errors, SHORT).await;
    service.shutdown().await.expect("service drains");
}

/// `subject` as the servers map it (partitions.conf): run subjects of gate, events and
/// control get `<p>` after the tenant, p computed here independently; others stay.
fn mapped(subject: &str) -> String {
    let mut tokens: Vec<String> = subject.split('.').map(str::to_owned).collect();
    let run_subject = match tokens.get(1).map(String::as_str) {
        Some("gate" | "events") => tokens.len() == 4,
        Some("control") => tokens.len() == 5,
        _ => false,
    };
    if run_subject {
        let p =
            deploy_nats::fnv1a32(format!("{}{}", tokens[2], tokens[3]).as_bytes()) % partitions_n();
        tokens.insert(3, p.to_string());
    }
    tokens.join(".")
}

/// The N of partitions.conf, read from its three mapping lines (which must agree).
fn partitions_n() -> u32 {
    let text = fusebox_e2e::read(&fusebox_e2e::deploy_dir().join("nats/partitions.conf"));
    let ns: BTreeSet<u32> = text
        .lines()
        .filter(|l| l.trim_start().starts_with('"'))
        .flat_map(|l| l.split("{{partition(").skip(1))
        .map(|rest| {
            rest.split(',')
                .next()
                .and_then(|n| n.trim().parse().ok())
                .expect("partition(N, …) with a number N")
        })
        .collect();
    assert_eq!(
        ns.len(),
        1,
        "every mapping in partitions.conf must use the same N: {ns:?}"
    );
    ns.into_iter().next().expect("one N")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_mapping_is_deterministic_per_run() {
    let n = partitions_n();
    let (_conf, server) = start_single();
    let urls = vec![server.url()];
    let expected =
        |tenant: &str, run: &str| deploy_nats::fnv1a32(format!("{tenant}{run}").as_bytes()) % n;

    let (daemon, _) = connect(&urls, "fuseboxd", None).await;
    let mut gate = daemon.subscribe("fusebox.gate.*.*.*").await.expect("sub");
    let mut events = daemon.subscribe("fusebox.events.*.*.*").await.expect("sub");
    let mut control = daemon
        .subscribe("fusebox.control.*.*.*.*")
        .await
        .expect("sub");
    // The plain gate subjects alone get nothing once the servers map: that is why a
    // single daemon subscribes to the partitioned form too (the first test shows its
    // Service answering through the mapping).
    let mut unpartitioned = daemon.subscribe("fusebox.gate.*.*").await.expect("sub");
    server_has_processed(&daemon).await;

    let (acme, mut acme_errors) = connect(&urls, "tenant-acme", Some("_INBOX.acme")).await;
    let (operator, _) = connect(&urls, "operator", None).await;

    // The subject the brief names: fusebox.gate.acme.r1, with the partition computed
    // independently here (FNV-1a of "acme" ‖ "r1", mod N).
    let p = expected("acme", "r1");
    for _ in 0..3 {
        acme.publish("fusebox.gate.acme.r1", "{}".into())
            .await
            .expect("publish");
        let got = tokio::time::timeout(Duration::from_secs(5), gate.next())
            .await
            .expect("mapped gate message")
            .expect("open");
        assert_eq!(got.subject.as_str(), format!("fusebox.gate.acme.{p}.r1"));
    }
    // The same run's events and operator commands land in the same partition.
    acme.publish("fusebox.events.acme.r1", "{}".into())
        .await
        .expect("publish");
    let got = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("mapped event")
        .expect("open");
    assert_eq!(got.subject.as_str(), format!("fusebox.events.acme.{p}.r1"));
    operator
        .publish("fusebox.control.acme.r1.cancel", "{}".into())
        .await
        .expect("publish");
    let got = tokio::time::timeout(Duration::from_secs(5), control.next())
        .await
        .expect("mapped control")
        .expect("open");
    assert_eq!(
        got.subject.as_str(),
        format!("fusebox.control.acme.{p}.r1.cancel")
    );
    // A run of a tree names its root first; the hash reads the root, so every run of
    // the tree lands in the root's partition, with the root and the run kept after it.
    let mut tree_gate = daemon.subscribe("fusebox.gate.*.*.*.*").await.expect("sub");
    let mut tree_control = daemon
        .subscribe("fusebox.control.*.*.*.*.*")
        .await
        .expect("sub");
    server_has_processed(&daemon).await;
    for child in ["r1-a", "r1-b-7", "0"] {
        acme.publish(format!("fusebox.gate.acme.r1.{child}"), "{}".into())
            .await
            .expect("publish");
        let got = tokio::time::timeout(Duration::from_secs(5), tree_gate.next())
            .await
            .expect("mapped gate message of a tree")
            .expect("open");
        assert_eq!(
            got.subject.as_str(),
            format!("fusebox.gate.acme.{p}.r1.{child}")
        );
    }
    operator
        .publish("fusebox.control.acme.r1.r1-a.cancel", "{}".into())
        .await
        .expect("publish");
    let got = tokio::time::timeout(Duration::from_secs(5), tree_control.next())
        .await
        .expect("mapped control of a tree")
        .expect("open");
    assert_eq!(
        got.subject.as_str(),
        format!("fusebox.control.acme.{p}.r1.r1-a.cancel")
    );
    // nats-server judges publish permissions on the MAPPED subject; the tenant token
    // stays third, so the tenant's own allow-list still covers it ...
    expect_no_error(&mut acme_errors, SHORT).await;
    // ... and another tenant's run is still refused after mapping.
    acme.publish("fusebox.gate.globex.r1", "{}".into())
        .await
        .expect("queued");
    expect_error(
        &mut acme_errors,
        &["Permissions Violation", "fusebox.gate.globex."],
        ERROR_WAIT,
    )
    .await;
    assert!(
        tokio::time::timeout(SHORT, unpartitioned.next())
            .await
            .is_err(),
        "a mapped gate request must not reach a plain fusebox.gate.*.* subscriber"
    );

    // Many runs: every one where the formula says, and the runs spread over partitions.
    let mut used = BTreeSet::new();
    for i in 0..64 {
        let run = format!("run-{i}");
        acme.publish(format!("fusebox.gate.acme.{run}"), "{}".into())
            .await
            .expect("publish");
        let got = tokio::time::timeout(Duration::from_secs(5), gate.next())
            .await
            .expect("mapped gate message")
            .expect("open");
        let want = expected("acme", &run);
        assert_eq!(
            got.subject.as_str(),
            format!("fusebox.gate.acme.{want}.{run}")
        );
        used.insert(want);
    }
    assert!(
        used.len() as u32 >= n.min(64) * 3 / 4,
        "64 runs should cover most of {n} partitions, got {used:?}"
    );

    // The stream the daemon creates still captures the partitioned event subjects.
    let js = async_nats::jetstream::new(daemon.clone());
    fusebox_nats::setup::ensure_stream(&js, fusebox_nats::setup::events_stream_config())
        .await
        .expect("FUSEBOX_EVENTS");
    let ack = async_nats::jetstream::new(acme.clone())
        .publish("fusebox.events.acme.r1", "{}".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let mut stream = js
        .get_stream(fusebox_nats::subjects::EVENTS_STREAM)
        .await
        .expect("stream");
    let stored = stream
        .get_raw_message(ack.sequence)
        .await
        .expect("stored message");
    assert_eq!(
        stored.subject.as_str(),
        format!("fusebox.events.acme.{p}.r1")
    );
    let _ = stream.info().await.expect("info");
}

/// Cluster mode's subscriptions on the shipped config: one fusebox-nats `Service` per
/// partition (`Scope::Partition`, as fuseboxd runs each partition it owns), spread over
/// two `fuseboxd` connections. Every run is served by exactly one partition, which gets
/// the run's gate requests AND its JetStream events (a gap would hold the run's next
/// gate request, and the gap timeout here is far longer than the test waits), and the
/// runs listing is answered by every partition. The leases, FUSEBOX_APPLIED and the
/// shared ledger are fuseboxd's and tested in crates/fuseboxd/tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_scoped_services_serve_each_run_in_one_partition() {
    use fusebox_nats::subjects::Scope;
    let n = partitions_n();
    let (_conf, server) = start_single();
    let urls = vec![server.url()];
    let (d1, mut d1_errors) = connect(&urls, "fuseboxd", None).await;
    let (d2, mut d2_errors) = connect(&urls, "fuseboxd", None).await;
    let mut services = Vec::new();
    for p in 0..n {
        let client = if p % 2 == 0 { d1.clone() } else { d2.clone() };
        let engine = fusebox_core::Engine::new(fusebox_core::PolicySet::default());
        let service = fusebox_nats::Service::start(
            client,
            fusebox_nats::MemoryStore::new(engine),
            fusebox_nats::ServiceOptions {
                scope: Scope::Partition { index: p, of: n },
                gap_timeout: Duration::from_secs(120),
                ..fusebox_nats::ServiceOptions::default()
            },
            Arc::new(fusebox_nats::NoopObserver),
        )
        .await
        .unwrap_or_else(|e| panic!("fuseboxd user: partition {p}'s service starts: {e}"));
        services.push(service);
    }
    // One durable per partition, filtered on its mapped event subjects.
    let js = async_nats::jetstream::new(d1.clone());
    let stream = js
        .get_stream(fusebox_nats::subjects::EVENTS_STREAM)
        .await
        .expect("FUSEBOX_EVENTS");
    for p in 0..n {
        let name = Scope::Partition { index: p, of: n }.events_consumer();
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .get_consumer(&name)
            .await
            .unwrap_or_else(|e| panic!("consumer {name}: {e}"));
        let info = consumer.info().await.expect("consumer info");
        assert_eq!(
            info.config.filter_subject,
            format!("fusebox.events.*.{p}.>")
        );
    }

    // Each run: started through the gate, a call reported through JetStream, its result
    // through the gate again.
    let (acme, mut acme_errors) = connect(&urls, "tenant-acme", Some("_INBOX.acme")).await;
    let acme_js = async_nats::jetstream::new(acme.clone());
    let runs: Vec<String> = (0..12).map(|i| format!("run-{i}")).collect();
    let gate = |subject: String, body: String| {
        let acme = acme.clone();
        async move {
            let reply = tokio::time::timeout(
                Duration::from_secs(10),
                acme.request(subject.clone(), body.into()),
            )
            .await
            .unwrap_or_else(|_| panic!("{subject}: no answer within 10 s"))
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
            let decision: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
            assert!(decision.get("action").is_some(), "{subject}: {decision}");
        }
    };
    for run in &runs {
        let subject = format!("fusebox.gate.acme.{run}");
        gate(
            subject.clone(),
            event(
                &format!("{run}-1"),
                "acme",
                run,
                1,
                r#""type":"run_started""#,
            ),
        )
        .await;
        acme_js
            .publish(
                format!("fusebox.events.acme.{run}"),
                event(
                    &format!("{run}-2"),
                    "acme",
                    run,
                    2,
                    r#""type":"tool_call","call_id":"c1","tool":"search","args":{"q":"x"}"#,
                )
                .into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
        gate(
            subject,
            event(
                &format!("{run}-3"),
                "acme",
                run,
                3,
                r#""type":"tool_result","call_id":"c1","tool":"search","kind":"SUCCESS","output":{"hits":1}"#,
            ),
        )
        .await;
    }
    expect_no_error(&mut acme_errors, SHORT).await;

    // fusebox.control.runs (not mapped) reaches every partition; the operator gathers.
    let (operator, mut operator_errors) = connect(&urls, "operator", None).await;
    let inbox = operator.new_inbox();
    let mut answers = operator.subscribe(inbox.clone()).await.expect("inbox");
    operator
        .publish_with_reply(fusebox_nats::subjects::CONTROL_RUNS, inbox, "".into())
        .await
        .expect("publish");
    let mut lists = Vec::new();
    let mut partitions = std::collections::BTreeSet::new();
    while let Ok(Some(answer)) = tokio::time::timeout(Duration::from_secs(1), answers.next()).await
    {
        let part: serde_json::Value =
            serde_json::from_slice(&answer.payload).expect("a partition's runs");
        assert_eq!(part["partitions"], n, "each answer says how many to gather");
        partitions.insert(part["partition"].as_u64().expect("its partition"));
        let list: Vec<serde_json::Value> =
            serde_json::from_value(part["runs"].clone()).expect("a runs list");
        lists.push(list);
    }
    assert_eq!(lists.len(), n as usize, "one runs answer per partition");
    assert_eq!(
        partitions,
        (0..n as u64).collect(),
        "each partition answers once"
    );
    for run in &runs {
        let found: Vec<&serde_json::Value> = lists
            .iter()
            .flatten()
            .filter(|s| s["tenant"] == "acme" && s["run"] == run.as_str())
            .collect();
        assert_eq!(found.len(), 1, "{run} is known to exactly one partition");
        assert_eq!(
            (found[0]["events"].as_u64(), found[0]["last_seq"].as_u64()),
            (Some(3), Some(3)),
            "{run}: its gate requests and its JetStream event met in one partition"
        );
    }
    // A run's operator commands reach the partition that holds it.
    let status = operator
        .request("fusebox.control.acme.run-5.status", "".into())
        .await
        .expect("status answered");
    let status: serde_json::Value = serde_json::from_slice(&status.payload).expect("JSON");
    assert_eq!(status["summary"]["run"], "run-5", "{status}");
    assert_eq!(status["summary"]["last_seq"], 3, "{status}");
    expect_no_error(&mut operator_errors, SHORT).await;
    expect_no_error(&mut d1_errors, SHORT).await;
    expect_no_error(&mut d2_errors, SHORT).await;
    for service in services {
        service.shutdown().await.expect("service drains");
    }
}
