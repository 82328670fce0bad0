/**
 * Mastra (`@mastra/core` 1.71): every tool call of an `Agent` gated by fuseboxd, and each
 * delegation to a sub-agent a child run.
 *
 *     const researcher = new Agent(MastraGuard.subAgent({ id: "researcher", model, tools }));
 *     const lead = new Agent({ id: "lead", model, tools, agents: { researcher } });
 *     const guard = new MastraGuard(run, { opKey });
 *     const result = await guard.generate(lead, "triage the queue", { maxSteps: 50 });
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
 *
 * Sub-agents are child runs (guard contract §6). What Mastra 1.71 does with an agent's
 * `agents`: each is a tool of the delegating agent, `agent-<key>`, whose call goes through
 * the delegating agent's hooks (one step of its run, gated like any call) and whose
 * `execute` runs the sub-agent's own `generate` with options Mastra makes itself: not the
 * caller's hooks, processors or `onStepFinish` (mastra #10866), only the sub-agent's own
 * (its config and `defaultOptions`) and a request context copied for this one delegation.
 * Before that, Mastra calls the caller's `delegation.onDelegationStart` with the model's
 * tool-call id and that copy; after it, `onDelegationComplete` with the same id, whose
 * `resultText` replaces what the caller's model reads. So:
 * - `generate` adds those two delegation hooks. At the start of each delegation the guard
 *   starts a child run of the delegating agent's run, `<parent>-<sub-agent id>-<tool-call
 *   id>`, and puts it in the delegation's request context; when the sub-agent returns
 *   the child is closed (`completed`, `failed: …` as above) — and when the guard stopped
 *   it (its own loop or budget, a tree budget, a stop of a run above reaching it, its
 *   kill switch), the caller's model reads the guard's words (`childStopText`) as the
 *   sub-agent's answer and the caller goes on, or ends, as its model decides. A child the
 *   daemon refuses to start (a cap of a run above, a stopped ancestor) never runs: the
 *   caller's model reads `[Delegation Rejected]` and the guard's words.
 * - A sub-agent's calls are told apart from its caller's by that request context: it is
 *   the one thing of this delegation's own that Mastra hands the sub-agent's hooks
 *   (`context.requestContext`) and processors (`requestContext`), while the caller's
 *   hooks and processors never see the sub-agent's calls. The guard's hooks and
 *   processor route each call, step and usage to the run named there. A sub-agent must carry them, since
 *   Mastra passes it nothing of its caller's: build it with `MastraGuard.subAgent(config)`
 *   (the hooks, the processor as an input and an output processor — its
 *   `processOutputStep` reports the sub-agent's usage per step — and the delegation hooks
 *   in its `defaultOptions`, so its own sub-agents are its children). Built once, it
 *   serves every guarded run; called outside one (no run in its context), the guard's
 *   pieces do nothing. A sub-agent built without them still gets its child run, opened
 *   and closed around it, with none of its calls in it.
 * - Not followed: delegations dispatched as background tasks and sub-agents that suspend
 *   (tool approval) — a child left open when `generate` ends is closed `failed` with
 *   it; networks (`agent.network`), whose routing loop runs its agents without
 *   delegation hooks. With `agent.stream`, pass `delegation: guard.delegation` too.
 * The adapter never decides: it asks the daemon through the run and applies the answer.
 */
import type {
  Agent,
  AgentConfig,
  AgentExecutionOptionsBase,
  DelegationCompleteContext,
  DelegationCompleteResult,
  DelegationConfig,
  DelegationStartContext,
} from "@mastra/core/agent";
import type { InputProcessor, OutputProcessor } from "@mastra/core/processors";
import type { ToolHooks } from "@mastra/core/tools";
import type { Gate } from "../gate.js";
import type { Run } from "../run.js";
import { summary } from "../types.js";
import {
  bestEffort,
  callOptions,
  childStopText,
  type GuardOptions,
  report,
  usage,
} from "./common.js";

/** The options of a plain (no structured output) `generate`. */
type GenerateOptions = AgentExecutionOptionsBase<unknown> & { structuredOutput?: never };
type Generated = Awaited<ReturnType<Agent["generate"]>>;

// biome-ignore lint/suspicious/noExplicitAny: an agent config of any id, tools, output and context type
type AnyAgentConfig = AgentConfig<any, any, any, any>;
/** What a config's `defaultOptions` holds: execution options, of which the guard adds to
 * `delegation` only. */
type DefaultOptions = { delegation?: DelegationConfig | undefined };

/** The guard's processor: an input processor (stops, warnings) and an output processor
 * (a sub-agent's usage). */
