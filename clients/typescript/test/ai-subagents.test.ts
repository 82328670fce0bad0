/**
 * Sub-agents of the AI SDK adapter as child runs (guard contract §6): an agent used as a
 * tool, through `guard.subAgent`, with the real SDK (`ai` 7), its scripted model
 * (`MockLanguageModelV4`: no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from "@ai-sdk/provider";
import { stepCountIs, ToolLoopAgent, type ToolSet, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { z } from "zod";
import { AiSdkGuard } from "../src/adapters/ai.js";
import { Fusebox, type RunOptions } from "../src/index.js";
import {
  freshRun,
  listIssuesOutput,
  runStatus,
  searchOutput,
  TENANT,
  ToolLog,
} from "./support/guard.js";
import type { Call } from "./support/scenarios.js";
import { type Stack, startStack } from "./support/stack.js";
import {
  type LeadScript,
  leadCalls,
  leadTasks,
  type ResearcherScript,
  reportOf,
  researcherCalls,
  TOPICS,
} from "./support/subagents.js";
import { children, executed, tree } from "./support/trees.js";

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
      const reply = respond(turn, task);
      const usage = {
        inputTokens: { total: 120, noCache: 120, cacheRead: undefined, cacheWrite: undefined },
        outputTokens: { total: 30, text: 30, reasoning: undefined },
      };
      if (typeof reply === "string") {
        return {
          content: [{ type: "text", text: reply }],
          finishReason: { unified: "stop", raw: "stop" },
          usage,
          warnings: [],
        };
      }
      return {
        content: reply.map(([name, args]) => ({
          type: "tool-call" as const,
          toolCallId: `call_${ids++}`,
          toolName: name,
          input: JSON.stringify(args),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
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

function workTools(log: ToolLog) {
  return {
    search: tool({
      description: "Search the web.",
      inputSchema: z.object({ query: z.string() }),
      execute: async ({ query }) => {
        log.calls.push(["search", query]);
        return searchOutput(query);
      },
    }),
    list_issues: tool({
      description: "List one page of issues.",
      inputSchema: z.object({ page: z.number() }),
      execute: async ({ page }) => {
        log.calls.push(["list_issues", page]);
        return listIssuesOutput(page);
      },
    }),
  };
}

const researcherModel = (script: ResearcherScript) =>
  conversation((turn, task) => researcherCalls(script, turn) ?? reportOf(task));

const leadModel = (script: LeadScript) =>
  conversation((turn) => {
    const tasks = leadTasks(script, turn);
    if (tasks === null) return "done";
    return [...tasks.map((topic): Call => ["research", { topic }]), ...leadCalls(script, turn)];
  });

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
  let stack: Stack;
  let fb: Fusebox;

  before(async () => {
    stack = await startStack();
    fb = await Fusebox.connect(stack.natsUrl, { tenant: TENANT });
  });
  after(async () => {
    await fb.close();
    await stack.stop();
  });

  /** The lead, whose `research` tool runs the researcher as a sub-agent. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; child?: RunOptions; runner?: Runner } = {},
  ) {
    const guard = new AiSdkGuard(
      await fb.startRun(freshRun(`ai-${name}`), { agent: "lead", ...opts.root }),
    );
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
      const nodes = await tree(fb.nats, guard.run.id);
      assert.deepEqual(nodes.get(guard.run.id)?.calls, [
        ["research", "execute"],
        ["research", "execute"],
      ]);
      const kids = children(nodes, guard.run.id);
      assert.equal(kids.length, 2);
      for (const kid of kids) {
        assert.equal(kid.agent, "researcher");
        assert.deepEqual(executed(kid), ["list_issues", "list_issues"]);
        assert.equal(kid.reason, "completed");
      }
      assert.equal(log.count("list_issues"), 4);
      // The sub-agents' model turns are theirs.
      const status = await runStatus(stack, guard.run.id);
      assert.equal((status.counters as Record<string, number>).model_turns, 2);
      assert.equal((status.summary as { open: boolean }).open, false);
    });
  }

  test("a sub-agent the guard stops ends there; the lead reads why and goes on", async () => {
    const { guard, log, model, result } = await lead("child-stop", "then_search", {
      child: { policy: { max_steps: 1 } },
    });
    assert.equal(result.text, "done");
    assert.equal(log.count("list_issues"), 1);
    const [research, search] = reads(model);
    const kid = children(await tree(fb.nats, guard.run.id), guard.run.id)[0];
    assert.equal(kid?.reason, "step_budget");
    assert.equal(
      research,
      `fusebox stopped the sub-agent researcher (run ${kid?.run}): STOPPED_LOOP_GUARD (step_budget). Its task is not done: do it another way or report that it could not be done, rather than starting the same sub-agent again.`,
    );
    // The lead's next call ran, with the daemon's word that its sub-agent was stopped.
    assert.match(search ?? "", /\[fusebox warning\] a sub-agent of this run was stopped/);
    assert.equal(guard.run.stopped, null);
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
