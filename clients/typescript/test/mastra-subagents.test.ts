/**
 * Sub-agents of the Mastra adapter as child runs (guard contract §6), with the real
 * package (`@mastra/core` 1.71: a lead `Agent` whose `agents` Mastra runs as its
 * `agent-<name>` tools), scripted models (`MockLanguageModelV4` from `ai/test`: no LLM, no
 * network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from "@ai-sdk/provider";
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { MastraGuard } from "../src/adapters/mastra.js";
import type { RunOptions } from "../src/index.js";
import { generateResult } from "./support/ai.js";
import {
  connectedStack,
  fuseboxCancel,
  listIssuesOutput,
  RUNAWAY_EXECUTIONS,
  runStatus,
  searchOutput,
  ToolLog,
} from "./support/guard.js";
import type { Call } from "./support/scenarios.js";
import {
  assertFanOutTree,
  assertLeadClosed,
  type LeadScript,
  leadReply,
  type ResearcherScript,
  reportOf,
  researcherReply,
  startLead,
  TOPICS,
} from "./support/subagents.js";
import { children, executed, tree } from "./support/trees.js";

/** Mastra's name of the tool that delegates to the sub-agent `researcher`. */
const DELEGATE = "agent-researcher";

type Part = {
  type: string;
  text?: string;
  toolCallId?: string;
  output?: { type: string; value?: unknown };
};
type Message = { role: string; content: unknown };

const partsOf = (m: Message): Part[] => (Array.isArray(m.content) ? (m.content as Part[]) : []);

/**
 * A scripted model that answers from its conversation, not from how often it was called:
 * sub-agents delegated to in one step run at once on the same model. Its turn is the
 * number of its own earlier turns in the prompt (its call ids carry `prefix`); its task,
 * the last user message (a delegation's prompt).
 */
function conversationModel(
  prefix: string,
  respond: (turn: number, task: string) => Call[] | string,
  before?: (turn: number) => Promise<void>,
): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doGenerate: async (options): Promise<LanguageModelV4GenerateResult> => {
      const prompt = options.prompt as unknown as Message[];
      const turns = new Set(
        prompt
          .filter((m) => m.role === "assistant")
          .flatMap(partsOf)
          .filter((p) => p.type === "tool-call" && p.toolCallId?.startsWith(`${prefix}_`))
          .map((p) => p.toolCallId?.split("_")[1]),
      );
      const user = prompt.filter((m) => m.role === "user").at(-1);
      const task =
        typeof user?.content === "string"
          ? user.content
          : (user ? partsOf(user) : []).map((p) => p.text ?? "").join("");
      await before?.(turns.size);
      const reply = respond(turns.size, task);
      return generateResult(reply, (i) => `${prefix}_${turns.size}_${i}`);
    },
  });
}

type ModelOf = ConstructorParameters<typeof Agent>[0]["model"];

/** The work tools, logging what really executed; `onList` runs inside each `list_issues`
 * execution. */
function makeTools(log: ToolLog, onList?: () => Promise<void>) {
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
    list_issues: createTool({
      id: "list_issues",
      description: "List one page of issues.",
      inputSchema: z.object({ page: z.number() }),
      execute: async ({ page }) => {
        log.calls.push(["list_issues", page]);
        await onList?.();
        return listIssuesOutput(page);
      },
    }),
  };
}

/** The researcher sub-agent, guarded as a sub-agent (`MastraGuard.subAgent`). */
function researcher(
  script: ResearcherScript,
  log: ToolLog,
  onList?: () => Promise<void>,
  model = conversationModel("res", (turn, task) => researcherReply(script, turn, task)),
) {
  return new Agent(
    MastraGuard.subAgent({
      id: "researcher",
      name: "researcher",
      description: "Researches the topic it is given.",
      instructions: "Research the topic you are given.",
      // Mastra types models with its own pinned copy of @ai-sdk/provider.
      model: model as unknown as ModelOf,
      tools: makeTools(log, onList),
      // Room for a runaway to be stopped by the guard, not by Mastra's default of 5.
      defaultOptions: { maxSteps: 20 },
    }),
  );
}

