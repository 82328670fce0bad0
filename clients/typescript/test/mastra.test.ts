/**
 * The Mastra adapter, with the real package (`@mastra/core` 1.71: an `Agent` with
 * `createTool` tools), a scripted model (`MockLanguageModelV4` from `ai/test`, which
 * Mastra runs as it runs any AI SDK model: no LLM, no network), a real nats-server and
 * fuseboxd started by the harness.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from "@ai-sdk/provider";
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { MastraGuard } from "../src/adapters/mastra.js";
import { Fusebox, type FuseboxOptions } from "../src/index.js";
import { generateResult } from "./support/ai.js";
import {
  bareNats,
  connectedStack,
  freshRun,
  fuseboxCancel,
  listIssuesOutput,
  openPageOutput,
  PAGES,
  PING_PONG_EXECUTIONS,
  RUNAWAY_EXECUTIONS,
  runStatus,
  searchOutput,
  sendEmailOutput,
  TENANT,
  ToolLog,
} from "./support/guard.js";
import { type Call, nextCalls, opKeyFor, type Scenario } from "./support/scenarios.js";

/** Distinct pages a sweep opens, one call each: every one is new work. */
const SWEEP = 30;

type Script = Scenario | "sweep";

function callsOf(script: Script, turn: number): Call[] | null {
  if (script === "sweep") {
    return turn < SWEEP ? [["open_page", { url: `https://example.com/p/${turn + 1}` }]] : null;
  }
  return nextCalls(script, turn);
}

function scripted(script: Script): MockLanguageModelV4 {
  let turn = 0;
  return new MockLanguageModelV4({
    doGenerate: async (): Promise<LanguageModelV4GenerateResult> => {
      const k = turn++;
      return generateResult(callsOf(script, k) ?? "done", (i) => `call_${k}_${i}`);
    },
  });
}

/** The scenario tools as Mastra tools, logging what really executed; `onTool` runs inside
 * each `list_issues` execution. */
function makeTools(log: ToolLog, onTool?: (executions: number) => Promise<void>) {
  return {
    search: createTool({
      id: "search",
      description: "Search the web.",
      inputSchema: z.object({ query: z.string() }),
      execute: async ({ query }) => {
        log.calls.push(["search", query]);
        return searchOutput(query);
      },
    }),
    open_page: createTool({
      id: "open_page",
      description: "Open a page.",
      inputSchema: z.object({ url: z.string() }),
      execute: async ({ url }) => {
        log.calls.push(["open_page", url]);
        return openPageOutput(url);
      },
    }),
    list_issues: createTool({
      id: "list_issues",
      description: "List one page of issues.",
      inputSchema: z.object({ page: z.number() }),
      execute: async ({ page }) => {
        log.calls.push(["list_issues", page]);
        await onTool?.(log.calls.length);
        return listIssuesOutput(page);
      },
    }),
    send_email: createTool({
      id: "send_email",
      description: "Notify someone about an incident.",
      inputSchema: z.object({ to: z.string(), incident: z.string() }),
      execute: async ({ to }) => {
        log.calls.push(["send_email", to]);
        return sendEmailOutput(to);
      },
    }),
  };
}

function agentOf(model: MockLanguageModelV4, tools: ReturnType<typeof makeTools>): Agent {
  return new Agent({
    id: "researcher",
    name: "researcher",
    instructions: "Answer the question.",
    // The same model at runtime: Mastra types it with its own pinned copy of
    // @ai-sdk/provider (4.0.17), whose LanguageModelV4 differs in detail from ai 7's.
    model: model as unknown as ConstructorParameters<typeof Agent>[0]["model"],
    tools,
  });
}

type Part = { type: string; output?: { type: string; value?: unknown } };

/** What the model read for each call, in its last request: each result's text. */
function reads(model: MockLanguageModelV4): string[] {
  const last: LanguageModelV4CallOptions | undefined = model.doGenerateCalls.at(-1);
  return (last?.prompt ?? [])
    .filter((m) => m.role === "tool")
    .flatMap((m) => m.content as unknown as Part[])
    .filter((p) => p.type === "tool-result")
    .map((p) => {
      const value = p.output?.value;
      return typeof value === "string" ? value : JSON.stringify(value);
    });
}

/** The system text of each request the model got, joined. */
function systemText(model: MockLanguageModelV4): string[] {
  return model.doGenerateCalls.map((call) =>
    call.prompt
      .filter((m) => m.role === "system")
      .map((m) => String(m.content))
      .join("\n"),
  );
}

