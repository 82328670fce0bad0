//! The cluster hooks: `submit_batch_then` shows the hook what the batch applied before
//! anything is written, a refusing hook leaves nothing durable, and adopted ledger
//! entries are logged records that a rebuild repeats.

mod common;

use common::{ev, full_replay, open, options};
use fusebox_core::{Action, LedgerEntry};
use fusebox_log::{AdoptedOp, Outcome};

const CALL: &str =
    r#""type":"tool_call","call_id":"c1","tool":"send","args":{"to":"ops"},"op_key":"notify-1""#;

fn adopted_elsewhere() -> Vec<AdoptedOp> {
    vec![AdoptedOp {
        tenant: "acme".to_owned(),
        op_key: "notify-1".to_owned(),
        entry: Some(LedgerEntry::Completed {
            run: "other".to_owned(),
            call_id: "c9".to_owned(),
            result: r#"{"sent":true}"#.to_owned(),
        }),
    }]
}

#[derive(Debug, thiserror::Error)]
#[error("refused by the test")]
struct Refused;

#[test]
fn the_hook_sees_the_applied_events_in_order_and_the_adopted_entry_decides() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let events = vec![
        ev("r1", 2, 11, CALL),
        ev("r1", 1, 10, r#""type":"progress","version":1"#),
    ];
    let mut seen = Vec::new();
    let outcomes = guard
        .submit_batch_then(adopted_elsewhere(), events, |engine, applied| {
            assert!(engine.ledger().get("acme", "notify-1").is_some());
            seen.extend(applied.iter().map(|e| e.seq));
            Ok::<(), Refused>(())
        })
        .unwrap();
    // seq 2 was held until seq 1 came: the hook sees application order.
    assert_eq!(seen, vec![Some(1), Some(2)]);
    assert!(matches!(outcomes[0], Outcome::Held { .. }));
    let Outcome::Applied(decisions) = &outcomes[1] else {
        panic!("{outcomes:?}")
    };
    assert_eq!(decisions[1].action, Action::UseCompletedResult);

    let position = guard.position();
    drop(guard);
    let reopened = open(dir.path(), options(0));
    assert_eq!(reopened.position(), position);
    assert_eq!(
        reopened.engine().ledger(),
        full_replay(reopened.log()).engine.ledger()
    );
    assert!(matches!(
        reopened.engine().ledger().get("acme", "notify-1"),
        Some(LedgerEntry::Completed { run, .. }) if run == "other"
    ));
}

#[test]
fn a_refusing_hook_leaves_nothing_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut guard = open(dir.path(), options(0));
    let before = guard.position();
    let err = guard
        .submit_batch_then(Vec::new(), vec![ev("r1", 1, 10, CALL)], |_, _| Err(Refused))
        .unwrap_err();
    assert!(err.to_string().contains("refused by the test"), "{err}");
    // Memory may be ahead of the disk now: the guard refuses further work.
    assert!(guard.submit_batch(vec![ev("r1", 2, 11, CALL)]).is_err());
    drop(guard);
    let mut reopened = open(dir.path(), options(0));
    assert_eq!(reopened.position(), before);
    let outcomes = reopened.submit_batch(vec![ev("r1", 1, 10, CALL)]).unwrap();
    assert!(matches!(&outcomes[0], Outcome::Applied(d) if d[0].action == Action::Execute));
}
