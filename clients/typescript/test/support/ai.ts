/**
 * The Vercel AI SDK pieces its suites share: a scripted model's answers, and the scenario
 * tools as AI SDK tools, which log what they really executed.
 */
import type { LanguageModelV4GenerateResult } from "@ai-sdk/provider";
import { tool } from "ai";
import { z } from "zod";
import {
  listIssuesOutput,
  openPageOutput,
  searchOutput,
  sendEmailOutput,
  type ToolLog,
} from "./guard.js";
import type { Call } from "./scenarios.js";

/** A scripted model's answer: its final text, or a call of each of `reply`'s tools (the
 * call ids from `callId`). */
export function generateResult(
  reply: Call[] | string,
  callId: (index: number) => string,
): LanguageModelV4GenerateResult {
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
    content: reply.map(([name, args], i) => ({
      type: "tool-call" as const,
      toolCallId: callId(i),
      toolName: name,
      input: JSON.stringify(args),
    })),
    finishReason: { unified: "tool-calls", raw: "tool_calls" },
    usage,
    warnings: [],
  };
}

/** The scenario tools; `onTool` runs inside each `list_issues` execution. */
export function makeTools(log: ToolLog, onTool?: (executions: number) => Promise<void>) {
  return {
    search: tool({
      description: "Search the web.",
      inputSchema: z.object({ query: z.string() }),
      execute: async ({ query }) => {
        log.calls.push(["search", query]);
        return searchOutput(query);
      },
    }),
    open_page: tool({
      description: "Open a page.",
      inputSchema: z.object({ url: z.string() }),
      execute: async ({ url }) => {
        log.calls.push(["open_page", url]);
        return openPageOutput(url);
      },
    }),
    list_issues: tool({
      description: "List one page of issues.",
      inputSchema: z.object({ page: z.number() }),
      execute: async ({ page }) => {
        log.calls.push(["list_issues", page]);
        await onTool?.(log.calls.length);
        return listIssuesOutput(page);
      },
    }),
    send_email: tool({
      description: "Notify someone about an incident.",
      inputSchema: z.object({ to: z.string(), incident: z.string() }),
      execute: async ({ to }) => {
        log.calls.push(["send_email", to]);
        return sendEmailOutput(to);
      },
    }),
  };
}
