/**
 * The gate-latency benchmark (bench/gate-latency.ts, `npm run bench`) run once, small,
 * so it cannot rot: both sides — `run.toolCall` and a raw nats.js request/reply to the
 * same daemon — answer every call, and the figures it reports are whole. How fast is
 * never asserted here (a loaded CI machine would fail a timed assertion at random):
 * the figures are printed, and the closing note reports `npm run bench`'s.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { measureGate } from "../bench/gate-latency.js";
import { connectedStack, TENANT } from "./support/guard.js";

describe("the gate-latency benchmark", () => {
  const live = connectedStack();

  test("measures both sides over the same calls and reports whole figures", async (t) => {
    const calls = 200;
    const figures = await measureGate({
      url: live.stack.natsUrl,
      tenant: TENANT,
      calls,
      perRun: 100,
    });
    t.diagnostic(JSON.stringify(figures));
    assert.equal(figures.raw_nats_js.n, calls);
    assert.equal(figures.fusebox_guard.n, calls);
    for (const q of [figures.raw_nats_js, figures.fusebox_guard, figures.nats_rtt]) {
      assert.ok(q.p50_ms > 0 && q.p50_ms <= q.p90_ms && q.p90_ms <= q.p99_ms, JSON.stringify(q));
    }
    assert.ok(Number.isFinite(figures.overhead_p50_ms));
    assert.ok(figures.cpu_us_per_call.raw > 0 && figures.cpu_us_per_call.client > 0);
  });
});
