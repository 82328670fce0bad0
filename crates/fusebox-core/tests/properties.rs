//! Property tests over random traces: determinism, snapshot/restore, the latch, and
//! exactly-once side effects; and fingerprints over random JSON.

use std::collections::{BTreeMap, BTreeSet};

use fusebox_core::event::{Args, Output, ResultKind};
use fusebox_core::fingerprint::{call_fingerprint, result_fingerprint};
use fusebox_core::volatile::{write_masked, Mask, MaskSet, TextMask};
use fusebox_core::{parse_event, Action, Decision, Engine, Event, EventBody};
use proptest::prelude::*;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
enum Op {
    Call {
        run: u8,
        tool: u8,
        arg: u8,
        op_key: Option<u8>,
    },
    Result {
        run: u8,
        kind: u8,
        output: u8,
        progress: Option<u8>,
    },
    Turn {
        run: u8,
        tokens: u16,
    },
    Progress {
        run: u8,
        version: u8,
    },
    Compaction {
        run: u8,
    },
    Cancel {
        run: u8,
    },
    Resume {
        run: u8,
        version: u8,
        approval: Option<u8>,
    },
    Wait {
        ms: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, 0..3u8, 0..3u8, proptest::option::weighted(0.3, 0..3u8))
            .prop_map(|(run, tool, arg, op_key)| Op::Call { run, tool, arg, op_key }),
        6 => (0..3u8, 0..5u8, 0..3u8, proptest::option::weighted(0.3, 0..6u8))
            .prop_map(|(run, kind, output, progress)| Op::Result { run, kind, output, progress }),
        1 => (0..3u8, 0..2000u16).prop_map(|(run, tokens)| Op::Turn { run, tokens }),
        1 => (0..3u8, 0..8u8).prop_map(|(run, version)| Op::Progress { run, version }),
        1 => (0..3u8).prop_map(|run| Op::Compaction { run }),
        1 => (0..3u8).prop_map(|run| Op::Cancel { run }),
        1 => (0..3u8, 0..8u8, proptest::option::of(0..3u8))
            .prop_map(|(run, version, approval)| Op::Resume { run, version, approval }),
        1 => (0..120_000u32).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// Turns ops into valid events (strict preset limits, so detectors fire often).
fn events(ops: &[Op]) -> Vec<Event> {
    let mut ts = 1_000_000u64;
    let mut seqs = [0u64; 3];
    let mut calls = [0u64; 3];
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let (run, body) = match op {
            Op::Wait { ms } => {
                ts += u64::from(*ms);
                continue;
            }
            Op::Call {
                run,
                tool,
                arg,
                op_key,
            } => {
                calls[*run as usize] += 1;
                let mut body = json!({"type":"tool_call","call_id":format!("c{}", calls[*run as usize]),
                    "tool":format!("tool{tool}"),"args":{"a":arg}});
                if let Some(k) = op_key {
                    body["op_key"] = json!(format!("op{k}"));
                }
                (*run, body)
            }
            Op::Result {
                run,
                kind,
                output,
                progress,
            } => {
                let kinds = ["SUCCESS", "SUCCESS", "PENDING", "RETRYABLE", "PRECONDITION"];
                let mut body = json!({"type":"tool_result","call_id":format!("c{}", calls[*run as usize]),
                    "tool":"tool0","kind":kinds[*kind as usize],"output":{"o":output},"retry_after_ms":0});
                if let Some(p) = progress {
                    body["progress"] = json!(p);
                }
                (*run, body)
            }
            Op::Turn { run, tokens } => (
                *run,
                json!({"type":"model_turn","stop_reason":"tool_use","usage":{"input_tokens":tokens}}),
            ),
            Op::Progress { run, version } => (*run, json!({"type":"progress","version":version})),
            Op::Compaction { run } => (*run, json!({"type":"compaction"})),
            Op::Cancel { run } => (*run, json!({"type":"cancel","by":"op"})),
            Op::Resume {
                run,
                version,
                approval,
            } => {
                let mut evidence = json!({"progress_version": version});
                if let Some(a) = approval {
                    evidence["approval_id"] = json!(format!("A{a}"));
                }
                (*run, json!({"type":"resume","by":"op","evidence":evidence}))
            }
        };
        ts += 100;
        seqs[run as usize] += 1;
        let mut event = json!({"v":1,"id":format!("e{i}"),"tenant":"t","run":format!("r{run}"),
            "seq":seqs[run as usize],"ts_ms":ts});
        if seqs[run as usize] == 1 {
            // Every run starts with the strict preset's tight limits.
            out.push(started(run, ts));
        }
        event
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        out.push(parse_event(event.to_string().as_bytes()).expect("generated events are valid"));
    }
    out
}

fn started(run: u8, ts: u64) -> Event {
    let line = json!({"v":1,"id":format!("start-{run}"),"tenant":"t","run":format!("r{run}"),"ts_ms":ts,
        "type":"run_started","policy":{"max_steps":20,"same_call_limit":2,"read_same_call_limit":2,
        "no_progress_limit":3,"consecutive_block_limit":2,"max_tokens":20000,"max_duration_s":600}});
    parse_event(line.to_string().as_bytes()).expect("valid")
}

fn replay(events: &[Event]) -> Vec<Decision> {
    let mut engine = Engine::default();
    events.iter().map(|e| engine.apply(e)).collect()
}

