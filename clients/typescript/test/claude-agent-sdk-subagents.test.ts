/**
 * Sub-agents of the Claude Agent SDK adapter as child runs (guard contract §6): the
 * `Agent` tool starting a programmatic sub-agent, with the real SDK driving its Claude
 * Code binary offline against a scripted model API on loopback, a real nats-server and
 * fuseboxd.
 */
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import type { Options } from "@anthropic-ai/claude-agent-sdk";
import { ClaudeAgentGuard } from "../src/adapters/claude-agent-sdk.js";
import type { RunOptions } from "../src/index.js";
import { makeServer, PREFIX, SERVER, toolUses, workspace } from "./support/claude-agent-sdk.js";
import { type Body, FakeAnthropic, type Turn, text } from "./support/fake-anthropic.js";
import { connectedStack, counters, runStatus, ToolLog } from "./support/guard.js";
import {
  assertFanOutTree,
  assertLeadClosed,
  type LeadScript,
  leadCalls,
  leadTasks,
  reportOf,
  researcherCalls,
  startLead,
  TOPICS,
} from "./support/subagents.js";
import { children, executed, tree } from "./support/trees.js";

type Block = { type?: string; text?: string; content?: unknown };

/** The text of a message's content (a string, or its text blocks). */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return (content as Block[])
    .map((b) => (b.type === "tool_result" ? textOf(b.content) : (b.text ?? "")))
    .join("\n");
}

/** Which conversation a request belongs to: its first user message ends with the task
 * (the lead's prompt, or the prompt of the `Agent` call that started a sub-agent). */
const taskOf = (body: Body): string =>
  textOf(body.messages?.find((m) => m.role === "user")?.content)
    .split("\n")
    .at(-1) ?? "";

/**
 * The lead and its researchers, on one scripted API: the lead hands each task to the
 * `researcher` sub-agent (in the foreground, so its answer is the call's output, unless
 * `background`: Claude Code's default, whose answer comes later as a notice); a
 * researcher lists two pages and reports, or (`runaway`) searches the same thing until
 * the guard says it is stopped, and then reports what it has.
 */
function scripted(
  script: LeadScript,
  researcher: "pages" | "runaway",
  background = false,
): FakeAnthropic {
  return new FakeAnthropic((body): Turn => {
    const turn = (body.messages ?? []).filter((m) => m.role === "assistant").length;
    const task = taskOf(body);
    if ((TOPICS as readonly string[]).includes(task)) {
      const last = textOf(body.messages?.at(-1)?.content);
      if (researcher === "runaway") {
        return last.includes("fusebox stopped this run")
          ? text("stopped before the end")
          : toolUses(researcherCalls("runaway", turn) ?? []);
      }
      const calls = researcherCalls("pages", turn);
      return calls === null ? text(reportOf(task)) : toolUses(calls);
    }
    const tasks = leadTasks(script, turn);
    if (tasks === null) return text("done");
    return [
      ...tasks.map((topic) => ({
        type: "tool_use" as const,
        name: "Agent",
        input: {
          description: `research ${topic}`,
          prompt: topic,
          subagent_type: "researcher",
          ...(background ? {} : { run_in_background: false }),
        },
      })),
      ...toolUses(leadCalls(script, turn)),
    ];
  });
}

function options(api: FakeAnthropic, log: ToolLog): Options {
  const { home, work } = workspace("fusebox-ts-claude-sub-");
  const tools = ["search", "list_issues"];
  const mcp = tools.map((name) => PREFIX + name);
  return {
    mcpServers: { [SERVER]: makeServer(log, undefined, tools) },
    tools: ["Agent"],
    allowedTools: ["Agent", ...mcp],
    agents: {
      researcher: { description: "Researches one topic.", prompt: "You research.", tools: mcp },
    },
    env: api.env(home),
    cwd: work,
    maxTurns: 50,
  };
}

/** What the lead read as each `Agent` call's output, in call order. */
function agentAnswers(api: FakeAnthropic): string[] {
  const ids: string[] = [];
  for (const body of api.agentRequests) {
    if ((TOPICS as readonly string[]).includes(taskOf(body))) continue;
    for (const m of body.messages ?? []) {
      if (m.role !== "assistant" || !Array.isArray(m.content)) continue;
      for (const b of m.content as Array<{ type: string; name?: string; id?: string }>) {
        if (b.type === "tool_use" && b.name === "Agent" && !ids.includes(String(b.id))) {
          ids.push(String(b.id));
        }
      }
    }
  }
  const results = api.toolResults();
  return ids.map((id) => results.get(id)?.content ?? "");
}

