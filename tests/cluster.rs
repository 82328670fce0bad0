//! Cluster mode end to end (issue 7), real processes on loopback only: the 3-node
//! nats-server cluster of deploy/nats/ with run partitioning on, three `fuseboxd` in
//! cluster mode, and a fleet of agent tasks over two tenants. Mid-load one daemon is
//! SIGKILLed, later one NATS node; the guarantees are checked afterwards:
//!
//! * every runaway run is stopped, with the stop kept on its kill switch;
//! * no legit run is blocked or stopped, and every run that has no side effects gets
//!   exactly the decisions the offline engine computes for its events;
//! * per (tenant, op_key) at most one call executes across the whole test, whatever
//!   partition, daemon or phase asks; later ones get the executor's stored result;
//! * every event acknowledged (a gate answer or a JetStream ack) is in its run's state,
//!   and every gate answer is repeated identically for the same event id.
//!
//! Times (takeover, failover) are printed, never asserted; only liveness has (generous)
//! timeouts. `gate_throughput_with_1_2_3_daemons` (ignored) is the scale-out benchmark:
//! `cargo test --release -p fuseboxd --test cluster -- --ignored --nocapture`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_client::FuseboxClient;
use fusebox_core::Action;
use fusebox_e2e::cluster::{add_daemon, partition_of, wait_owners, NatsCluster, PARTITIONS};
use fusebox_e2e::fleet::{
    ask, check_acknowledged_events_applied, check_answers_repeat, check_exactly_once, check_runs,
    join, op_key, op_key_of, retry, spawn_agent, wait_answers, Kind, RunLog, GATE_TIMEOUT, TENANTS,
};
use fusebox_e2e::{event, now_ms};
use serde_json::json;
use tokio::task::JoinHandle;

/// Phase 1 per tenant: 5 runaway, 6 legit, 3 op_key pairs (the two runs of a pair share
/// the key and sit in different partitions), 2 passive runaway, 1 passive legit.
/// Phase 2 per tenant: 3 runaway, 3 legit, 3 op runs re-asking phase 1's keys, 1
/// passive runaway.
fn plan(phase: u32) -> Vec<(String, String, Kind)> {
    let mut runs = Vec::new();
    for tenant in TENANTS {
        let mut add = |run: String, kind: Kind| runs.push((tenant.to_owned(), run, kind));
        let (runaway, legit, passive) = if phase == 1 { (5, 6, 2) } else { (3, 3, 1) };
        for i in 0..runaway {
            add(format!("loop{phase}-{i}"), Kind::Runaway);
        }
        for i in 0..legit {
            add(format!("page{phase}-{i}"), Kind::Legit);
        }
        for i in 0..passive {
            add(format!("ploop{phase}-{i}"), Kind::PassiveRunaway);
        }
        for j in 0..3 {
            let first = format!("op{phase}-{j}a");
            if phase == 1 {
                let second = (0..)
                    .map(|s| format!("op{phase}-{j}b{s}"))
                    .find(|b| partition_of(tenant, b) != partition_of(tenant, &first))
                    .unwrap();
                add(second, Kind::Op(op_key(tenant, j)));
            }
            add(first, Kind::Op(op_key(tenant, j)));
        }
        if phase == 1 {
            add(format!("ppage{phase}-0"), Kind::PassiveLegit);
        }
    }
    runs
}

fn spawn_fleet(
    phase: u32,
    clients: &HashMap<String, FuseboxClient>,
    answered: &Arc<AtomicUsize>,
) -> Vec<JoinHandle<RunLog>> {
    plan(phase)
        .into_iter()
        .map(|run| {
            let client = clients[&run.0].clone();
            spawn_agent(run, vec![client], 0, answered)
        })
        .collect()
}

/// How the fleet rode out a kill at `at`: the first gate answered by a new owner for a
/// run in `partitions` (its last attempt sent after the kill), and the latest answer of
/// a request that had to be retried across the kill.
struct RideOut {
    first_answer: Option<Duration>,
    all_unblocked: Option<Duration>,
    retried: usize,
}

fn ride_out(logs: &[RunLog], at: Instant, partitions: &[u32]) -> RideOut {
    let mut figures = RideOut {
        first_answer: None,
        all_unblocked: None,
        retried: 0,
    };
    for log in logs {
        let moved = partitions.contains(&partition_of(&log.tenant, &log.run));
        for gated in log.gates.iter().filter(|g| g.last_sent >= at) {
            let after = gated.answered - at;
            if moved {
                figures.first_answer = Some(figures.first_answer.map_or(after, |f| f.min(after)));
            }
            if gated.attempts > 1 {
                figures.retried += 1;
                figures.all_unblocked = Some(figures.all_unblocked.map_or(after, |f| f.max(after)));
            }
        }
    }
    figures
}

