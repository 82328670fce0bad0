/**
 * The Vercel AI SDK adapter, with the real SDK (`ai` 7), its scripted model
 * (`MockLanguageModelV4` from `ai/test`: no LLM, no network), a real nats-server and
 * fuseboxd started by the repo's harness.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type {
  LanguageModelV4CallOptions,
  LanguageModelV4GenerateResult,
  LanguageModelV4StreamPart,
} from "@ai-sdk/provider";
import { simulateReadableStream, stepCountIs, streamText } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { AiSdkGuard } from "../src/adapters/ai.js";
import { Fusebox, type FuseboxOptions } from "../src/index.js";
import { generateResult, makeTools } from "./support/ai.js";
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
import { nextCalls, opKeyFor, type Scenario } from "./support/scenarios.js";
import { type Stack, startStack } from "./support/stack.js";

function scripted(scenario: Scenario): MockLanguageModelV4 {
  let turn = 0;
  return new MockLanguageModelV4({
    doGenerate: async (): Promise<LanguageModelV4GenerateResult> => {
      const calls = nextCalls(scenario, turn);
      const k = turn++;
      return generateResult(calls ?? "done", (i) => `call_${k}_${i}`);
    },
  });
}

/** The same script, streamed: each answer as the stream parts a provider sends. */
function streamed(scenario: Scenario): MockLanguageModelV4 {
  let turn = 0;
  return new MockLanguageModelV4({
    doStream: async () => {
      const calls = nextCalls(scenario, turn);
      const k = turn++;
      const answer = generateResult(calls ?? "done", (i) => `call_${k}_${i}`);
      const chunks: LanguageModelV4StreamPart[] = [{ type: "stream-start", warnings: [] }];
      for (const part of answer.content) {
        if (part.type === "text") {
          chunks.push({ type: "text-start", id: "t" });
          chunks.push({ type: "text-delta", id: "t", delta: part.text });
          chunks.push({ type: "text-end", id: "t" });
        } else if (part.type === "tool-call") {
          chunks.push(part);
        }
      }
      chunks.push({ type: "finish", finishReason: answer.finishReason, usage: answer.usage });
      return { stream: simulateReadableStream({ chunks }) };
    },
  });
}

type Part = {
  type: string;
  toolCallId?: string;
  output?: { type: string; reason?: string; value?: unknown };
};

function parts(call: LanguageModelV4CallOptions, role: string): Part[] {
  return call.prompt.filter((m) => m.role === role).flatMap((m) => m.content as unknown as Part[]);
}

/** Every tool call the model saw in its input has a result for its call id. */
function assertHistoryValid(model: MockLanguageModelV4): void {
  for (const call of model.doGenerateCalls) {
    const asked = new Set(
      parts(call, "assistant")
        .filter((p) => p.type === "tool-call")
        .map((p) => p.toolCallId),
    );
    const answered = new Set(
      parts(call, "tool")
        .filter((p) => p.type === "tool-result")
        .map((p) => p.toolCallId),
    );
    for (const id of asked) assert.ok(answered.has(id), `unanswered call id ${id}`);
  }
}

/** What the model read for each call, in order: a result's text or a denial's reason. */
function reads(model: MockLanguageModelV4): string[] {
  const last = model.doGenerateCalls.at(-1);
  assert.ok(last);
  return parts(last, "tool")
    .filter((p) => p.type === "tool-result")
    .map((p) =>
      p.output?.type === "execution-denied"
        ? `DENIED ${p.output.reason}`
        : JSON.stringify(p.output?.value),
    );
}

