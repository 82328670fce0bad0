//! Data-driven guard tests: each `tests/cases/*.case` file is a trace written in a terse
//! line language, with the expected decision at the end of each line. The harness turns
//! every line into a real JSON event, sends it through `parse_event`, the `Sequencer`
//! and `Engine::apply`, and compares. A line without `->` expects the quiet answer
//! (`execute` for a call, `continue` for anything else).
//!
//! ```text
//! # comment
//! preset strict                        policy preset of the engine (default balanced)
//! run r2                               following lines belong to run r2
//! start {"tools":["a"],"policy":{…}}   run_started with these fields
//! call search {"q":"x"} op=k effect=write id=c9
//! ok {"hits":[]} progress=4 terminal for=c9
//! pending {…} | retry {…} after=500 code=rate_limited | precond code=x | fatal code=y
//! turn {"stop_reason":"end_turn","usage":{…}}
//! model tokens=800 usd=0.2               model_call (estimates optional)
//! progress 5 | compaction [{"reason":"auto"}] | cancel | resume {"approval_id":"a1"} | finish [status] | tick
//! prompt                               the user submitted a prompt (a new task)
//! wait 5000                            advance the event clock, no event
//! raw {"type":"…", …}                  any event; envelope fields filled in if absent
//!                                      ("seq":null: none, as operator commands have)
//! repeat 30 i … end                    the lines between, 30 times, `$i` = 0, 1, … 29
//!                                      (blocks nest; each names its own variable)
//! … -> block same_call_repeat          the expected action and (optionally) reason
//! state STOPPED_LOOP_GUARD no_progress the current run's terminal state and reason
//! ```
//!
//! Every case is also replayed with a snapshot taken and restored (through JSON) after
//! every event: the decisions must not change.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use fusebox_core::{parse_event, Admission, Decision, Engine, PolicySet, Preset, Sequencer};
use serde_json::{json, Map, Value};

struct Step {
    line: usize,
    event: Option<Value>,
    expect: Option<(String, Option<String>)>,
    state: Option<(String, String, Option<String>)>,
}

struct Clock {
    ts: u64,
    seqs: BTreeMap<String, u64>,
    calls: BTreeMap<String, u64>,
    last_call: BTreeMap<String, (String, String)>,
}

fn split_options(rest: &str) -> (Option<Value>, BTreeMap<String, String>, Vec<String>) {
    let rest = rest.trim();
    let (json_part, tail) =
        if rest.starts_with('{') || rest.starts_with('[') || rest.starts_with('"') {
            let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let value = stream.next().expect("a JSON value").expect("valid JSON");
            let used = stream.byte_offset();
            (Some(value), &rest[used..])
        } else {
            (None, rest)
        };
    let mut options = BTreeMap::new();
    let mut flags = Vec::new();
    for word in tail.split_whitespace() {
        match word.split_once('=') {
            Some((k, v)) => {
                options.insert(k.to_owned(), v.to_owned());
            }
            None => flags.push(word.to_owned()),
        }
    }
    (json_part, options, flags)
}

