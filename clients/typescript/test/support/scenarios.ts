/**
 * What the scripted model asks for, turn by turn, in each scenario; the same script drives
 * every framework's fake model, so the adapters are judged on the same runs (the Python
 * suites' tests/py/support/scenarios.py, kept the same).
 */
import { PAGES } from "./guard.js";

export type Call = [tool: string, args: Record<string, unknown>];
export type Scenario =
  | "runaway"
  | "ping_pong"
  | "pagination"
  | "retry_side_effect"
  | "parallel_runaway"
  | "one_search"
  | "one_email";

export const SEARCH: Call = ["search", { query: "weather tokyo" }];
export const OPEN_PAGE: Call = ["open_page", { url: "https://jma.go.jp" }];
export const EMAIL: Call = ["send_email", { to: "oncall@example.com", incident: "INC-7" }];

/** The tool calls of model turn `turn` (0-based); null = the final answer. */
export function nextCalls(scenario: Scenario, turn: number): Call[] | null {
  switch (scenario) {
    case "runaway": // the same search forever
      return [SEARCH];
    case "ping_pong": // A B A B … with the same results
      return [turn % 2 === 0 ? SEARCH : OPEN_PAGE];
    case "pagination": // 12 new pages, then done
      return turn < PAGES ? [["list_issues", { page: turn + 1 }]] : null;
    case "retry_side_effect": // the email, then the model "retries" it
      return turn < 2 ? [EMAIL] : null;
    case "parallel_runaway": // three identical searches per turn
      return [SEARCH, SEARCH, SEARCH];
    case "one_search":
      return turn < 1 ? [SEARCH] : null;
    case "one_email":
      return turn < 1 ? [EMAIL] : null;
  }
}

/** The business identity of the side effect: one notification per incident. The ledger
 * outlives a run, so each test's incident is its own (`scope`). */
export function opKeyFor(scope: string) {
  return (tool: string, args: unknown): string | undefined => {
    if (tool === "send_email" && typeof args === "object" && args !== null) {
      return `${scope}:${String((args as Record<string, unknown>).incident)}:email`;
    }
    return undefined;
  };
}
