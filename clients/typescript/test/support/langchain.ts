/**
 * The LangChain.js pieces the `createAgent` and LangGraph.js suites share: the scripted
 * `fakeModel()` (no LLM, no network), the scenario tools as LangChain tools, and the
 * checks on a message history.
 */
import assert from "node:assert/strict";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { type FakeBuiltModel, fakeModel } from "@langchain/core/testing";
import { tool } from "@langchain/core/tools";
import { z } from "zod";
import {
  listIssuesOutput,
  openPageOutput,
  searchOutput,
  sendEmailOutput,
  type ToolLog,
} from "./guard.js";
import { nextCalls, type Scenario } from "./scenarios.js";

/** An AI message with usage: @langchain/core's types infer `usage_metadata` as
 * `undefined` for the default message structure, though the runtime reads it. */
const aiMessage = (fields: Record<string, unknown>): AIMessage =>
  new AIMessage(fields as ConstructorParameters<typeof AIMessage>[0] & object);

export function scripted(scenario: Scenario): FakeBuiltModel {
  const model = fakeModel();
  let turn = 0;
  for (let i = 0; i < 100; i++) {
    model.respond(() => {
      const k = turn++;
      const calls = nextCalls(scenario, k);
      const usage_metadata = { input_tokens: 120, output_tokens: 30, total_tokens: 150 };
      if (calls === null) return aiMessage({ content: "done", usage_metadata });
      return aiMessage({
        content: "",
        tool_calls: calls.map(([name, args], j) => ({
          name,
          args,
          id: `call_${k}_${j}`,
          type: "tool_call" as const,
        })),
        usage_metadata,
      });
    });
  }
  return model;
}

export function makeTools(log: ToolLog, onTool?: (executions: number) => Promise<void>) {
  return [
    tool(
      async ({ query }: { query: string }) => {
        log.calls.push(["search", query]);
        return JSON.stringify(searchOutput(query));
      },
      { name: "search", description: "Search the web.", schema: z.object({ query: z.string() }) },
    ),
    tool(
      async ({ url }: { url: string }) => {
        log.calls.push(["open_page", url]);
        return JSON.stringify(openPageOutput(url));
      },
      { name: "open_page", description: "Open a page.", schema: z.object({ url: z.string() }) },
    ),
    tool(
      async ({ page }: { page: number }) => {
        log.calls.push(["list_issues", page]);
        await onTool?.(log.calls.length);
        return JSON.stringify(listIssuesOutput(page));
      },
      {
        name: "list_issues",
        description: "List one page of issues.",
        schema: z.object({ page: z.number() }),
      },
    ),
    tool(
      async ({ to }: { to: string; incident: string }) => {
        log.calls.push(["send_email", to]);
        return JSON.stringify(sendEmailOutput(to));
      },
      {
        name: "send_email",
        description: "Notify someone about an incident.",
        schema: z.object({ to: z.string(), incident: z.string() }),
      },
    ),
  ];
}

/** Every tool call in the history has a ToolMessage for its id. */
export function assertHistoryValid(messages: BaseMessage[]): void {
  const answered = new Set(
    messages
      .filter((m) => ToolMessage.isInstance(m))
      .map((m) => (m as unknown as ToolMessage).tool_call_id),
  );
  for (const m of messages) {
    if (!AIMessage.isInstance(m)) continue;
    for (const call of (m as unknown as AIMessage).tool_calls ?? []) {
      assert.ok(answered.has(call.id ?? ""), `unanswered call id ${call.id}`);
    }
  }
}

export function reads(messages: BaseMessage[]): string[] {
  return messages.filter((m) => ToolMessage.isInstance(m)).map((m) => String(m.content));
}
