/**
 * The OpenAI Agents JS adapter, with the real SDK (`@openai/agents` 0.20), a scripted
 * `Model` (no LLM, no network), a real nats-server and fuseboxd started by the harness.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Agent,
  type AgentInputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
  setTracingDisabled,
} from "@openai/agents";
import { OpenAIAgentsGuard } from "../src/adapters/openai-agents.js";
import { Fusebox, type FuseboxOptions, RunStopped } from "../src/index.js";
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
import { makeTools, modelResponse } from "./support/openai-agents.js";
import { nextCalls, opKeyFor, type Scenario } from "./support/scenarios.js";
import { type Stack, startStack } from "./support/stack.js";

setTracingDisabled(true);

/** A `Model` that answers from the scenario script, recording every request. */
class ScriptedModel implements Model {
  readonly requests: ModelRequest[] = [];
  private turn = 0;
  constructor(private readonly scenario: Scenario) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const k = this.turn++;
    return modelResponse(nextCalls(this.scenario, k) ?? "done", (i) => `call_${k}_${i}`);
  }

  // biome-ignore lint/correctness/useYield: the scripted model never streams
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

function makeAgent(model: Model, log: ToolLog, onTool?: (executions: number) => Promise<void>) {
  return new Agent({
    name: "researcher",
    instructions: "Answer the question.",
    model,
    tools: makeTools(log, onTool),
  });
}

type Item = { type?: string; callId?: string; output?: unknown };

function items(request: ModelRequest | undefined): Item[] {
  const input = request?.input;
  return Array.isArray(input) ? (input as AgentInputItem[] as Item[]) : [];
}

function outputText(output: unknown): string {
  if (typeof output === "string") return output;
  if (typeof output === "object" && output !== null && "text" in output) return String(output.text);
  return JSON.stringify(output);
}

/** What the model read for each call id, in the last request it got. */
function reads(model: ScriptedModel): Map<string, string> {
  const out = new Map<string, string>();
  for (const item of items(model.requests.at(-1))) {
    if (item.type === "function_call_result" && item.callId)
      out.set(item.callId, outputText(item.output));
  }
  return out;
}

/** Every function call the model saw in its input has an output for its call id. */
function assertHistoryValid(model: ScriptedModel): void {
  for (const request of model.requests) {
    const all = items(request);
    const answered = new Set(
      all.filter((i) => i.type === "function_call_result").map((i) => i.callId),
    );
    for (const call of all.filter((i) => i.type === "function_call")) {
      assert.ok(answered.has(call.callId), `unanswered call id ${call.callId}`);
    }
  }
}

