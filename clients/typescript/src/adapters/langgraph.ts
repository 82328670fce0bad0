/**
 * LangGraph.js (`@langchain/langgraph` 1.7): graphs you build yourself, `StateGraph` +
 * `ToolNode` or the prebuilt `createReactAgent`. `ToolNode` has no wrap hook, so the
 * tools themselves are wrapped: every call is gated by fuseboxd before it runs.
 *
 *     const guard = new LangGraphGuard(run);
 *     const graph = new StateGraph(MessagesAnnotation)
 *       .addNode("agent", callModel)
 *       .addNode("tools", new ToolNode(guard.tools(tools)))
 *       .addEdge(START, "agent")
 *       .addConditionalEdges("agent", toolsCondition)
 *       .addConditionalEdges("tools", guard.afterTools("agent"))
 *       .compile();
 *     const state = await guard.invoke(graph, { messages: [...] });  // RunStopped on a stop
 *
 * - A wrapped tool asks before it runs: `execute` / `warn` run it (a warning is appended
 *   to what the model reads), a block answers with the guard's message as the call's
 *   `ToolMessage`, `use_completed_result` with the stored result; every result is reported.
 * - A stop answers the call with the stop message; `afterTools` then routes to END, so the
 *   model is not called again and every call id in the history has its answer.
 *   `createReactAgent` has a fixed tools → agent edge: pass `preModelHook:
 *   guard.beforeModel`, which ends the graph before the next model call.
 * - `invoke` runs the graph with `callbacks` that report each model response's usage
 *   (`model_turn`), closes the run (`run_finished` `completed` / `failed`), and rejects
 *   with `GraphStopped` (a `RunStopped` carrying the graph's last state) on a stop.
 * - `subAgent` runs a subgraph (or any agent) under a child run (guard contract §6): from
 *   a tool (an agent used as a tool) or from a node of the parent graph. The wrapped
 *   tools, `afterTools`, `beforeModel` and `callbacks` of this guard report to the run of
 *   the sub-agent they run in, found from the async context, so a subgraph built once
 *   with this guard's tools serves every child. A compiled subgraph added as a node of
 *   its own (`addNode("research", subgraph)`) runs inside the parent's step: LangGraph
 *   gives no boundary to start a child run at, so its calls are the parent run's.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { BaseCallbackHandler, type CallbackHandlerMethods } from "@langchain/core/callbacks/base";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import type { ChatGeneration, LLMResult } from "@langchain/core/outputs";
import type { RunnableConfig } from "@langchain/core/runnables";
import type { StructuredToolInterface } from "@langchain/core/tools";
import { END } from "@langchain/langgraph";
import { RunStopped } from "../errors.js";
import type { ChildRunOptions, Run } from "../run.js";
import type { Decision, ResultKind, StopReport } from "../types.js";
import { asChild, bestEffort, callOptions, type GuardOptions, report } from "./common.js";
import { refusal, reportModelTurn } from "./langchain-messages.js";

/** The guard stopped the run; `state` is the graph's last state (its history is whole). */
export class GraphStopped<S = unknown> extends RunStopped {
  override name = "GraphStopped";
  constructor(
    report: StopReport | null,
    decision: Decision | null,
    readonly state: S | undefined,
  ) {
    super(report, decision);
  }
}

/** What `invoke` needs of a compiled graph (`CompiledStateGraph`, `createReactAgent`). */
export interface StreamingGraph<S> {
  stream(input: unknown, options?: Record<string, unknown>): Promise<AsyncIterable<S>>;
}

interface ToolCallInput {
  id?: string;
  name: string;
  args: Record<string, unknown>;
  type: "tool_call";
}

const isToolCall = (input: unknown): input is ToolCallInput =>
  typeof input === "object" &&
  input !== null &&
  (input as { type?: unknown }).type === "tool_call" &&
  "args" in input;

/** A guard and the sub-agents' guards made from it: which of them the code running now
 * reports to, and the one model-turn handler they share (so a subgraph invoked with its
 * parent's config does not report a turn twice). */
interface Family {
  readonly active: AsyncLocalStorage<LangGraphGuard>;
  readonly turns: BaseCallbackHandler;
}

export class LangGraphGuard {
  private family: Family;
  /** `invoke` closes the run; a sub-agent's guard leaves that to `subAgent`. */
  private closesRun = true;

  constructor(
    readonly run: Run,
    readonly opts: GuardOptions = {},
  ) {
    const active = new AsyncLocalStorage<LangGraphGuard>();
    this.family = { active, turns: new ModelTurns(() => (active.getStore() ?? this).run) };
  }

  /** Reports each model response as a `model_turn`, to the run of the sub-agent it was
   * made in; `invoke` adds it to `callbacks`. */
  get callbacks(): BaseCallbackHandler {
    return this.family.turns;
  }

  /** The guard of the sub-agent the code running now belongs to (this one outside). */
  private get current(): LangGraphGuard {
    return this.family.active.getStore() ?? this;
  }

  /** The same tools, each gated before it runs and its result reported. */
  tools<T extends StructuredToolInterface>(tools: readonly T[]): T[] {
    return tools.map((inner) => this.tool(inner));
  }

  tool<T extends StructuredToolInterface>(inner: T): T {
    // Delegates everything else (name, schema, description, returnDirect) to the tool.
    const wrapped = Object.create(inner) as T;
    wrapped.invoke = ((input: unknown, config?: Record<string, unknown>) =>
      this.call(inner, input, config)) as T["invoke"];
    return wrapped;
  }

