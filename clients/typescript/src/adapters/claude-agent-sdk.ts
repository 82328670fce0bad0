/**
 * The Claude Agent SDK for TypeScript (`@anthropic-ai/claude-agent-sdk` 0.3): every tool
 * call of the agent — built-in tools, MCP tools, in-process SDK tools — gated by fuseboxd
 * through the SDK's hooks.
 *
 *     const guard = new ClaudeAgentGuard(run);
 *     const result = await guard.runAgent("fix the failing test", { mcpServers, allowedTools });
 *     // a stop rejects with RunStopped (its `report` says why)
 *
 * - `PreToolUse` (with `onFailure: "block"`): asks the gate. `block` /
 *   `use_completed_result` deny the call with the guard's message (or the stored result)
 *   as the reason, which the model reads as the call's tool result; `warn` lets it run
 *   with the message as context; `stop` denies it *and* answers `continue: false` (alone,
 *   `continue: false` would let this call run first), and interrupts the query as a
 *   backstop.
 * - `PostToolUse` / `PostToolUseFailure`: the result (a failed tool is RETRYABLE with no
 *   wait); a `stop` answer ends the session the same way.
 * - `PreCompact`: `compaction`.
 * - Each assistant message's usage → `model_turn`; the kill switch interrupts the query.
 *
 * A hook that outlives its timeout is discarded by the SDK and the tool runs, so the
 * guard answers within its own deadline (`deadlineMs`, below the hook timeout it sets) and
 * denies when the guard is silent (unless the run's `gateOnError` is `allow`).
 */
import {
  type HookCallback,
  type HookCallbackMatcher,
  type HookEvent,
  type HookJSONOutput,
  type Options,
  type Query,
  query,
  type SDKResultMessage,
} from "@anthropic-ai/claude-agent-sdk";
import { GateTimeout } from "../errors.js";
import { Gate } from "../gate.js";
import type { Run } from "../run.js";
import type { Decision } from "../types.js";
import { bestEffort, callOptions, type GuardOptions, usage } from "./common.js";

/** How much longer the SDK waits for a hook than the guard's own deadline. */
const HOOK_TIMEOUT_MARGIN_MS = 5000;

export interface ClaudeGuardOptions extends GuardOptions {
  /** The longest a hook waits for the guard before it denies; default the run's own
   * request timeout plus half a second. */
  deadlineMs?: number;
}

type Fields = Record<string, unknown>;

export class ClaudeAgentGuard {
  readonly deadlineMs: number;
  private active: Query | null = null;
  private interrupted = false;
  private readonly turnsSeen = new Set<string>();

  constructor(
    readonly run: Run,
    private readonly opts: ClaudeGuardOptions = {},
  ) {
    this.deadlineMs = opts.deadlineMs ?? run.timeoutMs + 500;
    run.onStop(() => this.interrupt());
  }

  /** The hook matchers, for `options.hooks`. */
  hooks(): Partial<Record<HookEvent, HookCallbackMatcher[]>> {
    const timeout = Math.ceil((this.deadlineMs + HOOK_TIMEOUT_MARGIN_MS) / 1000);
    const matcher = (hook: HookCallback, block = false): HookCallbackMatcher => ({
      hooks: [hook],
      timeout,
      ...(block && { onFailure: "block" as const }),
    });
    return {
      PreToolUse: [matcher((input, id) => this.preToolUse(input as Fields, id), true)],
      PostToolUse: [matcher((input, id) => this.postToolUse(input as Fields, id))],
      PostToolUseFailure: [matcher((input, id) => this.postToolUse(input as Fields, id))],
      PreCompact: [matcher((input) => this.preCompact(input as Fields))],
    };
  }

  /** `options` with the guard's hooks added (before the user's own). */
  protect(options: Options): Options {
    const merged: Partial<Record<HookEvent, HookCallbackMatcher[]>> = { ...(options.hooks ?? {}) };
    for (const [event, matchers] of Object.entries(this.hooks()) as [
      HookEvent,
      HookCallbackMatcher[],
    ][]) {
      merged[event] = [...matchers, ...(merged[event] ?? [])];
    }
    return { ...options, hooks: merged };
  }

  /** Runs `prompt` to its result with the guard in place; rejects with `RunStopped` when
   * the guard ended the run; closes the run when the agent ends on its own. */
  async runAgent(prompt: string, options: Options = {}): Promise<SDKResultMessage | null> {
    await this.run.start();
    const q = query({ prompt, options: this.protect(options) });
    this.active = q;
    this.interrupted = false;
    if (this.run.stopped !== null) this.interrupt();
    let result: SDKResultMessage | null = null;
    try {
      for await (const message of q) {
        await this.observe(message);
        if (message.type === "result") result = message;
      }
    } catch (err) {
      this.run.throwIfStopped();
      await bestEffort(() => this.run.finish("failed"));
      throw err;
    } finally {
      this.active = null;
    }
    this.run.throwIfStopped();
    const failed = result !== null && result.subtype !== "success";
    await bestEffort(() => this.run.finish(failed ? "failed" : "completed"));
    return result;
  }