describe("OpenAI Agents JS adapter", () => {
  let stack: Stack;
  const clients: Fusebox[] = [];

  before(async () => {
    stack = await startStack();
  });
  after(async () => {
    for (const fb of clients) await fb.close();
    await stack.stop();
  });

  async function guarded(scenario: string, opts: FuseboxOptions = {}, scope?: string) {
    const fb = await Fusebox.connect(stack.natsUrl, { tenant: TENANT, ...opts });
    clients.push(fb);
    const run = await fb.startRun(freshRun(`oai-${scenario}`), { agent: "researcher" });
    return new OpenAIAgentsGuard(run, { opKey: opKeyFor(scope ?? run.id) });
  }

  async function stopped(running: Promise<unknown>): Promise<RunStopped> {
    const err = await running.then(
      () => assert.fail("the run was not stopped"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof RunStopped, String(err));
    return err;
  }

  test("a runaway is stopped after the same executions as the Rust demo", async () => {
    const guard = await guarded("runaway");
    const model = new ScriptedModel("runaway");
    const log = new ToolLog();
    const err = await stopped(
      guard.runAgent(makeAgent(model, log), "weather in tokyo?", { maxTurns: 100 }),
    );
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(err.report?.terminal_state, "STOPPED_LOOP_GUARD");
    const read = [...reads(model).values()];
    assert.match(read[RUNAWAY_EXECUTIONS - 1] ?? "", /\[fusebox warning\]/);
    assert.match(read[RUNAWAY_EXECUTIONS] ?? "", /^fusebox blocked search/);
    assertHistoryValid(model);
  });

  test("ping-pong is stopped", async () => {
    const guard = await guarded("ping_pong");
    const model = new ScriptedModel("ping_pong");
    const log = new ToolLog();
    await stopped(guard.runAgent(makeAgent(model, log), "go", { maxTurns: 100 }));
    assert.equal(log.calls.length, PING_PONG_EXECUTIONS, `${log.calls.length} executions`);
    assertHistoryValid(model);
  });

  test("a walk over twelve pages finishes untouched, usage reported, the run closed", async () => {
    const guard = await guarded("pagination");
    const model = new ScriptedModel("pagination");
    const log = new ToolLog();
    const result = await guard.runAgent(makeAgent(model, log), "list all issues", {
      maxTurns: 100,
    });
    assert.equal(result.finalOutput, "done");
    assert.deepEqual(
      log.calls.filter(([t]) => t === "list_issues").map(([, a]) => a),
      Array.from({ length: PAGES }, (_, i) => i + 1),
    );
    assert.equal(guard.run.stopped, null);
    assertHistoryValid(model);
    const status = await runStatus(stack, guard.run.id);
    const counters = status.counters as Record<string, number>;
    assert.equal(counters.model_turns, PAGES + 1);
    assert.equal(counters.tokens, (PAGES + 1) * 150);
    assert.equal(counters.steps, PAGES);
    assert.equal(counters.calls_refused, 0);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });

  test("one op_key executes once across a retry", async () => {
    const guard = await guarded("retry_side_effect");
    const model = new ScriptedModel("retry_side_effect");
    const log = new ToolLog();
    const result = await guard.runAgent(makeAgent(model, log), "notify on-call", { maxTurns: 100 });
    assert.equal(result.finalOutput, "done");
    assert.equal(log.count("send_email"), 1);
    // The retry was answered with the stored result, under the retry's own call id.
    assert.match(reads(model).get("call_1_0") ?? "", /"sent":true/);
    assertHistoryValid(model);
  });

  test("one op_key executes once across two runs", async () => {
    const scope = freshRun("incident");
    const log = new ToolLog();
    for (let i = 0; i < 2; i++) {
      const guard = await guarded("two_runs", {}, scope);
      const result = await guard.runAgent(
        makeAgent(new ScriptedModel("one_email"), log),
        "notify",
        { maxTurns: 10 },
      );
      assert.equal(result.finalOutput, "done");
    }
    assert.equal(log.count("send_email"), 1);
  });

  test("fusebox cancel from another process ends the run at its next step", async () => {
    const guard = await guarded("cancel");
    const model = new ScriptedModel("pagination");
    const log = new ToolLog();
    const agent = makeAgent(model, log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(stack, guard.run.id);
        await guard.run.waitStopped(5000);
      }
    });
    const err = await stopped(guard.runAgent(agent, "list all issues", { maxTurns: 100 }));
    assert.equal(log.count("list_issues"), 3);
    assert.equal(err.report?.terminal_state, "CANCELLED");
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, gateOnError, timeoutMs: 500 });
        const guard = new OpenAIAgentsGuard(await fb.startRun(freshRun("oai-down")));
        const model = new ScriptedModel("one_search");
        const log = new ToolLog();
        const result = await guard.runAgent(makeAgent(model, log), "weather?", { maxTurns: 10 });
        assert.equal(result.finalOutput, "done");
        if (gateOnError === "deny") {
          assert.equal(log.count("search"), 0);
          assert.match(reads(model).get("call_0_0") ?? "", /no fuseboxd is listening.*did not run/);
        } else {
          assert.equal(log.count("search"), 1);
        }
        assertHistoryValid(model);
        await fb.close();
      } finally {
        await nats.stop();
      }
    });
  }

  test("parallel calls are each gated and siblings refused after a stop", async () => {
    const guard = await guarded("parallel");
    const model = new ScriptedModel("parallel_runaway");
    const log = new ToolLog();
    await stopped(guard.runAgent(makeAgent(model, log), "go", { maxTurns: 100 }));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS, `${log.count("search")} executions`);
    assertHistoryValid(model);
  });
  test("an agent that fails closes the run as failed", async () => {
    const guard = await guarded("failing");
    const failing = new ScriptedModel("one_search");
    failing.getResponse = async () => {
      throw new Error("the model provider is down");
    };
    await assert.rejects(
      guard.runAgent(makeAgent(failing, new ToolLog()), "go", { maxTurns: 10 }),
      /the model provider is down/,
    );
    const status = await runStatus(stack, guard.run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });
});
