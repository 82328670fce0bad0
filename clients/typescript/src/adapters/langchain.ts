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
 */
import { AIMessage, type BaseMessage, ToolMessage } from "@langchain/core/messages";
import { createMiddleware } from "langchain";
import type { Run } from "../run.js";
import type { ResultKind } from "../types.js";
import { bestEffort, callOptions, type GuardOptions, report } from "./common.js";
import { refusal, reportModelTurn } from "./langchain-messages.js";

export interface MiddlewareOptions extends GuardOptions {
  /** Send `run_finished` (`completed`) when the agent ends on its own (default true). */
  closeRun?: boolean;
}

export function fuseboxMiddleware(run: Run, opts: MiddlewareOptions = {}) {
  const closeRun = opts.closeRun ?? true;
  return createMiddleware({
    name: "FuseboxMiddleware",
    beforeAgent: async () => {
      await run.start();
      return undefined;
    },
    beforeModel: {
      canJumpTo: ["end"],
      hook: () => (run.stopped !== null ? { jumpTo: "end" as const } : undefined),
    },
    wrapModelCall: async (request, handler) => {
      try {
        return await handler(request);
      } catch (err) {
        if (run.stopped === null) await bestEffort(() => run.finish("failed"));
        throw err;
      }
    },
    afterModel: async (state) => {
      const lastMessage = (state.messages as BaseMessage[]).at(-1);
      const last = AIMessage.isInstance(lastMessage) ? (lastMessage as unknown as AIMessage) : null;
      if (last !== null) await reportModelTurn(run, last);
      return undefined;
    },
    wrapToolCall: async (request, handler) => {
      const { name, args, id } = request.toolCall;
      const callId = id ?? run.nextCallId();
      const gate = await run.toolCall(name, args, callOptions(opts, name, args, callId));
      if (!gate.mayRun) return refusal(gate);
      const outcome = await handler(request);
      if (ToolMessage.isInstance(outcome)) {
        const kind: ResultKind = outcome.status === "error" ? "RETRYABLE" : "SUCCESS";
        await report(run, callId, name, kind, outcome.content);
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
      await report(run, callId, name, "SUCCESS", null);
      return outcome;
    },
    afterAgent: async () => {
      if (closeRun && run.stopped === null) await bestEffort(() => run.finish("completed"));
      return undefined;
    },
  });
}
