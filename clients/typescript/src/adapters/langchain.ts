/**
 * LangChain.js v1 `createAgent` (`langchain` 1.5): every tool call gated by fuseboxd,
 * as agent middleware.
 *
 *     const agent = createAgent({ model, tools, middleware: [fuseboxMiddleware(run)] });
 *     await agent.invoke({ messages: [{ role: "user", content: "…" }] });
 *     run.stopped;   // the stop report, when the guard ended the run
 *
 * - `wrapToolCall`: a refused call (block, stop, guard unavailable under deny) is answered
 *   with a `ToolMessage` for its call id without calling the tool; `use_completed_result`
 *   answers with the stored result; a `warn`'s message is appended to the tool's output;
 *   every result is reported.
 * - `wrapModelCall`: once the run is stopped (by a gate, a result's decision, or the kill
 *   switch) the model is not called again: the agent's answer is the guard's words,
 *   without tool calls, so the agent ends and every call id in the history has its
 *   answer. Each response's `usage_metadata` → `model_turn`.
 * - The run is closed with `run_finished`: `completed` at the model's final answer (a
 *   response without tool calls; pass `closeRun: false` to keep one run open across
 *   several invokes), `failed` when the model call throws.
 * - Only wrap hooks: a `beforeModel` / `afterModel` / `beforeAgent` / `afterAgent` hook is
 *   a graph node, each node a step of the caller's `recursionLimit`, so the guard costs no
 *   steps: a run makes as many calls as it would unguarded.
 *
 * Sub-agents (guard contract §6): an agent used as a tool — a tool that invokes another
 * `createAgent` built with the same middleware — runs under a child run of the calling
 * run. Its first model call sees the guarded call it runs in (from the async context of
 * the call's `wrapToolCall`) and starts the child, named by the calling tool, for that
 * invocation (its first message's id), so its calls, model turns and stop are its own. Once
 * the tool returns, the child is closed; when the guard stopped it (or the caps refused
 * it at its first model call), the call's answer is a `ToolMessage`
 * (status `error`) with the guard's words, whatever the tool made of the sub-agent's
 * final state. A sub-agent built with another middleware instance is not told apart.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { createMiddleware } from "langchain";
import type { Run } from "../run.js";
import { type ResultKind, summary } from "../types.js";
import { bestEffort, callOptions, childStopText, type GuardOptions, report } from "./common.js";
import { refusal, reportModelTurn } from "./langchain-messages.js";

export interface MiddlewareOptions extends GuardOptions {
  /** Send `run_finished` (`completed`) when the agent ends on its own (default true). */
  closeRun?: boolean;
}

/** A guarded call whose tool is running: the sub-agents it starts are children of `run`. */
interface Calling {
  run: Run;
  tool: string;
  children: Run[];
}

