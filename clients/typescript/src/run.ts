/**
 * `Run`: the handle that owns a run's envelope (guard contract §2): ids, `seq`, `ts_ms`,
 * `run_started`, and one method per event type.
 *
 * Ordering invariant: events are numbered 1, 2, 3 … and every one reaches the daemon, in
 * order. fuseboxd holds an event whose `seq` is ahead of a missing one, so a lost event
 * would stall the run: an event whose delivery failed stays queued and is re-sent, with the
 * same id and bytes, before anything newer (the daemon's dedup answers a re-sent event it
 * already applied with the original decision). Sends of one run are chained, so parallel
 * tool calls of one turn are gated one after the other, in the order they were asked.
 *
 * The one id that is not `<run>-<seq>` is `run_started`'s, `<run>-1.<nonce of this Run>`,
 * sent inline: a second process starting a run id the daemon already has (a restarted
 * worker) is refused with `RunExists` instead of being answered the old process's
 * decisions from the dedup.
 *
 * A sub-agent's run names its `parent` (guard contract §6). A child made from the parent's
 * handle (`startChild`) sends its `run_started` only after the parent's was delivered: the
 * daemon joins a child to its parent's tree only when it knows the parent, and a child
 * that came first would be a root of its own, its spending outside the parent's budgets.
 */
import { createHash, randomBytes } from "node:crypto";
import type { Fusebox } from "./client.js";
import { FuseboxError, GuardUnavailable, Refused, RunExists, RunStopped } from "./errors.js";
import { Gate } from "./gate.js";
import type { StopWatch } from "./killswitch.js";
import { checkId, gate as gateSubject } from "./subjects.js";
import type {
  Decision,
  Effect,
  GateOnError,
  ResultKind,
  ResultMode,
  StopReport,
  Usage,
} from "./types.js";

export interface RunOptions {
  /** The agent's name: the daemon applies `[agents.<name>.policy]`. */
  agent?: string;
  /** The tool names the run may call; other names count as unknown tools. */
  tools?: string[];
  /** Per-run policy overrides (the keys of the config's `[policy]`). */
  policy?: Record<string, unknown>;
  gateOnError?: GateOnError;
  results?: ResultMode;
  /** Every request's own timeout (ms); nats.js would default to 1 s. */
  timeoutMs?: number;
  /**
   * The run that started this one, of the same tenant: this run is its sub-agent. Each
   * budget of the parent and of the runs above it counts this run's calls, model turns,
   * tokens and cost; their caps (`max_depth`, `max_children`, `max_open_children`) may
   * refuse this run's start; a stop of any of them stops this run. The parent must be
   * started first (`Run.startChild` sees to it).
   */
  parent?: string;
  /**
   * The root of the parent's tree, when `parent` names a run that is itself a sub-agent
   * (a child made by `Run.child` knows it; `parent` alone is taken for the root). The
   * run's subjects name it, so that in a cluster the whole tree is served by one daemon
   * and its budgets stay exact.
   */
  root?: string;
}

/** A sub-agent's run, made by its parent's handle (`Run.child`, `Run.startChild`). */
export interface ChildRunOptions extends Omit<RunOptions, "parent" | "root"> {
  /** The child's run id; `<parent>-<agent>-<n>` (the n-th child of this handle) when
   * not given. */
  runId?: string;
  /** The framework's own id of the delegation (its tool-call id) in place of `<n>`: the
   * same delegation of the same parent always names the same child,
   * `<parent>-<agent>-<key>` (a key outside `[A-Za-z0-9_-]`, or longer than 64, is cut
   * and marked with a hash of it). */
  key?: string;
}

export interface ToolCallOptions {
  /** The framework's call id; one is made (`<run>-call-<n>`) when it has none. */
  callId?: string;
  /** Instead of `args`, for producers that must not ship arguments. */
  argsHash?: string;
  /** The business-operation identity of a side effect: it executes once per key. */
  opKey?: string;
  effect?: Effect;
}

export interface ToolResultOptions {
  output?: unknown;
  outputHash?: string;
  code?: string;
  retryAfterMs?: number;
  /** The progress version of external state after this call. */
  progress?: number;
  /** The run's goal is reached. */
  terminal?: boolean;
}

export interface ModelCallOptions {
  /** The tokens the call is expected to spend; else the run's mean per model turn. */
  estimateTokens?: number;
  /** Its expected cost in USD; else the run's mean per model turn. */
  estimateUsd?: number;
}

