/**
 * The Claude Agent SDK adapter, with the real SDK (`@anthropic-ai/claude-agent-sdk` 0.3)
 * driving its Claude Code binary offline against a scripted model API on loopback
 * (support/fake-anthropic.ts), and a real nats-server and fuseboxd. The tools are
 * in-process SDK MCP tools that log what they really executed.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Options } from "@anthropic-ai/claude-agent-sdk";
import { ClaudeAgentGuard } from "../src/adapters/claude-agent-sdk.js";
import { Fusebox, RunStopped } from "../src/index.js";
import {
  makeServer,
  PREFIX,
  SERVER,
  TOOLS,
  toolUses,
  workspace,
} from "./support/claude-agent-sdk.js";
import { FakeAnthropic, type Turn, text } from "./support/fake-anthropic.js";
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

/** The shared scenario script, turn by turn, as Claude tool uses. */
function scripted(scenario: Scenario): FakeAnthropic {
  return new FakeAnthropic((body): Turn => {
    const turn = (body.messages ?? []).filter((m) => m.role === "assistant").length;
    const calls = nextCalls(scenario, turn);
    if (calls === null) return text("done");
    return toolUses(calls);
  });
}

function options(api: FakeAnthropic, server: ReturnType<typeof makeServer>): Options {
  const { home, work } = workspace("fusebox-ts-claude-");
  return {
    mcpServers: { [SERVER]: server },
    allowedTools: TOOLS.map((name) => PREFIX + name),
    tools: [],
    env: api.env(home),
    cwd: work,
    maxTurns: 100,
  };
}

/** Tool-use ids of the last request's history without a tool result (the last assistant
 * turn may be the refused one that ended the session). */
function unanswered(api: FakeAnthropic): string[] {
  const last = api.toolUses().at(-1);
  if (last === undefined) return [];
  return last.asked.slice(0, -1).filter((id) => !last.answered.has(id));
}

async function stopped(running: Promise<unknown>): Promise<RunStopped> {
  const err = await running.then(
    () => assert.fail("the run was not stopped"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof RunStopped, String(err));
  return err;
}

describe("Claude Agent SDK adapter", () => {
  let stack: Stack;
  const clients: Fusebox[] = [];
  const apis: FakeAnthropic[] = [];

  before(async () => {
    stack = await startStack();
  });
  after(async () => {
    for (const fb of clients) await fb.close();
    for (const api of apis) await api.stop();
    await stack.stop();
  });

  async function guarded(scenario: Scenario, scope?: string) {
    const fb = await Fusebox.connect(stack.natsUrl, { tenant: TENANT });
    clients.push(fb);
    const run = await fb.startRun(freshRun(`cas-${scenario}`), { agent: "claude-agent" });
    const opKey = opKeyFor(scope ?? run.id);
    const guard = new ClaudeAgentGuard(run, { opKey: (t, a) => opKey(t.replace(PREFIX, ""), a) });
    const api = await scripted(scenario).start();
    apis.push(api);
    return { guard, api, log: new ToolLog() };
  }

  test("a runaway is stopped after the same executions as the Rust demo", async () => {
    const { guard, api, log } = await guarded("runaway");
    const err = await stopped(guard.runAgent("weather in tokyo?", options(api, makeServer(log))));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.equal(err.report?.terminal_state, "STOPPED_LOOP_GUARD");
    assert.deepEqual(unanswered(api), []);
    const refused = [...api.toolResults().values()].filter((r) => r.isError);
    assert.ok(
      refused.length > 0 && refused.every((r) => r.content.includes("fusebox")),
      JSON.stringify(refused),
    );
  });

  test("a walk over twelve pages finishes untouched, usage reported, the run closed", async () => {
    const { guard, api, log } = await guarded("pagination");
    const result = await guard.runAgent("list all issues", options(api, makeServer(log)));
    assert.equal(log.count("list_issues"), PAGES);
    assert.equal(result?.subtype === "success" ? result.result : null, "done");
    assert.equal(guard.run.stopped, null);
    assert.ok(![...api.toolResults().values()].some((r) => r.content.includes("fusebox")));
    const status = await runStatus(stack, guard.run.id);
    const counters = status.counters as Record<string, number>;
    assert.equal(counters.model_turns, PAGES + 1);
    assert.equal(counters.steps, PAGES);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });
  test("ping-pong is stopped", async () => {
    const { guard, api, log } = await guarded("ping_pong");
    const err = await stopped(guard.runAgent("go", options(api, makeServer(log))));
    assert.ok(
      err.report?.fired_guards.some((g) => g.startsWith("ping_pong")),
      JSON.stringify(err.report),
    );
    assert.equal(log.calls.length, PING_PONG_EXECUTIONS);
    assert.deepEqual(unanswered(api), []);
  });

  test("one op_key executes once across a retry", async () => {
    const { guard, api, log } = await guarded("retry_side_effect");
    await guard.runAgent("page on-call", options(api, makeServer(log)));
    assert.equal(log.count("send_email"), 1);
    const results = [...api.toolResults().values()];
    assert.equal(results.length, 2);
    // The retry was answered with the stored result (the MCP tool's content), under its
    // own call id, and the tool did not run again.
    assert.ok(
      results[1]?.isError && results[1].content.includes('sent\\":true'),
      JSON.stringify(results[1]),
    );
    assert.deepEqual(unanswered(api), []);
  });

  test("one op_key executes once across two runs", async () => {
    const scope = freshRun("incident");
    const log = new ToolLog();
    for (let i = 0; i < 2; i++) {
      const { guard, api } = await guarded("one_email", scope);
      const result = await guard.runAgent("page on-call", options(api, makeServer(log)));
      assert.equal(result?.subtype, "success");
    }
    assert.equal(log.count("send_email"), 1);
  });

  test("fusebox cancel from another process ends the run at its next step", async () => {
    const { guard, api, log } = await guarded("pagination");
    const server = makeServer(log, async (executions) => {
      if (executions === 3) {
        await fuseboxCancel(stack, guard.run.id);
        await guard.run.waitStopped(5000);
      }
    });
    const err = await stopped(guard.runAgent("list all issues", options(api, server)));
    assert.equal(err.report?.terminal_state, "CANCELLED");
    assert.equal(log.count("list_issues"), 3);
  });

  for (const gateOnError of ["deny", "allow"] as const) {
    test(`daemon down: ${gateOnError}`, async () => {
      const nats = await bareNats();
      const api = await scripted("one_search").start();
      apis.push(api);
      try {
        const fb = await Fusebox.connect(nats.url, { tenant: TENANT, gateOnError, timeoutMs: 500 });
        const guard = new ClaudeAgentGuard(await fb.startRun(freshRun("cas-down")));
        const log = new ToolLog();
        const result = await guard.runAgent("weather?", options(api, makeServer(log)));
        assert.equal(result?.subtype, "success");
        const [first] = [...api.toolResults().values()];
        if (gateOnError === "deny") {
          assert.equal(log.count("search"), 0);
          assert.match(first?.content ?? "", /no fuseboxd is listening.*did not run/);
        } else {
          assert.equal(log.count("search"), 1);
        }
        await fb.close();
      } finally {
        await nats.stop();
      }
    });
  }

  test("parallel calls are each gated and siblings refused after a stop", async () => {
    const { guard, api, log } = await guarded("parallel_runaway");
    await stopped(guard.runAgent("go", options(api, makeServer(log))));
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS);
    assert.deepEqual(unanswered(api), []);
  });
});
