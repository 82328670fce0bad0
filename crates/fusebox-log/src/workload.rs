//! The one deterministic, realistic event mix of the project — for benchmarks, crash
//! tests, `fusebox bench` and `fusebox generate`: many concurrent runs across a few
//! tenants, each a `run_started`, then tool calls paired with their results, model turns
//! now and then, and a `run_finished`. Each run takes one of the shapes agents really
//! take: a mixed worker (small arguments and outputs, side effects with `op_key`, some
//! retries, pending polls, repeats, progress), legitimate pagination, a poll that
//! advances, batch writes to distinct files, a notifier re-sending under one `op_key`,
//! a runaway repeating one search, a ping-pong between two tools, a flaky tool that asks
//! for retries. The same seed always gives the same events.

use fusebox_core::{parse_event, Event};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub seed: u64,
    pub tenants: u32,
    /// Runs in flight at once; their events interleave.
    pub concurrent_runs: usize,
    /// Each run makes between `max_steps / 4` and `max_steps` tool calls.
    pub max_steps: u32,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            seed: 1,
            tenants: 4,
            concurrent_runs: 256,
            max_steps: 40,
        }
    }
}

/// splitmix64: small, fast and good enough to shuffle a workload.
#[derive(Debug, Clone)]
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
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a run does, call after call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Mixed,
    Paginate,
    Poll,
    BatchWrite,
    SideEffect,
    Runaway,
    PingPong,
    Flaky,
}

/// Half the runs are mixed workers; the rest are the pure shapes, equally often.
const SHAPES: [Shape; 14] = [
    Shape::Mixed,
    Shape::Mixed,
    Shape::Mixed,
    Shape::Mixed,
    Shape::Mixed,
    Shape::Mixed,
    Shape::Mixed,
    Shape::Paginate,
    Shape::Poll,
    Shape::BatchWrite,
    Shape::SideEffect,
    Shape::Runaway,
    Shape::PingPong,
    Shape::Flaky,
];

#[derive(Debug, Clone)]
struct RunGen {
    shape: Shape,
    tenant: String,
    run: String,
    seq: u64,
    steps_left: u32,
    step: u32,
    /// The call waiting for its result: (call_id, tool, args).
    open_call: Option<(String, &'static str, Value)>,
    last_args: Option<(&'static str, Value)>,
    progress: u64,
}

#[derive(Debug, Clone)]
pub struct Workload {
    config: WorkloadConfig,
    rng: Rng,
    runs: Vec<RunGen>,
    next_run: u64,
    ts_ms: u64,
}

const TOOLS: [&str; 4] = ["search", "read_file", "write_file", "http_get"];

impl Workload {
    pub fn new(config: WorkloadConfig) -> Self {
        Workload {
            rng: Rng(config.seed),
            config,
            runs: Vec::new(),
            next_run: 0,
            ts_ms: 1_700_000_000_000,
        }
    }

    fn new_run(&mut self) -> RunGen {
        let n = self.next_run;
        self.next_run += 1;
        let max = u64::from(self.config.max_steps.max(4));
        RunGen {
            shape: SHAPES[self.rng.below(SHAPES.len() as u64) as usize],
            tenant: format!("tenant-{}", self.rng.below(u64::from(self.config.tenants))),
            run: format!("run-{}-{n}", self.config.seed),
            seq: 0,
            steps_left: (max / 4 + self.rng.below(max - max / 4 + 1)) as u32,
            step: 0,
            open_call: None,
            last_args: None,
            progress: 0,
        }
    }

    /// The next `n` events.
    pub fn batch(&mut self, n: usize) -> Vec<Event> {
        self.by_ref().take(n).collect()
    }
}

impl Iterator for Workload {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        while self.runs.len() < self.config.concurrent_runs.max(1) {
            let run = self.new_run();
            self.runs.push(run);
        }
        let index = self.rng.below(self.runs.len() as u64) as usize;
        self.ts_ms += 1 + self.rng.below(4);
        let mut run = self.runs.swap_remove(index);
        let body = next_body(&mut self.rng, &mut run);
        run.seq += 1;
        let mut event = json!({
            "v": 1,
            "id": format!("{}-{}", run.run, run.seq),
            "tenant": run.tenant,
            "run": run.run,
            "seq": run.seq,
            "ts_ms": self.ts_ms,
        });
        let finished = body["type"] == "run_finished";
        merge(&mut event, body);
        if !finished {
            self.runs.push(run);
        }
        let bytes = serde_json::to_vec(&event).expect("a JSON value always serialises");
        Some(parse_event(&bytes).expect("the workload only builds valid events"))
    }
}

fn merge(event: &mut Value, body: Value) {
    if let (Some(event), Value::Object(body)) = (event.as_object_mut(), body) {
        event.extend(body);
    }
}

/// The type-specific fields of a run's next event.
fn next_body(rng: &mut Rng, run: &mut RunGen) -> Value {
    if run.seq == 0 {
        return json!({"type": "run_started", "agent": "worker"});
    }
    if let Some((call_id, tool, args)) = run.open_call.take() {
        return tool_result(rng, run, call_id, tool, args);
    }
    if run.steps_left == 0 {
        return json!({"type": "run_finished", "status": "ok"});
    }
    if rng.chance(8) {
        return json!({
            "type": "model_turn",
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 800 + rng.below(400), "output_tokens": 40 + rng.below(80)},
            "cost_usd": 0.002,
        });
    }
    // Only a mixed worker reports progress: a pure shape is judged on its results.
    if run.shape == Shape::Mixed && rng.chance(5) {
        run.progress += 1;
        return json!({"type": "progress", "version": run.progress});
    }
    run.steps_left -= 1;
    run.step += 1;
    if run.shape != Shape::Mixed {
        return shaped_call(run);
    }
    let (tool, args) = match run.last_args.clone() {
        // An agent repeating itself now and then: the detectors' daily bread.
        Some(last) if rng.chance(10) => last,
        _ => fresh_args(rng, run),
    };
    let call_id = format!("c{}", run.step);
    let mut call = json!({"type": "tool_call", "call_id": call_id, "tool": tool, "args": args});
    if tool == "write_file" {
        call["op_key"] = json!(format!("{}-write-{}", run.run, run.step));
    }
    run.last_args = Some((tool, args.clone()));
    run.open_call = Some((call_id, tool, args));
    call
}

