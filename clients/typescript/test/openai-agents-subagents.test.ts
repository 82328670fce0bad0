/**
 * Sub-agents of the OpenAI Agents JS adapter as child runs (guard contract §6), with the
 * real SDK, scripted models (no LLM, no network), a real nats-server and fuseboxd:
 * `guard.asTool` (agents as tools, several at once) and handoffs.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  Agent,
  type AgentInputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
  setTracingDisabled,
} from "@openai/agents";
import { OpenAIAgentsGuard } from "../src/adapters/openai-agents.js";
import { type RunOptions, RunStopped } from "../src/index.js";
import { connectedStack, fuseboxCancel, ToolLog } from "./support/guard.js";
import { makeTools, modelResponse } from "./support/openai-agents.js";
import type { Call } from "./support/scenarios.js";
import {
  assertFanOutTree,
  assertLeadClosed,
  assertStepBudgetStopTold,
  type LeadScript,
  leadReply,
  type ResearcherScript,
  reportOf,
  researcherCalls,
  researcherReply,
  startLead,
  TOPICS,
} from "./support/subagents.js";
import { children, executed, tree } from "./support/trees.js";

setTracingDisabled(true);

type Item = {
  type?: string;
  role?: string;
  name?: string;
  callId?: string;
  output?: unknown;
  content?: unknown;
};

const itemsOf = (request: ModelRequest): Item[] =>
  Array.isArray(request.input) ? (request.input as AgentInputItem[] as Item[]) : [];

let callIds = 0;

/**
 * A `Model` that answers from what its conversation holds, not from how often it was
 * called: sub-agents of one agent run at once on the same model object. Its turn is the
 * number of its own earlier turns in the history (its call ids carry `prefix`).
 */
class ConversationModel implements Model {
  readonly requests: ModelRequest[] = [];

  constructor(
    private readonly prefix: string,
    private readonly respond: (turn: number, task: string) => Call[] | string,
  ) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const items = itemsOf(request);
    const turns = new Set(
      items
        .filter((i) => i.type === "function_call" && i.callId?.startsWith(`${this.prefix}_`))
        .map((i) => i.callId?.split("_")[1]),
    );
    return modelResponse(
      this.respond(turns.size, taskOf(request)),
      (i) => `${this.prefix}_${turns.size}_${i}_${callIds++}`,
    );
  }

  // biome-ignore lint/correctness/useYield: the scripted model never streams
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }

  /** What this model read for each call id, in the last request it got. */
  reads(): Map<string, string> {
    const out = new Map<string, string>();
    const last = this.requests.at(-1);
    for (const item of last ? itemsOf(last) : []) {
      if (item.type === "function_call_result" && item.callId) {
        out.set(item.callId, textOf(item.output));
      }
    }
    return out;
  }
}

function textOf(output: unknown): string {
  if (typeof output === "string") return output;
  if (typeof output === "object" && output !== null && "text" in output) return String(output.text);
  return JSON.stringify(output);
}

/** The first user message: the task an agent (or a sub-agent) was given. */
function taskOf(request: ModelRequest): string {
  if (typeof request.input === "string") return request.input;
  const user = itemsOf(request).find((i) => i.role === "user");
  const content = user?.content;
  if (typeof content === "string") return content;
  return Array.isArray(content) ? content.map((c: { text?: string }) => c.text ?? "").join("") : "";
}

/** The work tools; `onList` runs inside each `list_issues` execution. */
function tools(log: ToolLog, onList?: () => Promise<void>) {
  return makeTools(log, onList).filter((t) => t.name === "search" || t.name === "list_issues");
}

function researcher(script: ResearcherScript, log: ToolLog, onList?: () => Promise<void>): Agent {
  return new Agent({
    name: "researcher",
    instructions: "Research the topic you are given.",
    model: new ConversationModel("res", (turn, task) => researcherReply(script, turn, task)),
    tools: tools(log, onList),
  });
}