fn bytes(decisions: &[Decision]) -> Vec<u8> {
    decisions
        .iter()
        .flat_map(|d| serde_json::to_vec(d).expect("serialises"))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replay_is_deterministic(ops in proptest::collection::vec(op(), 1..120)) {
        let events = events(&ops);
        prop_assert_eq!(bytes(&replay(&events)), bytes(&replay(&events)));
    }

    #[test]
    fn snapshot_and_restore_mid_stream_changes_nothing(ops in proptest::collection::vec(op(), 1..120), cut in 0usize..200) {
        let events = events(&ops);
        let cut = cut.min(events.len());
        let straight = replay(&events);
        let mut engine = Engine::default();
        let mut decisions: Vec<Decision> = events[..cut].iter().map(|e| engine.apply(e)).collect();
        let snapshot = serde_json::to_vec(&engine).expect("serialises");
        let mut restored: Engine = serde_json::from_slice(&snapshot).expect("deserialises");
        prop_assert_eq!(&restored, &engine);
        decisions.extend(events[cut..].iter().map(|e| restored.apply(e)));
        prop_assert_eq!(bytes(&straight), bytes(&decisions));
    }

    #[test]
    fn nothing_executes_while_a_run_is_stopped(ops in proptest::collection::vec(op(), 1..150)) {
        let events = events(&ops);
        let decisions = replay(&events);
        let mut closed = BTreeSet::new();
        for (event, decision) in events.iter().zip(&decisions) {
            let run = event.run.clone();
            if let EventBody::ToolCall(_) = event.body {
                prop_assert!(!(closed.contains(&run) && decision.action.lets_tool_run()),
                    "{} executed after its stop: {:?}", run, decision);
            }
            match (&event.body, decision.action) {
                (_, Action::Stop | Action::Complete) => { closed.insert(run); }
                (EventBody::Resume(_), Action::Continue) => { closed.remove(&run); }
                _ => {}
            }
        }
    }

    #[test]
    fn an_op_key_never_executes_again_after_its_success(ops in proptest::collection::vec(op(), 1..150)) {
        let events = events(&ops);
        let decisions = replay(&events);
        let mut executing: BTreeMap<(String, String), String> = BTreeMap::new();
        let mut completed = BTreeSet::new();
        for (event, decision) in events.iter().zip(&decisions) {
            match &event.body {
                EventBody::ToolCall(call) => {
                    if let Some(key) = &call.op_key {
                        if decision.action.lets_tool_run() {
                            prop_assert!(!completed.contains(key), "{} executed after its SUCCESS", key);
                            executing.insert((event.run.clone(), call.call_id.clone()), key.clone());
                        }
                    }
                }
                EventBody::ToolResult(result) => {
                    if let Some(key) = executing.remove(&(event.run.clone(), result.call_id.clone())) {
                        if result.kind == fusebox_core::event::ResultKind::Success {
                            completed.insert(key);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn call_fingerprints_ignore_key_order_and_surrounding_space(
        entries in proptest::collection::btree_map("[a-z]{1,6}", "[ a-z]{0,6}", 0..8),
        seed in any::<u64>(),
    ) {
        let forward: serde_json::Map<String, Value> = entries.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        // Rebuild in a scrambled insertion order with padded strings.
        let mut keys: Vec<_> = entries.keys().cloned().collect();
        keys.sort_by_key(|k| (k.len() as u64).wrapping_mul(seed) ^ k.as_bytes()[0] as u64);
        let mut scrambled = serde_json::Map::new();
        for k in keys {
            scrambled.insert(k.clone(), json!(format!("  {}\t", entries[&k])));
        }
        let a = call_fingerprint("tool", &Args::Json(Value::Object(forward)), &[]);
        let b = call_fingerprint("tool", &Args::Json(Value::Object(scrambled)), &[]);
        prop_assert_eq!(a, b);
    }
}

proptest! {
    /// The text scanner sees any string, from any tool: it never panics, copies text with
    /// nothing to mask byte for byte, and a volatile token's value never changes the
    /// fingerprint while the words around it do.
    #[test]
    fn masking_is_total_and_only_masks_volatile_tokens(
        text in "\\PC{0,40}",
        words in "[a-z ]{1,12}",
        pid in 100u32..99_999,
        other_pid in 100u32..99_999,
        secs in 0u32..999,
    ) {
        let mask = TextMask { masks: MaskSet::of(&Mask::ALL), patterns: &[], extra_patterns: &[] };
        let mut buf = Vec::new();
        let masked = write_masked(&mut buf, &text, &mask);
        if !masked {
            prop_assert_eq!(&buf[..], text.as_bytes());
        }
        let fp = |s: String| {
            result_fingerprint(ResultKind::Pending, None, Some(&Output::Json(json!({"out": s}))), &|_, _| false, &mask)
        };
        let a = fp(format!("{words} (pid {pid}, {secs}.5s)"));
        let b = fp(format!("{words} (pid {other_pid}, {}.25s)", secs + 1));
        prop_assert_eq!(a, b);
        let c = fp(format!("{words}x (pid {pid}, {secs}.5s)"));
        prop_assert_ne!(a, c);
    }
}

#[test]
fn different_arguments_give_different_fingerprints() {
    let a = call_fingerprint("t", &Args::Json(json!({"page":1})), &[]);
    let b = call_fingerprint("t", &Args::Json(json!({"page":2})), &[]);
    let c = call_fingerprint("u", &Args::Json(json!({"page":1})), &[]);
    let d = call_fingerprint("t", &Args::Json(json!({"page":"1"})), &[]);
    assert_eq!(BTreeSet::from([a, b, c, d]).len(), 4);
}
