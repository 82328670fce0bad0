//! The durable guard's contract: group commit, dedup with the original decision,
//! held/released events, policy changes and retention that survive a rebuild.

mod common;

use std::time::Duration;

use common::{ev, full_replay, open, options};
use fusebox_core::{Action, PolicySet, Preset};
use fusebox_log::{inspect, Guard, Outcome};

const CALL: &str =
    r#""type":"tool_call","call_id":"c1","tool":"send","args":{"to":"ops"},"op_key":"notify-1""#;
const OK: &str =
    r#""type":"tool_result","call_id":"c1","tool":"send","kind":"SUCCESS","output":{"sent":true}"#;
const FINISH: &str = r#""type":"run_finished","status":"done""#;

fn applied(outcome: &Outcome) -> Vec<Action> {
    match outcome {
        Outcome::Applied(decisions) => decisions.iter().map(|d| d.action).collect(),
        other => panic!("expected Applied, got {other:?}"),
    }
}

#[test]
fn a_redelivered_event_gets_its_original_decision_in_the_batch_after_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let call = ev("r1", 1, 10, CALL);
    let outcomes = guard
        .submit_batch(vec![call.clone(), call.clone()])
        .unwrap();
    let original = match &outcomes[0] {
        Outcome::Applied(decisions) => decisions[0].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(original.action, Action::Execute);
    assert_eq!(outcomes[1], Outcome::Duplicate(Some(original.clone())));
    assert_eq!(
        guard.submit(call.clone()).unwrap(),
        Outcome::Duplicate(Some(original.clone()))
    );
    drop(guard);

    let mut guard = open(dir.path(), options(0));
    assert_eq!(
        guard.submit(call).unwrap(),
        Outcome::Duplicate(Some(original.clone()))
    );
    assert_eq!(
        guard.lookup_decision("acme", "r1", "r1-1").unwrap(),
        Some(original)
    );
    assert_eq!(guard.lookup_decision("acme", "r1", "nope").unwrap(), None);
}

#[test]
fn admission_outcomes_for_out_of_order_and_backwards_seq() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let first = ev("r1", 1, 10, CALL);
    let second = ev("r1", 2, 11, OK);
    let outcomes = guard
        .submit_batch(vec![second.clone(), second.clone(), first.clone()])
        .unwrap();
    assert_eq!(outcomes[0], Outcome::Held { waiting_for: 1 });
    // A copy of a held event has no decision yet.
    assert_eq!(outcomes[1], Outcome::Duplicate(None));
    assert_eq!(
        applied(&outcomes[2]),
        vec![Action::Execute, Action::Continue]
    );
    assert_eq!(
        guard.submit(second).unwrap(),
        Outcome::Duplicate(guard.lookup_decision("acme", "r1", "r1-2").unwrap())
    );
    let mut backwards = ev("r1", 1, 12, FINISH);
    backwards.id = "other-id".into();
    assert!(matches!(
        guard.submit(backwards).unwrap(),
        Outcome::Rejected(_)
    ));

    // A gap given up on: the held events are applied and logged.
    guard.submit(ev("r2", 2, 20, CALL)).unwrap();
    assert_eq!(guard.waiting().collect::<Vec<_>>(), vec![("acme", "r2", 1)]);
    let released = guard.release_gap("acme", "r2").unwrap();
    assert_eq!(released.len(), 1);
    assert_eq!(guard.waiting().count(), 0);
    drop(guard);
    let guard = open(dir.path(), options(0));
    assert!(guard
        .lookup_decision("acme", "r2", "r2-2")
        .unwrap()
        .is_some());
}

#[test]
fn the_ledger_tree_follows_the_engine_and_verify_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    guard
        .submit_batch(vec![ev("r1", 1, 10, CALL), ev("r1", 2, 11, OK)])
        .unwrap();
    // Another run asking for the same business operation gets the stored result.
    let again = guard.submit(ev("r2", 1, 12, CALL)).unwrap();
    assert_eq!(applied(&again), vec![Action::UseCompletedResult]);
    drop(guard);

    // Without a snapshot the tree still holds the (empty) ledger of the open, and says
    // so: verify compares it with the replay at that position.
    let check = |keys: u64| {
        let log = inspect::open(dir.path()).unwrap();
        let stats = inspect::stats(&log).unwrap();
        assert_eq!((stats.events, stats.ledger_keys, stats.runs), (3, keys, 2));
        let report = inspect::verify(&log).unwrap();
        assert!(report.is_ok(), "{report:#?}");
        assert_eq!(report.decisions_matched, 3);
    };
    check(0);
    // Opening catches the tree up with the log.
    drop(open(dir.path(), options(0)));
    check(1);
}

