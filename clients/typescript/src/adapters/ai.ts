/**
 * The Vercel AI SDK (`ai` 7): every tool call gated by fuseboxd.
 *
 *     const guard = new AiSdkGuard(run);
 *     const result = await guard.generateText({ model, tools, prompt, stopWhen: stepCountIs(50) });
 *     guard.run.stopped;   // the stop report, when the guard ended the run
 *
 * - `toolApproval` asks the daemon before a call runs: a refused call (block, stop, guard
 *   unavailable under deny) never reaches `execute`; the model reads the guard's message as
 *   the call's `execution-denied` reason.
 * - Each tool's `execute` is wrapped: it reports the result, appends a `warn`'s message,
 *   and answers a completed operation (`use_completed_result`) with the stored result
 *   without running again.
 * - A stop ends the loop through `stopWhen` after the step that learnt it (every call of
 *   that step has its result, so the history stays valid); the kill switch too.
 * - `onStepEnd`: each step's usage → `model_turn`. `generateText` and `streamText` close the
 *   run with `run_finished` (`completed` / `failed`) when the agent ends on its own; with
 *   the SDK's own `streamText`, `onEnd` / `onError` / `onAbort` do it (a stream has no
 *   end the adapter could await, so without them the run stays open until its budget).
 * - The AI SDK has no sub-agent of its own: an agent used as a tool is a tool whose
 *   `execute` runs another agent. `subAgent` runs it under a child run (guard contract
 *   §6); the SDK cannot tell a sub-agent's calls apart otherwise, so an agent run inside
 *   a tool without it is guarded (and counted) as whatever guard its tools were given.
 */
import type { StepResult, StopCondition, ToolApprovalStatus, ToolSet } from "ai";
import { generateText, stepCountIs, streamText } from "ai";
import type { Gate } from "../gate.js";
import type { ChildRunOptions, Run } from "../run.js";
import { toText } from "../types.js";
import { asChild, bestEffort, callOptions, type GuardOptions, report, usage } from "./common.js";

type Params = Parameters<typeof generateText>[0];
type StreamParams = Parameters<typeof streamText>[0];

interface ApprovalRequest {
  toolCall: { toolCallId: string; toolName: string; input: unknown };
}

export class AiSdkGuard {
  /** Gates of calls approved and not yet executed, by call id. */
  private readonly gates = new Map<string, Gate>();
  /** Warnings of calls whose tool has its own `toModelOutput`, by call id, until it runs. */
  private readonly warned = new Map<string, string>();
  /** `generateText` closes the run; a sub-agent's guard leaves that to `subAgent`. */
  private closesRun = true;

  constructor(
    readonly run: Run,
    private readonly opts: GuardOptions = {},
  ) {}

  /** The AI SDK's `toolApproval`: asks the daemon whether the call may run. */
  readonly toolApproval = async ({ toolCall }: ApprovalRequest): Promise<ToolApprovalStatus> => {
    const gate = await this.gate(toolCall.toolName, toolCall.input, toolCall.toolCallId);
    const allowed = gate.mayRun || gate.action === "use_completed_result";
    if (allowed) return { type: "approved" };
    return { type: "denied", reason: gate.modelText ?? "refused by fusebox" };
  };

  /** The AI SDK's `stopWhen`: true once the run is stopped. */
  readonly stopWhen: StopCondition<ToolSet> = () => this.run.stopped !== null;

  /** The AI SDK's `onStepEnd`: the step's usage as a `model_turn`. */
  readonly onStepEnd = async (step: StepResult<ToolSet>): Promise<void> => {
    const u = step.usage;
    await bestEffort(() =>
      this.run.modelTurn(stopReason(step.finishReason), {
        usage: usage({
          input_tokens: u.inputTokenDetails.noCacheTokens ?? u.inputTokens,
          output_tokens: u.outputTokens,
          cache_read_input_tokens: u.inputTokenDetails.cacheReadTokens,
          cache_creation_input_tokens: u.inputTokenDetails.cacheWriteTokens,
        }),
      }),
    );
  };

