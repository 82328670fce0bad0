//! `fusebox generate`: a deterministic mixed trace for benchmarks and soak tests.
//!
//! Many runs interleave, each following one of the shapes agents really take: legitimate
//! pagination, a poll that advances, batch writes to distinct files, side effects with
//! operation keys (some re-sent), a runaway repeating one search, a ping-pong between two
//! tools, a flaky tool that asks for retries. The same seed gives the same bytes.

use std::io::{self, Write};

/// splitmix64: tiny, fast, and good enough to pick shapes and sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy)]
enum Shape {
    Paginate,
    Poll,
    BatchWrite,
    SideEffect,
    Runaway,
    PingPong,
    Flaky,
}

const SHAPES: [Shape; 7] = [
    Shape::Paginate,
    Shape::Poll,
    Shape::BatchWrite,
    Shape::SideEffect,
    Shape::Runaway,
    Shape::PingPong,
    Shape::Flaky,
];

struct Run {
    id: u64,
    shape: Shape,
    seq: u64,
    step: u64,
    length: u64,
}

pub struct Options {
    pub events: u64,
    pub concurrent_runs: u64,
    pub seed: u64,
    pub tenants: u64,
}

impl Run {
    /// The run's next event body (without the envelope), or None when it is done.
    fn next_body(&mut self) -> Option<String> {
        if self.step >= self.length {
            return None;
        }
        let step = self.step;
        self.step += 1;
        if step == 0 {
            return Some(r#""type":"run_started","agent":"bench","tools":["search","fetch","check_job","write_file","send_email","open_url","read_screen","flaky"]"#.to_owned());
        }
        let call = step.div_ceil(2);
        let is_call = step % 2 == 1;
        if call.is_multiple_of(7) && is_call {
            // A model turn between tool calls, as in a real loop.
            return Some(format!(
                r#""type":"model_turn","stop_reason":"tool_use","usage":{{"input_tokens":{},"output_tokens":120,"cache_read_input_tokens":2048}}"#,
                800 + call * 10
            ));
        }
        let cid = format!("c{call}");
        let body = match (self.shape, is_call) {
            (Shape::Paginate, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"search","args":{{"query":"nats jetstream","page":{call}}}"#
            ),
            (Shape::Paginate, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"search","kind":"SUCCESS","output":{{"hits":["p{call}a","p{call}b"],"took_ms":{}}}"#,
                call % 13
            ),
            (Shape::Poll, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"check_job","args":{{"job_id":"j-{}"}}"#,
                self.id
            ),
            (Shape::Poll, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"check_job","kind":"PENDING","retry_after_ms":500,"output":{{"pct":{call}}}"#
            ),
            (Shape::BatchWrite, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"write_file","effect":"write","args":{{"path":"/out/{call}.txt","content":"row {call}"}}"#
            ),
            (Shape::BatchWrite, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"write_file","kind":"SUCCESS","output":{{"ok":true}}"#
            ),
            (Shape::SideEffect, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"send_email","op_key":"inc-{}-{}","args":{{"to":"oncall@example.com","subject":"update {call}"}}"#,
                self.id,
                call / 2
            ),
            (Shape::SideEffect, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"send_email","kind":"SUCCESS","output":{{"sent":true,"message_id":"m-{call}"}}"#
            ),
            (Shape::Runaway, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"search","args":{{"query":"  weather tokyo "}}"#
            ),
            (Shape::Runaway, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"search","kind":"SUCCESS","output":{{"hits":["jma.go.jp"],"request_id":"r{call}"}}"#
            ),
            (Shape::PingPong, true) if call % 2 == 1 => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"open_url","args":{{"url":"https://example.com/?q=song"}}"#
            ),
            (Shape::PingPong, true) => {
                format!(r#""type":"tool_call","call_id":"{cid}","tool":"read_screen","args":{{}}"#)
            }
            (Shape::PingPong, false) if call % 2 == 1 => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"open_url","kind":"SUCCESS","output":{{"opened":true}}"#
            ),
            (Shape::PingPong, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"read_screen","kind":"SUCCESS","output":{{"text":""}}"#
            ),
            (Shape::Flaky, true) => format!(
                r#""type":"tool_call","call_id":"{cid}","tool":"flaky","args":{{"item":{}}}"#,
                call / 2
            ),
            (Shape::Flaky, false) if call % 2 == 1 => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"flaky","kind":"RETRYABLE","code":"rate_limited","retry_after_ms":0"#
            ),
            (Shape::Flaky, false) => format!(
                r#""type":"tool_result","call_id":"{cid}","tool":"flaky","kind":"SUCCESS","output":{{"item":{}}}"#,
                call / 2
            ),
        };
        Some(body)
    }
}

/// Writes `options.events` events as JSONL.
pub fn generate(options: &Options, out: &mut dyn Write) -> io::Result<()> {
    let mut rng = Rng(options.seed);
    let mut next_run_id = 0u64;
    let mut new_run = |rng: &mut Rng| {
        next_run_id += 1;
        Run {
            id: next_run_id,
            shape: SHAPES[rng.below(SHAPES.len() as u64) as usize],
            seq: 0,
            step: 0,
            length: 10 + rng.below(50),
        }
    };
    let mut active: Vec<Run> = (0..options.concurrent_runs.max(1))
        .map(|_| new_run(&mut rng))
        .collect();
    let mut ts = 1_764_500_000_000u64;
    let mut written = 0u64;
    while written < options.events {
        let slot = rng.below(active.len() as u64) as usize;
        let run = &mut active[slot];
        let Some(body) = run.next_body() else {
            active[slot] = new_run(&mut rng);
            continue;
        };
        run.seq += 1;
        ts += 1 + rng.below(20);
        let tenant = run.id % options.tenants.max(1);
        writeln!(
            out,
            r#"{{"v":1,"id":"r{}-{}","tenant":"t{tenant}","run":"r{}","seq":{},"ts_ms":{ts},{body}}}"#,
            run.id, run.seq, run.id, run.seq
        )?;
        written += 1;
    }
    out.flush()
}