/** The lead agent: its research tasks go to `agents.researcher`. */
function lead(script: LeadScript, log: ToolLog, sub: Agent) {
  const model = conversationModel("lead", (turn) => {
    const reply = leadReply(script, turn, (topic) => ({ prompt: topic }));
    if (typeof reply === "string") return reply;
    return reply.map(([name, args]): Call => [name === "research" ? DELEGATE : name, args]);
  });
  const agent = new Agent({
    id: "lead",
    name: "lead",
    instructions: "Hand research to the researcher.",
    model: model as unknown as ModelOf,
    tools: { search: makeTools(log).search },
    agents: { researcher: sub },
  });
  return { agent, model };
}

/** What the model read for each call in its last request, by call id. */
function reads(model: MockLanguageModelV4): Map<string, string> {
  const last: LanguageModelV4CallOptions | undefined = model.doGenerateCalls.at(-1);
  const out = new Map<string, string>();
  for (const m of (last?.prompt ?? []) as unknown as Message[]) {
    if (m.role !== "tool") continue;
    for (const p of partsOf(m)) {
      if (p.type !== "tool-result" || p.toolCallId === undefined) continue;
      const value = p.output?.value;
      out.set(p.toolCallId, typeof value === "string" ? value : JSON.stringify(value));
    }
  }
  return out;
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

describe("Mastra sub-agents", () => {
  const live = connectedStack();

  async function guarded(name: string, opts: RunOptions = {}) {
    return new MastraGuard(await startLead(live.fb, `mastra-${name}`, opts));
  }

  test("two delegations at once: each a child run with the sub-agent's calls and usage", async () => {
    const guard = await guarded("fan-out");
    const log = new ToolLog();
    const { agent, model } = lead("fan_out", log, researcher("pages", log));
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    assert.equal(result.text, "done");
    // The lead read each sub-agent's report as the delegation's result, untouched.
    assert.deepEqual([...reads(model).values()].sort(), TOPICS.map(reportOf).sort());
    assert.ok(!systemText(model).some((s) => s.includes("fusebox")));
    const kids = await assertFanOutTree(live.fb.nats, guard.run.id, { delegate: DELEGATE });
    assert.equal(log.count("list_issues"), 4);
    // Each child is named from the lead's run and the delegation's tool-call id.
    assert.deepEqual(
      kids.map((kid) => kid.run),
      [`${guard.run.id}-researcher-lead_0_0`, `${guard.run.id}-researcher-lead_0_1`],
    );
    for (const kid of kids) {
      const status = await runStatus(live.stack, kid.run);
      assert.equal((status.tree as { parent?: string }).parent, guard.run.id);
      // The sub-agent's three model turns (two calls, its report) are the child's.
      const counters = status.counters as Record<string, number>;
      assert.equal(counters.model_turns, 3);
      assert.equal(counters.tokens, 3 * 150);
    }
    await assertLeadClosed(live.stack, guard.run.id);
  });

  test("a sub-agent that loops is stopped in its child run; the lead reads why and goes on", async () => {
    const guard = await guarded("child-loop");
    const log = new ToolLog();
    const { agent, model } = lead("then_search", log, researcher("runaway", log));
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    // The lead was not stopped: it made its own search, then answered.
    assert.equal(result.text, "done");
    assert.equal(result.tripwire, undefined);
    assert.equal(guard.run.stopped, null);
    // The sub-agent's searches ran in the child until its loop guard stopped it, and the
    // lead's own one.
    assert.equal(log.count("search"), RUNAWAY_EXECUTIONS + 1);
    const [kid, ...others] = children(await tree(live.fb.nats, guard.run.id), guard.run.id);
    assert.equal(others.length, 0);
    assert.equal(kid?.run, `${guard.run.id}-researcher-lead_0_0`);
    const status = await runStatus(live.stack, kid?.run ?? "");
    assert.equal(kid?.reason, "consecutive_blocks");
    assert.deepEqual(kid && executed(kid), Array(RUNAWAY_EXECUTIONS).fill("search"));
    assert.equal((status.tree as { parent?: string }).parent, guard.run.id);
    assert.equal(
      (status.summary as { terminal_state?: string }).terminal_state,
      "STOPPED_LOOP_GUARD",
    );
    // The lead read the guard's words as the sub-agent's answer …
    assert.match(
      reads(model).get("lead_0_0") ?? "",
      new RegExp(
        `^fusebox stopped the sub-agent researcher \\(run ${kid?.run}\\): STOPPED_LOOP_GUARD \\(consecutive_blocks\\)[^]*Its task is not done: do it another way`,
      ),
    );
    // … and the daemon's word of it with its next call, as a warning of its next step.
    const warned = systemText(model).filter((s) => s.includes("[fusebox warning]"));
    assert.equal(warned.length, 1, JSON.stringify(systemText(model)));
    assert.match(warned[0] ?? "", /a sub-agent of this run was stopped/);
    const closed = await runStatus(live.stack, guard.run.id);
    assert.equal((closed.summary as { terminal_state?: string }).terminal_state, "COMPLETED");
  });

  test("a cancel of the lead reaches its sub-agents: their next calls are refused", async () => {
    const guard = await guarded("cancel");
    const log = new ToolLog();
    // Both sub-agents at their second model call when the operator cancels the lead: the
    // calls that model asks for come after the cancel.
    let arrived = 0;
    let release = () => {};
    const released = new Promise<void>((done) => {
      release = done;
    });
    const cancelWhenBothIn = async (turn: number) => {
      if (turn !== 1) return;
      arrived += 1;
      if (arrived === 2) {
        await fuseboxCancel(live.stack, guard.run.id, "tree review");
        release();
      }
      await released;
    };
    const researcherModel = conversationModel(
      "res",
      (turn, task) => researcherReply("pages", turn, task),
      cancelWhenBothIn,
    );
    const sub = researcher("pages", log, undefined, researcherModel);
    const { agent } = lead("fan_out", log, sub);
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    assert.equal(guard.run.stopped?.terminal_state, "CANCELLED");
    assert.match(result.tripwire?.reason ?? "", /^fusebox stopped this run \(CANCELLED/);
    const nodes = await tree(live.fb.nats, guard.run.id);
    const kids = children(nodes, guard.run.id);
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.equal(kid.reason, "ancestor_stopped", kid.run);
      assert.equal(kid.stoppedBy, guard.run.id);
      assert.deepEqual(executed(kid), ["list_issues"]);
    }
    // Each sub-agent's second call was refused, and its model not asked again: two
    // model calls each, one page each.
    assert.equal(researcherModel.doGenerateCalls.length, 4);
    assert.deepEqual(log.calls, [
      ["list_issues", 1],
      ["list_issues", 1],
    ]);
  });

  test("the lead's step budget is its tree's, counted while its sub-agents run", async () => {
    const guard = await guarded("tree-budget", { policy: { max_steps: 4 } });
    const log = new ToolLog();
    const { agent, model } = lead("fan_out", log, researcher("pages", log));
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    assert.equal(result.text, "done");
    // Two steps of the lead (its delegations), two of its sub-agents: no more.
    assert.equal(log.count("list_issues"), 2);
    const kids = children(await tree(live.fb.nats, guard.run.id), guard.run.id);
    assert.equal(kids.length, 2);
    assert.equal(kids.flatMap(executed).length, 2);
    const read = reads(model);
    const stopped = kids.filter((kid) => kid.reason !== "completed");
    assert.ok(stopped.length > 0);
    for (const kid of stopped) {
      assert.equal(kid.reason, "tree_budget", kid.run);
      const callId = kid.run.slice(`${guard.run.id}-researcher-`.length);
      assert.match(
        read.get(callId) ?? "",
        new RegExp(`^fusebox stopped the sub-agent researcher \\(run ${kid.run}\\): `),
      );
    }
  });

  test("a delegation past a cap never starts; the lead reads the refusal", async () => {
    const guard = await guarded("cap", { policy: { max_children: 1 } });
    const log = new ToolLog();
    const { agent, model } = lead("twice", log, researcher("pages", log));
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    assert.equal(result.text, "done");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const read = reads(model);
    assert.equal(read.get("lead_0_0"), reportOf(TOPICS[0]));
    assert.match(
      read.get("lead_1_0") ?? "",
      /^\[Delegation Rejected\] fusebox stopped the sub-agent researcher \(run .*-researcher-lead_1_0\): STOPPED_LOOP_GUARD \(spawn_limit\): sub-agent not started/,
    );
  });

  test("a sub-agent's own sub-agent is its child: a tree of three runs", async () => {
    const guard = await guarded("nested");
    const log = new ToolLog();
    const fetcher = new Agent(
      MastraGuard.subAgent({
        id: "fetcher",
        name: "fetcher",
        description: "Fetches a page of issues.",
        instructions: "Fetch what you are asked for.",
        model: conversationModel("fetch", (turn) =>
          turn === 0 ? [["list_issues", { page: 1 }]] : "fetched",
        ) as unknown as ModelOf,
        tools: { list_issues: makeTools(log).list_issues },
      }),
    );
    const researcherModel = conversationModel("res", (turn) =>
      turn === 0 ? [["agent-fetcher", { prompt: "page one" }]] : reportOf("billing"),
    );
    const middle = new Agent(
      MastraGuard.subAgent({
        id: "researcher",
        name: "researcher",
        description: "Researches the topic it is given.",
        instructions: "Research the topic you are given.",
        model: researcherModel as unknown as ModelOf,
        agents: { fetcher },
      }),
    );
    // Two delegations, one per turn: each a child with its own grandchild.
    const { agent, model } = lead("twice", log, middle);
    const result = await guard.generate(agent, "triage the queue", { maxSteps: 10 });
    assert.equal(result.text, "done");
    assert.equal(reads(model).get("lead_0_0"), reportOf("billing"));
    assert.equal(reads(researcherModel).get("res_0_0"), "fetched");
    const nodes = await tree(live.fb.nats, guard.run.id);
    const kids = children(nodes, guard.run.id);
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.deepEqual(kid.calls, [["agent-fetcher", "execute"]]);
      assert.equal(kid.reason, "completed");
      const [grandchild, ...more] = children(nodes, kid.run);
      assert.equal(more.length, 0);
      assert.equal(grandchild?.run, `${kid.run}-fetcher-res_0_0`);
      assert.equal(grandchild?.agent, "fetcher");
      assert.equal(grandchild?.depth, 2);
      assert.deepEqual(grandchild && executed(grandchild), ["list_issues"]);
      assert.equal(grandchild?.reason, "completed");
    }
    assert.equal(log.count("list_issues"), 2);
  });

  test("the caller's own delegation hooks run too; one that rejects starts no child", async () => {
    const guard = await guarded("their-hooks");
    const log = new ToolLog();
    const { agent, model } = lead("twice", log, researcher("pages", log));
    const completed: string[] = [];
    const result = await guard.generate(agent, "triage the queue", {
      maxSteps: 10,
      delegation: {
        onDelegationStart: ({ prompt }) =>
          prompt === TOPICS[1] ? { proceed: false, rejectionReason: "not now" } : undefined,
        onDelegationComplete: ({ toolCallId }) => {
          completed.push(toolCallId);
        },
      },
    });
    assert.equal(result.text, "done");
    assert.deepEqual(completed, ["lead_0_0"]);
    assert.equal(reads(model).get("lead_1_0"), "[Delegation Rejected] not now");
    const kids = children(await tree(live.fb.nats, guard.run.id), guard.run.id);
    assert.deepEqual(
      kids.map((kid) => [kid.run, kid.reason]),
      [[`${guard.run.id}-researcher-lead_0_0`, "completed"]],
    );
  });

  test("a sub-agent built once serves two runs at once: each call goes to its own run's tree", async () => {
    const [first, second] = [await guarded("shared-a"), await guarded("shared-b")];
    const log = new ToolLog();
    const sub = researcher("pages", log);
    const results = await Promise.all(
      [first, second].map((guard) =>
        guard.generate(lead("fan_out", log, sub).agent, "triage the queue", { maxSteps: 10 }),
      ),
    );
    assert.deepEqual(
      results.map((r) => r.text),
      ["done", "done"],
    );
    for (const guard of [first, second]) {
      await assertFanOutTree(live.fb.nats, guard.run.id, { delegate: DELEGATE });
    }
  });
});
