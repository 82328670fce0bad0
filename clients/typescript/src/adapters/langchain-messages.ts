/** LangChain.js messages the `createAgent` middleware and the LangGraph.js tools share:
 * an AI message as a `model_turn`, and the answer to a refused call. */
import { type AIMessage, ToolMessage, type UsageMetadata } from "@langchain/core/messages";
import type { Gate } from "../gate.js";
import type { Run } from "../run.js";
import { bestEffort, usage } from "./common.js";

/** Reports one model response (its stop reason and token usage); never throws. */
export function reportModelTurn(run: Run, message: AIMessage): Promise<void> {
  const meta = message.usage_metadata as UsageMetadata | undefined;
  const cacheRead = meta?.input_token_details?.cache_read ?? 0;
  const cacheCreation = meta?.input_token_details?.cache_creation ?? 0;
  return bestEffort(() =>
    run.modelTurn((message.tool_calls?.length ?? 0) > 0 ? "tool_use" : "end_turn", {
      usage: usage({
        // LangChain's input_tokens include the cached ones; the contract sums them apart.
        input_tokens: meta ? Math.max(meta.input_tokens - cacheRead - cacheCreation, 0) : undefined,
        output_tokens: meta?.output_tokens,
        cache_read_input_tokens: cacheRead || undefined,
        cache_creation_input_tokens: cacheCreation || undefined,
      }),
    }),
  );
}

/** The refused call's answer, for its call id (a dangling id breaks the provider). */
export function refusal(gate: Gate): ToolMessage {
  return new ToolMessage({
    content: gate.modelText ?? "",
    tool_call_id: gate.callId,
    name: gate.tool,
    status: gate.action === "use_completed_result" ? "success" : "error",
  });
}