export type FuseboxProcessor = InputProcessor & OutputProcessor;

interface StepUsage {
  inputTokens?: number | undefined;
  outputTokens?: number | undefined;
  cachedInputTokens?: number | undefined;
}

interface Step {
  finishReason?: string | undefined;
  usage?: StepUsage;
}

/** The request-context key of the run a call belongs to (a `Scope`). */
const SCOPE_KEY = "fusebox__scope";

/** One guarded agent execution: a guard's own (`generate`) or a delegation's. */
class Scope {
  /** Gates of calls let through and not yet reported, by tool-call id. */
  readonly gates = new Map<string, Gate>();
  /** Warnings for the model's next step, in the order of their calls. */
  readonly warnings: string[] = [];
  /** Tool-call ids of this agent's delegations not reported yet. */
  readonly delegations = new Set<string>();
  /** Child runs of this agent's delegations whose sub-agent has not returned. */
  readonly children = new Set<Scope>();

  /** `delegated`: a sub-agent's, whose usage its output processor reports. */
  constructor(
    readonly run: Run,
    readonly opts: GuardOptions,
    readonly delegated: boolean,
  ) {}

  /** Mastra may serialize a request context (durable agents, traces): the run id. */
  toJSON(): string {
    return this.run.id;
  }
}

/** The run a request context names (a delegation's), if any. */
function scopeIn(requestContext: unknown): Scope | undefined {
  if (typeof requestContext !== "object" || requestContext === null) return undefined;
  const get = (requestContext as { get?: unknown }).get;
  if (typeof get !== "function") return undefined;
  const scope: unknown = get.call(requestContext, SCOPE_KEY);
  return scope instanceof Scope ? scope : undefined;
}

/** The run of a tool call: its request context's, else `fallback`'s. */
function scopeOfCall(context: unknown, fallback: Scope | null): Scope | null {
  const rc =
    typeof context === "object" && context !== null
      ? (context as { requestContext?: unknown }).requestContext
      : undefined;
  return scopeIn(rc) ?? fallback;
}

/** Delegations in flight, by the delegating execution's Mastra run id and tool-call id
 * (`onDelegationComplete` has no request context to find them by). */
const inFlight = new Map<string, { parent: Scope; child: Scope }>();
const flightKey = (ctx: { runId: string; toolCallId: string }) => `${ctx.runId}\n${ctx.toolCallId}`;

function toolHooks(fallback: Scope | null): ToolHooks {
  return {
    beforeToolCall: async ({ toolName, input, context }) => {
      const scope = scopeOfCall(context, fallback);
      if (scope === null) return undefined;
      const callId = toolCallIdOf(context) ?? scope.run.nextCallId();
      const gate = await scope.run.toolCall(
        toolName,
        input,
        callOptions(scope.opts, toolName, input, callId),
      );
      if (gate.mayRun) {
        scope.gates.set(callId, gate);
        return undefined;
      }
      if (gate.action === "use_completed_result") {
        return { proceed: false, output: gate.completedResult };
      }
      return { proceed: false, output: gate.modelText ?? "refused by fusebox" };
    },
    afterToolCall: async ({ toolName, context, output, error }) => {
      const scope = scopeOfCall(context, fallback);
      const callId = toolCallIdOf(context);
      const gate = callId === undefined ? undefined : scope?.gates.get(callId);
      if (scope === null || gate === undefined) return;
      scope.gates.delete(gate.callId);
      if (error !== undefined) {
        scope.delegations.delete(gate.callId);
        await report(scope.run, gate.callId, toolName, "RETRYABLE", String(error));
        return;
      }
      // A delegation's result is what the model reads of it (the sub-agent's answer, or
      // the guard's words), without the thread ids Mastra makes afresh each time.
      const read = scope.delegations.delete(gate.callId) ? delegationText(output) : output;
      await report(scope.run, gate.callId, toolName, "SUCCESS", read);
      if (gate.warning) scope.warnings.push(gate.warning);
    },
  };
}

function processorOf(fallback: Scope | null): FuseboxProcessor {
  return {
    id: "fusebox",
    processInputStep: ({ abort, systemMessages, requestContext }) => {
      const scope = scopeIn(requestContext) ?? fallback;
      if (scope === null) return undefined;
      if (scope.run.stopped !== null) abort(stopText(scope.run));
      if (scope.warnings.length === 0) return undefined;
      const said = scope.warnings.splice(0).map((w) => `[fusebox warning] ${w}`);
      return {
        systemMessages: [
          ...systemMessages,
          ...said.map((content) => ({ role: "system" as const, content })),
        ],
      };
    },
    processOutputStep: async ({ requestContext, finishReason, usage: u, messages }) => {
      // A guard's own run has its usage from `onStepFinish`; a sub-agent's from here.
      const scope = scopeIn(requestContext);
      if (scope?.delegated) await modelTurn(scope.run, { finishReason, usage: u });
      return messages;
    },
  };
}