export interface ModelTurnOptions {
  usage?: Usage;
  costUsd?: number;
  /** False when the model output failed structural validation. */
  valid?: boolean;
}

interface Queued {
  id: string;
  seq: number;
  event: Record<string, unknown>;
  payload: Uint8Array;
  inline: boolean;
  settled: boolean;
  resolve: (decision: Decision | null) => void;
  reject: (err: FuseboxError) => void;
}

const encoder = new TextEncoder();

/** One agent run behind the guard. Made by `Fusebox.run` / `Fusebox.startRun`. */
export class Run {
  readonly tenant: string;
  readonly agent: string | undefined;
  readonly tools: readonly string[] | undefined;
  readonly policy: Readonly<Record<string, unknown>> | undefined;
  readonly parent: string | undefined;
  /** The root of the run's tree (the run itself for a root): its subjects name it. */
  readonly root: string;
  readonly gateOnError: GateOnError;
  readonly results: ResultMode;
  readonly timeoutMs: number;
  private lastSeq = 0;
  private calls = 0;
  private children = 0;
  private readonly queue: Queued[] = [];
  private chain: Promise<void> = Promise.resolve();
  private watch: StopWatch | null = null;
  private stopDecision: Decision | null = null;
  /** The first `start()`, once it is called. */
  private starting: Promise<void> | null = null;
  private stopListeners: Array<(stop: Decision) => void> = [];
  /** Tells this handle's `run_started` from another process's for the same run id. */
  private readonly nonce = randomBytes(6).toString("hex");
  /** The daemon said the run id is another process's: nothing more is sent, since a
   * later id would be that process's, answered from the dedup. */
  private exists: RunExists | null = null;
  /** Why `run_started` is not delivered yet (it is re-sent with the next event). */
  startError: GuardUnavailable | null = null;

  /** `parentRun`: the parent's handle, for a child made by `child`, whose `run_started`
   * waits for the parent's. */
  constructor(
    readonly client: Fusebox,
    readonly id: string,
    opts: Required<Pick<RunOptions, "gateOnError" | "results" | "timeoutMs">> & RunOptions,
    private readonly parentRun: Run | null = null,
  ) {
    this.tenant = client.tenant;
    this.agent = opts.agent;
    this.tools = opts.tools;
    this.policy = opts.policy;
    this.parent = parentRun?.id ?? opts.parent;
    this.root = parentRun?.root ?? opts.root ?? opts.parent ?? id;
    this.gateOnError = opts.gateOnError;
    this.results = opts.results;
    this.timeoutMs = opts.timeoutMs;
  }

  // --- lifecycle -------------------------------------------------------------------

  /** Watches the kill switch (learning a stop kept from before), then sends
   * `run_started`. Idempotent: a later call waits for the first one (a refusal is thrown
   * to the first caller only). */
  start(opts: { watchStop?: boolean } = {}): Promise<void> {
    if (this.starting !== null) return this.starting.catch(() => undefined);
    this.starting = this.begin(opts);
    return this.starting;
  }

  private async begin(opts: { watchStop?: boolean }): Promise<void> {
    if (opts.watchStop ?? true) {
      this.watch = await this.client.watchStop(this.id);
      this.watch.onStop((stop) => this.latch(stop));
    }
    const fields: Record<string, unknown> = {};
    if (this.agent !== undefined) fields.agent = this.agent;
    if (this.tools !== undefined) fields.tools = [...this.tools];
    if (this.policy !== undefined) fields.policy = this.policy;
    if (this.parent !== undefined) fields.parent = this.parent;
    try {
      // Inline whatever the result mode: a refusal must reach the caller.
      await this.send("run_started", fields, true);
    } catch (err) {
      if (err instanceof Refused) this.close();
      // Queued: re-sent before the run's first gate, which decides (gateOnError) what
      // the agent may do meanwhile.
      if (!(err instanceof GuardUnavailable)) throw err;
      this.startError = err;
    }
  }

  /**
   * A handle for a sub-agent of this run (not started: see `startChild`). It inherits
   * this run's `gateOnError`, `results` and `timeoutMs` unless told otherwise, and is a
   * run like any other: its own events, ids and kill switch.
   */
  child(opts: ChildRunOptions = {}): Run {
    const { runId, key, ...rest } = opts;
    this.children += 1;
    const tail = key === undefined ? String(this.children) : childKey(key);
    const id = checkId("run", runId ?? childRunId(this.id, opts.agent, tail), 128);
    const inherited = {
      gateOnError: opts.gateOnError ?? this.gateOnError,
      results: opts.results ?? this.results,
      timeoutMs: opts.timeoutMs ?? this.timeoutMs,
    };
    return new Run(this.client, id, { ...rest, ...inherited }, this);
  }

