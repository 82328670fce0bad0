/**
 * Sub-agents of the LangGraph.js adapter as child runs (guard contract §6): a subgraph run
 * from a tool (an agent used as a tool, several at once) and from a node of the parent
 * graph, with the real packages (`@langchain/langgraph` 1.7), the scripted `fakeModel()`
 * (no LLM, no network), a real nats-server and fuseboxd.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { AIMessage, type BaseMessage, HumanMessage } from "@langchain/core/messages";
import { type FakeBuiltModel, fakeModel } from "@langchain/core/testing";
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

type State = typeof MessagesAnnotation.State;

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

  /** A lead graph whose `research` tool runs the researcher subgraph as a sub-agent; the
   * subgraph is built once, with the lead guard's tools. */
  async function lead(
    name: string,
    script: LeadScript,
    opts: { root?: RunOptions; child?: RunOptions; researcher?: ResearcherScript } = {},
  ) {
    const guard = new LangGraphGuard(
      await fb.startRun(freshRun(`lg-${name}`), { agent: "lead", ...opts.root }),
    );
    const log = new ToolLog();
    const researcher = agentGraph(
      guard,
      conversation(
        (turn, task) => researcherCalls(opts.researcher ?? "pages", turn) ?? reportOf(task),
      ),
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
    const model = conversation((turn) => {
      const tasks = leadTasks(script, turn);
      if (tasks === null) return "done";
      return [...tasks.map((topic): Call => ["research", { topic }]), ...leadCalls(script, turn)];
    });
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
    // The subgraphs' model turns are theirs, though they ran with the lead's callbacks.
    const counters = async (run: string) =>
      (await runStatus(stack, run)).counters as Record<string, number>;
    assert.equal((await counters(guard.run.id)).model_turns, 2);
    for (const kid of kids) assert.equal((await counters(kid.run)).model_turns, 3);
  });

  test("a subgraph the guard stops ends there; the lead reads why and goes on", async () => {
    const { guard, log, state } = await lead("child-stop", "then_search", {
      child: { policy: { max_steps: 1 } },
    });
    assert.equal(lastText(state), "done");
    assert.equal(log.count("list_issues"), 1);
    const [research, search] = reads(state.messages);
    const kid = children(await tree(fb.nats, guard.run.id), guard.run.id)[0];
    assert.equal(kid?.reason, "step_budget");
    assert.equal(
      research,
      `fusebox stopped the sub-agent researcher (run ${kid?.run}): STOPPED_LOOP_GUARD (step_budget). Its task is not done: do it another way or report that it could not be done, rather than starting the same sub-agent again.`,
    );
    assert.match(search ?? "", /\[fusebox warning\] a sub-agent of this run was stopped/);
    assert.equal(guard.run.stopped, null);
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
    const guard = new LangGraphGuard(await fb.startRun(freshRun("lg-node"), { agent: "lead" }));
    const log = new ToolLog();
    const researcher = agentGraph(
      guard,
      conversation((turn, task) => researcherCalls("pages", turn) ?? reportOf(task)),
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
    const nodes = await tree(fb.nats, guard.run.id);
    const [kid] = children(nodes, guard.run.id);
    assert.deepEqual(kid && executed(kid), ["list_issues", "list_issues"]);
    assert.deepEqual(nodes.get(guard.run.id)?.calls, []);
    assert.equal(nodes.get(guard.run.id)?.reason, "completed");
  });
});