  /** `streamText`'s `onEnd`: the stream ended on its own, so the run is closed
   * (`completed`); a stopped run is closed already. */
  readonly onEnd = async (): Promise<void> => {
    if (this.closesRun && this.run.stopped === null) {
      await bestEffort(() => this.run.finish("completed"));
    }
  };

  /** `streamText`'s `onError`: the stream failed, so the run is closed (`failed`). */
  readonly onError = async ({ error }: { error: unknown }): Promise<void> => {
    if (this.closesRun && this.run.stopped === null) {
      await bestEffort(() => this.run.finish(`failed: ${String(error)}`.slice(0, 200)));
    }
  };

  /** `streamText`'s `onAbort`: the caller aborted the stream, so the run is closed
   * (`failed: aborted`: its task did not end). */
  readonly onAbort = async (): Promise<void> => {
    if (this.closesRun && this.run.stopped === null) {
      await bestEffort(() => this.run.finish("failed: aborted"));
    }
  };

  /** The tools with each `execute` reporting to the guard (tools without one stay as
   * they are: the client runs them, and their approval is still gated). */
  tools<T extends ToolSet>(tools: T): T {
    const wrapped: Record<string, unknown> = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = tool.execute;
      if (execute === undefined) {
        wrapped[name] = tool;
        continue;
      }
      const toModelOutput = tool.toModelOutput as ModelOutputFn | undefined;
      wrapped[name] = {
        ...tool,
        // A tool that maps its own output for the model gets its own output, whatever its
        // shape; the warning is added to what its mapping makes of it.
        ...(toModelOutput === undefined
          ? {}
          : {
              toModelOutput: async (options: { toolCallId: string }) => {
                const made = await toModelOutput(options);
                const warning = this.warned.get(options.toolCallId);
                this.warned.delete(options.toolCallId);
                return warning === undefined ? made : withWarning(made, warning);
              },
            }),
        execute: async (input: unknown, options: { toolCallId: string }) => {
          const gate =
            this.gates.get(options.toolCallId) ??
            (await this.gate(name, input, options.toolCallId));
          this.gates.delete(options.toolCallId);
          if (gate.action === "use_completed_result") return gate.completedResult;
          if (!gate.mayRun) throw new Error(gate.modelText ?? "refused by fusebox");
          let output: unknown;
          try {
            output = await (execute as (i: unknown, o: unknown) => unknown)(input, options);
          } catch (err) {
            await report(this.run, gate.callId, name, "RETRYABLE", String(err));
            throw err;
          }
          await report(this.run, gate.callId, name, "SUCCESS", output);
          if (!gate.warning) return output;
          if (toModelOutput !== undefined) {
            this.warned.set(options.toolCallId, gate.warning);
            return output;
          }
          return gate.reads(output);
        },
      };
    }
    return wrapped as T;
  }

  /**
   * `generateText` with the guard in: the tools wrapped, `toolApproval`, the stop added to
   * `stopWhen`, usage reported. Closes the run with `run_finished` when the agent ends on
   * its own (`completed`, or `failed` when it throws); a stopped run is closed already.
   */
  async generateText(params: Params): ReturnType<typeof generateText> {
    const userStop = params.stopWhen;
    // Without a stopWhen of the caller's, the SDK's own default (one step) still holds.
    const stops =
      userStop === undefined ? [stepCountIs(1)] : Array.isArray(userStop) ? userStop : [userStop];
    const userStepEnd = params.onStepEnd;
    const guarded = {
      ...params,
      tools: this.tools(params.tools ?? {}),
      toolApproval: this.toolApproval,
      stopWhen: [this.stopWhen, ...stops],
      onStepEnd: async (step: StepResult<ToolSet>) => {
        await this.onStepEnd(step);
        await (userStepEnd as ((s: StepResult<ToolSet>) => unknown) | undefined)?.(step);
      },
    } as Params;
    await this.run.start();
    let result: Awaited<ReturnType<typeof generateText>>;
    try {
      result = await generateText(guarded);
    } catch (err) {
      if (this.closesRun && this.run.stopped === null) {
        await bestEffort(() => this.run.finish("failed"));
      }
      throw err;
    }
    if (this.closesRun && this.run.stopped === null) {
      await bestEffort(() => this.run.finish("completed"));
    }
    return result;
  }

  /**
   * `streamText` with the guard in, like `generateText`: the tools wrapped, `toolApproval`,
   * the stop added to `stopWhen`, usage reported, and the run closed when the stream ends
   * (`onEnd`: `completed`; `onError`: `failed`; `onAbort`: `failed: aborted`) — the
   * caller's own callbacks of those names run after the guard's. Consume the stream as
   * usual; the run is closed once it is read to its end.
   */
  streamText(params: StreamParams): ReturnType<typeof streamText> {
    const userStop = params.stopWhen;
    const stops =
      userStop === undefined ? [stepCountIs(1)] : Array.isArray(userStop) ? userStop : [userStop];
    type Callback = ((event: never) => unknown) | undefined;
    const after =
      (mine: (event: never) => Promise<void>, theirs: Callback) =>
      async (event: never): Promise<void> => {
        await mine(event);
        await theirs?.(event);
      };
    const guarded = {
      ...params,
      tools: this.tools(params.tools ?? {}),
      toolApproval: this.toolApproval,
      stopWhen: [this.stopWhen, ...stops],
      onStepEnd: after(this.onStepEnd as (e: never) => Promise<void>, params.onStepEnd as Callback),
      onEnd: after(this.onEnd, params.onEnd as Callback),
      onError: after(this.onError as (e: never) => Promise<void>, params.onError as Callback),
      onAbort: after(this.onAbort, params.onAbort as Callback),
    } as unknown as StreamParams;
    return streamText(guarded);
  }

  /**
   * Runs a sub-agent under a child run of this guard's run, inside the `execute` of the
   * tool that delegates to it: `body` gets a guard of the child's own — call its
   * `generateText`, or give its `tools`, `toolApproval`, `stopWhen` and `onStepEnd` to a
   * `ToolLoopAgent`. The tool's call is one step of this run; the sub-agent's calls and
   * model turns are the child's, and count in every budget above it. `child` sets the
   * child's run options (`agent`, `policy` …). Resolves with `body`'s result, or — when
   * the guard stopped the child, or refused to start it (a cap of a run above) — with the
   * guard's words, which the calling model reads as the tool's output; this run goes on.
   */
  subAgent<T>(body: (child: AiSdkGuard) => Promise<T>, child: ChildRunOptions = {}) {
    return asChild(
      this.run,
      child,
      (run) => {
        const guard = new AiSdkGuard(run, this.opts);
        guard.closesRun = false;
        return body(guard);
      },
      (text) => text,
    );
  }

  private async gate(tool: string, input: unknown, callId: string): Promise<Gate> {
    const gate = await this.run.toolCall(tool, input, callOptions(this.opts, tool, input, callId));
    if (gate.mayRun || gate.action === "use_completed_result") this.gates.set(callId, gate);
    return gate;
  }
}

