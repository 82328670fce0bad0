//! The envelope both the engine bench and `examples/engine_instructions.rs` put around
//! their events: 1,000 runs interleaved (a stride through them), each with its own
//! `seq`, a call then its result, event time moving on by `ts_step_ms` an event.

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
