//! A compaction stop says what was compacted how often: in the report's `detail` and in
//! the message the model and the operator read.

use fusebox_core::{parse_event, Action, Decision, Engine};
use serde_json::{json, Value};

fn apply_all(engine: &mut Engine, bodies: &[Value]) -> Vec<Decision> {
    bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let mut event =
                json!({"v":1,"id":format!("e{i}"),"tenant":"t","run":"r","seq":i+1,"ts_ms":1000+i});
            event
                .as_object_mut()
                .unwrap()
                .extend(body.as_object().unwrap().clone());
            let parsed = parse_event(event.to_string().as_bytes()).expect("valid");
            engine.apply(&parsed)
        })
        .collect()
}

#[test]
fn a_thrash_stop_counts_compactions_by_reason_and_overflows() {
    let decisions = apply_all(
        &mut Engine::default(),
        &[
            json!({"type":"run_started"}),
            json!({"type":"model_turn","stop_reason":"model_context_window_exceeded"}),
            json!({"type":"compaction","reason":"auto"}),
            json!({"type":"compaction","reason":"auto"}),
            json!({"type":"compaction","reason":"manual"}),
        ],
    );
    let stop = decisions.last().unwrap();
    assert_eq!(stop.action, Action::Stop);
    let report = stop.report.as_ref().expect("a stop carries its report");
    assert_eq!(report.reason.as_str(), "compaction_thrash");
    let detail = report.detail.as_deref().expect("a detail");
    assert_eq!(
        detail,
        "3 compaction cycles in a row with no progress; in the run: 3 compactions \
         (auto ×2, manual ×1), 1 model turn ended model_context_window_exceeded"
    );
    let message = stop.message.as_deref().unwrap();
    assert!(message.contains(detail), "{message}");
    assert!(report
        .fired_guards
        .iter()
        .any(|g| g.starts_with("compaction_thrash:stop@")));
    assert_eq!(stop.count, Some(3));
}

#[test]
fn a_budget_stop_names_the_budget() {
    let mut bodies = vec![json!({"type":"run_started","policy":{"max_compactions":2}})];
    for v in 1..=3u64 {
        bodies.push(json!({"type":"compaction"}));
        bodies.push(json!({"type":"progress","version":v}));
    }
    let decisions = apply_all(&mut Engine::default(), &bodies);
    let stop = decisions
        .iter()
        .find(|d| d.action == Action::Stop)
        .expect("the third compaction stops");
    let report = stop.report.as_ref().unwrap();
    assert_eq!(report.reason.as_str(), "compaction_budget");
    assert_eq!(
        report.detail.as_deref(),
        Some("3 compaction cycles in the run, max_compactions 2: 3 compactions (unspecified ×3)")
    );
    assert_eq!(
        report.resume_condition,
        fusebox_core::ResumeCondition::NewRun
    );
}

#[test]
fn compaction_reasons_stay_bounded() {
    let mut bodies = vec![
        json!({"type":"run_started","policy":{"compaction_thrash":{"enabled":false},"max_compactions":100}}),
    ];
    for i in 0..40 {
        bodies
            .push(json!({"type":"compaction","reason":format!("reason-{i}-{}", "x".repeat(100))}));
    }
    let mut engine = Engine::default();
    let decisions = apply_all(&mut engine, &bodies);
    assert!(decisions.iter().all(|d| d.action == Action::Continue));
    let run = engine.run("t", "r").unwrap();
    assert_eq!(run.compactions.compactions, 40);
    assert_eq!(run.compactions.reasons.len(), 8);
    assert!(run.compactions.reasons.iter().all(|(r, _)| r.len() <= 40));
    assert_eq!(
        run.compactions.reasons.iter().map(|(_, n)| n).sum::<u32>(),
        40
    );
    assert_eq!(run.compactions.reasons.last().unwrap().0, "other");
}
