/**
 * Sub-agents of the LangChain.js `createAgent` middleware as child runs (guard contract
 * §6): an agent used as a tool, built with the same middleware, with the real packages,
 * the scripted `fakeModel()` (no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AIMessage, type BaseMessage, HumanMessage } from "@langchain/core/messages";
import { type FakeBuiltModel, fakeModel } from "@langchain/core/testing";
import { tool } from "@langchain/core/tools";
import { createAgent } from "langchain";
import { z } from "zod";
import { fuseboxMiddleware } from "../src/adapters/langchain.js";
import { Fusebox, type RunOptions } from "../src/index.js";
import { freshRun, runStatus, TENANT, ToolLog } from "./support/guard.js";
import { makeTools, reads } from "./support/langchain.js";
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

let callIds = 0;

/** A scripted model that answers from its conversation (sub-agents share one model and
 * run at once): its turn is the number of AI messages so far, its task the first human
 * message. */
function conversation(respond: (turn: number, task: string) => Call[] | string): FakeBuiltModel {
  const model = fakeModel();
  for (let i = 0; i < 100; i++) {
    model.respond((messages: BaseMessage[]) => {
      const turn = messages.filter((m) => AIMessage.isInstance(m)).length;
      const task = String(messages.find((m) => HumanMessage.isInstance(m))?.content ?? "");
      const reply = respond(turn, task);
      const usage_metadata = { input_tokens: 120, output_tokens: 30, total_tokens: 150 };
      const fields =
        typeof reply === "string"
          ? { content: reply, usage_metadata }
          : {
              content: "",
              tool_calls: reply.map(([name, args]) => ({
                name,
                args,
                id: `call_${callIds++}`,
                type: "tool_call" as const,
              })),
              usage_metadata,
            };
      return new AIMessage(fields as ConstructorParameters<typeof AIMessage>[0] & object);
    });
  }
  return model;
}

describe("LangChain.js createAgent sub-agents", () => {
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

  /** A lead agent whose `research` tool invokes a researcher agent, both built with the
   * same middleware. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; researcher?: ResearcherScript } = {},
  ) {
    const run = await fb.startRun(freshRun(`lc-${name}`), { agent: "lead", ...opts.root });
    const middleware = fuseboxMiddleware(run);
    const log = new ToolLog();
    const researcher = createAgent({
      model: conversation(
        (turn, task) => researcherCalls(opts.researcher ?? "pages", turn) ?? reportOf(task),
      ),
      tools: makeTools(log),
      middleware: [middleware],
    });
    const research = tool(
      async ({ topic }: { topic: string }) => {
        const state = await researcher.invoke({ messages: [new HumanMessage(topic)] });
        return String(state.messages.at(-1)?.content ?? "");
      },
      {
        name: "research",
        description: "Research a topic.",
        schema: z.object({ topic: z.string() }),
      },
    );
    const agent = createAgent({
      model: conversation((turn) => {
        const tasks = leadTasks(script, turn);
        if (tasks === null) return "done";
        return [...tasks.map((topic): Call => ["research", { topic }]), ...leadCalls(script, turn)];
      }),
      tools: [research, ...makeTools(log)],
      middleware: [middleware],
    });
    const state = await agent.invoke({ messages: [new HumanMessage("triage the queue")] });
    return { run, log, messages: state.messages as BaseMessage[] };
  }

  test("an agent used as a tool, two at once: each a child run with its calls under it", async () => {
    const { run, log, messages } = await lead("fan-out", "fan_out");
    assert.equal(String(messages.at(-1)?.content), "done");
    assert.deepEqual(reads(messages).sort(), TOPICS.map(reportOf).sort());
    const nodes = await tree(fb.nats, run.id);
    assert.deepEqual(nodes.get(run.id)?.calls, [
      ["research", "execute"],
      ["research", "execute"],
    ]);
    const kids = children(nodes, run.id);
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.equal(kid.agent, "research");
      assert.deepEqual(executed(kid), ["list_issues", "list_issues"]);
      assert.equal(kid.reason, "completed");
      const counters = (await runStatus(stack, kid.run)).counters as Record<string, number>;
      assert.equal(counters.model_turns, 3);
    }
    assert.equal(log.count("list_issues"), 4);
    const status = await runStatus(stack, run.id);
    assert.equal((status.counters as Record<string, number>).model_turns, 2);
    assert.equal((status.summary as { open: boolean }).open, false);
  });

  test("a sub-agent the guard stops ends there; the lead reads why and goes on", async () => {
    const { run, log, messages } = await lead("child-stop", "then_search", {
      researcher: "runaway",
    });
    assert.equal(String(messages.at(-1)?.content), "done");
    const [research, search] = reads(messages);
    const kid = children(await tree(fb.nats, run.id), run.id)[0];
    assert.equal(kid?.reason, "consecutive_blocks");
    assert.match(
      research ?? "",
      new RegExp(
        `^fusebox stopped the sub-agent research \\(run ${kid?.run}\\): STOPPED_LOOP_GUARD \\(consecutive_blocks\\)\\. Its task is not done`,
      ),
    );
    assert.match(search ?? "", /\[fusebox warning\] a sub-agent of this run was stopped/);
    assert.equal(log.count("search"), 3 + 1);
    assert.equal(run.stopped, null);
  });

  test("a sub-agent past a cap never reaches its model; the lead reads the refusal", async () => {
    const { log, messages } = await lead("cap", "twice", { root: { policy: { max_children: 1 } } });
    assert.equal(String(messages.at(-1)?.content), "done");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const [first, second] = reads(messages);
    assert.equal(first, reportOf(TOPICS[0]));
    assert.match(
      second ?? "",
      /^fusebox stopped the sub-agent research \(run .*-research-2\): STOPPED_LOOP_GUARD \(spawn_limit\): sub-agent not started/,
    );
  });
});
