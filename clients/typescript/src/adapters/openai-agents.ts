/**
 * OpenAI Agents JS (`@openai/agents` 0.20): every function tool call gated by fuseboxd.
 *
 *     const guard = new OpenAIAgentsGuard(run);
 *     guard.protect(agent);                           // every function tool, and the model
 *     const result = await guard.runAgent(agent, "weather in tokyo?", { maxTurns: 50 });
 *     // a stop rejects with RunStopped (its `report` says why)
 *
 * - Each function tool gets an input guardrail that asks the daemon: a `block` (or the
 *   guard unavailable under deny) is `rejectContent` with the guard's message, which the
 *   model reads as the call's output; `use_completed_result` answers with the stored
 *   result; a `stop` is `throwException`, which ends `runner.run`.
 * - An output guardrail reports each result and appends a `warn`'s message.
 * - The agent's model (when it is a `Model` object) is wrapped: each response's usage →
 *   `model_turn`, and a run stopped meanwhile (the kill switch) ends before the next
 *   model call. `runAgent` also aborts a model call or tool in flight when a stop comes,
 *   and closes the run with `run_finished` when the agent ends on its own.
 */
import {
  type Agent,
  type AgentInputItem,
  type FunctionTool,
  type Model,
  type ModelRequest,
  type ModelResponse,
  type NonStreamRunOptions,
  Runner,
  type RunResult,
  type ToolGuardrailFunctionOutput,
  ToolGuardrailFunctionOutputFactory,
  type ToolInputGuardrailDefinition,
  type ToolOutputGuardrailDefinition,
} from "@openai/agents";
import type { Gate } from "../gate.js";
import type { Run } from "../run.js";
import { bestEffort, callOptions, type GuardOptions, parseArgs, report, usage } from "./common.js";

const GUARDED = Symbol("fusebox-guarded");

// biome-ignore lint/suspicious/noExplicitAny: an agent of any context and output type (Agent is invariant in both)
type AnyAgent = Agent<any, any>;

export class OpenAIAgentsGuard {
  /** Gates of calls let through and not yet answered, by call id. */
  private readonly gates = new Map<string, Gate>();

  constructor(
    readonly run: Run,
    private readonly opts: GuardOptions = {},
  ) {}

  /** The tool input guardrail that asks the daemon before a call runs. */
  readonly inputGuardrail: ToolInputGuardrailDefinition = {
    type: "tool_input",
    name: "fusebox",
    run: async ({ toolCall }): Promise<ToolGuardrailFunctionOutput> => {
      const args = parseArgs(toolCall.arguments);
      const gate = await this.run.toolCall(
        toolCall.name,
        args,
        callOptions(this.opts, toolCall.name, args, toolCall.callId),
      );
      if (gate.mayRun) {
        this.gates.set(gate.callId, gate);
        return ToolGuardrailFunctionOutputFactory.allow({ action: gate.action });
      }
      if (gate.stopped) return ToolGuardrailFunctionOutputFactory.throwException(gate.report);
      return ToolGuardrailFunctionOutputFactory.rejectContent(
        gate.modelText ?? "refused by fusebox",
        {
          action: gate.action,
        },
      );
    },
  };

  /** The tool output guardrail that reports each result (and appends a warning). */
  readonly outputGuardrail: ToolOutputGuardrailDefinition = {
    type: "tool_output",
    name: "fusebox",
    run: async ({ toolCall, output }): Promise<ToolGuardrailFunctionOutput> => {
      const gate = this.gates.get(toolCall.callId);
      this.gates.delete(toolCall.callId);
      if (gate === undefined) return ToolGuardrailFunctionOutputFactory.allow();
      await report(this.run, gate.callId, toolCall.name, "SUCCESS", output);
      if (gate.warning) return ToolGuardrailFunctionOutputFactory.rejectContent(gate.reads(output));
      return ToolGuardrailFunctionOutputFactory.allow();
    },
  };

  /** Puts the guard on every function tool of `agent` (and of its handoffs), and wraps
   * its model when it is a `Model` object. Idempotent. Returns `agent`. */
  protect<A extends AnyAgent>(agent: A): A {
    const seen = new Set<AnyAgent>();
    const visit = (a: AnyAgent): void => {
      if (seen.has(a)) return;
      seen.add(a);
      for (const tool of a.tools) {
        if (tool.type !== "function") continue;
        const fn = tool as FunctionTool & { [GUARDED]?: true };
        if (fn[GUARDED]) continue;
        fn.inputGuardrails = [this.inputGuardrail, ...(fn.inputGuardrails ?? [])];
        fn.outputGuardrails = [...(fn.outputGuardrails ?? []), this.outputGuardrail];
        fn[GUARDED] = true;
      }
      if (typeof a.model !== "string") a.model = this.model(a.model);
      for (const handoff of a.handoffs) {
        if ("tools" in handoff) visit(handoff as AnyAgent);
      }
    };
    visit(agent);
    return agent;
  }

  /** `model` reporting each response's usage, and refusing to be called once the run is
   * stopped (the kill switch ends the agent before another model turn). */
  model(model: Model): Model {
    if ((model as { [GUARDED]?: true })[GUARDED]) return model;
    const run = this.run;
    const guarded: Model & { [GUARDED]: true } = {
      [GUARDED]: true,
      async getResponse(request: ModelRequest): Promise<ModelResponse> {
        run.throwIfStopped();
        const response = await model.getResponse(request);
        const calls = response.output.some((item) => item.type === "function_call");
        const u = response.usage;
        const cached = u.inputTokensDetails.reduce((sum, d) => sum + (d.cached_tokens ?? 0), 0);
        await bestEffort(() =>
          run.modelTurn(calls ? "tool_use" : "end_turn", {
            usage: usage({
              input_tokens: Math.max(u.inputTokens - cached, 0),
              output_tokens: u.outputTokens,
              cache_read_input_tokens: cached || undefined,
              cache_creation_input_tokens: undefined,
            }),
          }),
        );
        return response;
      },
      getStreamedResponse(request: ModelRequest) {
        run.throwIfStopped();
        return model.getStreamedResponse(request);
      },
    };
    return guarded;
  }

  /**
   * `runner.run(agent, input)` behind the guard: rejects with `RunStopped` when the guard
   * (or an operator, through the kill switch) stops the run, aborting whatever is in
   * flight; closes the run with `run_finished` when the agent ends on its own.
   */
  async runAgent<A extends AnyAgent>(
    agent: A,
    input: string | AgentInputItem[],
    options: Omit<NonStreamRunOptions<unknown>, "signal"> = {},
    runner: Runner = new Runner(),
  ): Promise<RunResult<unknown, A>> {
    this.protect(agent);
    await this.run.start();
    const abort = new AbortController();
    this.run.onStop(() => abort.abort());
    try {
      const result = (await runner.run(agent, input, {
        ...options,
        signal: abort.signal,
      })) as RunResult<unknown, A>;
      this.run.throwIfStopped();
      await bestEffort(() => this.run.finish("completed"));
      return result;
    } catch (err) {
      this.run.throwIfStopped();
      await bestEffort(() => this.run.finish("failed"));
      throw err;
    }
  }
}