  /**
   * Starts a sub-agent of this run (`child` and `start`). The daemon may refuse it —
   * a cap of a run above (`depth_limit`, `spawn_limit`, `concurrency_limit`) or a stopped
   * ancestor — and then the child comes back already stopped: `child.stopped` says why,
   * for the parent's model to read instead of the sub-agent's answer.
   */
  async startChild(opts: ChildRunOptions = {}): Promise<Run> {
    const child = this.child(opts);
    await child.start();
    return child;
  }

  /** Stops watching the kill switch (the run itself stays as it is). */
  close(): void {
    this.watch?.close();
    this.watch = null;
  }

  // --- state -----------------------------------------------------------------------

  /** The `seq` of the last event made. */
  get seq(): number {
    return this.lastSeq;
  }

  /** The stop decision once the run is stopped (gate, observe answer, or kill switch). */
  get stop(): Decision | null {
    return this.stopDecision;
  }

  /** The stop report once the run is stopped; null while it may go on. */
  get stopped(): StopReport | null {
    const stop = this.stopDecision;
    if (stop === null) return null;
    return stop.report ?? fallbackReport(stop.reason ?? "stopped");
  }

  throwIfStopped(): void {
    if (this.stopDecision !== null) throw new RunStopped(this.stopped, this.stopDecision);
  }

  /** Calls `listener` once when the run is stopped (at once if it already is). */
  onStop(listener: (stop: Decision) => void): void {
    if (this.stopDecision !== null) listener(this.stopDecision);
    else this.stopListeners.push(listener);
  }

  /** Waits for the kill switch (needs `start()` with the watch on). */
  async waitStopped(timeoutMs?: number): Promise<StopReport | null> {
    if (this.watch !== null && this.stopDecision === null) await this.watch.wait(timeoutMs);
    return this.stopped;
  }

  private latch(decision: Decision): void {
    if (this.stopDecision !== null || decision.action !== "stop") return;
    this.stopDecision = decision;
    this.watch?.latch(decision);
    for (const listener of this.stopListeners.splice(0)) listener(decision);
  }

  // --- events ----------------------------------------------------------------------

  /** A call id for producers whose framework has none. */
  nextCallId(): string {
    this.calls += 1;
    return `${this.id}-call-${this.calls}`;
  }

  /**
   * Asks whether `tool` may run. Never throws for the guard's sake: a silent or absent
   * daemon gives a `Gate` with `error` set, which lets the tool run only under
   * `gateOnError: "allow"`; a run known to be stopped is refused without a round trip.
   */
  async toolCall(tool: string, args: unknown = {}, opts: ToolCallOptions = {}): Promise<Gate> {
    if (this.starting === null) await this.start();
    const callId = opts.callId ?? this.nextCallId();
    if (this.stopDecision !== null) return new Gate(callId, tool, this.refusal(callId));
    const body: Record<string, unknown> = { call_id: callId, tool };
    if (opts.argsHash !== undefined) body.args_hash = opts.argsHash;
    else body.args = args ?? {};
    if (opts.opKey !== undefined) body.op_key = opts.opKey;
    if (opts.effect !== undefined) body.effect = opts.effect;
    try {
      const decision = await this.send("tool_call", body, true);
      if (decision === null) throw new Error("unreachable: an inline send has a decision");
      return new Gate(callId, tool, decision);
    } catch (err) {
      if (!(err instanceof FuseboxError)) throw err;
      const allowed = this.gateOnError === "allow" && err instanceof GuardUnavailable;
      return new Gate(callId, tool, null, err, allowed);
    }
  }

  /** Reports how a call ended. Inline mode returns the observe decision (`continue`,
   * `retry_after`, `stop` …); passive mode returns null. */
  toolResult(
    callId: string,
    tool: string,
    kind: ResultKind = "SUCCESS",
    opts: ToolResultOptions = {},
  ): Promise<Decision | null> {
    const body: Record<string, unknown> = { call_id: callId, tool, kind };
    if (opts.code !== undefined) body.code = opts.code;
    if (opts.retryAfterMs !== undefined) body.retry_after_ms = opts.retryAfterMs;
    if (opts.terminal !== undefined) body.terminal = opts.terminal;
    if (opts.outputHash !== undefined) body.output_hash = opts.outputHash;
    else if ("output" in opts) body.output = opts.output ?? null;
    if (opts.progress !== undefined) body.progress = opts.progress;
    return this.observe("tool_result", body);
  }

