/**
 * Sub-agents of the AI SDK adapter as child runs (guard contract §6): an agent used as a
 * tool, through `guard.subAgent`, with the real SDK (`ai` 7), its scripted model
 * (`MockLanguageModelV4`: no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from "@ai-sdk/provider";
import { stepCountIs, ToolLoopAgent, type ToolSet, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { AiSdkGuard } from "../src/adapters/ai.js";
import type { RunOptions } from "../src/index.js";
import { generateResult, makeTools } from "./support/ai.js";
import { connectedStack, ToolLog } from "./support/guard.js";
import type { Call } from "./support/scenarios.js";
import {
  assertFanOutTree,
  assertLeadClosed,
  assertStepBudgetStopTold,
  type LeadScript,
  leadReply,
  type ResearcherScript,
  reportOf,
  researcherReply,
  startLead,
  TOPICS,
} from "./support/subagents.js";

type Part = { type: string; text?: string; output?: { type: string; value?: unknown } };

const partsOf = (call: LanguageModelV4CallOptions, role: string): Part[] =>
  call.prompt.filter((m) => m.role === role).flatMap((m) => m.content as unknown as Part[]);

/** A scripted model that answers from its conversation (sub-agents share one model and
 * run at once): its turn is the number of assistant messages so far, its task the first
 * user message. */
function conversation(respond: (turn: number, task: string) => Call[] | string) {
  let ids = 0;
  return new MockLanguageModelV4({
    doGenerate: async (call): Promise<LanguageModelV4GenerateResult> => {
      const turn = call.prompt.filter((m) => m.role === "assistant").length;
      const task = partsOf(call, "user")
        .map((p) => p.text ?? "")
        .join("");
      return generateResult(respond(turn, task), () => `call_${ids++}`);
    },
  });
}

/** What the model read as each tool's output, in its last request. */
function reads(model: MockLanguageModelV4): string[] {
  const last = model.doGenerateCalls.at(-1);
  assert.ok(last);
  return partsOf(last, "tool")
    .filter((p) => p.type === "tool-result")
    .map((p) => {
      const value = p.output?.value;
      return typeof value === "string" ? value : JSON.stringify(value);
    });
}

/** The tools the lead and its researchers work with. */
function workTools(log: ToolLog) {
  const { search, list_issues } = makeTools(log);
  return { search, list_issues };
}

const researcherModel = (script: ResearcherScript) =>
  conversation((turn, task) => researcherReply(script, turn, task));

const leadModel = (script: LeadScript) => conversation((turn) => leadReply(script, turn));

/** How the research tool runs its sub-agent: the child guard's `generateText`, or a
 * `ToolLoopAgent` given the child guard's pieces. */
type Runner = (child: AiSdkGuard, topic: string, tools: ToolSet) => Promise<string>;

const viaGenerateText: Runner = async (child, topic, tools) =>
  (
    await child.generateText({
      model: researcherModel("pages"),
      tools,
      prompt: topic,
      stopWhen: stepCountIs(10),
    })
  ).text;

const viaToolLoopAgent: Runner = async (child, topic, tools) => {
  const agent = new ToolLoopAgent({
    model: researcherModel("pages"),
    tools: child.tools(tools),
    toolApproval: child.toolApproval,
    stopWhen: [child.stopWhen, stepCountIs(10)],
  });
  return (await agent.generate({ prompt: topic, onStepEnd: child.onStepEnd })).text;
};

describe("AI SDK sub-agents", () => {
  const live = connectedStack();

  /** The lead, whose `research` tool runs the researcher as a sub-agent. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; child?: RunOptions; runner?: Runner } = {},
  ) {
    const guard = new AiSdkGuard(await startLead(live.fb, `ai-${name}`, opts.root));
    const log = new ToolLog();
    const runner = opts.runner ?? viaGenerateText;
    const research = tool({
      description: "Research a topic.",
      inputSchema: z.object({ topic: z.string() }),
      execute: ({ topic }) =>
        guard.subAgent((child) => runner(child, topic, workTools(log)), {
          agent: "researcher",
          ...opts.child,
        }),
    });
    const model = leadModel(script);
    const result = await guard.generateText({
      model,
      tools: { research, ...workTools(log) },
      prompt: "triage the queue",
      stopWhen: stepCountIs(10),
    });
    return { guard, log, model, result };
  }

  for (const [how, runner] of [
    ["generateText", viaGenerateText],
    ["a ToolLoopAgent", viaToolLoopAgent],
  ] as const) {
    test(`agents as tools, two at once (${how}): each a child run with its calls under it`, async () => {
      const { guard, log, model, result } = await lead("fan-out", "fan_out", { runner });
      assert.equal(result.text, "done");
      assert.deepEqual(reads(model).sort(), TOPICS.map(reportOf).sort());
      await assertFanOutTree(live.fb.nats, guard.run.id);
      assert.equal(log.count("list_issues"), 4);
      // The sub-agents' model turns are theirs.
      await assertLeadClosed(live.stack, guard.run.id);
    });
  }

  test("a sub-agent the guard stops ends there; the lead reads why and goes on", async () => {
    const { guard, log, model, result } = await lead("child-stop", "then_search", {
      child: { policy: { max_steps: 1 } },
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("list_issues"), 1);
    // The lead's next call ran, with the daemon's word that its sub-agent was stopped.
    await assertStepBudgetStopTold(live.fb.nats, guard.run, reads(model));
  });

  test("a sub-agent past a cap never starts; the lead reads the refusal", async () => {
    const { log, model, result } = await lead("cap", "twice", {
      root: { policy: { max_children: 1 } },
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const [first, second] = reads(model);
    assert.equal(first, reportOf(TOPICS[0]));
    assert.match(
      second ?? "",
      /^fusebox stopped the sub-agent researcher \(run .*-researcher-2\): STOPPED_LOOP_GUARD \(spawn_limit\): sub-agent not started: .*\(max_children 1\)\. Its task is not done/,
    );
  });
});