fn fresh_args(rng: &mut Rng, run: &RunGen) -> (&'static str, Value) {
    let tool = TOOLS[rng.below(TOOLS.len() as u64) as usize];
    let args = match tool {
        "search" => json!({"q": format!("topic {}", rng.below(50)), "page": rng.below(3)}),
        "read_file" => json!({"path": format!("/src/mod_{}.rs", rng.below(40))}),
        "write_file" => json!({
            "path": format!("/out/{}/{}.txt", run.run, run.step),
            "content": format!("line {}", rng.below(1000)),
        }),
        _ => json!({"url": format!("https://api.example.com/items/{}", rng.below(200))}),
    };
    (tool, args)
}

/// The next call of a run of a pure shape; its result comes from [`shaped_result`].
fn shaped_call(run: &mut RunGen) -> Value {
    let step = run.step;
    let call_id = format!("c{step}");
    let (tool, args) = match run.shape {
        Shape::Paginate => ("search", json!({"query": "nats jetstream", "page": step})),
        Shape::Poll => ("check_job", json!({"job_id": format!("j-{}", run.run)})),
        Shape::BatchWrite => (
            "write_file",
            json!({"path": format!("/out/{step}.txt"), "content": format!("row {step}")}),
        ),
        Shape::SideEffect => (
            "send_email",
            json!({"to": "oncall@example.com", "subject": format!("update {step}")}),
        ),
        // Whitespace jitter: the same call to the guard.
        Shape::Runaway => ("search", json!({"query": "  weather tokyo "})),
        Shape::PingPong if step % 2 == 1 => {
            ("open_url", json!({"url": "https://example.com/?q=song"}))
        }
        Shape::PingPong => ("read_screen", json!({})),
        Shape::Flaky | Shape::Mixed => ("flaky", json!({"item": step / 2})),
    };
    let mut call = json!({"type": "tool_call", "call_id": call_id, "tool": tool, "args": args});
    match run.shape {
        Shape::BatchWrite => call["effect"] = json!("write"),
        // Re-sent every other step under the same key: the second is answered from
        // the ledger.
        Shape::SideEffect => call["op_key"] = json!(format!("inc-{}-{}", run.run, step / 2)),
        _ => {}
    }
    run.open_call = Some((call_id, tool, args));
    call
}

fn shaped_result(run: &RunGen, call_id: String, tool: &str) -> Value {
    let step = run.step;
    let mut result =
        json!({"type": "tool_result", "call_id": call_id, "tool": tool, "kind": "SUCCESS"});
    let output = match (run.shape, tool) {
        (Shape::Paginate, _) => {
            json!({"hits": [format!("p{step}a"), format!("p{step}b")], "took_ms": step % 13})
        }
        (Shape::Poll, _) => {
            result["kind"] = json!("PENDING");
            result["retry_after_ms"] = json!(500);
            json!({"pct": step})
        }
        (Shape::BatchWrite, _) => json!({"ok": true}),
        (Shape::SideEffect, _) => json!({"sent": true, "message_id": format!("m-{step}")}),
        (Shape::Runaway, _) => json!({"hits": ["jma.go.jp"], "request_id": format!("r{step}")}),
        (Shape::PingPong, "open_url") => json!({"opened": true}),
        (Shape::PingPong, _) => json!({"text": ""}),
        (Shape::Flaky | Shape::Mixed, _) if step % 2 == 1 => {
            result["kind"] = json!("RETRYABLE");
            result["code"] = json!("rate_limited");
            result["retry_after_ms"] = json!(0);
            return result;
        }
        (Shape::Flaky | Shape::Mixed, _) => json!({"item": step / 2}),
    };
    result["output"] = output;
    result
}

fn tool_result(rng: &mut Rng, run: &RunGen, call_id: String, tool: &str, args: Value) -> Value {
    if run.shape != Shape::Mixed {
        return shaped_result(run, call_id, tool);
    }
    let roll = rng.below(100);
    let mut result = json!({"type": "tool_result", "call_id": call_id, "tool": tool});
    match roll {
        0..=4 => {
            result["kind"] = json!("RETRYABLE");
            result["code"] = json!("rate_limited");
            result["retry_after_ms"] = json!(500);
        }
        5..=8 => {
            result["kind"] = json!("PENDING");
            result["output"] = json!({"job": run.step, "state": "running"});
        }
        _ => {
            result["kind"] = json!("SUCCESS");
            result["output"] = json!({
                "items": [format!("{}", args), rng.below(10)],
                "took_ms": rng.below(300),
            });
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_deterministic_and_pairs_calls_with_results() {
        let config = WorkloadConfig {
            concurrent_runs: 8,
            ..WorkloadConfig::default()
        };
        let a: Vec<Event> = Workload::new(config.clone()).take(2000).collect();
        let b: Vec<Event> = Workload::new(config).take(2000).collect();
        assert_eq!(a, b);
        let count = |name: &str| a.iter().filter(|e| e.type_name() == name).count();
        assert!(count("tool_call") > 500);
        assert!(count("tool_call") - count("tool_result") <= 8);
        assert!(count("run_finished") > 0);
    }
}
