//! Cluster mode under a real network partition (issue 17 §3): a daemon cut off from the
//! others while it holds partitions must stop serving them before another daemon takes
//! them over, and no op_key may run on both sides.
//!
//! The split is made for real with a network namespace and veth pairs of the test's own
//! ([`NatsCluster::start_split`]): NATS node a and daemon d1 run in the namespace (d1
//! talks to node a only), nodes b, c and daemons d2, d3 in the root namespace (talking to
//! b and c only). Node a's routes go over one link, its clients from the root namespace
//! over another. Once d1 holds partitions and the fleet runs, only the route link is
//! cut: node a and d1 lose JetStream's quorum, but agents still reach d1 through node a,
//! while b and c (the majority) keep the quorum and d2, d3 take d1's partitions over
//! once its leases expire. Every agent holds a connection to each side (node a; b and
//! c) and asks the other side after an unanswered attempt, so the same runs are asked
//! on both sides, and the two runs of an op_key pair start on different sides.
//!
//! Checked: the last answer the minority side got for d1's partitions after the cut came
//! before the first one the majority side got for them, and within the fence (⅔ of the
//! lease) of the cut; after healing, at most one execution per (tenant, op_key) over the
//! whole test, every acknowledged event in its run's state, every answer repeated
//! identically, side-effect-free runs decided exactly as the offline engine decides, and
//! no op_key left in flight in the shared ledger (the owners wrote every outcome back,
//! with no operator's `ledger resolve`).
//! The figures (cut, d1's last answer, first takeover answer, lease, fence) are printed.
//!
//! Needs root (netns); CI runs as root.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fusebox_client::FuseboxClient;
use fusebox_e2e::cluster::{
    partition_of, tenant_client_at, wait_owners, ClusterDaemon, NatsCluster, LEASE_MS,
};
use fusebox_e2e::fleet::{
    check_acknowledged_events_applied, check_answers_repeat, check_exactly_once,
    check_no_key_in_flight, check_runs, join, spawn_agent, Kind, RunLog, GATE_TIMEOUT, TENANTS,
};
use fusebox_e2e::netns::Netns;
use tokio::task::JoinHandle;

/// The agents' connection to node a (with d1, cut off) and to nodes b and c.
const MINORITY: usize = 0;
const MAJORITY: usize = 1;
/// A new wave of runs this often, so runs start and end across the cut and the heal.
const WAVE_EVERY: Duration = Duration::from_millis(700);
/// How long d1 must have served the same partitions before the cut.
const STEADY_BEFORE_CUT: Duration = Duration::from_secs(3);
/// What a minority answer may take beyond the fence on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);
/// fuseboxd's log line when a partition's service stops at the fence.
const FENCED: &str = "lease not renewed in time; stopped serving the partition";
/// fuseboxd's log line when the renewal loop found the lease lost first and stopped the
/// partition's service itself (logged once the service has ended): stopped serving too.
const LOST: &str = "partition lost; stopped serving it";

/// Per tenant: a runaway run, a legit one, a passive one (legit or runaway by turns),
/// and an op_key pair whose runs sit in different partitions and start on different
/// sides. Runs alternate which side they ask first.
fn wave(w: usize) -> Vec<((String, String, Kind), usize)> {
    let mut runs = Vec::new();
    for tenant in TENANTS {
        let mut add = |run: String, kind: Kind, side: usize| {
            runs.push(((tenant.to_owned(), run, kind), side));
        };
        add(format!("loop{w}"), Kind::Runaway, w % 2);
        add(format!("page{w}"), Kind::Legit, (w + 1) % 2);
        if w.is_multiple_of(2) {
            add(format!("ppage{w}"), Kind::PassiveLegit, MINORITY);
        } else {
            add(format!("ploop{w}"), Kind::PassiveRunaway, MAJORITY);
        }
        let key = format!("{tenant}:INC-w{w}:notify");
        let first = format!("op{w}a");
        let second = (0..)
            .map(|s| format!("op{w}b{s}"))
            .find(|b| partition_of(tenant, b) != partition_of(tenant, &first))
            .unwrap();
        add(first, Kind::Op(key.clone()), MINORITY);
        add(second, Kind::Op(key), MAJORITY);
    }
    runs
}

fn spawn_wave(
    w: usize,
    sides: &HashMap<String, Vec<FuseboxClient>>,
    answered: &Arc<AtomicUsize>,
) -> Vec<JoinHandle<RunLog>> {
    wave(w)
        .into_iter()
        .map(|(run, side)| {
            let clients = sides[&run.0].clone();
            spawn_agent(run, clients, side, answered)
        })
        .collect()
}

