/** What the model reads for each kind of answer: decisions in, texts and permissions out
 * (no server: the `Gate` is a pure function of the decision or the error). */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Gate, GateTimeout, NoResponders, parseDecision, Refused } from "../src/index.js";

const decision = (fields: Record<string, unknown>) =>
  parseDecision({ v: 1, tenant: "t", run: "r", event_id: "r-2", call_id: "c1", ...fields });

const report = {
  terminal_state: "STOPPED_LOOP_GUARD",
  reason: "consecutive_blocks",
  completed_steps: 3,
  fired_guards: ["exact_repeat:block@5"],
};

const cases: Array<{ name: string; gate: Gate; mayRun: boolean; text: RegExp | null }> = [
  {
    name: "execute",
    gate: new Gate("c1", "search", decision({ action: "execute" })),
    mayRun: true,
    text: null,
  },
  {
    name: "warn",
    gate: new Gate("c1", "search", decision({ action: "warn", message: "3rd time" })),
    mayRun: true,
    text: null,
  },
  {
    name: "block",
    gate: new Gate(
      "c1",
      "search",
      decision({ action: "block", reason: "same_call_repeat", message: "use that result" }),
    ),
    mayRun: false,
    text: /^fusebox blocked search: use that result$/,
  },
  {
    name: "block without a message",
    gate: new Gate("c1", "search", decision({ action: "block", reason: "ping_pong" })),
    mayRun: false,
    text: /^fusebox blocked search: search was refused \(ping_pong\)\.$/,
  },
  {
    name: "stop",
    gate: new Gate(
      "c1",
      "search",
      decision({ action: "stop", reason: "consecutive_blocks", report }),
    ),
    mayRun: false,
    text: /^fusebox stopped this run \(STOPPED_LOOP_GUARD \(consecutive_blocks\)\); search did not run\.$/,
  },
  {
    name: "use_completed_result",
    gate: new Gate(
      "c1",
      "send_email",
      decision({ action: "use_completed_result", result: { sent: true } }),
    ),
    mayRun: false,
    text: /^\{"sent":true\}$/,
  },
  {
    name: "no daemon, deny",
    gate: new Gate("c1", "search", null, new NoResponders("fusebox.gate.t.r")),
    mayRun: false,
    text: /^fusebox could not be asked whether search may run \(no fuseboxd is listening .*\); the tool did not run\.$/,
  },
  {
    name: "timeout, allow",
    gate: new Gate("c1", "search", null, new GateTimeout("fusebox.gate.t.r", 500), true),
    mayRun: true,
    text: null,
  },
  {
    name: "refused by the daemon, even under allow",
    gate: new Gate("c1", "write", null, new Refused("event_too_large", "20 kB > 8 kB"), true),
    mayRun: false,
    text: /^fusebox refused to gate write: .*event_too_large.*The tool did not run\.$/,
  },
];

for (const { name, gate, mayRun, text } of cases) {
  test(`a gate: ${name}`, () => {
    assert.equal(gate.mayRun, mayRun);
    if (text === null) assert.equal(gate.modelText, null);
    else assert.match(gate.modelText ?? "", text);
  });
}

test("a warning is appended to what the tool returned", () => {
  const gate = new Gate("c1", "search", decision({ action: "warn", message: "3rd time" }));
  assert.equal(gate.reads({ hits: 1 }), '{"hits":1}\n\n[fusebox warning] 3rd time');
  assert.equal(new Gate("c1", "search", decision({ action: "execute" })).reads("plain"), "plain");
});

test("a decision with an unknown action or a wrong field type is refused", () => {
  assert.throws(() => decision({ action: "explode" }), /unknown action/);
  assert.throws(() => decision({ action: "execute", seq: "7" }), /seq is not an integer/);
  const newer = decision({ action: "block", reason: "a_detector_from_the_future", extra: [1] });
  assert.equal(newer.reason, "a_detector_from_the_future");
  assert.deepEqual(newer.raw.extra, [1]);
});
