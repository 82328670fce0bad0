/**
 * Sub-agents of the LangGraph.js adapter as child runs (guard contract §6): a subgraph run
 * from a tool (an agent used as a tool, several at once) and from a node of the parent
 * graph, with the real packages (`@langchain/langgraph` 1.7), the scripted `fakeModel()`
 * (no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { AIMessage, HumanMessage } from "@langchain/core/messages";
import type { FakeBuiltModel } from "@langchain/core/testing";
import { tool } from "@langchain/core/tools";
import {
  type LangGraphRunnableConfig,
  MessagesAnnotation,
  START,
  StateGraph,
} from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { z } from "zod";
import { LangGraphGuard } from "../src/adapters/langgraph.js";
import type { RunOptions } from "../src/index.js";
import { connectedStack, counters, ToolLog } from "./support/guard.js";
import { conversation, makeTools, reads } from "./support/langchain.js";
import {
  assertFanOutTree,
  assertStepBudgetStopTold,
  type LeadScript,
  leadReply,
  type ResearcherScript,
  reportOf,
  researcherReply,
  startLead,
  TOPICS,
} from "./support/subagents.js";
import { children, executed, tree } from "./support/trees.js";

type State = typeof MessagesAnnotation.State;

/** An agent graph: the model, then its tools (wrapped by `guard`), until it answers. */
function agentGraph(
  guard: LangGraphGuard,
  model: FakeBuiltModel,
  tools: ReturnType<typeof makeTools>,
) {
  const callModel = async (state: State, config: LangGraphRunnableConfig) => ({
    messages: [await model.invoke(state.messages, config)],
  });
  return new StateGraph(MessagesAnnotation)
    .addNode("agent", callModel)
    .addNode("tools", new ToolNode(guard.tools(tools)))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition)
    .addConditionalEdges("tools", guard.afterTools("agent"))
    .compile();
}

const lastText = (state: State): string => String(state.messages.at(-1)?.content ?? "");

describe("LangGraph.js sub-agents", () => {
  const live = connectedStack();

  /** A lead graph whose `research` tool runs the researcher subgraph as a sub-agent; the
   * subgraph is built once, with the lead guard's tools. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; child?: RunOptions; researcher?: ResearcherScript } = {},
  ) {
    const guard = new LangGraphGuard(await startLead(live.fb, `lg-${name}`, opts.root));
    const log = new ToolLog();
    const researcher = agentGraph(
      guard,
      conversation((turn, task) => researcherReply(opts.researcher ?? "pages", turn, task)),
      makeTools(log),
    );
    const research = tool(
      async ({ topic }: { topic: string }, config: LangGraphRunnableConfig) =>
        guard.subAgent(
          async (child) =>
            lastText(
              (await child.invoke(
                researcher,
                { messages: [new HumanMessage(topic)] },
                config,
              )) as State,
            ),
          { agent: "researcher", ...opts.child },
        ),
      {
        name: "research",
        description: "Research a topic.",
        schema: z.object({ topic: z.string() }),
      },
    );
    const model = conversation((turn) => leadReply(script, turn));
    const graph = agentGraph(guard, model, [research, ...makeTools(log)] as ReturnType<
      typeof makeTools
    >);
    const state = (await guard.invoke(graph, {
      messages: [new HumanMessage("triage the queue")],
    })) as State;
    return { guard, log, state };
  }

  test("a subgraph used as a tool, two at once: each a child run with its calls under it", async () => {
    const { guard, log, state } = await lead("fan-out", "fan_out");
    assert.equal(lastText(state), "done");
    assert.deepEqual(reads(state.messages).sort(), TOPICS.map(reportOf).sort());
    const kids = await assertFanOutTree(live.fb.nats, guard.run.id);
    assert.equal(log.count("list_issues"), 4);
    // The subgraphs' model turns are theirs, though they ran with the lead's callbacks.
    assert.equal((await counters(live.stack, guard.run.id)).model_turns, 2);
    for (const kid of kids) assert.equal((await counters(live.stack, kid.run)).model_turns, 3);
  });

  test("a subgraph the guard stops ends there; the lead reads why and goes on", async () => {
    const { guard, log, state } = await lead("child-stop", "then_search", {
      child: { policy: { max_steps: 1 } },
    });
    assert.equal(lastText(state), "done");
    assert.equal(log.count("list_issues"), 1);
    await assertStepBudgetStopTold(live.fb.nats, guard.run, reads(state.messages));
  });

  test("a subgraph past a cap never starts; the lead reads the refusal", async () => {
    const { log, state } = await lead("cap", "twice", { root: { policy: { max_children: 1 } } });
    assert.equal(lastText(state), "done");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const [first, second] = reads(state.messages);
    assert.equal(first, reportOf(TOPICS[0]));
    assert.match(
      second ?? "",
      /\(spawn_limit\): sub-agent not started: .*\(max_children 1\)\. Its task/,
    );
  });

  test("a subgraph run from a node of the parent graph is a child run", async () => {
    const guard = new LangGraphGuard(await startLead(live.fb, "lg-node"));
    const log = new ToolLog();
    const researcher = agentGraph(
      guard,
      conversation((turn, task) => researcherReply("pages", turn, task)),
      makeTools(log),
    );
    const graph = new StateGraph(MessagesAnnotation)
      .addNode("research", async (state: State, config: LangGraphRunnableConfig) => {
        const answer = await guard.subAgent(
          async (child) =>
            lastText(
              (await child.invoke(researcher, { messages: state.messages }, config)) as State,
            ),
          { agent: "researcher" },
        );
        return { messages: [new AIMessage(answer)] };
      })
      .addEdge(START, "research")
      .compile();
    const state = (await guard.invoke(graph, { messages: [new HumanMessage("billing")] })) as State;
    assert.equal(lastText(state), reportOf("billing"));
    const nodes = await tree(live.fb.nats, guard.run.id);
    const [kid] = children(nodes, guard.run.id);
    assert.deepEqual(kid && executed(kid), ["list_issues", "list_issues"]);
    assert.deepEqual(nodes.get(guard.run.id)?.calls, []);
    assert.equal(nodes.get(guard.run.id)?.reason, "completed");
  });
});
