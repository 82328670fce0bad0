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
 *
 * Sub-agents are child runs (guard contract §6):
 * - `guard.asTool(agent, options)` is `agent.asTool(options)` whose every call runs the
 *   agent under a child run of the calling agent's run. A child the guard stops (or
 *   refuses to start) ends there, and the calling agent's model reads the guard's words
 *   as the tool's output; the parent goes on.
 * - A handoff starts a child run of the run of the agent that handed off, for the agent
 *   taking over. A handoff never returns, so a stop of that child ends the whole
 *   `runAgent`: it rejects with `RunStopped` for the child's run (`decision.run`).
 *
 * Which run a call, a result or a model response belongs to is found from the async
 * context of the `runAgent` (or sub-agent) it happens in, not from the objects: the SDK's
 * agents, tools and models are usually made once and shared by many runs, and the
 * guardrails and model wrapper installed on them by the first guard serve every run.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import {
  type Agent,
  type AgentInputItem,
  type AgentToolOptionsWithDefault,
  type AgentToolOptionsWithParameters,
  type FunctionTool,
  type Model,
  type ModelRequest,
  type ModelResponse,
  type NonStreamRunOptions,
  Runner,
  type RunResult,
  type ToolGuardrailFunctionOutput,
  ToolGuardrailFunctionOutputFactory,
  type ToolInputGuardrailData,
  type ToolInputGuardrailDefinition,
  type ToolOutputGuardrailData,
  type ToolOutputGuardrailDefinition,
} from "@openai/agents";
import { RunStopped } from "../errors.js";
import type { Gate } from "../gate.js";
import type { ChildRunOptions, Run } from "../run.js";
import {
  asChild,
  bestEffort,
  callOptions,
  childStopText,
  type GuardOptions,
  parseArgs,
  report,
  usage,
} from "./common.js";

const GUARDED = Symbol("fusebox-guarded");

// biome-ignore lint/suspicious/noExplicitAny: an agent of any context and output type (Agent is invariant in both)
type AnyAgent = Agent<any, any>;

/** `agent.asTool`'s options, either form (the default `{ input }` or your parameters). */
export type SubAgentToolOptions<A extends AnyAgent> =
  // biome-ignore lint/suspicious/noExplicitAny: an agent of any context, with any parameters schema
  AgentToolOptionsWithDefault<any, A> | AgentToolOptionsWithParameters<any, A, any>;

/** One agent run in progress, `runAgent`'s or a sub-agent's: the runs of its agents. */
interface Scope {
  /** The guard whose `runAgent` this scope is part of. */
  readonly guard: OpenAIAgentsGuard;
  /** The run of the agent the scope began with. */
  readonly run: Run;
  /** Runs of the agents handed off to in this scope (the latest handoff to each). */
  readonly handoffs: Map<AnyAgent, Promise<Run>>;
  /** Every handoff's run, to be closed with the scope. */
  readonly children: Array<Promise<Run>>;
  /** Gates of calls let through and not answered yet, by call id, with their run. */
  readonly gates: Map<string, { gate: Gate; run: Run }>;
}

/** The scope of the agent run the current async context is part of. */
const scopes = new AsyncLocalStorage<Scope>();

function newScope(guard: OpenAIAgentsGuard, run: Run): Scope {
  return { guard, run, handoffs: new Map(), children: [], gates: new Map() };
}

/** The run of `agent` in `scope`: a handoff's child run, else the scope's own. */
function runOf(scope: Scope, agent: AnyAgent): Promise<Run> {
  return scope.handoffs.get(agent) ?? Promise.resolve(scope.run);
}

/** `agent_handoff`, on every protected agent: the agent taking over gets a child run of
 * the handing-off agent's run (its first model call or tool call waits for it). */
function onHandoff(from: AnyAgent, next: AnyAgent): void {
  const scope = scopes.getStore();
  if (scope === undefined) return;
  const child = runOf(scope, from).then((parent) => parent.startChild({ agent: next.name }));
  // Awaited by the new agent's first call; a failed start fails that call, not the process.
  child.catch(() => undefined);
  scope.handoffs.set(next, child);
  scope.children.push(child);
}