/// The case's lines with every `repeat N var … end` block written out, each line with
/// its line number in the file.
fn expand_repeats(text: &str) -> Vec<(usize, String)> {
    fn block<'a>(
        lines: &mut impl Iterator<Item = (usize, &'a str)>,
        vars: &[(String, usize)],
        out: &mut Vec<(usize, String)>,
    ) {
        while let Some((index, raw)) = lines.next() {
            let line = index + 1;
            let content = raw.trim();
            // A block's own `end` was cut off with its body: this one has no `repeat`.
            assert!(content != "end", "line {line}: `end` without `repeat`");
            if let Some(rest) = content.strip_prefix("repeat ") {
                let mut words = rest.split_whitespace();
                let count: usize = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("line {line}: repeat needs a count"));
                let var = words
                    .next()
                    .unwrap_or_else(|| panic!("line {line}: repeat needs a variable"))
                    .to_owned();
                let body: Vec<(usize, &str)> = {
                    // The block's own lines, up to its matching `end`.
                    let mut depth = 1;
                    let mut body = Vec::new();
                    for (i, l) in lines.by_ref() {
                        let t = l.trim();
                        if t.starts_with("repeat ") {
                            depth += 1;
                        } else if t == "end" {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        body.push((i, l));
                    }
                    assert!(depth == 0, "line {line}: repeat without `end`");
                    body
                };
                for n in 0..count {
                    let mut inner = vars.to_vec();
                    inner.push((var.clone(), n));
                    block(&mut body.iter().copied(), &inner, out);
                }
                continue;
            }
            let mut expanded = raw.to_owned();
            for (name, value) in vars.iter().rev() {
                expanded = expanded.replace(&format!("${name}"), &value.to_string());
            }
            out.push((line, expanded));
        }
    }
    let mut out = Vec::new();
    block(&mut text.lines().enumerate(), &[], &mut out);
    out
}