  /** Feeds a message of the conversation to the guard (usage per model response). */
  async observe(message: { type: string } & Fields): Promise<void> {
    if (message.type !== "assistant") return;
    const inner = message.message as
      | { id?: string; usage?: Fields; stop_reason?: string | null }
      | undefined;
    const turn = inner?.id ?? String(message.uuid ?? "");
    if (inner?.usage === undefined || this.turnsSeen.has(turn)) return;
    this.turnsSeen.add(turn);
    const u = inner.usage;
    const n = (key: string) => (typeof u[key] === "number" ? (u[key] as number) : undefined);
    await bestEffort(() =>
      this.run.modelTurn(inner.stop_reason ?? "tool_use", {
        usage: usage({
          input_tokens: n("input_tokens"),
          output_tokens: n("output_tokens"),
          cache_creation_input_tokens: n("cache_creation_input_tokens"),
          cache_read_input_tokens: n("cache_read_input_tokens"),
        }),
      }),
    );
  }

  // --- hooks -----------------------------------------------------------------------

  private async preToolUse(input: Fields, toolUseId: string | undefined): Promise<HookJSONOutput> {
    const tool = String(input.tool_name ?? "");
    const args = input.tool_input ?? {};
    const callId =
      toolUseId ??
      (typeof input.tool_use_id === "string" ? input.tool_use_id : this.run.nextCallId());
    const gate = await this.ask(tool, args, callId);
    if (gate.mayRun) {
      if (gate.warning) return preTool({ additionalContext: `fusebox: ${gate.warning}` });
      // Nothing: "allow" would skip the user's own permission rules.
      return {};
    }
    const reason = gate.modelText ?? `fusebox refused ${tool}.`;
    const answer = preTool({ permissionDecision: "deny", permissionDecisionReason: reason });
    if (!gate.stopped) return answer;
    this.interrupt();
    return { ...answer, ...end(reason) };
  }

  private async ask(tool: string, args: unknown, callId: string): Promise<Gate> {
    const asked = this.run.toolCall(tool, args, callOptions(this.opts, tool, args, callId));
    const late = new Promise<null>((done) => setTimeout(() => done(null), this.deadlineMs).unref());
    const gate = await Promise.race([asked, late]);
    if (gate !== null) return gate;
    // Beyond its own deadline the guard is silent, whatever gateOnError says: the hook
    // must answer before the SDK discards it and runs the tool anyway.
    const error = new GateTimeout(
      `fusebox.gate.${this.run.tenant}.${this.run.id}`,
      this.deadlineMs,
    );
    return new Gate(callId, tool, null, error, false);
  }

  private async postToolUse(input: Fields, toolUseId: string | undefined): Promise<HookJSONOutput> {
    const tool = String(input.tool_name ?? "");
    const callId = toolUseId ?? String(input.tool_use_id ?? "");
    const failed = input.hook_event_name === "PostToolUseFailure";
    const reported = failed
      ? this.run.toolResult(callId, tool, "RETRYABLE", {
          code: input.is_interrupt ? "interrupted" : "tool_error",
          retryAfterMs: 0,
          output: String(input.error ?? ""),
        })
      : this.run.toolResult(callId, tool, "SUCCESS", { output: input.tool_response ?? null });
    const decision = await this.observed(reported);
    if (decision?.action !== "stop") return {};
    this.interrupt();
    return end(stopText(decision));
  }

  private async preCompact(input: Fields): Promise<HookJSONOutput> {
    const decision = await this.observed(
      this.run.compaction(`claude-agent-sdk: ${String(input.trigger ?? "compaction")}`),
    );
    if (decision?.action !== "stop") return {};
    this.interrupt();
    return end(stopText(decision));
  }

  /** An observe event, within the deadline; an undelivered one stays queued in the run
   * and is re-sent with its next event, and the agent goes on. */
  private async observed(reported: Promise<Decision | null>): Promise<Decision | null> {
    const late = new Promise<null>((done) => setTimeout(() => done(null), this.deadlineMs).unref());
    return Promise.race([reported.catch(() => null), late]);
  }

  /** The backstop behind `continue: false`: interrupt the query, once, outside the hook
   * (the CLI is waiting for this very hook's answer). */
  private interrupt(): void {
    const active = this.active;
    if (active === null || this.interrupted) return;
    this.interrupted = true;
    setImmediate(() => void active.interrupt().catch(() => undefined));
  }
}

function preTool(fields: Fields): HookJSONOutput {
  return { hookSpecificOutput: { hookEventName: "PreToolUse", ...fields } } as HookJSONOutput;
}

function end(reason: string): HookJSONOutput {
  return { continue: false, stopReason: reason, systemMessage: reason };
}

function stopText(decision: Decision): string {
  return decision.message
    ? `fusebox: ${decision.message}`
    : `fusebox stopped this run (${decision.reason ?? "stop"}).`;
}