  /** A conditional edge after the tools node: END once the run is stopped, else `next`. */
  afterTools<N extends string>(next: N): () => N | typeof END {
    return () => (this.current.run.stopped !== null ? END : next);
  }

  /** A node before each model call (`createReactAgent`'s `preModelHook`): throws
   * `RunStopped` once the run is stopped, which `invoke` turns into `GraphStopped`. */
  readonly beforeModel = (): Record<string, never> => {
    this.current.run.throwIfStopped();
    return {};
  };

  /**
   * Runs a sub-agent under a child run of the current run: `body` gets a guard of the
   * child's own — `child.invoke(subgraph, input, config)` — and the tools, edges and
   * callbacks of this guard report to the child while `body` runs. Call it in a tool
   * (an agent used as a tool) or in a node of the parent graph. The sub-agent's calls and
   * model turns are the child's, and count in every budget above it; `child` sets the
   * child's run options (`agent`, `policy` …). Resolves with `body`'s result, or — when
   * the guard stopped the child, or refused to start it (a cap of a run above) — with the
   * guard's words, for the parent's model to read as the sub-agent's answer; the parent
   * goes on.
   */
  subAgent<T>(body: (child: LangGraphGuard) => Promise<T>, child: ChildRunOptions = {}) {
    return asChild(
      this.current.run,
      child,
      (run) => {
        const guard = new LangGraphGuard(run, this.opts);
        guard.family = this.family;
        guard.closesRun = false;
        return this.family.active.run(guard, () => body(guard));
      },
      (text) => text,
    );
  }

  /** Runs `graph` behind the guard; resolves with its final state. `config` may be the
   * config a node or a tool was given (a subgraph run by `subAgent`). */
  async invoke<S>(
    graph: StreamingGraph<S>,
    input: unknown,
    config: RunnableConfig = {},
  ): Promise<S> {
    await this.run.start();
    let state: S | undefined;
    try {
      const stream = await graph.stream(input, {
        ...config,
        callbacks: withHandler(config.callbacks, this.callbacks),
        streamMode: "values",
      });
      for await (const values of stream) state = values;
    } catch (err) {
      if (this.run.stopped === null) {
        if (this.closesRun) await bestEffort(() => this.run.finish("failed"));
        throw err;
      }
    }
    if (this.run.stopped !== null) {
      throw new GraphStopped(this.run.stopped, this.run.stop, state);
    }
    if (this.closesRun) await bestEffort(() => this.run.finish("completed"));
    return state as S;
  }

  private async call(
    inner: StructuredToolInterface,
    input: unknown,
    config?: Record<string, unknown>,
  ): Promise<unknown> {
    const { run, opts } = this.current;
    const name = inner.name;
    const toolCall = isToolCall(input) ? input : undefined;
    const args = toolCall ? toolCall.args : input;
    const callId = toolCall?.id ?? run.nextCallId();
    const gate = await run.toolCall(name, args, callOptions(opts, name, args, callId));
    if (!gate.mayRun) return toolCall?.id ? refusal(gate) : (gate.modelText ?? "");
    let outcome: unknown;
    try {
      outcome = await inner.invoke(input as Parameters<typeof inner.invoke>[0], config);
    } catch (err) {
      await report(run, callId, name, "RETRYABLE", String(err));
      throw err;
    }
    if (!ToolMessage.isInstance(outcome)) {
      await report(run, callId, name, "SUCCESS", outcome);
      return gate.warning ? gate.reads(outcome) : outcome;
    }
    const message = outcome as ToolMessage;
    const kind: ResultKind = message.status === "error" ? "RETRYABLE" : "SUCCESS";
    await report(run, callId, name, kind, message.content);
    if (!gate.warning) return message;
    return new ToolMessage({
      content: gate.reads(message.content),
      tool_call_id: message.tool_call_id,
      name: message.name ?? name,
      status: message.status ?? "success",
    });
  }
}

/** `handleLLMEnd` → `model_turn` of the run the call was made in, awaited so the turn is
 * sent before its tool calls. */
class ModelTurns extends BaseCallbackHandler implements CallbackHandlerMethods {
  name = "FuseboxModelTurns";
  override awaitHandlers = true;

  constructor(private readonly run: () => Run) {
    super();
  }

  override async handleLLMEnd(output: LLMResult): Promise<void> {
    const message = (output.generations[0]?.[0] as ChatGeneration | undefined)?.message;
    if (AIMessage.isInstance(message)) await reportModelTurn(this.run(), message as AIMessage);
  }
}

/** The caller's callbacks (a list or a manager) plus ours, unless they hold it already
 * (a subgraph invoked with its parent's config). */
function withHandler(callbacks: unknown, handler: BaseCallbackHandler): unknown {
  if (callbacks === undefined || callbacks === null) return [handler];
  if (Array.isArray(callbacks))
    return callbacks.includes(handler) ? callbacks : [...callbacks, handler];
  const manager = callbacks as {
    handlers: BaseCallbackHandler[];
    copy(): { addHandler(h: BaseCallbackHandler): void };
  };
  if (manager.handlers.includes(handler)) return manager;
  const copy = manager.copy();
  copy.addHandler(handler);
  return copy;
}
