/**
 * The sub-agent scripts every framework's suite runs (guard contract §6): a lead agent
 * that hands work to a researcher sub-agent, and the researcher's own turns. The same
 * scripts drive each framework's fake models, so the adapters are judged on the same
 * trees, with the same checks of what the daemon holds of them.
 */
import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Fusebox, Run, RunOptions } from "../../src/index.js";
import { freshRun, runStatus } from "./guard.js";
import type { Call } from "./scenarios.js";
import type { Stack } from "./stack.js";
import { children, executed, type TreeNode, tree } from "./trees.js";

export type LeadScript =
  /** Two research tasks in one turn (run at once), then the answer. */
  | "fan_out"
  /** One research task, then a search of its own (where a child's stop is told), then
   * the answer. */
  | "then_search"
  /** One research task per turn, twice, then the answer. */
  | "twice";

export type ResearcherScript =
  /** Two pages of issues, then its report. */
  | "pages"
  /** The same search forever. */
  | "runaway";

export const TOPICS = ["billing", "outage"] as const;

/** The research tasks the lead hands out at its turn `turn` (0-based); [] = none this
 * turn (its other calls, if any, are `leadCalls`); null = the final answer. */
export function leadTasks(script: LeadScript, turn: number): string[] | null {
  switch (script) {
    case "fan_out":
      return turn === 0 ? [...TOPICS] : null;
    case "then_search":
      return turn === 0 ? [TOPICS[0]] : turn === 1 ? [] : null;
    case "twice":
      return turn < 2 ? [TOPICS[turn] as string] : null;
  }
}

/** The lead's own tool calls at its turn `turn` (besides research). */
export function leadCalls(script: LeadScript, turn: number): Call[] {
  return script === "then_search" && turn === 1 ? [["search", { query: "status page" }]] : [];
}

/** The researcher's calls at its turn `turn`; null = its report. */
export function researcherCalls(script: ResearcherScript, turn: number): Call[] | null {
  switch (script) {
    case "pages":
      return turn < 2 ? [["list_issues", { page: turn + 1 }]] : null;
    case "runaway":
      return [["search", { query: "weather tokyo" }]];
  }
}

/** The researcher's final text, which its caller reads as the sub-agent's answer. */
export const reportOf = (topic: string): string => `report on ${topic}`;

/** The lead's run, started (a fresh id from `name`), as agent "lead" unless `opts` says. */
export const startLead = (fb: Fusebox, name: string, opts: RunOptions = {}): Promise<Run> =>
  fb.startRun(freshRun(name), { agent: "lead", ...opts });

/** The lead's reply at its turn `turn`: a `research` call for each task it hands out (its
 * arguments `args(topic)`) and its own calls, or its final answer, "done". */
export function leadReply(
  script: LeadScript,
  turn: number,
  args: (topic: string) => Record<string, unknown> = (topic) => ({ topic }),
): Call[] | string {
  const tasks = leadTasks(script, turn);
  if (tasks === null) return "done";
  return [...tasks.map((topic): Call => ["research", args(topic)]), ...leadCalls(script, turn)];
}

/** The researcher's reply at its turn `turn` to its task: its calls, or its report. */
export const researcherReply = (
  script: ResearcherScript,
  turn: number,
  task: string,
): Call[] | string => researcherCalls(script, turn) ?? reportOf(task);

/** The `fan_out` lead's tree as the daemon holds it: the lead's run made two `delegate`
 * calls, both executed, and under it are two runs of `agent`, each of which executed
 * `listed` twice (the researcher's `pages`) and completed. Those two, by run id. */
export async function assertFanOutTree(
  nc: NatsConnection,
  lead: string,
  names: { delegate?: string; agent?: string; listed?: string } = {},
): Promise<TreeNode[]> {
  const { delegate = "research", agent = "researcher", listed = "list_issues" } = names;
  const nodes = await tree(nc, lead);
  assert.deepEqual(nodes.get(lead)?.calls, [
    [delegate, "execute"],
    [delegate, "execute"],
  ]);
  const kids = children(nodes, lead);
  assert.equal(kids.length, 2);
  for (const kid of kids) {
    assert.equal(kid.agent, agent);
    assert.deepEqual(executed(kid), [listed, listed]);
    assert.equal(kid.reason, "completed");
  }
  return kids;
}

/** The lead's run holds its own two model turns (its sub-agents' are theirs) and is
 * closed. */
export async function assertLeadClosed(stack: Stack, lead: string): Promise<void> {
  const status = await runStatus(stack, lead);
  assert.equal((status.counters as Record<string, number>).model_turns, 2);
  assert.equal((status.summary as { open: boolean }).open, false);
}

/** A `then_search` lead whose researcher the guard stopped at its step budget: the
 * researcher's run closed with `step_budget`; the lead read the stop as the `research`
 * call's output (`research`), and the daemon's word of it with its own next call's
 * output (`next`), and was not stopped. */
export async function assertStepBudgetStopTold(
  nc: NatsConnection,
  lead: Run,
  [research, next]: Array<string | undefined>,
): Promise<void> {
  const kid = children(await tree(nc, lead.id), lead.id)[0];
  assert.equal(kid?.reason, "step_budget");
  assert.equal(
    research,
    `fusebox stopped the sub-agent researcher (run ${kid?.run}): STOPPED_LOOP_GUARD (step_budget). Its task is not done: do it another way or report that it could not be done, rather than starting the same sub-agent again.`,
  );
  assert.match(next ?? "", /\[fusebox warning\] a sub-agent of this run was stopped/);
  assert.equal(lead.stopped, null);
}