/// The node leading FUSEBOX_EVENTS (the hardest one to lose).
async fn events_leader(js: &jetstream::Context) -> String {
    retry("FUSEBOX_EVENTS leader", || async {
        let mut stream = js
            .get_stream(fusebox_nats::subjects::EVENTS_STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let info = stream.info().await.map_err(|e| e.to_string())?;
        let cluster = info.cluster.clone().ok_or("not clustered")?;
        cluster.leader.ok_or_else(|| "no leader".to_owned())
    })
    .await
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| format!("{} ms", d.as_millis()))
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_move_on_a_daemon_crash_and_nothing_is_lost_or_done_twice() {
    let mut nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    // One after the other, each joining a cluster that serves every partition already
    // (the first ones give partitions up to the newcomer's fair share).
    let mut daemons = Vec::new();
    let mut owners = Vec::new();
    for _ in 0..3 {
        owners = add_daemon(&mut daemons, dir.path(), &urls).await;
    }
    eprintln!("partition owners at start: {owners:?}");

    let mut clients = HashMap::new();
    for tenant in TENANTS {
        clients.insert(
            tenant.to_owned(),
            nats.tenant_client(tenant, GATE_TIMEOUT).await,
        );
    }
    let admin = jetstream::new(nats.connect("fuseboxd", None).await);
    let answered = Arc::new(AtomicUsize::new(0));

    // Phase 1: the fleet runs; d2 is SIGKILLed once 120 gate requests were answered.
    let fleet = spawn_fleet(1, &clients, &answered);
    wait_answers(&answered, 120, &fleet).await;
    let mut victim = daemons.remove(1);
    let moved: Vec<u32> = (0..PARTITIONS)
        .filter(|p| owners[*p as usize] == victim.node_id)
        .collect();
    victim.kill();
    let killed = Instant::now();
    let owners_after = wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(30),
    )
    .await;
    let reowned = killed.elapsed();
    let mut logs = join(fleet).await;
    let takeover = ride_out(&logs, killed, &moved);
    assert!(
        takeover.first_answer.is_some(),
        "no run of {}'s partitions {moved:?} asked anything after the kill: the takeover was not exercised",
        victim.node_id
    );
    eprintln!(
        "daemon {} SIGKILLed (partitions {moved:?}): owners {owners_after:?} after {} ms (logs); \
         first answer in a moved partition after {}; every agent unblocked after {} \
         ({} gate requests had to be retried)",
        victim.node_id,
        reowned.as_millis(),
        ms(takeover.first_answer),
        ms(takeover.all_unblocked),
        takeover.retried
    );

    // Phase 2: more load; the node leading FUSEBOX_EVENTS is SIGKILLed under it.
    let before = answered.load(Ordering::Relaxed);
    let fleet = spawn_fleet(2, &clients, &answered);
    let leader = events_leader(&admin).await;
    wait_answers(&answered, before + 60, &fleet).await;
    let node = nats.nodes.iter_mut().find(|n| n.name == leader).unwrap();
    node.kill();
    let nats_killed = Instant::now();
    let phase2 = join(fleet).await;
    let failover = ride_out(&phase2, nats_killed, &[]);
    eprintln!(
        "NATS node {leader} (FUSEBOX_EVENTS leader) SIGKILLed: {} gate requests retried, \
         the last answered {} after the kill",
        failover.retried,
        ms(failover.all_unblocked)
    );
    // Both daemons are still there and again own every partition once between them.
    wait_owners(
        &mut daemons.iter_mut().collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    eprintln!(
        "every partition owned once again {} ms after the NATS node loss (checked after the load)",
        nats_killed.elapsed().as_millis()
    );
    logs.extend(phase2);

    let executed = check_exactly_once(&logs);
    check_phase_2_reads_the_ledger(&logs, &executed);
    check_answers_repeat(&logs, &clients).await;
    check_acknowledged_events_applied(&logs, &nats.operator_client().await).await;
    check_runs(&logs, &daemons[0].config, &admin).await;

    let mut actions = BTreeMap::new();
    for gated in logs.iter().flat_map(|l| &l.gates) {
        *actions.entry(gated.decision.action.as_str()).or_insert(0) += 1;
    }
    let events: usize = logs.iter().map(|l| l.events.len()).sum();
    eprintln!(
        "{} runs, {events} events acknowledged, gate decisions {actions:?}",
        logs.len()
    );
}

/// Phase 2 re-asks every key that ran in phase 1: all answered from the ledger.
fn check_phase_2_reads_the_ledger(
    logs: &[RunLog],
    executed: &std::collections::BTreeSet<(String, String)>,
) {
    for log in logs.iter().filter(|l| l.run.starts_with("op2-")) {
        let Kind::Op(key) = &log.kind else {
            unreachable!()
        };
        if executed.contains(&(log.tenant.clone(), key.clone())) {
            let first = log
                .gates
                .iter()
                .find(|g| op_key_of(&log.events[g.event]).is_some());
            assert_eq!(
                first.map(|g| g.decision.action),
                Some(Action::UseCompletedResult),
                "{}: {key} completed in phase 1",
                log.run
            );
        }
    }
}

/// Gate requests of the throughput measurement, after a warm-up of `WARM_UP`.
const BENCH_GATES: usize = 40_000;
const WARM_UP: usize = 4_000;
const IN_FLIGHT: usize = 128;
/// Calls per run: many runs spread over all partitions, none near its step budget.
const CALLS_PER_RUN: usize = 100;

/// One throughput measurement.
struct Throughput {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    /// Requests that had to be asked again (a partition changing hands under load).
    retried: usize,
}

/// `total` distinct tool calls of tenant acme (runs `<prefix>-<n>`), `IN_FLIGHT` at a
/// time over the given connections, each asked until answered. Every call must be
/// answered `execute`, or the figure would be measuring refusals.
async fn gate_load(clients: &[FuseboxClient], prefix: &str, total: usize) -> Throughput {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|w| {
            let (client, next, prefix) = (
                clients[w % clients.len()].clone(),
                next.clone(),
                prefix.to_owned(),
            );
            tokio::spawn(async move {
                let (mut latencies, mut retried) = (Vec::new(), 0);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return (latencies, retried);
                    }
                    let call = event(json!({"v":1,"id":format!("{prefix}-{i}"),"tenant":"acme",
                        "run":format!("{prefix}-{}", i / CALLS_PER_RUN),"ts_ms":now_ms(),
                        "type":"tool_call","call_id":format!("c{i}"),"tool":"search",
                        "args":{"q":format!("query {i}")}}));
                    let asked = Instant::now();
                    let answer = ask(std::slice::from_ref(&client), 0, &call).await;
                    assert_eq!(
                        answer.decision.action,
                        Action::Execute,
                        "bench call {i}: {:?}",
                        answer.decision
                    );
                    latencies.push(asked.elapsed());
                    retried += usize::from(answer.attempts > 1);
                }
            })
        })
        .collect();
    let (mut latencies, mut retried) = (Vec::with_capacity(total), 0);
    for worker in workers {
        let (mine, again) = worker.await.expect("bench worker");
        latencies.extend(mine);
        retried += again;
    }
    let per_second = total as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Throughput {
        per_second,
        p50: latencies[total / 2],
        p99: latencies[total * 99 / 100],
        retried,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: cargo test --release -p fusebox-e2e --test e2e_cluster -- --ignored --nocapture"]
async fn gate_throughput_with_1_2_3_daemons() {
    let nats = NatsCluster::start().await;
    let urls = nats.urls();
    let dir = tempfile::tempdir().unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(nats.tenant_client("acme", Duration::from_secs(10)).await);
    }
    let mut daemons = Vec::new();
    let mut rates = Vec::new();
    for k in 1..=3 {
        let owners = add_daemon(&mut daemons, dir.path(), &urls).await;
        gate_load(&clients, &format!("warm{k}"), WARM_UP).await;
        let figure = gate_load(&clients, &format!("bench{k}"), BENCH_GATES).await;
        eprintln!(
            "{k} daemon(s) {owners:?}: {:.0} gates/s, p50 {} µs, p99 {} µs \
             ({BENCH_GATES} calls, {IN_FLIGHT} in flight, {} asked again)",
            figure.per_second,
            figure.p50.as_micros(),
            figure.p99.as_micros(),
            figure.retried
        );
        rates.push(figure.per_second);
    }
    eprintln!(
        "scaling: k=2/k=1 = {:.2}, k=3/k=1 = {:.2} (on {} cores, NATS and clients included)",
        rates[1] / rates[0],
        rates[2] / rates[0],
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
