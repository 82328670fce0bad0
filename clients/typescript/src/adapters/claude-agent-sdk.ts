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
 *
 * Sub-agents (the `Agent` tool, `Task` before it) are child runs (guard contract §6). The
 * `Agent` call is gated in the caller's run; when it may run, its sub-agent's child run
 * is started there, before the sub-agent exists — a child the guard refuses (a cap of a
 * run above) denies the call with the guard's words. `SubagentStart` ties the child to
 * the sub-agent's `agent_id`, which every later hook of the sub-agent and each of its
 * assistant messages carry, so its calls, results, compactions and model turns are the
 * child's; `SubagentStop` closes it. A stop of a child ends that sub-agent only: its
 * calls are denied with the guard's words, which its model reads and reports back, and a
 * foreground `Agent` call's output becomes the guard's words for the caller. Only a stop
 * of the root run ends the query.
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
import {
  bestEffort,
  callOptions,
  childStopText,
  type GuardOptions,
  report,
  usage,
} from "./common.js";

/** How much longer the SDK waits for a hook than the guard's own deadline. */
const HOOK_TIMEOUT_MARGIN_MS = 5000;

export interface ClaudeGuardOptions extends GuardOptions {
  /** The longest a hook waits for the guard before it denies; default the run's own
   * request timeout plus half a second. */
  deadlineMs?: number;
}

type Fields = Record<string, unknown>;

/** The tool that starts a sub-agent (`Task` in Claude Code before 2.1). */
const isAgentTool = (tool: string): boolean => tool === "Agent" || tool === "Task";

/** A sub-agent's type as Claude Code names it when the call leaves it out. */
const DEFAULT_SUBAGENT = "general-purpose";