/** What a tool's `toModelOutput` makes, as far as a warning is added to it. */
type ModelOutput =
  | { type: "text" | "error-text"; value: string }
  | { type: "json" | "error-json"; value: unknown }
  | { type: "content"; value: Array<Record<string, unknown>> }
  | { type: string; value?: unknown };
type ModelOutputFn = (options: { toolCallId: string }) => ModelOutput | PromiseLike<ModelOutput>;

/** A tool's mapped output with a warning after it, in the output's own form. */
function withWarning(made: ModelOutput, warning: string): ModelOutput {
  const line = `[fusebox warning] ${warning}`;
  switch (made.type) {
    case "text":
    case "error-text":
      return { ...made, value: `${String(made.value)}\n\n${line}` };
    case "content":
      return { ...made, value: [...(made.value as unknown[]), { type: "text", text: line }] };
    default:
      // JSON (or a form this version does not know): its text, then the warning.
      return {
        type: "content",
        value: [
          { type: "text", text: toText(made.value) },
          { type: "text", text: line },
        ],
      };
  }
}

function stopReason(finish: string): string {
  switch (finish) {
    case "tool-calls":
      return "tool_use";
    case "stop":
      return "end_turn";
    case "length":
      return "max_tokens";
    case "content-filter":
      return "refusal";
    default:
      return finish;
  }
}