function lead(script: LeadScript, log: ToolLog, research: ReturnType<OpenAIAgentsGuard["asTool"]>) {
  const model = new ConversationModel("lead", (turn) =>
    leadReply(script, turn, (topic) => ({ input: topic })),
  );
  const agent = new Agent({
    name: "lead",
    instructions: "Hand research to the researcher.",
    model,
    tools: [research, ...tools(log)],
  });
  return { agent, model };
}

describe("OpenAI Agents JS sub-agents", () => {
  const live = connectedStack();

  async function guarded(name: string, opts: RunOptions = {}) {
    return new OpenAIAgentsGuard(await startLead(live.fb, `oai-${name}`, opts));
  }

  const researchTool = (guard: OpenAIAgentsGuard, agent: Agent, policy?: Record<string, unknown>) =>
    guard.asTool(
      agent,
      { toolName: "research", toolDescription: "Research a topic." },
      policy === undefined ? {} : { policy },
    );

  test("agents as tools, two at once: each a child run with its calls under it", async () => {
    const guard = await guarded("fan-out");
    const log = new ToolLog();
    const { agent, model } = lead("fan_out", log, researchTool(guard, researcher("pages", log)));
    const result = await guard.runAgent(agent, "triage the queue", { maxTurns: 10 });
    assert.equal(result.finalOutput, "done");
    // The lead read each sub-agent's report as the tool's output.
    assert.deepEqual([...model.reads().values()].sort(), TOPICS.map(reportOf).sort());
    await assertFanOutTree(live.fb.nats, guard.run.id);
    assert.equal(log.count("list_issues"), 4);
    // The sub-agents' model turns are theirs: the lead's run holds its own two.
    await assertLeadClosed(live.stack, guard.run.id);
  });

  test("a sub-agent the guard stops ends there; the lead reads why and goes on", async () => {
    const guard = await guarded("child-stop");
    const log = new ToolLog();
    const research = researchTool(guard, researcher("pages", log), { max_steps: 1 });
    const { agent, model } = lead("then_search", log, research);
    const result = await guard.runAgent(agent, "triage the queue", { maxTurns: 10 });
    assert.equal(result.finalOutput, "done");
    assert.equal(log.count("list_issues"), 1);
    // The lead's next call ran, with the daemon's word that its sub-agent was stopped.
    await assertStepBudgetStopTold(live.fb.nats, guard.run, [...model.reads().values()]);
    assert.equal(log.count("search"), 1);
  });

  test("a sub-agent past a cap never starts; the lead reads the refusal", async () => {
    const guard = await guarded("cap", { policy: { max_children: 1 } });
    const log = new ToolLog();
    const { agent, model } = lead("twice", log, researchTool(guard, researcher("pages", log)));
    const result = await guard.runAgent(agent, "triage the queue", { maxTurns: 10 });
    assert.equal(result.finalOutput, "done");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const read = [...model.reads().values()];
    assert.equal(read[0], reportOf(TOPICS[0]));
    assert.match(
      read[1] ?? "",
      /^fusebox stopped the sub-agent researcher \(run .*-researcher-2\): STOPPED_LOOP_GUARD \(spawn_limit\): sub-agent not started: run .* has started 1 sub-agents \(max_children 1\)\. Its task is not done/,
    );
  });

  test("agents shared by two runs at once: each call goes to its own run's tree", async () => {
    const [first, second] = [await guarded("shared-a"), await guarded("shared-b")];
    const log = new ToolLog();
    // Made once, with the first guard: the SDK's objects serve every run.
    const { agent } = lead("fan_out", log, researchTool(first, researcher("pages", log)));
    const results = await Promise.all(
      [first, second].map((guard) => guard.runAgent(agent, "triage the queue", { maxTurns: 10 })),
    );
    assert.deepEqual(
      results.map((r) => r.finalOutput),
      ["done", "done"],
    );
    for (const guard of [first, second]) {
      const nodes = await tree(live.fb.nats, guard.run.id);
      assert.equal(nodes.get(guard.run.id)?.calls.length, 2, guard.run.id);
      const kids = children(nodes, guard.run.id);
      assert.equal(kids.length, 2);
      for (const kid of kids) assert.deepEqual(executed(kid), ["list_issues", "list_issues"]);
    }
  });

  test("a cancel of the root through the operator API ends its sub-agents", async () => {
    const guard = await guarded("cancel");
    const log = new ToolLog();
    // Both sub-agents inside their first call when the operator cancels the root.
    let arrived = 0;
    let release = () => {};
    const released = new Promise<void>((done) => {
      release = done;
    });
    const cancelWhenBothIn = async () => {
      arrived += 1;
      if (arrived === 2) {
        await fuseboxCancel(live.stack, guard.run.id, "tree review");
        release();
      }
      await released;
    };
    const research = researchTool(guard, researcher("pages", log, cancelWhenBothIn));
    const { agent } = lead("fan_out", log, research);
    const err = await guard.runAgent(agent, "triage the queue", { maxTurns: 10 }).then(
      () => assert.fail("the run was not stopped"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof RunStopped, String(err));
    assert.equal(err.report?.terminal_state, "CANCELLED");
    const nodes = await tree(live.fb.nats, guard.run.id);
    const kids = children(nodes, guard.run.id);
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.equal(kid.reason, "ancestor_stopped", kid.run);
      assert.equal(kid.stoppedBy, guard.run.id);
    }
    // No sub-agent went on after the cancel: each finished the call it was in, no more.
    assert.deepEqual(log.calls, [
      ["list_issues", 1],
      ["list_issues", 1],
    ]);
  });

  /** The triage agent, which hands billing questions off to the billing agent; that one
   * makes the calls of a researcher of `script`, then answers `answer`. */
  function triage(script: ResearcherScript, answer: string, log: ToolLog) {
    const billing = new Agent({
      name: "billing",
      instructions: "Answer billing questions.",
      model: new ConversationModel("billing", (turn) => researcherCalls(script, turn) ?? answer),
      tools: tools(log),
    });
    return new Agent({
      name: "triage",
      instructions: "Hand billing questions to billing.",
      model: new ConversationModel("triage", (turn) =>
        turn === 0 ? [["transfer_to_billing", {}]] : "triage done",
      ),
      handoffs: [billing],
    });
  }

  test("a handoff is a child run of the agent that handed off", async () => {
    const guard = await guarded("handoff", { agent: "triage" });
    const triaged = triage("pages", "billing done", new ToolLog());
    const result = await guard.runAgent(triaged, "why was I charged twice?", { maxTurns: 10 });
    assert.equal(result.finalOutput, "billing done");
    const nodes = await tree(live.fb.nats, guard.run.id);
    const [kid] = children(nodes, guard.run.id);
    assert.equal(kid?.agent, "billing");
    assert.deepEqual(kid && executed(kid), ["list_issues", "list_issues"]);
    assert.equal(kid?.reason, "completed");
    assert.deepEqual(nodes.get(guard.run.id)?.calls, []);
    assert.equal(nodes.get(guard.run.id)?.reason, "completed");
  });

  test("a stop of a run handed off to ends runAgent with that run's RunStopped", async () => {
    const guard = await guarded("handoff-stop", { agent: "triage" });
    const err = await guard
      .runAgent(triage("runaway", "x", new ToolLog()), "why was I charged twice?", {
        maxTurns: 20,
      })
      .then(
        () => assert.fail("the run was not stopped"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof RunStopped, String(err));
    assert.equal(err.report?.terminal_state, "STOPPED_LOOP_GUARD");
    const nodes = await tree(live.fb.nats, guard.run.id);
    const [kid] = children(nodes, guard.run.id);
    assert.equal(err.decision?.run, kid?.run);
    assert.equal(kid?.agent, "billing");
    assert.equal(nodes.get(guard.run.id)?.open, false);
  });
});