describe("Vercel AI SDK adapter", () => {
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
    const run = await fb.startRun(freshRun(`ai-${scenario}`), { agent: "researcher" });
    return new AiSdkGuard(run, { opKey: opKeyFor(scope ?? run.id) });
  }

  test("a runaway is stopped after the same executions as the Rust demo", async () => {
    const guard = await guarded("runaway");
    const model = scripted("runaway");
    const log = new ToolLog();
    const result = await guard.generateText({
      model,
      tools: makeTools(log),
      prompt: "weather?",
      stopWhen: stepCountIs(100),
    });
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(guard.run.stopped?.terminal_state, "STOPPED_LOOP_GUARD");
    assert.ok(result.steps.length < 10);
    const read = reads(model);
    assert.match(read[RUNAWAY_EXECUTIONS - 1] ?? "", /\[fusebox warning\]/);
    assert.match(read[RUNAWAY_EXECUTIONS] ?? "", /^DENIED fusebox blocked search/);
    assertHistoryValid(model);
  });

  test("ping-pong is stopped", async () => {
    const guard = await guarded("ping_pong");
    const model = scripted("ping_pong");
    const log = new ToolLog();
    await guard.generateText({
      model,
      tools: makeTools(log),
      prompt: "go",
      stopWhen: stepCountIs(100),
    });
    assert.ok(guard.run.stopped !== null);
    assert.equal(log.calls.length, PING_PONG_EXECUTIONS, `${log.calls.length} executions`);
    assertHistoryValid(model);
  });

  test("a walk over twelve pages finishes untouched, usage reported, the run closed", async () => {
    const guard = await guarded("pagination");
    const model = scripted("pagination");
    const log = new ToolLog();
    const result = await guard.generateText({
      model,
      tools: makeTools(log),
      prompt: "list all issues",
      stopWhen: stepCountIs(100),
    });
    assert.equal(result.text, "done");
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
    // run_finished closed it: the daemon says so, and a later call is refused.
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
    const late = await guard.run.toolCall("search", { query: "after the end" });
    assert.equal(late.mayRun, false);
  });

  test("streamText: twelve pages untouched, usage reported, the run closed at the stream's end", async () => {
    const guard = await guarded("stream_pagination");
    const log = new ToolLog();
    const result = guard.streamText({
      model: streamed("pagination"),
      tools: makeTools(log),
      prompt: "list all issues",
      stopWhen: stepCountIs(100),
    });
    assert.equal(await result.text, "done");
    assert.equal(log.count("list_issues"), PAGES);
    const status = await runStatus(stack, guard.run.id);
    const counters = status.counters as Record<string, number>;
    assert.equal(counters.model_turns, PAGES + 1);
    assert.equal(counters.steps, PAGES);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
    assert.equal((status.summary as { terminal_state?: string }).terminal_state, "COMPLETED");
  });

  test("streamText: a runaway is stopped after the same executions", async () => {
    const guard = await guarded("stream_runaway");
    const log = new ToolLog();
    const result = guard.streamText({
      model: streamed("runaway"),
      tools: makeTools(log),
      prompt: "weather?",
      stopWhen: stepCountIs(100),
    });
    await result.consumeStream();
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(guard.run.stopped?.terminal_state, "STOPPED_LOOP_GUARD");
  });

  test("the SDK's own streamText with the README's pieces and onEnd closes the run", async () => {
    const guard = await guarded("stream_own");
    const log = new ToolLog();
    const result = streamText({
      model: streamed("pagination"),
      tools: guard.tools(makeTools(log)),
      toolApproval: guard.toolApproval,
      stopWhen: [guard.stopWhen, stepCountIs(100)],
      onStepEnd: guard.onStepEnd,
      onEnd: guard.onEnd,
      onError: guard.onError,
      onAbort: guard.onAbort,
      prompt: "list all issues",
    });
    assert.equal(await result.text, "done");
    const status = await runStatus(stack, guard.run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });

  test("one op_key executes once across a retry", async () => {
    const guard = await guarded("retry_side_effect");
    const model = scripted("retry_side_effect");
    const log = new ToolLog();
    const result = await guard.generateText({
      model,
      tools: makeTools(log),
      prompt: "notify on-call",
      stopWhen: stepCountIs(100),
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("send_email"), 1);
    // The retry was answered with the stored result, under the retry's own call id.
    assert.match(reads(model)[1] ?? "", /"sent":true/);
    assertHistoryValid(model);
  });

  test("one op_key executes once across two runs", async () => {
    const scope = freshRun("incident");
    const log = new ToolLog();
    for (let i = 0; i < 2; i++) {
      const guard = await guarded("two_runs", {}, scope);
      const result = await guard.generateText({
        model: scripted("one_email"),
        tools: makeTools(log),
        prompt: "notify",
        stopWhen: stepCountIs(10),
      });
      assert.equal(result.text, "done");
    }
    assert.equal(log.count("send_email"), 1);
  });

  test("fusebox cancel from another process ends the run at its next step", async () => {
    const guard = await guarded("cancel");
    const model = scripted("pagination");
    const log = new ToolLog();
    let cancelled = false;
    const tools = makeTools(log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(stack, guard.run.id);
        await guard.run.waitStopped(5000);
        cancelled = true;
      }
    });
    await guard.generateText({
      model,
      tools,
      prompt: "list all issues",
      stopWhen: stepCountIs(100),
    });
    assert.ok(cancelled);
    assert.equal(log.count("list_issues"), 3);
    assert.equal(guard.run.stopped?.terminal_state, "CANCELLED");
    assertHistoryValid(model);
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, gateOnError, timeoutMs: 500 });
        const guard = new AiSdkGuard(await fb.startRun(freshRun("ai-down")));
        const model = scripted("one_search");
        const log = new ToolLog();
        const result = await guard.generateText({
          model,
          tools: makeTools(log),
          prompt: "weather?",
          stopWhen: stepCountIs(10),
        });
        assert.equal(result.text, "done");
        if (gateOnError === "deny") {
          assert.equal(log.count("search"), 0);
          assert.match(reads(model)[0] ?? "", /no fuseboxd is listening.*did not run/);
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
    const model = scripted("parallel_runaway");
    const log = new ToolLog();
    const result = await guard.generateText({
      model,
      tools: makeTools(log),
      prompt: "go",
      stopWhen: stepCountIs(100),
    });
    assert.ok(guard.run.stopped !== null);
    // The step that learnt the stop answered its other calls with the stop, as denials.
    const denials = result.response.messages
      .filter((m) => m.role === "tool")
      .flatMap((m) => m.content as unknown as Part[])
      .filter((p) => p.type === "tool-result" && p.output?.type === "execution-denied");
    assert.ok(denials.some((p) => p.output?.reason?.includes("stopped this run")));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS, `${log.count("search")} executions`);
    assertHistoryValid(model);
  });
  test("an agent that fails closes the run as failed", async () => {
    const guard = await guarded("failing");
    const model = new MockLanguageModelV4({
      doGenerate: async () => {
        throw new Error("the model provider is down");
      },
    });
    await assert.rejects(
      guard.generateText({ model, tools: makeTools(new ToolLog()), prompt: "go", maxRetries: 0 }),
      /the model provider is down/,
    );
    const status = await runStatus(stack, guard.run.id);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });
});