#[test]
fn a_checkpoint_writes_the_ledger_tree() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    guard
        .submit_batch(vec![ev("r1", 1, 10, CALL), ev("r1", 2, 11, OK)])
        .unwrap();
    guard.checkpoint().unwrap();
    drop(guard);
    let log = inspect::open(dir.path()).unwrap();
    assert_eq!(inspect::stats(&log).unwrap().ledger_keys, 1);
    assert!(inspect::verify(&log).unwrap().is_ok());
}

#[test]
fn a_policy_change_is_logged_and_applies_to_new_runs_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    guard.submit(ev("old", 1, 10, CALL)).unwrap();
    drop(guard);

    let strict = PolicySet::new(Preset::Strict.policy());
    let mut guard = Guard::open(dir.path(), strict.clone(), options(0)).unwrap();
    guard.submit(ev("new", 1, 20, CALL)).unwrap();
    let policy_of =
        |guard: &Guard, run: &str| guard.engine().run("acme", run).unwrap().policy.clone();
    assert_eq!(&policy_of(&guard, "new"), strict.base());
    assert_ne!(&policy_of(&guard, "old"), strict.base());
    let before = guard.state().clone();
    drop(guard);

    let guard = Guard::open(dir.path(), strict, options(0)).unwrap();
    assert_eq!(
        guard.state(),
        &before,
        "reopening with the same policies logs nothing"
    );
    assert_eq!(&full_replay(guard.log()), guard.state());
    drop(guard);
    let report = inspect::verify(&inspect::open(dir.path()).unwrap()).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(report.operations, 2);
}

#[test]
fn retention_prunes_long_closed_runs_and_keeps_their_ledger_keys() {
    let dir = tempfile::tempdir().unwrap();
    let retained = fusebox_log::GuardOptions {
        retention: Some(Duration::from_secs(60)),
        ..options(1)
    };
    let mut guard = open(dir.path(), retained.clone());
    guard
        .submit_batch(vec![
            ev("done", 1, 1_000, CALL),
            ev("done", 2, 1_001, OK),
            ev("done", 3, 1_002, FINISH),
        ])
        .unwrap();
    guard
        .submit(ev("open", 1, 2_000, r#""type":"progress","version":1"#))
        .unwrap();
    // Two minutes of event time later, the next snapshot prunes the finished run.
    guard
        .submit(ev("open", 2, 121_000, r#""type":"progress","version":2"#))
        .unwrap();
    guard
        .submit(ev("open", 3, 121_001, r#""type":"progress","version":3"#))
        .unwrap();
    assert!(guard.engine().run("acme", "done").is_none());
    assert!(guard.engine().run("acme", "open").is_some());
    assert_eq!(guard.engine().ledger().len(), 1);
    assert_eq!(
        guard.lookup_decision("acme", "done", "done-1").unwrap(),
        None
    );
    let state = guard.state().clone();
    drop(guard);

    let guard = open(dir.path(), retained);
    assert_eq!(guard.state(), &state);
    assert_eq!(&full_replay(guard.log()), &state);
    drop(guard);
    let log = inspect::open(dir.path()).unwrap();
    let report = inspect::verify(&log).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(inspect::stats(&log).unwrap().runs, 1);
}

#[test]
fn ledger_retention_forgets_old_keys_as_a_logged_operation() {
    let dir = tempfile::tempdir().unwrap();
    let retained = fusebox_log::GuardOptions {
        ledger_retention: Some(Duration::from_secs(60)),
        ..options(1)
    };
    let mut guard = open(dir.path(), retained.clone());
    guard
        .submit_batch(vec![ev("r1", 1, 1_000, CALL), ev("r1", 2, 1_001, OK)])
        .unwrap();
    // Still within retention: another run asking for the operation gets the result.
    let again = guard.submit(ev("r2", 1, 30_000, CALL)).unwrap();
    assert_eq!(applied(&again), vec![Action::UseCompletedResult]);
    assert_eq!(guard.engine().ledger().len(), 1);
    // Two minutes of event time later the key is forgotten at the next snapshot, and
    // the operation may run again.
    guard
        .submit(ev("r3", 1, 121_000, r#""type":"progress","version":1"#))
        .unwrap();
    guard
        .submit(ev("r3", 2, 121_001, r#""type":"progress","version":2"#))
        .unwrap();
    assert!(guard.engine().ledger().is_empty());
    let fresh = guard.submit(ev("r4", 1, 121_002, CALL)).unwrap();
    assert_eq!(applied(&fresh), vec![Action::Execute]);
    let state = guard.state().clone();
    drop(guard);

    let guard = open(dir.path(), retained);
    assert_eq!(guard.state(), &state);
    assert_eq!(&full_replay(guard.log()), &state);
    drop(guard);
    let report = inspect::verify(&inspect::open(dir.path()).unwrap()).unwrap();
    assert!(report.is_ok(), "{report:#?}");
    assert_eq!(
        report.operations, 2,
        "the policy record and one forget_operations"
    );
}