export function fuseboxMiddleware(run: Run, opts: MiddlewareOptions = {}) {
  const closeRun = opts.closeRun ?? true;
  /** The sub-agents' child runs under way, by the invocation they serve (`invocation`). */
  const children = new Map<string, Run>();
  const calling = new AsyncLocalStorage<Calling>();
  /**
   * One sub-agent invocation: the guarded call it runs in, and the id of its first message
   * (the messages reducer gives every message an id once, so it names one `invoke` for
   * as long as it runs). Null for the root agent, which runs in no guarded call.
   */
  const invocation = (state: { messages?: BaseMessage[] }): string | null => {
    const call = calling.getStore();
    if (call === undefined) return null;
    return `${call.run.id}/${call.tool}/${state.messages?.[0]?.id ?? ""}`;
  };
  /** The run a step belongs to: its sub-agent invocation's child, else the root. */
  const runOf = (state: { messages?: BaseMessage[] }): Run =>
    children.get(invocation(state) ?? "") ?? run;
  /** The run of a model call: a sub-agent's first one starts its child run. */
  const modelRunOf = async (state: { messages?: BaseMessage[] }): Promise<Run> => {
    const key = invocation(state);
    const call = calling.getStore();
    if (key === null || call === undefined) return run;
    const known = children.get(key);
    if (known !== undefined) return known;
    const child = await call.run.startChild({ agent: call.tool });
    children.set(key, child);
    call.children.push(child);
    return child;
  };

  // Only the wrap hooks: each before/after hook is a graph node of its own, and every node
  // a step costs one of the caller's `recursionLimit` (25 by default) — a beforeModel and
  // an afterModel halved the tool calls a run could make. So the run is started by
  // `startRun`, its model turns are reported and a stop ends the agent inside
  // `wrapModelCall`, and the run is closed at the model's final answer.
  return createMiddleware({
    name: "FuseboxMiddleware",
    wrapModelCall: async (request, handler) => {
      const state = request.state as { messages?: BaseMessage[] };
      const current = await modelRunOf(state);
      if (current === run) await run.start();
      if (current.stopped !== null) {
        // The model is not asked again: this answer, without tool calls, ends the agent
        // (every call id in the history already has its answer), in the guard's words.
        return new AIMessage({ content: stopText(current) });
      }
      let response: AIMessage;
      try {
        response = (await handler(request)) as AIMessage;
      } catch (err) {
        // A sub-agent's failure is its caller's to close (`wrapToolCall`).
        if (current === run && run.stopped === null) {
          await bestEffort(() => run.finish("failed"));
        }
        throw err;
      }
      if (AIMessage.isInstance(response)) {
        await reportModelTurn(current, response);
        const final = (response.tool_calls?.length ?? 0) === 0;
        // The final answer ends the agent: the run is closed now (a sub-agent's child is
        // closed by its caller once the tool returns).
        if (final && closeRun && current === run && run.stopped === null) {
          await bestEffort(() => run.finish("completed"));
        }
      }
      return response;
    },
    wrapToolCall: async (request, handler) => {
      const current = runOf(request.state);
      const { name, args, id } = request.toolCall;
      const callId = id ?? current.nextCallId();
      const gate = await current.toolCall(name, args, callOptions(opts, name, args, callId));
      if (!gate.mayRun) return refusal(gate);
      const call: Calling = { run: current, tool: name, children: [] };
      /** The answer to a call whose sub-agent the guard stopped: the guard's words. */
      const childStopped = async (child: Run) => {
        const text = childStopText(child);
        await report(current, callId, name, "SUCCESS", text);
        return new ToolMessage({ content: text, tool_call_id: callId, name, status: "error" });
      };
      let outcome: Awaited<ReturnType<typeof handler>>;
      try {
        outcome = await calling.run(call, () => handler(request));
      } catch (err) {
        const stopped = await closeChildren(call, "failed");
        if (stopped === null) throw err;
        return childStopped(stopped);
      }
      const stopped = await closeChildren(call, "completed");
      if (stopped !== null) return childStopped(stopped);
      if (ToolMessage.isInstance(outcome)) {
        const kind: ResultKind = outcome.status === "error" ? "RETRYABLE" : "SUCCESS";
        await report(current, callId, name, kind, outcome.content);
        if (gate.warning) {
          return new ToolMessage({
            content: gate.reads(outcome.content),
            tool_call_id: outcome.tool_call_id,
            name: outcome.name ?? name,
            status: outcome.status ?? "success",
          });
        }
        return outcome;
      }
      await report(current, callId, name, "SUCCESS", null);
      return outcome;
    },
  });

  /** Closes the child runs a call started (`status` unless the guard stopped one), and
   * returns one the guard stopped, if any: its words are the call's answer. */
  async function closeChildren(call: Calling, status: string): Promise<Run | null> {
    let stopped: Run | null = null;
    for (const child of call.children.splice(0)) {
      for (const [key, known] of children) if (known === child) children.delete(key);
      if (child.stopped === null) await bestEffort(() => child.finish(status));
      else stopped ??= child;
      child.close();
    }
    return stopped;
  }
}

/** The agent's last words when the guard stopped its run: why, and that it is over. */
function stopText(run: Run): string {
  const report = run.stopped;
  const why = report === null ? "stopped" : summary(report);
  const said = run.stop?.message;
  const base = `fusebox stopped this run (${why}); no more tools were called.`;
  return said ? `${base} ${said}` : base;
}