  /**
   * Asks, before the agent calls its model, whether a token, cost or model-turn budget
   * (this run's, or one of a run above it counting its tree) has room for the call; the
   * guard holds what it reserves (the estimate, else this run's mean per model turn)
   * until the next `modelTurn`. Always inline: the answer must come before the model is
   * called. A `stop` is latched like a tool call's (`throwIfStopped` throws it); a run
   * known to be stopped is answered with its stop without a round trip. Unanswered, it
   * throws the `FuseboxError`, or returns null (the call may go ahead) under
   * `gateOnError: "allow"`.
   */
  async modelCall(opts: ModelCallOptions = {}): Promise<Decision | null> {
    if (this.starting === null) await this.start();
    if (this.stopDecision !== null) return this.refusal(null);
    const body: Record<string, unknown> = {};
    if (opts.estimateTokens !== undefined) body.estimate_tokens = opts.estimateTokens;
    if (opts.estimateUsd !== undefined) body.estimate_usd = opts.estimateUsd;
    try {
      return await this.send("model_call", body, true);
    } catch (err) {
      if (this.gateOnError === "allow" && err instanceof GuardUnavailable) return null;
      throw err;
    }
  }

  modelTurn(stopReason: string, opts: ModelTurnOptions = {}): Promise<Decision | null> {
    const body: Record<string, unknown> = { stop_reason: stopReason };
    if (opts.usage !== undefined) body.usage = opts.usage;
    if (opts.costUsd !== undefined) body.cost_usd = opts.costUsd;
    if (opts.valid !== undefined) body.valid = opts.valid;
    return this.observe("model_turn", body);
  }

  progress(version: number, note?: string): Promise<Decision | null> {
    return this.observe("progress", note === undefined ? { version } : { version, note });
  }

  compaction(reason?: string): Promise<Decision | null> {
    return this.observe("compaction", reason === undefined ? {} : { reason });
  }

  /** `run_finished`: the producer closes the run (`completed`, `failed` …). */
  finish(status?: string): Promise<Decision | null> {
    return this.observe("run_finished", status === undefined ? {} : { status });
  }

  /** Any event type with its own fields, enveloped like the rest. */
  sendEvent(
    type: string,
    fields: Record<string, unknown>,
    inline: boolean,
  ): Promise<Decision | null> {
    return this.send(type, fields, inline);
  }

  // --- transport -------------------------------------------------------------------

  private observe(type: string, body: Record<string, unknown>): Promise<Decision | null> {
    return this.send(type, body, this.results === "inline");
  }

  private send(
    type: string,
    body: Record<string, unknown>,
    inline: boolean,
  ): Promise<Decision | null> {
    try {
      JSON.stringify(body);
    } catch (err) {
      // Refused before it takes a seq: the run's numbering stays whole.
      return Promise.reject(new TypeError(`${type} is not JSON: ${String(err)}`, { cause: err }));
    }
    return new Promise<Decision | null>((resolve, reject) => {
      this.chain = this.chain.then(async () => {
        if (this.exists !== null) return reject(this.exists);
        const queued = this.make(type, body, inline, resolve, reject);
        this.queue.push(queued);
        await this.flush();
      });
    });
  }

  private make(
    type: string,
    body: Record<string, unknown>,
    inline: boolean,
    resolve: Queued["resolve"],
    reject: Queued["reject"],
  ): Queued {
    this.lastSeq += 1;
    const seq = this.lastSeq;
    const id = type === "run_started" ? `${this.id}-${seq}.${this.nonce}` : `${this.id}-${seq}`;
    const event = {
      v: 1,
      id,
      tenant: this.tenant,
      run: this.id,
      seq,
      ts_ms: Date.now(),
      type,
      ...body,
    };
    return {
      id,
      seq,
      event,
      payload: encoder.encode(JSON.stringify(event)),
      inline,
      settled: false,
      resolve,
      reject,
    };
  }

