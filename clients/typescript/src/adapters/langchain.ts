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
 * - `beforeModel` jumps to the end once the run is stopped (by a gate, a result's
 *   decision, or the kill switch), so the model is not called again and every call id in
 *   the history has its answer.
 * - `afterModel`: the last AI message's `usage_metadata` → `model_turn`.
 * - The run is closed with `run_finished`: `completed` when the agent ends on its own
 *   (`afterAgent`; pass `closeRun: false` to keep one run open across several invokes),
 *   `failed` when the model call throws.
 *
 * Sub-agents (guard contract §6): an agent used as a tool — a tool that invokes another
 * `createAgent` built with the same middleware — runs under a child run of the calling
 * run. `beforeAgent` sees the guarded call it runs in (from the async context of the
 * call's `wrapToolCall`) and starts the child, named by the calling tool; the sub-agent's
 * state names it (`fusebox_run`), so its calls, model turns and stop are its own. Once
 * the tool returns, the child is closed; when the guard stopped it (or the caps refused
 * it, and it ended before its first model call), the call's answer is a `ToolMessage`
 * (status `error`) with the guard's words, whatever the tool made of the sub-agent's
 * final state. A sub-agent built with another middleware instance is not told apart.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { createMiddleware } from "langchain";
import { z } from "zod";
import type { Run } from "../run.js";
import type { ResultKind } from "../types.js";
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
  /** The sub-agents' child runs under way, by run id (their state's `fusebox_run`). */
  const children = new Map<string, Run>();
  const calling = new AsyncLocalStorage<Calling>();
  /** The run a step belongs to: the sub-agent's its state names, else the root. */
  const runOf = (state: { fusebox_run?: string | undefined }): Run =>
    children.get(state.fusebox_run ?? "") ?? run;

  return createMiddleware({
    name: "FuseboxMiddleware",
    stateSchema: z.object({ fusebox_run: z.string().optional() }),
    beforeAgent: {
      canJumpTo: ["end"],
      hook: async () => {
        const call = calling.getStore();
        if (call === undefined) {
          await run.start();
          return undefined;
        }
        // A sub-agent, inside a guarded call: its own child run.
        const child = await call.run.startChild({ agent: call.tool });
        children.set(child.id, child);
        call.children.push(child);
        if (child.stopped !== null) return { fusebox_run: child.id, jumpTo: "end" as const };
        return { fusebox_run: child.id };
      },
    },
    beforeModel: {
      canJumpTo: ["end"],
      hook: (state) => (runOf(state).stopped !== null ? { jumpTo: "end" as const } : undefined),
    },
    wrapModelCall: async (request, handler) => {
      try {
        return await handler(request);
      } catch (err) {
        // A sub-agent's failure is its caller's to close (`wrapToolCall`).
        const current = runOf(request.state);
        if (current === run && run.stopped === null) {
          await bestEffort(() => run.finish("failed"));
        }
        throw err;
      }
    },
    afterModel: async (state) => {
      const lastMessage = (state.messages as BaseMessage[]).at(-1);
      const last = AIMessage.isInstance(lastMessage) ? (lastMessage as unknown as AIMessage) : null;
      if (last !== null) await reportModelTurn(runOf(state), last);
      return undefined;
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
    afterAgent: async (state) => {
      // A sub-agent is closed by its caller (`wrapToolCall`), once the tool returns.
      if (closeRun && runOf(state) === run && run.stopped === null) {
        await bestEffort(() => run.finish("completed"));
      }
      return undefined;
    },
  });

  /** Closes the child runs a call started (`status` unless the guard stopped one), and
   * returns one the guard stopped, if any: its words are the call's answer. */
  async function closeChildren(call: Calling, status: string): Promise<Run | null> {
    let stopped: Run | null = null;
    for (const child of call.children.splice(0)) {
      children.delete(child.id);
      if (child.stopped === null) await bestEffort(() => child.finish(status));
      else stopped ??= child;
      child.close();
    }
    return stopped;
  }
}