fn after(at: Instant, then: Option<Instant>) -> String {
    then.map_or("-".to_owned(), |t| {
        if t >= at {
            format!("+{} ms", (t - at).as_millis())
        } else {
            format!("-{} ms", (at - t).as_millis())
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_cut_off_with_its_partitions_stops_serving_before_they_are_taken_over() {
    let nats = NatsCluster::start_split().await;
    let split = nats.split.as_ref().expect("split cluster");
    let urls = nats.urls();
    let (minority_urls, majority_urls) = (urls[..1].to_vec(), urls[1..].to_vec());
    let dir = tempfile::tempdir().unwrap();
    // d1 first, alone in the namespace with node a; then d2 and d3 on b and c. The
    // lease is the other cluster suites' 2 s: the majority side must hold its leases
    // through the leader elections the split causes (each renewed by a task of its own).
    let start = |ns: Option<&Netns>, node: &str, urls: &[String]| {
        ClusterDaemon::start_in(ns, dir.path(), node, urls, LEASE_MS)
    };
    let mut d1 = start(Some(&split.ns), "d1", &[nats.inner_url()]);
    wait_owners(&mut [&mut d1], Duration::from_secs(60)).await;
    let mut d2 = start(None, "d2", &majority_urls);
    wait_owners(&mut [&mut d1, &mut d2], Duration::from_secs(60)).await;
    let mut d3 = start(None, "d3", &majority_urls);
    let owners = wait_owners(&mut [&mut d1, &mut d2, &mut d3], Duration::from_secs(60)).await;
    eprintln!("partition owners at start: {owners:?}");

    let mut sides = HashMap::new();
    for tenant in TENANTS {
        let minority = tenant_client_at(tenant, GATE_TIMEOUT, &minority_urls).await;
        let majority = tenant_client_at(tenant, GATE_TIMEOUT, &majority_urls).await;
        sides.insert(tenant.to_owned(), vec![minority, majority]);
    }
    let answered = Arc::new(AtomicUsize::new(0));
    let mut fleet = Vec::new();
    let mut waves = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Load, until d1 has served the same partitions for a while: the cut must find it
    // serving them (partitions still move between daemons while the three settle their
    // fair shares, and a partition whose service failed is claimed afresh).
    let (mut d1_owns, mut owned_since) = (d1.owned(), Instant::now());
    while answered.load(Ordering::Relaxed) < 150
        || waves < 3
        || d1_owns.is_empty()
        || owned_since.elapsed() < STEADY_BEFORE_CUT
    {
        assert!(
            Instant::now() < deadline,
            "load too slow ({answered:?}) or d1's partitions never steady ({d1_owns:?})"
        );
        fleet.extend(spawn_wave(waves, &sides, &answered));
        waves += 1;
        tokio::time::sleep(WAVE_EVERY).await;
        let now_owned = d1.owned();
        if now_owned != d1_owns {
            (d1_owns, owned_since) = (now_owned, Instant::now());
        }
    }

    // The split: node a and d1 alone, the fleet still reaching both sides.
    let held: BTreeSet<u32> = d1.owned();
    assert!(!held.is_empty(), "d1 holds no partition to be cut off with");
    split.route_link.cut();
    let cut = Instant::now();
    let (mut d1_fenced, mut d1_gave_up) = (None, None);
    let (mut first_claimed, mut taken_over) = (None, None);
    let deadline = cut + Duration::from_secs(60);
    let mut last_wave = Instant::now() - WAVE_EVERY;
    loop {
        if last_wave.elapsed() >= WAVE_EVERY {
            fleet.extend(spawn_wave(waves, &sides, &answered));
            waves += 1;
            last_wave = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The new owners' logs are read before d1's: whatever d1 logged before a claim
        // was logged is seen in the same round.
        let majority: BTreeSet<u32> = d2.owned().union(&d3.owned()).copied().collect();
        let now = Instant::now();
        if first_claimed.is_none() && !held.is_disjoint(&majority) {
            first_claimed = Some(now);
        }
        if taken_over.is_none() && held.is_subset(&majority) {
            taken_over = Some(now);
        }
        // Stopped serving: at the fence, lost, or its service ended on its own (a failed
        // batch) and the partition was given up (no longer owned).
        let stopped: BTreeSet<u32> = d1.logged(FENCED).union(&d1.logged(LOST)).copied().collect();
        let d1_owns = d1.owned();
        let all_stopped = held
            .iter()
            .all(|p| stopped.contains(p) || !d1_owns.contains(p));
        if d1_fenced.is_none() && all_stopped {
            d1_fenced = Some(now);
        }
        if d1_gave_up.is_none() && d1.owned().is_disjoint(&held) {
            d1_gave_up = Some(now);
        }
        // Some load on the new owners before the heal.
        if taken_over.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "d1's partitions {held:?} not taken over 60 s after the cut (d2 {:?}, d3 {:?}, d1 {:?}):\n{}",
            d2.owned(),
            d3.owned(),
            d1.owned(),
            d1.logs()
        );
    }
    split.route_link.heal();
    let healed = Instant::now();
    for _ in 0..2 {
        fleet.extend(spawn_wave(waves, &sides, &answered));
        waves += 1;
        tokio::time::sleep(WAVE_EVERY).await;
    }
    let logs = join(fleet).await;
    // d1 is back with its share.
    let owners_after = wait_owners(&mut [&mut d1, &mut d2, &mut d3], Duration::from_secs(90)).await;
    let rejoined = healed.elapsed();

    // 1. d1 stopped serving before its partitions were taken over.
    let in_held = |log: &&RunLog| held.contains(&partition_of(&log.tenant, &log.run));
    let held_gates = || logs.iter().filter(in_held).flat_map(|l| &l.gates);
    let minority_before = held_gates()
        .filter(|g| g.side == MINORITY && g.answered < cut)
        .count();
    assert!(
        minority_before > 0,
        "no answer reached the minority side for d1's partitions before the cut"
    );
    let last_minority = held_gates()
        .filter(|g| g.side == MINORITY && g.answered >= cut && g.answered < healed)
        .map(|g| g.answered)
        .max();
    let first_takeover = held_gates()
        .filter(|g| g.side == MAJORITY && g.last_sent >= cut)
        .map(|g| g.answered)
        .min()
        .expect("no majority answer for d1's partitions after the cut: no takeover exercised");
    assert!(
        first_takeover < healed,
        "d1's partitions were first answered on the majority side after the heal"
    );
    let fence = Duration::from_millis(LEASE_MS as u64 * 2 / 3);
    if let Some(last) = last_minority {
        assert!(
            last < first_takeover,
            "the minority side was answered for d1's partitions {} after the cut, after the \
             first answer of the new owners ({} after the cut)",
            after(cut, Some(last)),
            after(cut, Some(first_takeover)),
        );
        assert!(
            last - cut <= fence + SLACK,
            "the minority side was answered {} after the cut (fence {fence:?})",
            after(cut, Some(last))
        );
    }
    // d1 stopped serving (its fence) before any of its partitions was claimed.
    let d1_fenced = d1_fenced.unwrap_or_else(|| {
        panic!(
            "d1 never logged stopping its partitions {held:?} (at the fence, or lost):\n{}",
            d1.logs()
        )
    });
    assert!(
        first_claimed.is_some_and(|claimed| d1_fenced <= claimed),
        "d1 stopped serving {} after the cut, its partitions were first claimed {} after it",
        after(cut, Some(d1_fenced)),
        after(cut, first_claimed)
    );
    // Anything else the minority side got while cut off (other partitions' owners are
    // out of its reach): printed, it should be nothing but answers already on the way.
    let minority_other = logs
        .iter()
        .filter(|l| !in_held(l))
        .flat_map(|l| &l.gates)
        .filter(|g| g.side == MINORITY && g.answered >= cut && g.answered < healed)
        .map(|g| g.answered)
        .max();
    eprintln!(
        "split: d1 held partitions {held:?}; lease {LEASE_MS} ms, fence {} ms. After the cut: \
         d1's last minority answer {} (other partitions' {}), d1 stopped serving them {} and \
         gave them up {}, d2/d3 claimed the first {} and all {} (logs, polled every 50 ms), \
         first majority answer for them {}; healed after {}, owners {owners_after:?} again \
         {} ms after the heal",
        fence.as_millis(),
        after(cut, last_minority),
        after(cut, minority_other),
        after(cut, Some(d1_fenced)),
        after(cut, d1_gave_up),
        after(cut, first_claimed),
        after(cut, taken_over),
        after(cut, Some(first_takeover)),
        after(cut, Some(healed)),
        rejoined.as_millis()
    );

    // 2. and 3.: nothing done twice, nothing acknowledged lost, a replay's decisions.
    check_exactly_once(&logs);
    let mut clients = HashMap::new();
    for tenant in TENANTS {
        clients.insert(
            tenant.to_owned(),
            nats.tenant_client(tenant, GATE_TIMEOUT).await,
        );
    }
    check_answers_repeat(&logs, &clients).await;
    check_acknowledged_events_applied(&logs, &nats.operator_client().await).await;
    let admin = jetstream::new(nats.connect("fuseboxd", None).await);
    check_runs(&logs, &d2.config, &admin).await;
    check_no_key_in_flight(&admin).await;

    let mut actions = BTreeMap::new();
    let mut by_side = [0; 2];
    for gated in logs.iter().flat_map(|l| &l.gates) {
        *actions.entry(gated.decision.action.as_str()).or_insert(0) += 1;
        by_side[gated.side] += 1;
    }
    let events: usize = logs.iter().map(|l| l.events.len()).sum();
    eprintln!(
        "{} runs in {waves} waves, {events} events acknowledged, gate answers {} on the \
         minority side and {} on the majority side, decisions {actions:?}",
        logs.len(),
        by_side[MINORITY],
        by_side[MAJORITY]
    );
}