  /** Delivers the queue in order; stops at the first failure (the failed event and
   * everything after it stay queued for the next send). */
  private async flush(): Promise<void> {
    while (this.queue.length > 0) {
      const head = this.queue[0] as Queued;
      const parentPending = head.event.type === "run_started" ? await this.parentStarted() : null;
      if (parentPending !== null) {
        settle(this.queue[this.queue.length - 1] as Queued, parentPending);
        return;
      }
      let decision: Decision | null;
      try {
        decision = await this.deliver(head);
      } catch (err) {
        const failure =
          err instanceof FuseboxError ? err : new FuseboxError(String(err), { cause: err });
        if (failure instanceof Refused && failure.reason === "run_exists") {
          // A queued run_started (the daemon was unreachable at start) for a run id
          // another process has: fail everything, send nothing more.
          this.exists = new RunExists(this.tenant, this.id, failure.detail, failure.eventId);
          for (const queued of this.queue.splice(0)) settle(queued, this.exists);
          return;
        }
        if (failure instanceof Refused) {
          // Not applied: its seq goes to the events behind it.
          this.queue.shift();
          this.renumber(head.seq);
          settle(head, failure);
          continue;
        }
        settle(this.queue[this.queue.length - 1] as Queued, failure);
        return;
      }
      this.queue.shift();
      if (decision?.action === "stop") this.latch(decision);
      settle(head, decision);
    }
  }

  /** Delivers the parent's `run_started` first (see the top of this file); why it is
   * still undelivered, or null once it is. */
  private async parentStarted(): Promise<GuardUnavailable | null> {
    const parent = this.parentRun;
    if (parent === null) return null;
    await parent.start().catch(() => undefined);
    const pending = () => parent.queue.some((queued) => queued.event.type === "run_started");
    if (pending()) {
      parent.chain = parent.chain.then(() => parent.flush());
      await parent.chain;
    }
    if (!pending()) return null;
    return (
      parent.startError ??
      new GuardUnavailable(
        gateSubject(parent.tenant, parent.id),
        `the parent run ${parent.id} is not started yet`,
      )
    );
  }

  private async deliver(event: Queued): Promise<Decision | null> {
    if (event.inline) return this.client.ask(this.id, event.payload, this.timeoutMs, this.root);
    await this.client.publish(this.id, event.id, event.payload, this.timeoutMs, this.root);
    return null;
  }

  /** Shifts the queued events after a refused one down by one `seq`. */
  private renumber(freeSeq: number): void {
    let seq = freeSeq;
    for (const queued of this.queue) {
      if (queued.seq <= freeSeq) continue;
      queued.seq = seq;
      queued.id = `${this.id}-${seq}`;
      queued.event = { ...queued.event, seq, id: queued.id };
      queued.payload = encoder.encode(JSON.stringify(queued.event));
      seq += 1;
    }
    this.lastSeq = seq - 1;
  }

  /** The answer to a call of a run known to be stopped: the run's own stop. */
  private refusal(callId: string | null): Decision {
    const stop = this.stopDecision as Decision;
    return { ...stop, event_id: "", call_id: callId };
  }
}

/**
 * `<parent>-<agent>-<n>` (as the Python client names children): an operator reads the
 * tree in the ids, and a child's id is fresh as long as its parent's is. Within the 128
 * characters of a run id: a long parent id is cut and marked with a hash of it, so two
 * parents that share a prefix never share a child id.
 */
function childRunId(parent: string, agent: string | undefined, n: string): string {
  const tag = agent ? agent.replace(/[^A-Za-z0-9_-]+/g, "_").slice(0, 32) : "sub";
  const suffix = `-${tag}-${n}`;
  if (parent.length + suffix.length <= 128) return parent + suffix;
  const digest = createHash("sha256").update(parent).digest("hex").slice(0, 8);
  return `${parent.slice(0, 128 - suffix.length - 9)}-${digest}${suffix}`;
}

/** A delegation's key as the tail of a child's id: itself when it is a plain id token of
 * at most 64 characters, else its first 55 (made plain) and a hash of the whole key. */
function childKey(key: string): string {
  if (key.length > 0 && key.length <= 64 && /^[A-Za-z0-9_-]+$/.test(key)) return key;
  const digest = createHash("sha256").update(key).digest("hex").slice(0, 8);
  return `${key.replace(/[^A-Za-z0-9_-]+/g, "_").slice(0, 55)}-${digest}`;
}

function settle(queued: Queued, outcome: Decision | null | FuseboxError): void {
  if (queued.settled) return;
  queued.settled = true;
  if (outcome instanceof FuseboxError) queued.reject(outcome);
  else queued.resolve(outcome);
}

function fallbackReport(reason: string): StopReport {
  return {
    terminal_state: "",
    reason,
    completed_steps: 0,
    progress_version: null,
    completed_operations: [],
    last_safe_checkpoint: null,
    unmet_precondition: null,
    resume_condition: null,
    fired_guards: [],
    detail: null,
  };
}
