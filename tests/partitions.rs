//! Cluster mode on one real nats-server with the shipped partition mapping (N = 4) and
//! two fuseboxd: every decision the pair gives — across partitions that share op_keys
//! through the KV ledger, and across a SIGKILL of one daemon and the other's takeover —
//! is the decision one offline engine gives for the same events in the same order.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_client::{FuseboxClient, Gate};
use fusebox_core::{Action, Decision, Event, LedgerEntry};
use fusebox_e2e::{
    bin, client, event, expected, fixture, free_port, repo_dir, Daemon, NatsServer, FIXTURES,
};
use futures_util::StreamExt;
use serde_json::json;

const PARTITIONS: u32 = 4;

/// nats-server with JetStream and deploy/nats/partitions.conf (its `8` set to 4).
fn mapped_nats(dir: &Path) -> NatsServer {
    let mapping = std::fs::read_to_string(repo_dir().join("deploy/nats/partitions.conf"))
        .unwrap()
        .replace("partition(8,", &format!("partition({PARTITIONS},"));
    // Three kinds of subject, each in its plain and its tree form.
    assert_eq!(
        mapping.matches(&format!("partition({PARTITIONS},")).count(),
        6
    );
    std::fs::write(dir.join("partitions.conf"), mapping).unwrap();
    let port = free_port();
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?} }}\nmappings {{\n  include \"partitions.conf\"\n}}\n",
            dir.join("js").display().to_string()
        ),
    )
    .unwrap();
    NatsServer::with_config("nats-server (mapped)", &conf, port)
}

fn cluster_config(dir: &Path, node: &str) -> PathBuf {
    let base = fusebox_e2e::write_config(dir);
    let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    let cluster: toml::Table = toml::from_str(&format!(
        "partitions = {PARTITIONS}\nnode_id = \"{node}\"\nlease_ms = 1000\nreplicas = 1\n"
    ))
    .unwrap();
    doc.insert("cluster".into(), toml::Value::Table(cluster));
    let path = dir.join(format!("fusebox-{node}.toml"));
    std::fs::write(&path, toml::to_string(&doc).unwrap()).unwrap();
    path
}

/// What the daemons' logs say each one serves now.
fn served(daemons: &[&Daemon]) -> BTreeSet<u32> {
    let mut serving = BTreeSet::new();
    for daemon in daemons {
        let mut mine = BTreeSet::<u32>::new();
        for line in daemon.logs().lines() {
            let Some(at) = line.find("partition=") else {
                continue;
            };
            let digits: String = line[at + 10..]
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(char::is_ascii_digit)
                .collect();
            let Ok(partition) = digits.parse() else {
                continue;
            };
            if line.contains("partition claimed") {
                mine.insert(partition);
            } else if line.contains("partition released") || line.contains("partition lost") {
                mine.remove(&partition);
            }
        }
        serving.extend(mine);
    }
    serving
}

async fn wait_until_served(daemons: &[&Daemon]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while served(daemons).len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "partitions not all served: {:?}",
            served(daemons)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks the gate until it answers, as an agent riding out a takeover would, with the
/// same event (so a request the dead daemon applied gets its original decision).
async fn gate(client: &FuseboxClient, event: &Event) -> Decision {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.gate(event).await {
            Gate::Decided(decision) => return decision,
            Gate::Refused(err) => panic!("{}: refused: {err:?}", event.id),
            Gate::Unanswered { error, .. } => {
                assert!(
                    Instant::now() < deadline,
                    "{}: no answer: {error}",
                    event.id
                );
            }
        }
    }
}

struct Trace {
    sent: Vec<Event>,
    got: Vec<Decision>,
}

impl Trace {
    async fn gate(&mut self, client: &FuseboxClient, event: Event) -> Decision {
        let decision = gate(client, &event).await;
        self.sent.push(event);
        self.got.push(decision.clone());
        decision
    }
}