async function modelTurn(run: Run, step: Step): Promise<void> {
  const u = step.usage ?? {};
  const cached = u.cachedInputTokens ?? 0;
  await bestEffort(() =>
    run.modelTurn(step.finishReason === "tool-calls" ? "tool_use" : "end_turn", {
      usage: usage({
        input_tokens: u.inputTokens === undefined ? undefined : u.inputTokens - cached,
        output_tokens: u.outputTokens,
        cache_read_input_tokens: cached || undefined,
        cache_creation_input_tokens: undefined,
      }),
    }),
  );
}

type DelegationHooks = Required<
  Pick<DelegationConfig, "onDelegationStart" | "onDelegationComplete">
>;

function delegationHooks(fallback: Scope | null): DelegationHooks {
  return {
    onDelegationStart: async (ctx: DelegationStartContext) => {
      if (ctx.primitiveType !== "agent") return undefined;
      const parent = scopeIn(ctx.requestContext) ?? fallback;
      if (parent === null) return undefined;
      let child: Run;
      try {
        child = await parent.run.startChild({ agent: ctx.primitiveId, key: ctx.toolCallId });
      } catch (err) {
        // Mastra would go on without the child (a hook that throws only warns).
        return {
          proceed: false,
          rejectionReason: `fusebox could not start the run of the sub-agent ${ctx.primitiveId}: ${String(err)}`,
        };
      }
      parent.delegations.add(ctx.toolCallId);
      if (child.stopped !== null) {
        child.close();
        return { proceed: false, rejectionReason: childStopText(child) };
      }
      const scope = new Scope(child, parent.opts, true);
      ctx.requestContext.set(SCOPE_KEY, scope);
      parent.children.add(scope);
      inFlight.set(flightKey(ctx), { parent, child: scope });
      return undefined;
    },
    onDelegationComplete: async (ctx: DelegationCompleteContext) => {
      const flight = inFlight.get(flightKey(ctx));
      if (flight === undefined) return undefined;
      inFlight.delete(flightKey(ctx));
      const { parent, child } = flight;
      parent.children.delete(child);
      const status =
        ctx.error !== undefined
          ? `failed: ${String(ctx.error)}`
          : ctx.result.finishReason === "tool-calls"
            ? `failed: ${UNANSWERED}`
            : ctx.result.finishReason === "error"
              ? "failed"
              : "completed";
      // Stopped by the guard while it ran; else closed now (whose answer may be a stop
      // too, the run's last word, not the sub-agent's outcome).
      const stopped = child.run.stopped !== null;
      await closeScope(child, status);
      return stopped ? { resultText: childStopText(child.run) } : undefined;
    },
  };
}

/** `ours` and the caller's own delegation config: theirs may reject a delegation first
 * (no child is started then); the guard's words replace a stopped sub-agent's answer. */
function withDelegation(ours: DelegationHooks, theirs?: DelegationConfig): DelegationConfig {
  if (theirs === undefined) return ours;
  return {
    ...theirs,
    onDelegationStart: async (ctx) => {
      const said = (await theirs.onDelegationStart?.(ctx)) ?? undefined;
      if (said?.proceed === false) return said;
      const guard = await ours.onDelegationStart(ctx);
      return guard?.proceed === false ? guard : said;
    },
    onDelegationComplete: async (ctx) => {
      const said = (await theirs.onDelegationComplete?.(ctx)) ?? undefined;
      const guard = (await ours.onDelegationComplete(ctx)) ?? undefined;
      return guard === undefined ? said : ({ ...said, ...guard } as DelegationCompleteResult);
    },
  };
}

/** Closes a child run (and any of its own children still open), unless it is stopped. */
async function closeScope(scope: Scope, status: string): Promise<void> {
  for (const below of [...scope.children]) {
    scope.children.delete(below);
    await closeScope(below, `failed: ${LEFT_OPEN}`);
  }
  for (const [key, flight] of inFlight) if (flight.child === scope) inFlight.delete(key);
  if (scope.run.stopped === null) await bestEffort(() => scope.run.finish(status.slice(0, 200)));
  scope.run.close();
}

/** Hooks, processor and delegation hooks that follow the run in the request context only
 * (a sub-agent's, built once for every run). */