export class ClaudeAgentGuard {
  readonly deadlineMs: number;
  private active: Query | null = null;
  private interrupted = false;
  private readonly turnsSeen = new Set<string>();
  /** Child runs started for `Agent` calls whose sub-agent has not started yet. */
  private readonly launched: Array<{ type: string; child: Run }> = [];
  /** Each sub-agent's child run, by `agent_id` (kept after it stops: its last messages
   * may be read after its `SubagentStop`). */
  private readonly subagents = new Map<string, Run>();
  /** The last text of each sub-agent's messages fed to `observe` (its turn reported). */
  private readonly saidLast = new Map<string, string>();
  /** Sub-agents that ended whose final turn is not reported yet, with their final text. */
  private readonly ending = new Map<string, string>();
  private readonly closedSubagents = new Set<string>();

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
      SubagentStart: [matcher((input) => this.subagentStart(input as Fields))],
      SubagentStop: [matcher((input) => this.subagentStop(input as Fields))],
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
      await this.closeChildren("failed");
      await bestEffort(() => this.run.finish("failed"));
      throw err;
    } finally {
      this.active = null;
    }
    this.run.throwIfStopped();
    const failed = result !== null && result.subtype !== "success";
    await this.closeChildren(failed ? "failed" : "completed");
    await bestEffort(() => this.run.finish(failed ? "failed" : "completed"));
    return result;
  }

  /** Closes the child runs still open when the query ended, before the root (a root
   * closed as failed would stop them as its descendants). */
  private async closeChildren(status: string): Promise<void> {
    const open = [
      ...this.launched.splice(0).map((l) => l.child),
      ...[...this.subagents].filter(([id]) => !this.closedSubagents.has(id)).map(([, r]) => r),
    ];
    for (const child of open) {
      if (child.stopped === null) await bestEffort(() => child.finish(status));
      child.close();
    }
  }

  /** The run a hook or a message belongs to: its sub-agent's child run, else the root. */
  private runOf(fields: Fields): Run {
    const id = fields.agent_id;
    return (typeof id === "string" ? this.subagents.get(id) : undefined) ?? this.run;
  }

  /** Feeds a message of the conversation to the guard (usage per model response, to the
   * run of the sub-agent that made it). */
  async observe(message: { type: string } & Fields): Promise<void> {
    if (message.type !== "assistant") return;
    const run = this.runOf(message);
    const inner = message.message as
      | { id?: string; usage?: Fields; stop_reason?: string | null; content?: unknown }
      | undefined;
    const turn = inner?.id ?? String(message.uuid ?? "");
    const used = inner?.usage;
    if (used !== undefined && !this.turnsSeen.has(turn)) {
      this.turnsSeen.add(turn);
      await bestEffort(() =>
        run.modelTurn(inner?.stop_reason ?? "tool_use", { usage: anthropicUsage(used) }),
      );
    }
    const agentId = message.agent_id;
    const said = textOf(inner?.content);
    if (typeof agentId !== "string" || said === "") return;
    this.saidLast.set(agentId, said);
    if (this.ending.get(agentId) === said) await this.closeSubagent(agentId);
  }

  // --- hooks -----------------------------------------------------------------------

  private async preToolUse(input: Fields, toolUseId: string | undefined): Promise<HookJSONOutput> {
    const run = this.runOf(input);
    const tool = String(input.tool_name ?? "");
    const args = input.tool_input ?? {};
    const callId =
      toolUseId ?? (typeof input.tool_use_id === "string" ? input.tool_use_id : run.nextCallId());
    const gate = await this.ask(run, tool, args, callId);
    if (gate.mayRun) {
      const refused = isAgentTool(tool) ? await this.launch(run, gate, args) : null;
      if (refused !== null) {
        return preTool({ permissionDecision: "deny", permissionDecisionReason: refused });
      }
      if (gate.warning) return preTool({ additionalContext: `fusebox: ${gate.warning}` });
      // Nothing: "allow" would skip the user's own permission rules.
      return {};
    }
    const reason = gate.modelText ?? `fusebox refused ${tool}.`;
    const answer = preTool({ permissionDecision: "deny", permissionDecisionReason: reason });
    // A sub-agent's stop ends that sub-agent only: its model reads why and reports back.
    if (!gate.stopped || run !== this.run) return answer;
    this.interrupt();
    return { ...answer, ...end(reason) };
  }

  /** An `Agent` call the guard let through: its sub-agent's child run, started now. A
   * refused child (a cap of a run above) is the call's answer instead, in the guard's
   * words; null when the sub-agent may start. */
  private async launch(parent: Run, gate: Gate, args: unknown): Promise<string | null> {
    const asked = (args as Fields).subagent_type;
    const type = typeof asked === "string" && asked !== "" ? asked : DEFAULT_SUBAGENT;
    const child = await parent.startChild({ agent: type });
    if (child.stopped === null) {
      this.launched.push({ type, child });
      return null;
    }
    child.close();
    const text = childStopText(child);
    await report(parent, gate.callId, gate.tool, "SUCCESS", text);
    return text;
  }

  /** A sub-agent starts: the child run started for its `Agent` call becomes its run (the
   * first one waiting of its type: the hook does not name the call). One whose call was
   * not seen gets a child run of the root here. */
  private async subagentStart(input: Fields): Promise<HookJSONOutput> {
    const id = String(input.agent_id ?? "");
    const type = String(input.agent_type ?? DEFAULT_SUBAGENT);
    const waiting = this.launched.findIndex((l) => l.type === type);
    const child =
      waiting >= 0
        ? (this.launched.splice(waiting, 1)[0] as { child: Run }).child
        : await this.run.startChild({ agent: type });
    this.subagents.set(id, child);
    return {};
  }

  /**
   * A sub-agent ends on its own: its child run is closed once its final turn is reported
   * too (a turn reported to a closed run would not count). That turn reaches the guard
   * one of two ways: a background sub-agent's final message comes through the SDK's
   * queue (`observe`), possibly after this hook; a foreground one's is not a message at
   * all, but the usage in its `Agent` call's output (`postToolUse`). Neither by the
   * guard's deadline (messages not fed to `observe`): closed then.
   */
  private async subagentStop(input: Fields): Promise<HookJSONOutput> {
    const id = String(input.agent_id ?? "");
    const final = input.last_assistant_message;
    if (typeof final !== "string" || final === "" || this.saidLast.get(id) === final) {
      await this.closeSubagent(id);
      return {};
    }
    this.ending.set(id, final);
    setTimeout(() => void this.closeSubagent(id), this.deadlineMs).unref();
    return {};
  }

  /** Closes a sub-agent's child run (once): `completed`, unless the guard stopped it. */
  private async closeSubagent(id: string): Promise<void> {
    const child = this.subagents.get(id);
    if (child === undefined || this.closedSubagents.has(id)) return;
    this.closedSubagents.add(id);
    this.ending.delete(id);
    if (child.stopped === null) await this.observed(child.finish("completed"));
    child.close();
  }

  private async ask(run: Run, tool: string, args: unknown, callId: string): Promise<Gate> {
    const asked = run.toolCall(tool, args, callOptions(this.opts, tool, args, callId));
    const late = new Promise<null>((done) => setTimeout(() => done(null), this.deadlineMs).unref());
    const gate = await Promise.race([asked, late]);
    if (gate !== null) return gate;
    // Beyond its own deadline the guard is silent, whatever gateOnError says: the hook
    // must answer before the SDK discards it and runs the tool anyway.
    const error = new GateTimeout(`fusebox.gate.${run.tenant}.${run.id}`, this.deadlineMs);
    return new Gate(callId, tool, null, error, false);
  }

  private async postToolUse(input: Fields, toolUseId: string | undefined): Promise<HookJSONOutput> {
    const run = this.runOf(input);
    const tool = String(input.tool_name ?? "");
    const callId = toolUseId ?? String(input.tool_use_id ?? "");
    const failed = input.hook_event_name === "PostToolUseFailure";
    const ended = failed || !isAgentTool(tool) ? null : foreground(input.tool_response);
    const child = ended === null ? undefined : this.subagents.get(ended.agentId);
    // A foreground sub-agent the guard stopped: its caller reads the guard's words as the
    // sub-agent's answer.
    const stopped = child?.stopped ? childStopText(child) : null;
    const reported = failed
      ? run.toolResult(callId, tool, "RETRYABLE", {
          code: input.is_interrupt ? "interrupted" : "tool_error",
          retryAfterMs: 0,
          output: String(input.error ?? ""),
        })
      : run.toolResult(callId, tool, "SUCCESS", { output: stopped ?? input.tool_response ?? null });
    const decision = await this.observed(reported);
    if (decision?.action === "stop" && run === this.run) {
      this.interrupt();
      return end(stopText(decision));
    }
    if (ended !== null) await this.foregroundEnded(ended.agentId, ended.usage);
    if (stopped === null || ended === null) return {};
    return {
      hookSpecificOutput: {
        hookEventName: "PostToolUse",
        updatedToolOutput: { ...ended.output, content: [{ type: "text", text: stopped }] },
      },
    };
  }

  /** A foreground sub-agent ended: its final turn (never a message) is the usage its
   * `Agent` output carries; with it reported, its child run is closed. */
  private async foregroundEnded(agentId: string, used: Fields): Promise<void> {
    const child = this.subagents.get(agentId);
    if (child === undefined || this.closedSubagents.has(agentId)) return;
    await this.observed(child.modelTurn("end_turn", { usage: anthropicUsage(used) }));
    await this.closeSubagent(agentId);
  }

  private async preCompact(input: Fields): Promise<HookJSONOutput> {
    const run = this.runOf(input);
    const decision = await this.observed(
      run.compaction(`claude-agent-sdk: ${String(input.trigger ?? "compaction")}`),
    );
    if (decision?.action !== "stop" || run !== this.run) return {};
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

/** A foreground `Agent` call's output (the sub-agent's answer, its `agentId` and its final
 * turn's `usage`); null for a background launch's (`isAsync`) or anything else. */
function foreground(response: unknown): { output: Fields; agentId: string; usage: Fields } | null {
  if (typeof response !== "object" || response === null) return null;
  const output = response as Fields;
  const { agentId, usage: used, isAsync } = output;
  if (typeof agentId !== "string" || isAsync === true) return null;
  if (typeof used !== "object" || used === null) return null;
  return { output, agentId, usage: used as Fields };
}

/** An Anthropic `usage` object as the contract's. */
function anthropicUsage(u: Fields) {
  const n = (key: string) => (typeof u[key] === "number" ? (u[key] as number) : undefined);
  return usage({
    input_tokens: n("input_tokens"),
    output_tokens: n("output_tokens"),
    cache_creation_input_tokens: n("cache_creation_input_tokens"),
    cache_read_input_tokens: n("cache_read_input_tokens"),
  });
}

/** The text blocks of a message's content. */
function textOf(content: unknown): string {
  if (!Array.isArray(content)) return "";
  return (content as Array<{ type?: string; text?: string }>)
    .filter((block) => block.type === "text")
    .map((block) => block.text ?? "")
    .join("");
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
