/**
 * The OpenAI Agents JS pieces its suites share: a scripted `Model`'s answers, and the
 * scenario tools as SDK function tools, which log what they really executed.
 */
import { type ModelResponse, tool, Usage } from "@openai/agents";
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
export function modelResponse(
  reply: Call[] | string,
  callId: (index: number) => string,
): ModelResponse {
  const usage = new Usage({ requests: 1, inputTokens: 120, outputTokens: 30, totalTokens: 150 });
  if (typeof reply === "string") {
    return {
      usage,
      output: [
        {
          type: "message",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: reply }],
        },
      ],
    };
  }
  return {
    usage,
    output: reply.map(([name, args], i) => ({
      type: "function_call" as const,
      callId: callId(i),
      name,
      arguments: JSON.stringify(args),
      status: "completed" as const,
    })),
  };
}

/** The scenario tools; `onTool` runs inside each `list_issues` execution. */
export function makeTools(log: ToolLog, onTool?: (executions: number) => Promise<void>) {
  return [
    tool({
      name: "search",
      description: "Search the web.",
      parameters: z.object({ query: z.string() }),
      execute: async ({ query }) => {
        log.calls.push(["search", query]);
        return searchOutput(query);
      },
    }),
    tool({
      name: "open_page",
      description: "Open a page.",
      parameters: z.object({ url: z.string() }),
      execute: async ({ url }) => {
        log.calls.push(["open_page", url]);
        return openPageOutput(url);
      },
    }),
    tool({
      name: "list_issues",
      description: "List one page of issues.",
      parameters: z.object({ page: z.number() }),
      execute: async ({ page }) => {
        log.calls.push(["list_issues", page]);
        await onTool?.(log.calls.length);
        return listIssuesOutput(page);
      },
    }),
    tool({
      name: "send_email",
      description: "Notify someone about an incident.",
      parameters: z.object({ to: z.string(), incident: z.string() }),
      execute: async ({ to }) => {
        log.calls.push(["send_email", to]);
        return sendEmailOutput(to);
      },
    }),
  ];
}