describe("Mastra adapter", () => {
  const live = connectedStack();

  async function guarded(scenario: string, opts: FuseboxOptions = {}, scope?: string) {
    const fb =
      Object.keys(opts).length === 0
        ? live.fb
        : await Fusebox.connect(live.stack.natsUrl, { tenant: TENANT, ...opts });
    const run = await fb.startRun(freshRun(`mastra-${scenario}`), { agent: "researcher" });
    return new MastraGuard(run, { opKey: opKeyFor(scope ?? run.id) });
  }

  async function closed(runId: string): Promise<Record<string, unknown>> {
    const status = await runStatus(live.stack, runId);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
    return status;
  }

  test("a runaway is stopped after the same executions, and the user is told why", async () => {
    const guard = await guarded("runaway");
    const model = scripted("runaway");
    const log = new ToolLog();
    const result = await guard.generate(agentOf(model, makeTools(log)), "weather?", {
      maxSteps: 100,
    });
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(guard.run.stopped?.terminal_state, "STOPPED_LOOP_GUARD");
    assert.match(result.tripwire?.reason ?? "", /^fusebox stopped this run \(STOPPED_LOOP_GUARD/);
    const read = reads(model);
    assert.match(read[RUNAWAY_EXECUTIONS] ?? "", /^fusebox blocked search/);
    // The warned call's result, then the warning in the next step's system messages.
    assert.doesNotMatch(read[RUNAWAY_EXECUTIONS - 1] ?? "", /fusebox/);
    const warned = systemText(model).filter((s) => s.includes("[fusebox warning]"));
    assert.equal(warned.length, 1, JSON.stringify(systemText(model)));
    assert.match(warned[0] ?? "", /already ran twice/);
    await closed(guard.run.id);
  });

  test("ping-pong is stopped", async () => {
    const guard = await guarded("ping_pong");
    const log = new ToolLog();
    await guard.generate(agentOf(scripted("ping_pong"), makeTools(log)), "go", { maxSteps: 100 });
    assert.ok(guard.run.stopped !== null);
    assert.equal(log.calls.length, PING_PONG_EXECUTIONS, `${log.calls.length} executions`);
  });

  test("a walk over twelve pages finishes untouched, usage reported, the run closed", async () => {
    const guard = await guarded("pagination");
    const model = scripted("pagination");
    const log = new ToolLog();
    const result = await guard.generate(agentOf(model, makeTools(log)), "list all issues", {
      maxSteps: 100,
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("list_issues"), PAGES);
    assert.ok(!reads(model).some((r) => r.includes("fusebox")));
    const status = await closed(guard.run.id);
    const counters = status.counters as Record<string, number>;
    assert.equal(counters.model_turns, PAGES + 1);
    assert.equal(counters.tokens, (PAGES + 1) * 150);
    assert.equal(counters.steps, PAGES);
    assert.equal(counters.calls_refused, 0);
    assert.equal((status.summary as { terminal_state?: string }).terminal_state, "COMPLETED");
  });

  test("a sweep of thirty distinct calls finishes untouched", async () => {
    const guard = await guarded("sweep");
    const model = scripted("sweep");
    const log = new ToolLog();
    const result = await guard.generate(agentOf(model, makeTools(log)), "open them all", {
      maxSteps: 100,
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("open_page"), SWEEP);
    assert.ok(!systemText(model).some((s) => s.includes("fusebox")));
    assert.ok(!reads(model).some((r) => r.includes("fusebox")));
    await closed(guard.run.id);
  });

  test("one op_key executes once across a retry", async () => {
    const guard = await guarded("retry_side_effect");
    const model = scripted("retry_side_effect");
    const log = new ToolLog();
    const result = await guard.generate(agentOf(model, makeTools(log)), "notify on-call", {
      maxSteps: 100,
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("send_email"), 1);
    // The retry is answered with the stored result.
    assert.match(reads(model)[1] ?? "", /"sent":true/);
  });

  test("fusebox cancel from another process refuses the next call and ends the agent", async () => {
    const guard = await guarded("cancel");
    const log = new ToolLog();
    const tools = makeTools(log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(live.stack, guard.run.id);
        await guard.run.waitStopped(5000);
      }
    });
    const result = await guard.generate(agentOf(scripted("pagination"), tools), "go", {
      maxSteps: 100,
    });
    assert.equal(log.count("list_issues"), 3);
    assert.equal(guard.run.stopped?.terminal_state, "CANCELLED");
    assert.match(result.tripwire?.reason ?? "", /^fusebox stopped this run \(CANCELLED/);
  });

  test("Mastra's maxSteps ends the agent with calls still asked for: the run is closed failed", async () => {
    const guard = await guarded("max_steps");
    const log = new ToolLog();
    await guard.generate(agentOf(scripted("pagination"), makeTools(log)), "go", { maxSteps: 3 });
    assert.equal(log.count("list_issues"), 3);
    const status = await closed(guard.run.id);
    assert.equal((status.summary as { terminal_state?: string }).terminal_state, "FAILED");
  });

  test("a tool that returns nothing ends Mastra's loop as it does unguarded; the run is closed failed", async () => {
    const outcomes: Array<[string, number]> = [];
    for (const guardIt of [false, true]) {
      const guard = await guarded("nothing");
      let executions = 0;
      const nothing = createTool({
        id: "list_issues",
        description: "List one page of issues.",
        inputSchema: z.object({ page: z.number() }),
        execute: async () => {
          executions++;
          return undefined;
        },
      });
      const agent = new Agent({
        id: "researcher",
        name: "researcher",
        instructions: "Answer the question.",
        model: scripted("pagination") as unknown as ConstructorParameters<typeof Agent>[0]["model"],
        tools: { list_issues: nothing },
      });
      const result = guardIt
        ? await guard.generate(agent, "go", { maxSteps: 100 })
        : await agent.generate("go", { maxSteps: 100 });
      outcomes.push([String(result.finishReason), executions]);
      assert.equal(executions, 1);
      if (guardIt) {
        const status = await closed(guard.run.id);
        const summary = status.summary as { terminal_state?: string };
        assert.equal(summary.terminal_state, "FAILED", JSON.stringify(status));
      }
    }
    assert.deepEqual(outcomes[1], outcomes[0]);
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, timeoutMs: 300, gateOnError });
        try {
          const run = fb.run(freshRun("mastra-down"));
          const guard = new MastraGuard(run);
          const model = scripted("one_search");
          const log = new ToolLog();
          await guard.generate(agentOf(model, makeTools(log)), "weather?", { maxSteps: 5 });
          if (gateOnError === "deny") {
            assert.equal(log.count("search"), 0);
            assert.match(
              reads(model)[0] ?? "",
              /fusebox could not be asked whether search may run/,
            );
          } else {
            assert.equal(log.count("search"), 1);
            assert.match(reads(model)[0] ?? "", /jma\.go\.jp/);
          }
        } finally {
          await fb.close();
        }
      } finally {
        await nats.stop();
      }
    });
  }
});
