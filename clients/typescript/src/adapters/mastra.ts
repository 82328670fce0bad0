/**
 * Mastra (`@mastra/core` 1.71): every tool call of an `Agent` gated by fuseboxd.
 *
 *     const guard = new MastraGuard(run, { opKey });
 *     const result = await guard.generate(agent, "triage the queue", { maxSteps: 50 });
 *     guard.run.stopped;   // the stop report, when the guard ended the run
 *
 * - `hooks.beforeToolCall` asks the daemon before each call (Mastra calls it with the
 *   call's `toolCallId` in `context`): a refused call (block, stop, guard unavailable
 *   under deny) returns `{ proceed: false, output }` with the guard's words, so the tool
 *   does not run and the model reads them as the call's result; `use_completed_result`
 *   returns the stored result. `afterToolCall` reports each result (`RETRYABLE` when the
 *   tool threw).
 * - A warned call runs. Mastra's `afterToolCall` cannot change a result, so the warning
 *   reaches the model from the input processor, as a system message of the next step
 *   (the model reads the result, then the warning — as in Claude Code's hook context).
 * - The input processor (`processInputStep`) ends the agent's run before the model is
 *   asked again once the run is stopped (by a gate's stop, a result's decision, or the
 *   kill switch): Mastra's tripwire, whose reason is the guard's words
 *   (`result.tripwire.reason`; `finishReason` `other`).
 * - `onStepFinish`: each step's usage → `model_turn`.
 * - `generate` closes the run with `run_finished`: `completed` when the agent answers,
 *   `failed: …` when it throws or when Mastra ended it on a step that asked for tools
 *   (Mastra stops there silently: at `maxSteps`, mastra #16765, and after a tool that
 *   returned `undefined`), so the run never stays open.
 * - Sub-agents (an agent's `agents`, networks) run their own `generate` with their own
 *   hooks and processors: Mastra does not pass an execution's hooks on (mastra #10866).
 *   Build each sub-agent with `hooks: guard.hooks` and `inputProcessors:
 *   [guard.processor]` to have its calls gated; they count in this run (no child run).
 *   The adapter never decides: it asks the daemon through the run and applies the answer.
 */
import type { Agent, AgentExecutionOptionsBase } from "@mastra/core/agent";
import type { InputProcessor } from "@mastra/core/processors";
import type { ToolHooks } from "@mastra/core/tools";
import type { Gate } from "../gate.js";
import type { Run } from "../run.js";
import { summary } from "../types.js";
import { bestEffort, callOptions, type GuardOptions, report, usage } from "./common.js";

/** The options of a plain (no structured output) `generate`. */
type GenerateOptions = AgentExecutionOptionsBase<unknown> & { structuredOutput?: never };
type Generated = Awaited<ReturnType<Agent["generate"]>>;

interface StepUsage {
  inputTokens?: number | undefined;
  outputTokens?: number | undefined;
  cachedInputTokens?: number | undefined;
}

interface Step {
  finishReason?: string;
  usage?: StepUsage;
}

export class MastraGuard {
  /** Gates of calls let through and not yet reported, by tool-call id. */
  private readonly gates = new Map<string, Gate>();
  /** Warnings for the model's next step, in the order of their calls. */
  private readonly warnings: string[] = [];

  constructor(
    readonly run: Run,
    private readonly opts: GuardOptions = {},
  ) {}

  /** Mastra's tool hooks: the gate before each call, the report after it. */
  readonly hooks: ToolHooks = {
    beforeToolCall: async ({ toolName, input, context }) => {
      const callId = toolCallIdOf(context) ?? this.run.nextCallId();
      const gate = await this.run.toolCall(
        toolName,
        input,
        callOptions(this.opts, toolName, input, callId),
      );
      if (gate.mayRun) {
        this.gates.set(callId, gate);
        return undefined;
      }
      if (gate.action === "use_completed_result") {
        return { proceed: false, output: gate.completedResult };
      }
      return { proceed: false, output: gate.modelText ?? "refused by fusebox" };
    },
    afterToolCall: async ({ toolName, context, output, error }) => {
      const callId = toolCallIdOf(context);
      const gate = callId === undefined ? undefined : this.gates.get(callId);
      if (gate === undefined) return;
      this.gates.delete(gate.callId);
      if (error !== undefined) {
        await report(this.run, gate.callId, toolName, "RETRYABLE", String(error));
        return;
      }
      await report(this.run, gate.callId, toolName, "SUCCESS", output);
      if (gate.warning) this.warnings.push(gate.warning);
    },
  };

