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
 */
import { BaseCallbackHandler, type CallbackHandlerMethods } from "@langchain/core/callbacks/base";
import { AIMessage, ToolMessage } from "@langchain/core/messages";
import type { ChatGeneration, LLMResult } from "@langchain/core/outputs";
import type { StructuredToolInterface } from "@langchain/core/tools";
import { END } from "@langchain/langgraph";
import { RunStopped } from "../errors.js";
import type { Run } from "../run.js";
import type { Decision, ResultKind, StopReport } from "../types.js";
import { bestEffort, callOptions, type GuardOptions, report } from "./common.js";
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

export class LangGraphGuard {
  /** Reports each model response as a `model_turn`; `invoke` adds it to `callbacks`. */
  readonly callbacks: BaseCallbackHandler;

  constructor(
    readonly run: Run,
    readonly opts: GuardOptions = {},
  ) {
    this.callbacks = new ModelTurns(run);
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
    return () => (this.run.stopped !== null ? END : next);
  }

  /** A node before each model call (`createReactAgent`'s `preModelHook`): throws
   * `RunStopped` once the run is stopped, which `invoke` turns into `GraphStopped`. */
  readonly beforeModel = (): Record<string, never> => {
    this.run.throwIfStopped();
    return {};
  };

  /** Runs `graph` behind the guard; resolves with its final state. */
  async invoke<S>(
    graph: StreamingGraph<S>,
    input: unknown,
    config: Record<string, unknown> = {},
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
        await bestEffort(() => this.run.finish("failed"));
        throw err;
      }
    }
    if (this.run.stopped !== null) {
      throw new GraphStopped(this.run.stopped, this.run.stop, state);
    }
    await bestEffort(() => this.run.finish("completed"));
    return state as S;
  }

  private async call(
    inner: StructuredToolInterface,
    input: unknown,
    config?: Record<string, unknown>,
  ): Promise<unknown> {
    const name = inner.name;
    const toolCall = isToolCall(input) ? input : undefined;
    const args = toolCall ? toolCall.args : input;
    const callId = toolCall?.id ?? this.run.nextCallId();
    const gate = await this.run.toolCall(name, args, callOptions(this.opts, name, args, callId));
    if (!gate.mayRun) return toolCall?.id ? refusal(gate) : (gate.modelText ?? "");
    let outcome: unknown;
    try {
      outcome = await inner.invoke(input as Parameters<typeof inner.invoke>[0], config);
    } catch (err) {
      await report(this.run, callId, name, "RETRYABLE", String(err));
      throw err;
    }
    if (!ToolMessage.isInstance(outcome)) {
      await report(this.run, callId, name, "SUCCESS", outcome);
      return gate.warning ? gate.reads(outcome) : outcome;
    }
    const message = outcome as ToolMessage;
    const kind: ResultKind = message.status === "error" ? "RETRYABLE" : "SUCCESS";
    await report(this.run, callId, name, kind, message.content);
    if (!gate.warning) return message;
    return new ToolMessage({
      content: gate.reads(message.content),
      tool_call_id: message.tool_call_id,
      name: message.name ?? name,
      status: message.status ?? "success",
    });
  }
}

/** `handleLLMEnd` → `model_turn`, awaited so the turn is sent before its tool calls. */
class ModelTurns extends BaseCallbackHandler implements CallbackHandlerMethods {
  name = "FuseboxModelTurns";
  override awaitHandlers = true;

  constructor(private readonly run: Run) {
    super();
  }

  override async handleLLMEnd(output: LLMResult): Promise<void> {
    const message = (output.generations[0]?.[0] as ChatGeneration | undefined)?.message;
    if (AIMessage.isInstance(message)) await reportModelTurn(this.run, message as AIMessage);
  }
}

/** The caller's callbacks (a list or a manager) plus ours. */
function withHandler(callbacks: unknown, handler: BaseCallbackHandler): unknown {
  if (callbacks === undefined || callbacks === null) return [handler];
  if (Array.isArray(callbacks)) return [...callbacks, handler];
  const manager = callbacks as { copy(): { addHandler(h: BaseCallbackHandler): void } };
  const copy = manager.copy();
  copy.addHandler(handler);
  return copy;
}