fn parse_case(text: &str) -> (Preset, Vec<Step>) {
    let mut preset = Preset::Balanced;
    let mut run = "r1".to_owned();
    let mut clock = Clock {
        ts: 1_764_500_000_000,
        seqs: BTreeMap::new(),
        calls: BTreeMap::new(),
        last_call: BTreeMap::new(),
    };
    let mut steps = Vec::new();
    for (event_number, (line, raw)) in expand_repeats(text).into_iter().enumerate() {
        let content = raw.split(" #").next().unwrap_or("").trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let (body, expect) = match content.split_once("->") {
            Some((body, expect)) => {
                let mut words = expect.split_whitespace();
                let action = words.next().expect("an action after ->").to_owned();
                (body.trim(), Some((action, words.next().map(str::to_owned))))
            }
            None => (content, None),
        };
        let (verb, rest) = body.split_once(' ').unwrap_or((body, ""));
        let mut fields = Map::new();
        match verb {
            "preset" => {
                preset = Preset::from_name(rest.trim()).expect("a preset name");
                continue;
            }
            "run" => {
                run = rest.trim().to_owned();
                continue;
            }
            "wait" => {
                clock.ts += rest.trim().parse::<u64>().expect("milliseconds");
                continue;
            }
            "state" => {
                let mut words = rest.split_whitespace();
                let state = words.next().expect("a terminal state").to_owned();
                steps.push(Step {
                    line,
                    event: None,
                    expect: None,
                    state: Some((run.clone(), state, words.next().map(str::to_owned))),
                });
                continue;
            }
            _ => {}
        }
        let (value, options, flags) = split_options(rest);
        let event_type = match verb {
            "start" => {
                if let Some(Value::Object(map)) = value {
                    fields.extend(map);
                }
                "run_started"
            }
            "call" => {
                let (tool, args) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "{}"));
                let (args, options, _) = split_options(args);
                let n = clock.calls.entry(run.clone()).or_default();
                *n += 1;
                let call_id = options.get("id").cloned().unwrap_or(format!("c{n}"));
                clock
                    .last_call
                    .insert(run.clone(), (call_id.clone(), tool.to_owned()));
                fields.insert("call_id".into(), json!(call_id));
                fields.insert("tool".into(), json!(tool));
                match options.get("args_hash") {
                    Some(hash) => fields.insert("args_hash".into(), json!(hash)),
                    None => fields.insert("args".into(), args.unwrap_or(json!({}))),
                };
                if let Some(op) = options.get("op") {
                    fields.insert("op_key".into(), json!(op));
                }
                if let Some(effect) = options.get("effect") {
                    fields.insert("effect".into(), json!(effect));
                }
                "tool_call"
            }
            "ok" | "pending" | "retry" | "precond" | "fatal" => {
                let kind = match verb {
                    "ok" => "SUCCESS",
                    "pending" => "PENDING",
                    "retry" => "RETRYABLE",
                    "precond" => "PRECONDITION",
                    _ => "FATAL",
                };
                let (last_id, last_tool) = clock
                    .last_call
                    .get(&run)
                    .cloned()
                    .expect("a result needs a call before it");
                let call_id = options.get("for").cloned().unwrap_or(last_id);
                let tool = options.get("tool").cloned().unwrap_or(last_tool);
                fields.insert("call_id".into(), json!(call_id));
                fields.insert("tool".into(), json!(tool));
                fields.insert("kind".into(), json!(kind));
                if let Some(output) = value {
                    fields.insert("output".into(), output);
                }
                for (key, name) in [("progress", "progress"), ("after", "retry_after_ms")] {
                    if let Some(n) = options.get(key) {
                        fields.insert(name.into(), json!(n.parse::<u64>().expect("a number")));
                    }
                }
                if let Some(code) = options.get("code") {
                    fields.insert("code".into(), json!(code));
                }
                if let Some(hash) = options.get("output_hash") {
                    fields.insert("output_hash".into(), json!(hash));
                }
                if flags.iter().any(|f| f == "terminal") {
                    fields.insert("terminal".into(), json!(true));
                }
                "tool_result"
            }
            "turn" => {
                if let Some(Value::Object(map)) = value {
                    fields.extend(map);
                }
                fields.entry("stop_reason").or_insert(json!("tool_use"));
                "model_turn"
            }
            "model" => {
                if let Some(n) = options.get("tokens") {
                    let n = n.parse::<u64>().expect("a token count");
                    fields.insert("estimate_tokens".into(), json!(n));
                }
                if let Some(usd) = options.get("usd") {
                    let usd = usd.parse::<f64>().expect("a cost");
                    fields.insert("estimate_usd".into(), json!(usd));
                }
                "model_call"
            }
            "progress" => {
                fields.insert(
                    "version".into(),
                    json!(rest.trim().parse::<u64>().expect("a version")),
                );
                "progress"
            }
            "compaction" => {
                if let Some(Value::Object(map)) = value {
                    fields.extend(map);
                }
                "compaction"
            }
            "cancel" => {
                fields.insert("by".into(), json!("operator"));
                fields.insert("reason".into(), json!("test"));
                "cancel"
            }
            "resume" => {
                fields.insert("by".into(), json!("operator"));
                fields.insert("evidence".into(), value.unwrap_or(json!({})));
                "resume"
            }
            "finish" => {
                let status = Some(rest.trim())
                    .filter(|s| !s.is_empty())
                    .unwrap_or("done");
                fields.insert("status".into(), json!(status));
                "run_finished"
            }
            "tick" => "tick",
            "prompt" => "prompt",
            "raw" => {
                if let Some(Value::Object(map)) = value {
                    fields.extend(map);
                }
                ""
            }
            other => panic!("line {line}: unknown verb {other:?}"),
        };
        clock.ts += 100;
        let mut event = Map::new();
        // A `raw` event that sets its own seq (`null`: none, like an operator command)
        // does not take the run's next one.
        if !fields.contains_key("seq") {
            let seq = clock.seqs.entry(run.clone()).or_default();
            *seq += 1;
            event.insert("seq".into(), json!(*seq));
        }
        event.insert("v".into(), json!(1));
        event.insert("id".into(), json!(format!("{run}-{event_number}")));
        event.insert("tenant".into(), json!("t"));
        event.insert("run".into(), json!(run));
        event.insert("ts_ms".into(), json!(clock.ts));
        if !event_type.is_empty() {
            event.insert("type".into(), json!(event_type));
        }
        event.extend(fields);
        steps.push(Step {
            line,
            event: Some(Value::Object(event)),
            expect,
            state: None,
        });
    }
    (preset, steps)
}

fn quiet_action(event: &Value) -> &'static str {
    if event["type"] == "tool_call" {
        "execute"
    } else {
        "continue"
    }
}

