/**
 * `Fusebox`: one NATS connection for one tenant, speaking fuseboxd's wire contract
 * (interfaces.md §2). It asks and reports; it never decides.
 */
import { randomUUID } from "node:crypto";
import { type JetStreamClient, jetstream } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { type ConnectOptions, connectNats } from "./connection.js";
import { BadAnswer, type FuseboxError, Refused } from "./errors.js";
import { requestFailure } from "./failures.js";
import { StopWatch } from "./killswitch.js";
import { Run, type RunOptions } from "./run.js";
import * as subjects from "./subjects.js";
import { type Decision, type GateOnError, parseDecision, type ResultMode } from "./types.js";

export interface FuseboxOptions {
  /** Every request's timeout (ms; default 2000). nats.js would default to 1 s. */
  timeoutMs?: number;
  /** What a tool does when the guard cannot be asked; `deny` unless chosen otherwise. */
  gateOnError?: GateOnError;
  /** Where non-gate events go (`inline` request/reply, or `passive` JetStream). */
  results?: ResultMode;
}

/** A run id nobody used before: `<prefix>-<12 hex>`. A run's ids and `seq` start at 1,
 * so a handle must never reuse the id of an earlier run. */
export function newRunId(prefix = "run"): string {
  return subjects.checkId("run", `${prefix}-${randomUUID().replaceAll("-", "").slice(0, 12)}`, 128);
}

/** A tenant's connection to the guard. Make one per process and open runs on it. */
export class Fusebox {
  readonly tenant: string;
  readonly timeoutMs: number;
  readonly gateOnError: GateOnError;
  readonly results: ResultMode;
  private readonly js: JetStreamClient;

  constructor(
    readonly nats: NatsConnection,
    opts: FuseboxOptions & { tenant: string; ownsConnection?: boolean },
  ) {
    this.tenant = subjects.checkId("tenant", opts.tenant, 64);
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.gateOnError = opts.gateOnError ?? "deny";
    this.results = opts.results ?? "inline";
    this.ownsConnection = opts.ownsConnection ?? false;
    this.js = jetstream(nats, { timeout: this.timeoutMs });
  }

  private readonly ownsConnection: boolean;

  /**
   * Connects to NATS; throws `ConnectError` with the reason when the first connect fails.
   * The inbox prefix defaults to `_INBOX.<tenant>`.
   */
  static async connect(
    servers: string | string[],
    opts: ConnectOptions & FuseboxOptions,
  ): Promise<Fusebox> {
    subjects.checkId("tenant", opts.tenant, 64);
    const nc = await connectNats(servers, opts);
    return new Fusebox(nc, { ...opts, ownsConnection: true });
  }

  /** A handle for run `runId` (not started: `await run.start()`, or use `startRun`).
   * Without an id, a fresh one (`newRunId`). A sub-agent's run names its `parent`, or is
   * made from the parent's handle (`Run.startChild`). */
  run(runId: string = newRunId(), opts: RunOptions = {}): Run {
    return new Run(this, subjects.checkId("run", runId, 128), {
      ...opts,
      gateOnError: opts.gateOnError ?? this.gateOnError,
      results: opts.results ?? this.results,
      timeoutMs: opts.timeoutMs ?? this.timeoutMs,
    });
  }

  /** `run(...)` and `start()`: the kill switch is watched and `run_started` sent. */
  async startRun(runId: string = newRunId(), opts: RunOptions = {}): Promise<Run> {
    const run = this.run(runId, opts);
    await run.start();
    return run;
  }

  /** One event on the run's gate subject (its tree's, naming `root`, for a run of a
   * tree); its decision. A retried request with the same event id is answered from the
   * daemon's dedup with the same decision. */
  async ask(
    runId: string,
    payload: Uint8Array,
    timeoutMs: number,
    root: string = runId,
  ): Promise<Decision> {
    const subject = subjects.treeGate(this.tenant, root, runId);
    let data: Uint8Array;
    try {
      data = (await this.nats.request(subject, payload, { timeout: timeoutMs })).data;
    } catch (err) {
      throw requestFailure(subject, err, timeoutMs);
    }
    return decodeDecision(subject, data);
  }

  /** One event to `FUSEBOX_EVENTS`, waiting for JetStream to store it. The
   * `Nats-Msg-Id` is `<tenant>.<run>.<id>`, so a re-sent event is stored once. */
  async publish(
    runId: string,
    eventId: string,
    payload: Uint8Array,
    timeoutMs: number,
    root: string = runId,
  ): Promise<void> {
    const subject = subjects.treeEvents(this.tenant, root, runId);
    try {
      await this.js.publish(subject, payload, {
        msgID: `${this.tenant}.${runId}.${eventId}`,
        timeout: timeoutMs,
      });
    } catch (err) {
      throw requestFailure(
        subject,
        err,
        timeoutMs,
        "no FUSEBOX_EVENTS stream: is fuseboxd set up?",
      );
    }
  }

  /** The run's kill switch, including a stop kept from before this call. */
  watchStop(runId: string): Promise<StopWatch> {
    return StopWatch.open(this.nats, this.tenant, runId, this.timeoutMs);
  }

  /** Drains and closes the connection, when this client made it. */
  async close(): Promise<void> {
    if (this.ownsConnection && !this.nats.isClosed()) await this.nats.drain();
  }
}

/** A reply of fuseboxd: a decision, or `{"error": …}` (a refusal). */
/** One decoder for every answer: a TextDecoder per call is a cost on the gate's path. */
const decoder = new TextDecoder();

export function decodeDecision(subject: string, data: Uint8Array): Decision {
  let body: unknown;
  try {
    body = JSON.parse(decoder.decode(data));
  } catch (err) {
    throw new BadAnswer(subject, `not JSON: ${String(err)}`);
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new BadAnswer(subject, "not a JSON object");
  }
  const error = (body as Record<string, unknown>).error;
  if (typeof error === "object" && error !== null) {
    const e = error as Record<string, unknown>;
    const refused: FuseboxError = new Refused(
      String(e.reason ?? "refused"),
      String(e.message ?? ""),
      typeof e.event_id === "string" ? e.event_id : null,
    );
    throw refused;
  }
  try {
    return parseDecision(body);
  } catch (err) {
    throw new BadAnswer(subject, `not a decision: ${String(err)}`);
  }
}