/** Closes the handoff runs of a scope that ended (newest first, each below the last). */
async function closeChildren(scope: Scope, status: string): Promise<void> {
  for (const started of [...scope.children].reverse()) {
    const child = await started.catch(() => null);
    if (child === null) continue;
    if (child.stopped === null) await bestEffort(() => child.finish(status));
    child.close();
  }
}

/** A handoff run of the scope the guard stopped, if any (the root's own stop aside). */
async function stoppedChild(scope: Scope): Promise<Run | null> {
  for (const started of scope.children) {
    const child = await started.catch(() => null);
    if (child?.stopped) return child;
  }
  return null;
}

export class OpenAIAgentsGuard {
  /** The scope of calls made outside `runAgent` (your own `runner.run` on a protected
   * agent): they belong to this guard's run. */
  private readonly outside: Scope;

  constructor(
    readonly run: Run,
    private readonly opts: GuardOptions = {},
  ) {
    this.outside = newScope(this, run);
  }

  /** The tool input guardrail that asks the daemon before a call runs. */
  readonly inputGuardrail: ToolInputGuardrailDefinition = {
    type: "tool_input",
    name: "fusebox",
    run: (data) => this.beforeCall(scopes.getStore() ?? this.outside, data),
  };

  /** The tool output guardrail that reports each result (and appends a warning). */
  readonly outputGuardrail: ToolOutputGuardrailDefinition = {
    type: "tool_output",
    name: "fusebox",
    run: (data) => this.afterCall(scopes.getStore() ?? this.outside, data),
  };

  private async beforeCall(
    scope: Scope,
    { agent, toolCall }: ToolInputGuardrailData,
  ): Promise<ToolGuardrailFunctionOutput> {
    const run = await runOf(scope, agent);
    const opts = scope.guard.opts;
    const args = parseArgs(toolCall.arguments);
    const gate = await run.toolCall(
      toolCall.name,
      args,
      callOptions(opts, toolCall.name, args, toolCall.callId),
    );
    if (gate.mayRun) {
      scope.gates.set(gate.callId, { gate, run });
      return ToolGuardrailFunctionOutputFactory.allow({ action: gate.action });
    }
    if (gate.stopped) return ToolGuardrailFunctionOutputFactory.throwException(gate.report);
    return ToolGuardrailFunctionOutputFactory.rejectContent(
      gate.modelText ?? "refused by fusebox",
      { action: gate.action },
    );
  }

  private async afterCall(
    scope: Scope,
    { toolCall, output }: ToolOutputGuardrailData,
  ): Promise<ToolGuardrailFunctionOutput> {
    const called = scope.gates.get(toolCall.callId);
    scope.gates.delete(toolCall.callId);
    if (called === undefined) return ToolGuardrailFunctionOutputFactory.allow();
    const { gate, run } = called;
    await report(run, gate.callId, toolCall.name, "SUCCESS", output);
    if (gate.warning) return ToolGuardrailFunctionOutputFactory.rejectContent(gate.reads(output));
    return ToolGuardrailFunctionOutputFactory.allow();
  }

