//! What the model reads counts what happened: executions as runs, refusals apart
//! (issue 44 §8: "already ran 4 times" after 3 executions misled the model).

use fusebox_core::{parse_event, Action, Decision, Engine};
use serde_json::{json, Value};

fn apply(engine: &mut Engine, seq: &mut u64, body: Value) -> Decision {
    *seq += 1;
    let mut event =
        json!({"v":1,"id":format!("e{seq}"),"tenant":"t","run":"r","seq":*seq,"ts_ms":1000 + *seq});
    event
        .as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    engine.apply(&parse_event(event.to_string().as_bytes()).expect("valid"))
}

#[test]
fn a_repeat_is_told_how_often_it_ran_and_how_often_it_was_refused() {
    let mut engine = Engine::default();
    let seq = &mut 0;
    apply(
        &mut engine,
        seq,
        json!({"type":"run_started","policy":{"consecutive_block_limit":5}}),
    );
    let call = |n: u64| json!({"type":"tool_call","call_id":format!("c{n}"),"tool":"search","args":{"q":"x"}});
    for n in 1..=3 {
        apply(&mut engine, seq, call(n));
        apply(
            &mut engine,
            seq,
            json!({"type":"tool_result","call_id":format!("c{n}"),"tool":"search","kind":"SUCCESS","output":{"hits":[]}}),
        );
    }
    let first = apply(&mut engine, seq, call(4));
    assert_eq!(first.action, Action::Block);
    let message = first.message.unwrap();
    assert!(
        message.contains("already ran 3 times with the same result"),
        "{message}"
    );
    assert!(!message.contains("refused"), "{message}");

    let second = apply(&mut engine, seq, call(5));
    assert_eq!(second.action, Action::Block);
    let message = second.message.unwrap();
    assert!(
        message.contains("already ran 3 times (and was refused once since)"),
        "{message}"
    );
}

#[test]
fn a_tree_stop_says_which_run_and_which_cap_or_budget() {
    let mut engine = Engine::default();
    let seq = &mut 0;
    let start = |run: &str, parent: Option<&str>| {
        let mut body = json!({"type":"run_started","policy":{"max_open_children":1}});
        if let Some(parent) = parent {
            body["parent"] = json!(parent);
        }
        (run.to_owned(), body)
    };
    let mut apply_to = |(run, body): (String, Value)| {
        *seq += 1;
        let mut event =
            json!({"v":1,"id":format!("e{seq}"),"tenant":"t","run":run,"ts_ms":1000 + *seq});
        event
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        engine.apply(&parse_event(event.to_string().as_bytes()).expect("valid"))
    };
    apply_to(start("lead", None));
    apply_to(start("first", Some("lead")));
    let refused = apply_to(start("second", Some("lead")));
    assert_eq!(refused.action, Action::Stop);
    let message = refused.message.unwrap();
    assert!(
        message.contains(
            "sub-agent not started: run lead has 1 sub-agents running (max_open_children 1)"
        ),
        "{message}"
    );
    assert!(!message.contains("fatal"), "{message}");
}

#[test]
fn a_stop_that_reached_a_run_through_its_parent_names_where_it_began() {
    let mut engine = Engine::default();
    let mut seq = 0;
    let mut apply = |run: &str, body: Value| {
        seq += 1;
        let mut event =
            json!({"v":1,"id":format!("e{seq}"),"tenant":"t","run":run,"ts_ms":1000 + seq});
        event
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        engine.apply(&parse_event(event.to_string().as_bytes()).expect("valid"))
    };
    apply("root", json!({"type":"run_started"}));
    apply("mid", json!({"type":"run_started","parent":"root"}));
    apply("leaf", json!({"type":"run_started","parent":"mid"}));
    apply("root", json!({"type":"cancel","by":"oncall"}));
    // The daemon's tick reaches the middle run first; the leaf's stop names the root.
    apply("mid", json!({"type":"tick"}));
    let stop = apply(
        "leaf",
        json!({"type":"tool_call","call_id":"c1","tool":"t","args":{}}),
    );
    let detail = stop.report.unwrap().detail.clone().unwrap();
    assert!(detail.starts_with("run root above this one"), "{detail}");
}
