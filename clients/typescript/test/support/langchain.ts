/**
 * The LangChain.js pieces the `createAgent` and LangGraph.js suites share: the scripted
 * `fakeModel()`s (no LLM, no network: a scenario's, and the sub-agents' conversation),
 * the scenario tools as LangChain tools, and the checks on a message history.
 */
import assert from "node:assert/strict";
import { AIMessage, type BaseMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
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
import { type Call, nextCalls, type Scenario } from "./scenarios.js";

/** An AI message with usage: @langchain/core's types infer `usage_metadata` as
 * `undefined` for the default message structure, though the runtime reads it. */
const aiMessage = (fields: Record<string, unknown>): AIMessage =>
  new AIMessage(fields as ConstructorParameters<typeof AIMessage>[0] & object);

/** A scripted model's answer: its final text, or a call of each of `answer`'s tools (the
 * call ids from `callId`). */
function reply(answer: Call[] | string, callId: (index: number) => string): AIMessage {
  const usage_metadata = { input_tokens: 120, output_tokens: 30, total_tokens: 150 };
  if (typeof answer === "string") return aiMessage({ content: answer, usage_metadata });
  return aiMessage({
    content: "",
    tool_calls: answer.map(([name, args], j) => ({
      name,
      args,
      id: callId(j),
      type: "tool_call" as const,
    })),
    usage_metadata,
  });
}

export function scripted(scenario: Scenario): FakeBuiltModel {
  const model = fakeModel();
  let turn = 0;
  for (let i = 0; i < 100; i++) {
    model.respond(() => {
      const k = turn++;
      return reply(nextCalls(scenario, k) ?? "done", (j) => `call_${k}_${j}`);
    });
  }
  return model;
}

let callIds = 0;

/** A scripted model that answers from its conversation (sub-agents share one model and
 * run at once): its turn is the number of AI messages so far, its task the first human
 * message. */
export function conversation(
  respond: (turn: number, task: string) => Call[] | string,
): FakeBuiltModel {
  const model = fakeModel();
  for (let i = 0; i < 100; i++) {
    model.respond((messages: BaseMessage[]) => {
      const turn = messages.filter((m) => AIMessage.isInstance(m)).length;
      const task = String(messages.find((m) => HumanMessage.isInstance(m))?.content ?? "");
      return reply(respond(turn, task), () => `call_${callIds++}`);
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