describe("Claude Agent SDK sub-agents", () => {
  const apis: FakeAnthropic[] = [];
  after(async () => {
    for (const api of apis) await api.stop();
  });
  const live = connectedStack();

  async function lead(
    name: string,
    script: LeadScript,
    researcher: "pages" | "runaway",
    root: RunOptions = {},
    background = false,
  ) {
    const run = await startLead(live.fb, `cas-${name}`, root);
    const guard = new ClaudeAgentGuard(run);
    const api = await scripted(script, researcher, background).start();
    apis.push(api);
    const log = new ToolLog();
    const result = await guard.runAgent("triage the queue", options(api, log));
    return { guard, api, log, result };
  }

  test("an Agent call's sub-agent is a child run with its calls and turns under it", async () => {
    const { guard, api, log, result } = await lead("fan-out", "fan_out", "pages");
    assert.equal(result?.subtype === "success" ? result.result : null, "done");
    const answers = agentAnswers(api);
    assert.equal(answers.length, 2);
    for (const topic of TOPICS) {
      assert.ok(
        answers.some((a) => a.includes(reportOf(topic))),
        `${topic}: ${JSON.stringify(answers)}`,
      );
    }
    const kids = await assertFanOutTree(live.fb.nats, guard.run.id, {
      delegate: "Agent",
      listed: `${PREFIX}list_issues`,
    });
    // Their final turns, which a foreground sub-agent reports only in its call's output.
    for (const kid of kids) {
      assert.equal((await counters(live.stack, kid.run)).model_turns, 3, kid.run);
    }
    assert.equal(log.count("list_issues"), 4);
    await assertLeadClosed(live.stack, guard.run.id);
  });

  test("a background sub-agent is a child run too, closed when its final turn is in", async () => {
    const { guard, api, log, result } = await lead("background", "twice", "pages", {}, true);
    assert.equal(result?.subtype, "success");
    assert.equal(log.count("list_issues"), 4);
    assert.ok(agentAnswers(api).every((a) => a.includes("Async agent launched")));
    const kids = children(await tree(live.fb.nats, guard.run.id), guard.run.id);
    assert.equal(kids.length, 2);
    for (const kid of kids) {
      assert.deepEqual(executed(kid), [`${PREFIX}list_issues`, `${PREFIX}list_issues`]);
      assert.equal(kid.reason, "completed");
      assert.equal((await counters(live.stack, kid.run)).model_turns, 3, kid.run);
    }
  });

  test("a sub-agent the guard stops ends alone; its caller reads why and goes on", async () => {
    const { guard, api, log, result } = await lead("child-stop", "then_search", "runaway");
    assert.equal(result?.subtype, "success");
    assert.equal(guard.run.stopped, null);
    const kid = children(await tree(live.fb.nats, guard.run.id), guard.run.id)[0];
    assert.equal(kid?.reason, "consecutive_blocks");
    const [answer] = agentAnswers(api);
    assert.match(
      answer ?? "",
      new RegExp(
        `fusebox stopped the sub-agent researcher \\(run ${kid?.run}\\): STOPPED_LOOP_GUARD \\(consecutive_blocks\\)`,
      ),
    );
    // The lead's own next call ran.
    assert.equal(log.count("search"), 3 + 1);
    const status = await runStatus(live.stack, guard.run.id);
    assert.equal((status.summary as { reason?: string }).reason, "completed");
  });

  test("a sub-agent past a cap never starts; the caller reads the refusal", async () => {
    const { guard, api, log, result } = await lead("cap", "twice", "pages", {
      policy: { max_children: 1 },
    });
    assert.equal(result?.subtype, "success");
    assert.equal(log.count("list_issues"), 2, "only the first sub-agent ran");
    const [first, second] = agentAnswers(api);
    assert.match(first ?? "", new RegExp(reportOf(TOPICS[0])));
    assert.match(
      second ?? "",
      /fusebox stopped the sub-agent researcher \(run .*-researcher-2\): STOPPED_LOOP_GUARD \(spawn_limit\): sub-agent not started: .*\(max_children 1\)\. Its task is not done/,
    );
    // The refused one never joined the tree: its own run says why.
    assert.equal(children(await tree(live.fb.nats, guard.run.id), guard.run.id).length, 1);
    const refused = await runStatus(live.stack, `${guard.run.id}-researcher-2`);
    assert.equal((refused.summary as { reason?: string }).reason, "spawn_limit");
  });
});
