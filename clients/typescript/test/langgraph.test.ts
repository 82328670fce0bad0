/**
 * LangGraph.js graphs behind the guard, with the real packages (`@langchain/langgraph`
 * 1.7: a `StateGraph` with `ToolNode`, and the prebuilt `createReactAgent`), the scripted
 * `fakeModel()` (no LLM, no network), a real nats-server and fuseboxd started by the harness.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { type FakeBuiltModel, fakeModel } from "@langchain/core/testing";
import type { LangGraphRunnableConfig } from "@langchain/langgraph";
import { MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { createReactAgent, ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { GraphStopped, LangGraphGuard } from "../src/adapters/langgraph.js";
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

type Kind = "StateGraph" | "createReactAgent";
const KINDS: Kind[] = ["StateGraph", "createReactAgent"];

/** The graph a user builds, with the guard's wrapped tools and its way to end. */
function build(kind: Kind, guard: LangGraphGuard, model: FakeBuiltModel, tools: ToolSet) {
  const guarded = guard.tools(tools);
  if (kind === "createReactAgent") {
    return createReactAgent({ llm: model, tools: guarded, preModelHook: guard.beforeModel });
  }
  const callModel = async (
    state: typeof MessagesAnnotation.State,
    config: LangGraphRunnableConfig,
  ) => ({ messages: [await model.invoke(state.messages, config)] });
  return new StateGraph(MessagesAnnotation)
    .addNode("agent", callModel)
    .addNode("tools", new ToolNode(guarded))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition)
    .addConditionalEdges("tools", guard.afterTools("agent"))
    .compile();
}

type ToolSet = ReturnType<typeof makeTools>;

interface Outcome {
  messages: BaseMessage[];
  stopped: GraphStopped | null;
}

/** `guard.invoke`: the final history, and the stop it rejected with (if any). */
async function invoke(
  kind: Kind,
  run: Run,
  model: FakeBuiltModel,
  tools: ToolSet,
  scope?: string,
): Promise<Outcome> {
  const guard = new LangGraphGuard(run, { opKey: opKeyFor(scope ?? run.id) });
  const graph = build(kind, guard, model, tools);
  const input = { messages: [{ role: "user", content: "go" }] };
  try {
    const state = await guard.invoke(graph, input, { recursionLimit: 500 });
    return { messages: (state as { messages: BaseMessage[] }).messages, stopped: null };
  } catch (err) {
    if (!(err instanceof GraphStopped)) throw err;
    const state = err.state as { messages: BaseMessage[] } | undefined;
    return { messages: state?.messages ?? [], stopped: err };
  }
}

/** The graph ended at the stop: its last step answered the calls, and the model was not
 * asked again (each model call is an AI message of the history). */
function assertEndedAtStop(messages: BaseMessage[], model: FakeBuiltModel): void {
  assert.ok(ToolMessage.isInstance(messages.at(-1)), "the history ends with a tool answer");
  const turns = messages.filter((m) => AIMessage.isInstance(m)).length;
  assert.equal(model.callCount, turns, "the model was called after the stop");
  assertHistoryValid(messages);
}

describe("LangGraph.js wrapped tools", () => {
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
    return fb.startRun(freshRun(`lg-${scenario}`), { agent: "researcher" });
  }

  for (const kind of KINDS) {
    test(`${kind}: a runaway is stopped after the same executions as the Rust demo`, async () => {
      const run = await started("runaway");
      const log = new ToolLog();
      const model = scripted("runaway");
      const { messages, stopped } = await invoke(kind, run, model, makeTools(log));
      assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
      assert.equal(stopped?.report?.terminal_state, "STOPPED_LOOP_GUARD");
      const read = reads(messages);
      assert.match(read[RUNAWAY_EXECUTIONS - 1] ?? "", /\[fusebox warning\]/);
      assert.match(read[RUNAWAY_EXECUTIONS] ?? "", /^fusebox blocked search/);
      assert.match(read.at(-1) ?? "", /^fusebox stopped this run/);
      assertEndedAtStop(messages, model);
    });

    test(`${kind}: ping-pong is stopped`, async () => {
      const run = await started("ping_pong");
      const log = new ToolLog();
      const model = scripted("ping_pong");
      const { messages, stopped } = await invoke(kind, run, model, makeTools(log));
      assert.ok(stopped !== null);
      assert.equal(log.calls.length, PING_PONG_EXECUTIONS, `${log.calls.length} executions`);
      assertEndedAtStop(messages, model);
    });

    test(`${kind}: a walk over twelve pages finishes untouched, usage reported, the run closed`, async () => {
      const run = await started("pagination");
      const log = new ToolLog();
      const { messages, stopped } = await invoke(kind, run, scripted("pagination"), makeTools(log));
      assert.equal(stopped, null);
      assert.equal(messages.at(-1)?.content, "done");
      assert.deepEqual(
        log.calls.filter(([t]) => t === "list_issues").map(([, a]) => a),
        Array.from({ length: PAGES }, (_, i) => i + 1),
      );
      assertHistoryValid(messages);
      const status = await runStatus(stack, run.id);
      const counters = status.counters as Record<string, number>;
      assert.equal(counters.model_turns, PAGES + 1);
      assert.equal(counters.tokens, (PAGES + 1) * 150);
      assert.equal(counters.steps, PAGES);
      assert.equal(counters.calls_refused, 0);
      assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
    });
  }

  test("one op_key executes once across a retry", async () => {
    const run = await started("retry_side_effect");
    const log = new ToolLog();
    const { messages } = await invoke(
      "StateGraph",
      run,
      scripted("retry_side_effect"),
      makeTools(log),
    );
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
      const { messages } = await invoke(
        "StateGraph",
        run,
        scripted("one_email"),
        makeTools(log),
        scope,
      );
      assert.equal(messages.at(-1)?.content, "done");
    }
    assert.equal(log.count("send_email"), 1);
  });

  test("fusebox cancel from another process ends the graph after its tools step", async () => {
    const run = await started("cancel");
    const log = new ToolLog();
    const tools = makeTools(log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(stack, run.id);
        await run.waitStopped(5000);
      }
    });
    const model = scripted("pagination");
    const { messages, stopped } = await invoke("StateGraph", run, model, tools);
    assert.equal(log.count("list_issues"), 3);
    assert.equal(stopped?.report?.terminal_state, "CANCELLED");
    assertEndedAtStop(messages, model);
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, gateOnError, timeoutMs: 500 });
        const run = await fb.startRun(freshRun("lg-down"));
        const log = new ToolLog();
        const { messages } = await invoke(
          "StateGraph",
          run,
          scripted("one_search"),
          makeTools(log),
        );
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
    const model = scripted("parallel_runaway");
    const { messages, stopped } = await invoke("StateGraph", run, model, makeTools(log));
    assert.ok(stopped !== null);
    assert.ok(reads(messages).some((text) => text.includes("stopped this run")));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS, `${log.count("search")} executions`);
    assertEndedAtStop(messages, model);
  });

  test("a graph that fails closes the run as failed", async () => {
    const run = await started("failing");
    const model = fakeModel().alwaysThrow(new Error("the model provider is down"));
    await assert.rejects(
      invoke("StateGraph", run, model, makeTools(new ToolLog())),
      /the model provider is down/,
    );
    const status = await runStatus(stack, run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });
});
