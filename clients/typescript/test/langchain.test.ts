/**
 * The LangChain.js `createAgent` middleware, with the real packages (`langchain` 1.5,
 * `@langchain/core` 1.4), the scripted `fakeModel()` (no LLM, no network), a real
 * nats-server and fuseboxd started by the harness.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { BaseMessage } from "@langchain/core/messages";
import { type FakeBuiltModel, fakeModel } from "@langchain/core/testing";
import { createAgent } from "langchain";
import { fuseboxMiddleware } from "../src/adapters/langchain.js";
import { Fusebox, type FuseboxOptions, type Run } from "../src/index.js";
import {
  bareNats,
  freshRun,
  fuseboxCancel,
  PAGES,
  PING_PONG_EXECUTIONS,
  RUNAWAY_EXECUTIONS,
  runStatus,
  TENANT,
  ToolLog,
} from "./support/guard.js";
import { assertHistoryValid, makeTools, reads, scripted } from "./support/langchain.js";
import { opKeyFor } from "./support/scenarios.js";
import { type Stack, startStack } from "./support/stack.js";

async function invoke(
  run: Run,
  model: FakeBuiltModel,
  tools: ReturnType<typeof makeTools>,
  scope?: string,
) {
  const agent = createAgent({
    model,
    tools,
    middleware: [fuseboxMiddleware(run, { opKey: opKeyFor(scope ?? run.id) })],
  });
  const state = await agent.invoke(
    { messages: [{ role: "user", content: "go" }] },
    { recursionLimit: 500 },
  );
  return state.messages as BaseMessage[];
}

describe("LangChain.js createAgent middleware", () => {
  let stack: Stack;
  const clients: Fusebox[] = [];

  before(async () => {
    stack = await startStack();
  });
  after(async () => {
    for (const fb of clients) await fb.close();
    await stack.stop();
  });

  async function started(scenario: string, opts: FuseboxOptions = {}) {
    const fb = await Fusebox.connect(stack.natsUrl, { tenant: TENANT, ...opts });
    clients.push(fb);
    return fb.startRun(freshRun(`lc-${scenario}`), { agent: "researcher" });
  }

  test("a runaway is stopped after the same executions as the Rust demo", async () => {
    const run = await started("runaway");
    const log = new ToolLog();
    const messages = await invoke(run, scripted("runaway"), makeTools(log));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(run.stopped?.terminal_state, "STOPPED_LOOP_GUARD");
    const read = reads(messages);
    assert.match(read[RUNAWAY_EXECUTIONS - 1] ?? "", /\[fusebox warning\]/);
    assert.match(read[RUNAWAY_EXECUTIONS] ?? "", /^fusebox blocked search/);
    assertHistoryValid(messages);
  });

  test("ping-pong is stopped", async () => {
    const run = await started("ping_pong");
    const log = new ToolLog();
    const messages = await invoke(run, scripted("ping_pong"), makeTools(log));
    assert.ok(run.stopped !== null);
    assert.equal(log.calls.length, PING_PONG_EXECUTIONS, `${log.calls.length} executions`);
    assertHistoryValid(messages);
  });

  test("a walk over twelve pages finishes untouched, usage reported, the run closed", async () => {
    const run = await started("pagination");
    const log = new ToolLog();
    const messages = await invoke(run, scripted("pagination"), makeTools(log));
    assert.equal(messages.at(-1)?.content, "done");
    assert.deepEqual(
      log.calls.filter(([t]) => t === "list_issues").map(([, a]) => a),
      Array.from({ length: PAGES }, (_, i) => i + 1),
    );
    assert.equal(run.stopped, null);
    assertHistoryValid(messages);
    const status = await runStatus(stack, run.id);
    const counters = status.counters as Record<string, number>;
    assert.equal(counters.model_turns, PAGES + 1);
    assert.equal(counters.tokens, (PAGES + 1) * 150);
    assert.equal(counters.steps, PAGES);
    assert.equal(counters.calls_refused, 0);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });

  test("the guard costs no recursion steps: as many calls as unguarded under the default limit", async () => {
    // LangGraph's default recursionLimit (25) is what a user who passes none gets. The
    // twelve-page walk ends there unguarded after its 12 calls (at the final answer, the
    // 25th step); guarded, it must make the same 12 calls (a before/after-model hook pair
    // made that 6), end the same way, and be closed as the README shows.
    const outcome = (running: Promise<unknown>) =>
      running.then(
        () => "finished",
        (err: unknown) => (err instanceof Error ? err.name : String(err)),
      );
    const unguarded = new ToolLog();
    const plain = createAgent({ model: scripted("pagination"), tools: makeTools(unguarded) });
    const plainEnd = await outcome(plain.invoke({ messages: [{ role: "user", content: "go" }] }));
    const run = await started("pagination_default_limit");
    const log = new ToolLog();
    const agent = createAgent({
      model: scripted("pagination"),
      tools: makeTools(log),
      middleware: [fuseboxMiddleware(run)],
    });
    const guardedEnd = await outcome(
      agent.invoke({ messages: [{ role: "user", content: "go" }] }).catch(async (err: unknown) => {
        await run.finish("failed");
        throw err;
      }),
    );
    assert.equal(unguarded.count("list_issues"), PAGES);
    assert.equal(log.count("list_issues"), PAGES);
    assert.equal(guardedEnd, plainEnd);
    assert.equal(run.stopped, null);
    const status = await runStatus(stack, run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });

  test("one op_key executes once across a retry", async () => {
    const run = await started("retry_side_effect");
    const log = new ToolLog();
    const messages = await invoke(run, scripted("retry_side_effect"), makeTools(log));
    assert.equal(messages.at(-1)?.content, "done");
    assert.equal(log.count("send_email"), 1);
    assert.match(reads(messages)[1] ?? "", /"sent":true/);
    assertHistoryValid(messages);
  });

  test("one op_key executes once across two runs", async () => {
    const scope = freshRun("incident");
    const log = new ToolLog();
    for (let i = 0; i < 2; i++) {
      const run = await started("two_runs");
      const messages = await invoke(run, scripted("one_email"), makeTools(log), scope);
      assert.equal(messages.at(-1)?.content, "done");
    }
    assert.equal(log.count("send_email"), 1);
  });

  test("fusebox cancel from another process ends the run at its next step", async () => {
    const run = await started("cancel");
    const log = new ToolLog();
    const tools = makeTools(log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(stack, run.id);
        await run.waitStopped(5000);
      }
    });
    const messages = await invoke(run, scripted("pagination"), tools);
    assert.equal(log.count("list_issues"), 3);
    assert.equal(run.stopped?.terminal_state, "CANCELLED");
    assertHistoryValid(messages);
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, gateOnError, timeoutMs: 500 });
        const run = await fb.startRun(freshRun("lc-down"));
        const log = new ToolLog();
        const messages = await invoke(run, scripted("one_search"), makeTools(log));
        assert.equal(messages.at(-1)?.content, "done");
        if (gateOnError === "deny") {
          assert.equal(log.count("search"), 0);
          assert.match(reads(messages)[0] ?? "", /no fuseboxd is listening.*did not run/);
        } else {
          assert.equal(log.count("search"), 1);
        }
        assertHistoryValid(messages);
        await fb.close();
      } finally {
        await nats.stop();
      }
    });
  }

  test("parallel calls are each gated and siblings refused after a stop", async () => {
    const run = await started("parallel");
    const log = new ToolLog();
    const messages = await invoke(run, scripted("parallel_runaway"), makeTools(log));
    assert.ok(run.stopped !== null);
    assert.ok(reads(messages).some((text) => text.includes("stopped this run")));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS, `${log.count("search")} executions`);
    assertHistoryValid(messages);
  });
  test("an agent that fails closes the run as failed", async () => {
    const run = await started("failing");
    const model = fakeModel().alwaysThrow(new Error("the model provider is down"));
    await assert.rejects(
      invoke(run, model, makeTools(new ToolLog())),
      /the model provider is down/,
    );
    const status = await runStatus(stack, run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });
});
