/**
 * What the client adds to a gate call (issue 49 §3): `run.toolCall` beside a raw nats.js
 * request/reply to the same daemon, interleaved in one run (bench/gate-latency.ts, also
 * `npm run bench`). The goal is ≤ 0.2 ms at the median; the client's own CPU per call is
 * checked beside it, so a slower client shows even when the daemon's time dominates.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { measureGate } from "../bench/gate-latency.js";
import { connectedStack, TENANT } from "./support/guard.js";

/** The median the client may add to the raw request (ms). */
const OVERHEAD_P50_MS = 0.2;

describe("the gate call's latency", () => {
  const live = connectedStack();

  test("run.toolCall adds at most 0.2 ms at p50 to a raw nats.js request", async () => {
    const figures = await measureGate({
      url: live.stack.natsUrl,
      tenant: TENANT,
      calls: 1600,
      perRun: 400,
    });
    const said = JSON.stringify(figures);
    assert.ok(figures.overhead_p50_ms <= OVERHEAD_P50_MS, said);
    // The client's own work, in CPU time: what it adds apart from waiting.
    const cpu = figures.cpu_us_per_call;
    assert.ok(cpu.client - cpu.raw <= OVERHEAD_P50_MS * 1000, said);
  });
});
