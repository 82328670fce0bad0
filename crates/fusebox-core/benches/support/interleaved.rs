//! What the engine bench and `examples/engine_instructions.rs` share: the envelope
//! around their events — 1,000 runs interleaved (a stride through them), each with its
//! own `seq`, a call then its result, event time moving on by `ts_step_ms` an event —
//! and the mixed trace's three kinds of run.

use fusebox_core::{parse_event, Event};

/// `events` events; `body(run, n, call)` writes the `n`-th event of run `run` (odd `n`: a
/// call, even: its result; `call` counts both from 1) after the envelope's fields.
pub fn interleaved(
    events: usize,
    ts_step_ms: usize,
    body: impl Fn(usize, u64, u64) -> String,
) -> Vec<Event> {
    let runs = 1000;
    let mut out = Vec::with_capacity(events);
    let mut seq = vec![0u64; runs];
    let mut i = 0usize;
    while out.len() < events {
        let run = (i * 7919) % runs;
        seq[run] += 1;
        let n = seq[run];
        let line = format!(
            r#"{{"v":1,"id":"e{i}","tenant":"t","run":"r{run}","seq":{n},"ts_ms":{},{}}}"#,
            1_000_000 + i * ts_step_ms,
            body(run, n, n.div_ceil(2))
        );
        out.push(parse_event(line.as_bytes()).expect("valid"));
        i += 1;
    }
    out
}

/// The `n`-th event of a run of kind `kind` (0: pagination, 1: a runaway repeat, 2: a
/// side effect with a key that recurs, answered from the ledger).
pub fn mixed(kind: usize, run: usize, n: u64, call: u64) -> String {
    match (kind, n % 2 == 1) {
        (0, true) => format!(
            r#""type":"tool_call","call_id":"c{call}","tool":"search","args":{{"q":"nats","page":{call}}}"#
        ),
        (0, false) => format!(
            r#""type":"tool_result","call_id":"c{call}","tool":"search","kind":"SUCCESS","output":{{"hits":["a{call}","b"],"took_ms":3}}"#
        ),
        (1, true) => format!(
            r#""type":"tool_call","call_id":"c{call}","tool":"search","args":{{"q":" weather tokyo"}}"#
        ),
        (1, false) => format!(
            r#""type":"tool_result","call_id":"c{call}","tool":"search","kind":"SUCCESS","output":{{"hits":["jma"]}}"#
        ),
        (_, true) => format!(
            r#""type":"tool_call","call_id":"c{call}","tool":"send_email","op_key":"k{run}-{}","args":{{"to":"x","n":{call}}}"#,
            call % 4
        ),
        (_, false) => format!(
            r#""type":"tool_result","call_id":"c{call}","tool":"send_email","kind":"SUCCESS","output":{{"sent":true}}"#
        ),
    }
}