  /** Puts the guard on every function tool of `agent` (and of the agents it hands off
   * to), wraps its model when it is a `Model` object, and starts a child run at each of
   * its handoffs. Idempotent. Returns `agent`. */
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
      if (typeof a.model !== "string") a.model = this.agentModel(a.model, a);
      const marked = a as AnyAgent & { [GUARDED]?: true };
      if (!marked[GUARDED]) {
        a.on("agent_handoff", (_context, next: AnyAgent) => onHandoff(a, next));
        marked[GUARDED] = true;
      }
      for (const handoff of a.handoffs) visit("tools" in handoff ? handoff : handoff.agent);
    };
    visit(agent);
    return agent;
  }

  /** `model` reporting each response's usage, and refusing to be called once the run is
   * stopped (the kill switch ends the agent before another model turn). */
  model(model: Model): Model {
    return this.agentModel(model, null);
  }

  /** `model` for `agent`'s turns: usage goes to the run of that agent in the current
   * scope (a handoff's or a sub-agent's run), or to this guard's run. */
  private agentModel(model: Model, agent: AnyAgent | null): Model {
    if ((model as { [GUARDED]?: true })[GUARDED]) return model;
    const runNow = (): Promise<Run> => {
      const scope = scopes.getStore() ?? this.outside;
      return agent === null ? Promise.resolve(scope.run) : runOf(scope, agent);
    };
    const guarded: Model & { [GUARDED]: true } = {
      [GUARDED]: true,
      async getResponse(request: ModelRequest): Promise<ModelResponse> {
        const run = await runNow();
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
      async *getStreamedResponse(request: ModelRequest) {
        (await runNow()).throwIfStopped();
        yield* model.getStreamedResponse(request);
      },
    };
    return guarded;
  }

  /**
   * `agent.asTool(options)` as a sub-agent: each call of the tool runs `agent` under a
   * child run of the calling agent's run (`child` sets its run id, policy …; `agent`
   * defaults to the agent's name). The tool call itself is one step of the caller's run;
   * the sub-agent's calls and model turns are the child's, and count in every budget
   * above it. When the guard stops the child (or refuses to start it: a cap of a run
   * above), the sub-agent ends there and the caller's model reads the guard's words as
   * the tool's output.
   */
  asTool<A extends AnyAgent>(
    agent: A,
    options: SubAgentToolOptions<A>,
    child: ChildRunOptions = {},
  ): FunctionTool {
    this.protect(agent);
    // Either form of the options; `asTool`'s overloads take one at a time.
    const maker = agent as { asTool(o: SubAgentToolOptions<A>): FunctionTool };
    const tool = maker.asTool(options);
    const invoke = tool.invoke;
    tool.invoke = (runContext, input, details) => {
      const scope = scopes.getStore() ?? this.outside;
      const callId = details?.toolCall?.callId;
      const parent = (callId === undefined ? undefined : scope.gates.get(callId)?.run) ?? scope.run;
      const body = async (run: Run): Promise<unknown> => {
        const inner = newScope(scope.guard, run);
        let output: unknown;
        try {
          output = await scopes.run(inner, () => invoke(runContext, input, details));
        } catch (err) {
          await closeChildren(inner, "failed");
          throw err;
        }
        // The SDK turns a failure inside the sub-agent into an error text for the model;
        // when it was the stop of a run the sub-agent handed off to, the guard's words
        // are the answer instead.
        const below = await stoppedChild(inner);
        await closeChildren(inner, below === null ? "completed" : "failed");
        return below === null ? output : childStopText(below);
      };
      return asChild(parent, { agent: agent.name, ...child }, body, (text) => text);
    };
    return tool;
  }

  /**
   * `runner.run(agent, input)` behind the guard: rejects with `RunStopped` when the guard
   * (or an operator, through the kill switch) stops the run or a run it handed off to,
   * aborting whatever is in flight; closes the run with `run_finished` when the agent ends
   * on its own.
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
    const scope = newScope(this, this.run);
    return scopes.run(scope, async () => {
      let result: RunResult<unknown, A>;
      try {
        result = (await runner.run(agent, input, {
          ...options,
          signal: abort.signal,
        })) as RunResult<unknown, A>;
      } catch (err) {
        this.run.throwIfStopped();
        const child = await stoppedChild(scope);
        await closeChildren(scope, "failed");
        await bestEffort(() => this.run.finish("failed"));
        if (child !== null) throw new RunStopped(child.stopped, child.stop);
        throw err;
      }
      this.run.throwIfStopped();
      await closeChildren(scope, "completed");
      await bestEffort(() => this.run.finish("completed"));
      return result;
    });
  }
}