fn ev(run: &str, seq: u64, body: serde_json::Value) -> Event {
    let mut value = json!({"v": 1, "id": format!("{run}-{seq}"), "tenant": "acme", "run": run,
        "seq": seq, "ts_ms": 1_764_500_000_000u64 + seq * 100});
    value
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    event(value)
}

fn send(call_id: &str, op_key: &str) -> serde_json::Value {
    json!({"type": "tool_call", "call_id": call_id, "tool": "send_email",
        "args": {"to": "ops@example.com"}, "op_key": op_key, "effect": "write"})
}

fn result(call_id: &str, kind: &str) -> serde_json::Value {
    json!({"type": "tool_result", "call_id": call_id, "tool": "send_email", "kind": kind,
        "output": {"sent": kind == "SUCCESS"}})
}

fn started() -> serde_json::Value {
    json!({"type": "run_started", "agent": "notifier"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_decide_like_one_engine_across_partitions_and_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let nats = mapped_nats(dir.path());
    let d1_config = cluster_config(dir.path(), "d1");
    let d2_config = cluster_config(dir.path(), "d2");
    let mut d1 = Daemon::start(&nats.url(), &d1_config, &dir.path().join("d1")).await;
    let mut d2 = Daemon::start(&nats.url(), &d2_config, &dir.path().join("d2")).await;
    wait_until_served(&[&d1, &d2]).await;
    let client = client(&nats.url()).await;
    let mut trace = Trace {
        sent: Vec::new(),
        got: Vec::new(),
    };

    // The contract's fixtures, each its own run.
    for name in FIXTURES {
        for event in fixture(name) {
            trace.gate(&client, event).await;
        }
    }

    // One op_key, six runs: the first sends, every other run gets its result.
    let share: Vec<String> = (0..6).map(|i| format!("share-{i}")).collect();
    for run in &share {
        trace.gate(&client, ev(run, 1, started())).await;
    }
    assert!(trace
        .gate(&client, ev(&share[0], 2, send("c1", "report-7")))
        .await
        .action
        .lets_tool_run());
    trace
        .gate(&client, ev(&share[0], 3, result("c1", "SUCCESS")))
        .await;
    for run in &share[1..] {
        let decision = trace
            .gate(&client, ev(run, 2, send("c1", "report-7")))
            .await;
        assert_eq!(
            decision.action,
            Action::UseCompletedResult,
            "{run}: {decision:?}"
        );
    }

    // In flight in one run: refused in the others until it fails, then free again.
    let hold: Vec<String> = (0..5).map(|i| format!("hold-{i}")).collect();
    for run in &hold {
        trace.gate(&client, ev(run, 1, started())).await;
    }
    assert!(trace
        .gate(&client, ev(&hold[0], 2, send("c1", "wire-1")))
        .await
        .action
        .lets_tool_run());
    for run in &hold[1..] {
        let decision = trace.gate(&client, ev(run, 2, send("c1", "wire-1"))).await;
        assert!(
            !decision.action.lets_tool_run(),
            "{run}: ran while in flight: {decision:?}"
        );
    }
    trace
        .gate(&client, ev(&hold[0], 3, result("c1", "RETRYABLE")))
        .await;
    assert!(trace
        .gate(&client, ev(&hold[1], 3, send("c2", "wire-1")))
        .await
        .action
        .lets_tool_run());

    // A result that waits for an earlier seq (held) still settles the shared ledger
    // when it is applied: the other runs then get its result, wherever they live.
    let late = ev(&hold[1], 5, result("c2", "SUCCESS"));
    let held = tokio::spawn({
        let (client, late) = (client.clone(), late.clone());
        async move { gate(&client, &late).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gap = ev(&hold[1], 4, json!({"type": "progress", "version": 1}));
    trace.gate(&client, gap).await;
    let late_decision = held.await.unwrap();
    trace.sent.push(late);
    trace.got.push(late_decision);
    for run in &hold[2..] {
        let decision = trace.gate(&client, ev(run, 3, send("c3", "wire-1"))).await;
        assert_eq!(
            decision.action,
            Action::UseCompletedResult,
            "{run}: {decision:?}"
        );
    }

    // Those runs really are spread over partitions (each partition its own engine), so
    // only the shared ledger can have answered them.
    let js = jetstream::new(client.nats().clone());
    let applied = js.get_stream("FUSEBOX_APPLIED").await.unwrap();
    let subjects = applied
        .info_with_subjects("fusebox.applied.>")
        .await
        .unwrap();
    let mut subjects: Vec<String> = futures_util::TryStreamExt::try_collect::<Vec<_>>(subjects)
        .await
        .unwrap()
        .into_iter()
        .map(|(subject, _)| subject)
        .collect();
    subjects.sort();
    assert!(subjects.len() >= 3, "runs landed in {subjects:?}");

    // The operator's listing gathers every partition's answer, from both daemons.
    let listing = client.runs_listing().await.unwrap();
    assert!(listing.unanswered.is_empty(), "{:?}", listing.unanswered);
    let listed: BTreeSet<&str> = listing.runs.iter().map(|r| r.run.as_str()).collect();
    let sent: BTreeSet<&str> = trace.sent.iter().map(|e| e.run.as_str()).collect();
    assert_eq!(listed, sent);

    // SIGKILL one daemon: the other takes its partitions and every run goes on where
    // it was — stopped runs stay stopped, completed op_keys stay completed.
    let killed = Instant::now();
    d1.kill();
    let mut first_answer = None;
    let runs: Vec<(String, u64)> = {
        let mut last = std::collections::BTreeMap::new();
        for e in &trace.sent {
            let seq = last.entry(e.run.clone()).or_insert(0);
            *seq = (*seq).max(e.seq.unwrap_or(0));
        }
        last.into_iter().collect()
    };
    for (run, seq) in &runs {
        let tenant = trace
            .sent
            .iter()
            .find(|e| &e.run == run)
            .unwrap()
            .tenant
            .clone();
        let mut next = ev(run, seq + 1, send("after", "report-7"));
        next.tenant = tenant;
        next.id = format!("{run}-after");
        trace.gate(&client, next).await;
        first_answer.get_or_insert(killed.elapsed());
    }
    let all_answered = killed.elapsed();
    wait_until_served(&[&d2]).await;
    eprintln!(
        "takeover: first answer {:?} after the SIGKILL, all {} runs answered after {all_answered:?}",
        first_answer.unwrap(),
        runs.len()
    );

    let want = expected(&d1_config, &trace.sent);
    for ((event, got), want) in trace.sent.iter().zip(&trace.got).zip(&want) {
        assert_eq!(
            got,
            want,
            "{}/{} {}",
            event.run,
            event.id,
            event.type_name()
        );
    }

    // A daemon configured with another N is refused at start: it would split runs
    // differently from the servers' mapping and the others.
    let mut doc: toml::Table =
        toml::from_str(&std::fs::read_to_string(&d2_config).unwrap()).unwrap();
    let cluster = doc.get_mut("cluster").unwrap().as_table_mut().unwrap();
    cluster.insert("partitions".into(), toml::Value::Integer(8));
    cluster.insert("node_id".into(), toml::Value::String("d3".into()));
    let wrong_n = dir.path().join("fusebox-d3.toml");
    std::fs::write(&wrong_n, toml::to_string(&doc).unwrap()).unwrap();
    let refused = Command::new(bin("fuseboxd"))
        .arg("--config")
        .arg(&wrong_n)
        .args([
            "--nats-url",
            &nats.url(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path().join("d3"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("into 4 partitions, this one into 8"),
        "{stderr}"
    );

    // Passive ingest is served for the taken-over partitions too.
    let before = client
        .run_status("acme", &share[2])
        .await
        .unwrap()
        .summary
        .events;
    let progress = ev(&share[2], 4, json!({"type": "progress", "version": 1}));
    client.report(&progress).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .run_status("acme", &share[2])
        .await
        .unwrap()
        .summary
        .events
        == before
    {
        assert!(
            Instant::now() < deadline,
            "the reported event was never applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A clean restart of the daemon that now owns everything: each partition's log
    // keeps a mark of how far it reaches into the replicated stream, so the new process
    // reads none of the history it holds (a catch-up must not grow with the stream's
    // age), and it still answers every earlier event as recorded.
    let status = d2.terminate();
    assert!(status.success(), "exit {status}:\n{}", d2.logs());
    let d2 = Daemon::start(&nats.url(), &d2_config, &dir.path().join("d2")).await;
    wait_until_served(&[&d2]).await;
    let logs = d2.logs();
    let claimed: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("partition claimed"))
        .collect();
    assert_eq!(claimed.len(), PARTITIONS as usize, "{logs}");
    for line in claimed {
        assert!(line.contains("batches_read=0"), "{line}");
    }
    for (event, want) in trace.sent.iter().zip(&want) {
        assert_eq!(&gate(&client, event).await, want, "{}", event.id);
    }
}

/// A daemon told to stop while NATS is unreachable must still exit (within
/// `Daemon::terminate`'s 30 s, Kubernetes' default grace): its replies and lease releases
/// cannot be delivered anyway, and waiting for the outage to end kept it up for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_daemon_stops_on_sigterm_while_nats_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let nats = mapped_nats(dir.path());
    let config = cluster_config(dir.path(), "alone");
    let mut daemon = Daemon::start(&nats.url(), &config, &dir.path().join("alone")).await;
    wait_until_served(&[&daemon]).await;
    drop(nats);
    // Past the lease (1 s): the partitions fence themselves meanwhile, and the SIGTERM
    // meets the ownership loop in the middle of its failing requests.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = daemon.terminate();
    assert!(status.success(), "exit {status}:\n{}", daemon.logs());
}

/// The op_key entries of the shared ledger (`FUSEBOX_LEDGER`), by KV key.
async fn shared_ledger(js: &jetstream::Context) -> Vec<(String, Option<LedgerEntry>)> {
    let kv = js.get_key_value("FUSEBOX_LEDGER").await.unwrap();
    let mut keys = kv.keys().await.unwrap();
    let mut entries = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.unwrap();
        let value = kv.get(key.clone()).await.unwrap().unwrap();
        entries.push((key, serde_json::from_slice(value.as_ref()).unwrap()));
    }
    entries
}

/// An outcome a partition's owner committed but could not write to the shared ledger
/// (cut off at its fence, issue 25 §1) is written back by the partition's next owner
/// when it catches up: no key stays in flight for an operator to resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_owner_writes_back_an_outcome_the_shared_ledger_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let nats = mapped_nats(dir.path());
    let config = cluster_config(dir.path(), "alone");
    let data = dir.path().join("alone");
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    wait_until_served(&[&daemon]).await;
    let client = client(&nats.url()).await;
    gate(&client, &ev("mailer", 1, started())).await;
    let sent = gate(&client, &ev("mailer", 2, send("c1", "INC-9:notify"))).await;
    assert!(sent.action.lets_tool_run(), "{sent:?}");
    gate(&client, &ev("mailer", 3, result("c1", "SUCCESS"))).await;

    // What the shared ledger holds when the write-back after the commit never came.
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let entries: [(String, Option<LedgerEntry>); 1] = shared_ledger(&js).await.try_into().unwrap();
    let [(key, Some(LedgerEntry::Completed { run, call_id, .. }))] = entries else {
        panic!("the completion was not written to the shared ledger: {entries:?}")
    };
    let in_flight = LedgerEntry::InFlight {
        run,
        call_id,
        since_ms: 1,
    };
    let kv = js.get_key_value("FUSEBOX_LEDGER").await.unwrap();
    kv.put(
        key.clone(),
        serde_json::to_vec(&Some(&in_flight)).unwrap().into(),
    )
    .await
    .unwrap();
    daemon.kill();

    // The next owner (here the same daemon, restarted) catches the partitions up.
    let daemon = Daemon::start(&nats.url(), &config, &data).await;
    wait_until_served(&[&daemon]).await;
    let written = Duration::from_secs(30);
    completed_in_shared_ledger(
        &js,
        &key,
        written,
        &daemon,
        "the outcome was not written back",
    )
    .await;
    // And a later call with the key, in another run, gets the completed result.
    a_later_run_gets_the_completed_result(&client, "INC-9:notify").await;
}

/// Waits up to `within` for the shared ledger to hold `key` completed (with the mailer's
/// result) as its only entry; fails with `what` and the daemon's log otherwise.
async fn completed_in_shared_ledger(
    js: &jetstream::Context,
    key: &str,
    within: Duration,
    daemon: &Daemon,
    what: &str,
) {
    let deadline = Instant::now() + within;
    loop {
        let entries = shared_ledger(js).await;
        match entries.as_slice() {
            [(k, Some(LedgerEntry::Completed { result, .. }))] if k == key => {
                assert!(result.contains("sent"), "{result}");
                return;
            }
            other => assert!(
                Instant::now() < deadline,
                "{what}: {other:?}\n{}",
                daemon.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A call with `op_key` in a new run is answered with the completed result.
async fn a_later_run_gets_the_completed_result(client: &FuseboxClient, op_key: &str) {
    gate(client, &ev("retry", 1, started())).await;
    let again = gate(client, &ev("retry", 2, send("c1", op_key))).await;
    assert_eq!(again.action, Action::UseCompletedResult, "{again:?}");
}

/// Sets the largest message the shared ledger's stream takes: a write-back refused
/// while the key itself stays readable (what a ledger unreachable for a while does to
/// an owner's writes, without touching anything else the owner needs).
async fn limit_ledger_messages(js: &jetstream::Context, max_message_size: i32) {
    let mut stream = js.get_stream("KV_FUSEBOX_LEDGER").await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.max_message_size = max_message_size;
    js.update_stream(config).await.unwrap();
}

/// An outcome the owner could not write to the shared ledger when its batch committed
/// (the ledger refused it for a while, issue 25 §1) is written by that same owner once
/// the ledger takes writes again: no key stays in flight while the owner keeps the
/// partition (a next owner's catch-up would only come with a change of owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_writes_an_outcome_again_once_the_shared_ledger_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let nats = mapped_nats(dir.path());
    let config = cluster_config(dir.path(), "alone");
    let daemon = Daemon::start(&nats.url(), &config, &dir.path().join("alone")).await;
    wait_until_served(&[&daemon]).await;
    let client = client(&nats.url()).await;
    gate(&client, &ev("mailer", 1, started())).await;
    let sent = gate(&client, &ev("mailer", 2, send("c1", "INC-7:notify"))).await;
    assert!(sent.action.lets_tool_run(), "{sent:?}");
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let entries: [(String, Option<LedgerEntry>); 1] = shared_ledger(&js).await.try_into().unwrap();
    let [(key, Some(LedgerEntry::InFlight { .. }))] = entries else {
        panic!("the call was not claimed in the shared ledger: {entries:?}")
    };

    // The completion does not fit while the limit holds: the write-back after the
    // result's commit fails (it is logged), and the key stays in flight.
    limit_ledger_messages(&js, 16).await;
    gate(&client, &ev("mailer", 3, result("c1", "SUCCESS"))).await;
    let entries = shared_ledger(&js).await;
    assert!(
        matches!(entries.as_slice(), [(k, Some(LedgerEntry::InFlight { .. }))] if *k == key),
        "{entries:?}"
    );
    assert!(
        daemon
            .logs()
            .contains("cannot write an outcome to the shared ledger yet"),
        "{}",
        daemon.logs()
    );

    limit_ledger_messages(&js, -1).await;
    let within = Duration::from_secs(20);
    let what = "the owner never wrote the outcome again";
    completed_in_shared_ledger(&js, &key, within, &daemon, what).await;
    a_later_run_gets_the_completed_result(&client, "INC-7:notify").await;
}
