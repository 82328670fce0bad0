/**
 * Reservations through the client, against a real fuseboxd: `run.modelCall` before a
 * model call holds its estimate (else the run's mean per turn) against every token, cost
 * and model-turn budget above it until the turn's `modelTurn` reconciles it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { RunStopped } from "../src/index.js";
import { connectedStack, freshRun } from "./support/guard.js";

describe("reservations against fuseboxd", () => {
  const live = connectedStack();

  test("a model call with no room left in the root's budget is refused before it runs", async () => {
    const root = await live.fb.startRun(freshRun("reserve-root"), {
      policy: { max_tokens: 1000 },
    });
    const a = await root.startChild({ agent: "a" });
    const b = await root.startChild({ agent: "b" });
    assert.equal((await a.modelCall({ estimateTokens: 600 }))?.action, "continue");
    // a's 600 is in flight: b's 500 would pass the root's 1000 before either is spent.
    const refused = await b.modelCall({ estimateTokens: 500 });
    assert.equal(refused?.action, "stop");
    assert.equal(refused?.reason, "tree_budget");
    assert.match(refused?.message ?? "", /no room for this model call/);
    assert.throws(() => b.throwIfStopped(), RunStopped);
    // Latched: b's next model call is its stop, without a round trip.
    assert.equal((await b.modelCall())?.event_id, "");
    // A turn in flight never holds up its run's tools.
    const gate = await a.toolCall("search", { q: "x" });
    assert.ok(gate.mayRun);
    await a.toolResult(gate.callId, "search", "SUCCESS", { output: { hits: 1 } });
    // a's turn spent 200, not 600: the rest is free again.
    await a.modelTurn("end_turn", { usage: { input_tokens: 200 } });
    const c = await root.startChild({ agent: "c" });
    assert.equal((await c.modelCall({ estimateTokens: 800 }))?.action, "continue");
    // Without an estimate, a reserves its mean (200): 200 spent + 800 held + 200 > 1000.
    assert.equal((await a.modelCall())?.reason, "tree_budget");
  });
});