/// Runs the steps; `snapshot_every_event` round-trips the engine through JSON between
/// events. Returns the decisions and the mismatches.
fn run_case(
    preset: Preset,
    steps: &[Step],
    snapshot_every_event: bool,
) -> (Vec<Decision>, Vec<String>) {
    let mut engine = Engine::new(PolicySet::new(preset.policy()));
    let mut sequencer = Sequencer::default();
    let mut decisions = Vec::new();
    let mut failures = Vec::new();
    for step in steps {
        if let Some((run, state, reason)) = &step.state {
            let report = engine.run("t", run).and_then(|r| r.report());
            let got = report.map_or("OPEN".to_owned(), |r| r.terminal_state.as_str().to_owned());
            let got_reason = report.map(|r| r.reason.as_str().to_owned());
            if &got != state || (reason.is_some() && &got_reason != reason) {
                failures.push(format!(
                    "line {}: run {run} is {got} {got_reason:?}, expected {state} {reason:?}",
                    step.line
                ));
            }
            continue;
        }
        let event_json = step.event.as_ref().expect("an event step");
        let bytes = serde_json::to_vec(event_json).expect("serialises");
        let event = match parse_event(&bytes) {
            Ok(event) => event,
            Err(err) => {
                failures.push(format!("line {}: event refused: {err}", step.line));
                continue;
            }
        };
        let ready = match sequencer.admit(event) {
            Ok(Admission::Ready(ready)) => ready,
            other => {
                failures.push(format!("line {}: not admitted: {other:?}", step.line));
                continue;
            }
        };
        for event in ready {
            if snapshot_every_event {
                let snapshot = serde_json::to_vec(&engine).expect("engine serialises");
                engine = serde_json::from_slice(&snapshot).expect("engine deserialises");
            }
            let decision = engine.apply(&event);
            let (action, reason) = match &step.expect {
                Some((action, reason)) => (action.clone(), reason.clone()),
                None => (quiet_action(event_json).to_owned(), None),
            };
            let got_reason = decision.reason.map(|r| r.as_str().to_owned());
            if decision.action.as_str() != action || (reason.is_some() && got_reason != reason) {
                failures.push(format!(
                    "line {}: got {} {}, expected {action} {}\n    {}",
                    step.line,
                    decision.action.as_str(),
                    got_reason.unwrap_or_default(),
                    reason.unwrap_or_default(),
                    serde_json::to_string(&decision).unwrap_or_default()
                ));
            }
            let mut fast = Vec::new();
            decision.write_json(&mut fast);
            let serde = serde_json::to_vec(&decision).expect("serialises");
            if fast != serde {
                failures.push(format!(
                    "line {}: write_json wrote\n    {}\nwhere serde writes\n    {}",
                    step.line,
                    String::from_utf8_lossy(&fast),
                    String::from_utf8_lossy(&serde)
                ));
            }
            decisions.push(decision);
        }
    }
    (decisions, failures)
}

#[test]
fn every_case_gives_its_expected_decisions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut paths: Vec<_> = fs::read_dir(&dir)
        .expect("tests/cases exists")
        .map(|e| e.expect("readable dir").path())
        .filter(|p| p.extension().is_some_and(|e| e == "case"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 10,
        "expected the case files in {}",
        dir.display()
    );
    let mut report = String::new();
    for path in &paths {
        let text = fs::read_to_string(path).expect("readable case");
        let (preset, steps) = parse_case(&text);
        let (straight, failures) = run_case(preset, &steps, false);
        for failure in failures {
            report.push_str(&format!("{}: {failure}\n", path.display()));
        }
        let (restored, _) = run_case(preset, &steps, true);
        if straight != restored {
            report.push_str(&format!(
                "{}: decisions differ when the engine is snapshotted and restored between events\n",
                path.display()
            ));
        }
    }
    assert!(report.is_empty(), "\n{report}");
}
