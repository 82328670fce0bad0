/**
 * The sub-agent scripts every framework's suite runs (guard contract §6): a lead agent
 * that hands work to a researcher sub-agent, and the researcher's own turns. The same
 * scripts drive each framework's fake models, so the adapters are judged on the same
 * trees.
 */
import type { Call } from "./scenarios.js";

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