  /** Mastra's input processor: ends the agent once the run is stopped; hands the model
   * the warnings of the calls it just made. */
  readonly processor: InputProcessor = {
    id: "fusebox",
    processInputStep: ({ abort, systemMessages }) => {
      if (this.run.stopped !== null) abort(stopText(this.run));
      if (this.warnings.length === 0) return undefined;
      const said = this.warnings.splice(0).map((w) => `[fusebox warning] ${w}`);
      return {
        systemMessages: [
          ...systemMessages,
          ...said.map((content) => ({ role: "system" as const, content })),
        ],
      };
    },
  };

  /** `onStepFinish`: the step's usage as a `model_turn`. */
  readonly onStepFinish = async (step: Step): Promise<void> => {
    const u = step.usage ?? {};
    const cached = u.cachedInputTokens ?? 0;
    await bestEffort(() =>
      this.run.modelTurn(step.finishReason === "tool-calls" ? "tool_use" : "end_turn", {
        usage: usage({
          input_tokens: u.inputTokens === undefined ? undefined : u.inputTokens - cached,
          output_tokens: u.outputTokens,
          cache_read_input_tokens: cached || undefined,
          cache_creation_input_tokens: undefined,
        }),
      }),
    );
  };

  /**
   * `agent.generate` with the guard in: the hooks, the processor (after the caller's own
   * input processors), usage reported. Closes the run: `completed` when the agent
   * answers, `failed: …` when it throws or stops at `maxSteps` with calls asked for; a
   * stopped run is closed already (`result.tripwire.reason` is the guard's words).
   */
  async generate(
    agent: Agent,
    messages: Parameters<Agent["generate"]>[0],
    options: GenerateOptions = {},
  ): Promise<Generated> {
    const theirStep = options.onStepFinish as ((step: Step) => unknown) | undefined;
    const guarded = {
      ...options,
      hooks: { ...options.hooks, ...this.hooks },
      inputProcessors: [...(options.inputProcessors ?? []), this.processor],
      onStepFinish: async (step: Step) => {
        await this.onStepFinish(step);
        await theirStep?.(step);
      },
    } as GenerateOptions;
    await this.run.start();
    let result: Generated;
    try {
      result = await agent.generate(messages, guarded);
    } catch (err) {
      await this.close(`failed: ${String(err)}`);
      throw err;
    }
    if (result.error) await this.close(`failed: ${String(result.error)}`);
    else if (result.finishReason === "tool-calls") await this.close(`failed: ${UNANSWERED}`);
    else await this.close("completed");
    return result;
  }

  private async close(status: string): Promise<void> {
    if (this.run.stopped !== null) return;
    await bestEffort(() => this.run.finish(status.slice(0, 200)));
  }
}

/**
 * Why a run whose agent ended on a step that asked for tools is closed `failed`: Mastra
 * ends its loop there silently — at `maxSteps` (mastra #16765), and (1.71) after a tool
 * that returned `undefined` — with the model's task not done.
 */
const UNANSWERED =
  "the agent ended with tool calls asked for and no answer from the model (maxSteps, or a tool that returned nothing)";

function toolCallIdOf(context: unknown): string | undefined {
  if (typeof context !== "object" || context === null) return undefined;
  const id = (context as { toolCallId?: unknown }).toolCallId;
  return typeof id === "string" && id !== "" ? id : undefined;
}

/** What the user reads when the guard ended the agent: why, and that it is over. */
function stopText(run: Run): string {
  const report = run.stopped;
  const why = report === null ? "stopped" : summary(report);
  const said = run.stop?.message;
  const base = `fusebox stopped this run (${why}).`;
  return said ? `${base} ${said}` : base;
}