const SUB_AGENT = {
  hooks: toolHooks(null),
  processor: processorOf(null),
  delegation: delegationHooks(null),
};

export class MastraGuard {
  private readonly scope: Scope;
  /** Mastra's tool hooks: the gate before each call, the report after it (for the run in
   * the call's request context, a delegation's, else this guard's). */
  readonly hooks: ToolHooks;
  /** Mastra's processor: as an input processor it ends the agent once its run is
   * stopped and hands the model the warnings of the calls it just made; as an output
   * processor it reports a sub-agent's usage. */
  readonly processor: FuseboxProcessor;
  /** The delegation hooks `generate` adds: each delegation a child run. */
  readonly delegation: DelegationHooks;

  constructor(
    readonly run: Run,
    opts: GuardOptions = {},
  ) {
    this.scope = new Scope(run, opts, false);
    this.hooks = toolHooks(this.scope);
    this.processor = processorOf(this.scope);
    this.delegation = delegationHooks(this.scope);
  }

  /**
   * A sub-agent's config with the guard in: its calls gated in the child run of each
   * delegation to it (the hooks, after the config's own ones: a call they refuse is
   * never asked), its steps stopped and warned (the processor, after its own input
   * processors), its usage reported (the processor, after its own output processors),
   * its own sub-agents its children (the delegation hooks, in its `defaultOptions`).
   * For `new Agent(MastraGuard.subAgent({ … }))`, once: it follows whichever guarded run
   * delegates to it.
   */
  static subAgent<C extends AnyAgentConfig>(config: C): C {
    const theirs = config.hooks;
    const hooks: ToolHooks =
      theirs === undefined
        ? SUB_AGENT.hooks
        : {
            beforeToolCall: async (ctx) => {
              const said = await theirs.beforeToolCall?.(ctx);
              if (said?.proceed === false) return said;
              return SUB_AGENT.hooks.beforeToolCall?.(ctx);
            },
            afterToolCall: async (ctx) => {
              await SUB_AGENT.hooks.afterToolCall?.(ctx);
              await theirs.afterToolCall?.(ctx);
            },
          };
    const guarded = {
      ...config,
      hooks,
      inputProcessors: appended(config.inputProcessors, SUB_AGENT.processor),
      outputProcessors: appended(config.outputProcessors, SUB_AGENT.processor),
      defaultOptions: dynamic(config.defaultOptions, (options: DefaultOptions | undefined) => ({
        ...options,
        delegation: withDelegation(SUB_AGENT.delegation, options?.delegation),
      })),
    };
    return guarded as C;
  }

  /** `onStepFinish`: the step's usage as a `model_turn`. */
  readonly onStepFinish = (step: Step): Promise<void> => modelTurn(this.run, step);

  /**
   * `agent.generate` with the guard in: the hooks, the processor (after the caller's own
   * input processors), usage reported, each delegation a child run. Closes the run:
   * `completed` when the agent answers, `failed: …` when it throws or stops at `maxSteps`
   * with calls asked for; a stopped run is closed already (`result.tripwire.reason` is
   * the guard's words).
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
      delegation: withDelegation(this.delegation, options.delegation),
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
    for (const child of [...this.scope.children]) {
      this.scope.children.delete(child);
      await closeScope(child, `failed: ${LEFT_OPEN}`);
    }
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

/** Why a child is closed `failed` with its caller: its sub-agent never returned (a
 * background task, a suspension) before the caller ended. */
const LEFT_OPEN = "the sub-agent had not returned when its caller ended";

/** A config's processors with `processor` after them, whether given as a list or as
 * Mastra's function of the request. */
function appended<P>(
  theirs: P[] | ((args: never) => P[] | Promise<P[]>) | undefined,
  processor: P,
): P[] | ((args: never) => Promise<P[]>) {
  return dynamic(theirs, (list: P[] | undefined) => [...(list ?? []), processor]);
}

/** `change` applied to a config value that Mastra may take as a function of the request
 * (`DynamicArgument`). */
function dynamic<T, U>(
  value: T | ((args: never) => T | Promise<T>) | undefined,
  change: (value: T | undefined) => U,
): U | ((args: never) => Promise<U>) {
  if (typeof value !== "function") return change(value);
  const resolve = value as (args: never) => T | Promise<T>;
  return async (args: never) => change(await resolve(args));
}

/** What the caller's model reads of a delegation's result (`{ text, … }`, or a text). */
function delegationText(output: unknown): unknown {
  if (typeof output === "string") return output;
  if (typeof output === "object" && output !== null && "text" in output) {
    return (output as { text: unknown }).text;
  }
  return output;
}

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
