/**
 * Sub-agents of the LangChain.js `createAgent` middleware as child runs (guard contract
 * §6): an agent used as a tool, built with the same middleware, with the real packages,
 * the scripted `fakeModel()` (no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { type BaseMessage, HumanMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { createAgent } from "langchain";
import { z } from "zod";
import { fuseboxMiddleware } from "../src/adapters/langchain.js";
import type { RunOptions } from "../src/index.js";
import { connectedStack, counters, ToolLog } from "./support/guard.js";
import { conversation, makeTools, reads } from "./support/langchain.js";
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
import { children, tree } from "./support/trees.js";

describe("LangChain.js createAgent sub-agents", () => {
  const live = connectedStack();

  /** A lead agent whose `research` tool invokes a researcher agent, both built with the
   * same middleware. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; researcher?: ResearcherScript } = {},
  ) {
    const run = await startLead(live.fb, `lc-${name}`, opts.root);
    const middleware = fuseboxMiddleware(run);
    const log = new ToolLog();
    const researcher = createAgent({
      model: conversation((turn, task) => researcherReply(opts.researcher ?? "pages", turn, task)),
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
      model: conversation((turn) => leadReply(script, turn)),
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
    const kids = await assertFanOutTree(live.fb.nats, run.id, { agent: "research" });
    for (const kid of kids) assert.equal((await counters(live.stack, kid.run)).model_turns, 3);
    assert.equal(log.count("list_issues"), 4);
    await assertLeadClosed(live.stack, run.id);
  });

  test("a sub-agent the guard stops ends there; the lead reads why and goes on", async () => {
    const { run, log, messages } = await lead("child-stop", "then_search", {
      researcher: "runaway",
    });
    assert.equal(String(messages.at(-1)?.content), "done");
    const [research, search] = reads(messages);
    const kid = children(await tree(live.fb.nats, run.id), run.id)[0];
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
