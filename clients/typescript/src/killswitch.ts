/**
 * The kill switch seen from an agent: `fusebox.stop.<tenant>.<run>`, live, plus the stop
 * kept from before the watch began (a worker that starts after its run was stopped, or an
 * operator's `fusebox cancel` that came first, must still learn it at once).
 */
import { type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { describe } from "./connection.js";
import { BadAnswer, FuseboxError, TransportError } from "./errors.js";
import { requestFailure } from "./failures.js";
import * as subjects from "./subjects.js";
import { type Decision, parseDecision } from "./types.js";

export type StopListener = (stop: Decision) => void;

/** A stop decision from a message body, or null when it is not one. */
export function parseStop(data: Uint8Array): Decision | null {
  try {
    const decision = parseDecision(JSON.parse(new TextDecoder().decode(data)));
    return decision.action === "stop" ? decision : null;
  } catch {
    return null;
  }
}

/**
 * The stop `FUSEBOX_STOPS` keeps for the run, or null when there is none: a JetStream
 * direct get of the last message on the run's own stop subject — the one JetStream request
 * a tenant user may make, answered by JetStream itself, so it works while fuseboxd is down.
 */
export async function keptStop(
  jsm: JetStreamManager,
  tenant: string,
  run: string,
  timeoutMs: number,
): Promise<Decision | null> {
  const stopSubject = subjects.stop(tenant, run);
  const request = `$JS.API.DIRECT.GET.${subjects.STOPS_STREAM}.${stopSubject}`;
  let stored: Awaited<ReturnType<JetStreamManager["direct"]["getMessage"]>>;
  try {
    stored = await jsm.direct.getMessage(subjects.STOPS_STREAM, { last_by_subj: stopSubject });
  } catch (err) {
    throw requestFailure(
      request,
      err,
      timeoutMs,
      "no FUSEBOX_STOPS stream with direct get: has a current fuseboxd ever run?",
    );
  }
  if (stored === null) return null;
  const decision = parseStop(stored.data);
  if (decision === null) throw new BadAnswer(request, "the kept message is not a stop decision");
  return decision;
}

/** Holds the run's stop once one is known; calls the listeners once, at that moment. */
export class StopWatch {
  private current: Decision | null = null;
  private listeners: StopListener[] = [];
  private waiters: Array<() => void> = [];
  private sub: Subscription | null = null;
  /** Why the stop kept from before the watch could not be looked up (null: it was). */
  lookupError: FuseboxError | null = null;

  private constructor(
    readonly tenant: string,
    readonly run: string,
  ) {}

  /**
   * Subscribes first, then looks up the kept stop: a stop published in between is seen
   * on the subscription, so there is no gap. A failed lookup is kept in `lookupError` (the
   * gate stays the authority: it answers `stop` for every call of a stopped run).
   */
  static async open(
    nc: NatsConnection,
    tenant: string,
    run: string,
    timeoutMs: number,
  ): Promise<StopWatch> {
    const watch = new StopWatch(tenant, run);
    watch.sub = nc.subscribe(subjects.stop(tenant, run), {
      callback: (err, msg) => {
        if (err === null) {
          const stop = parseStop(msg.data);
          if (stop !== null) watch.latch(stop);
        }
      },
    });
    try {
      await nc.flush();
      const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: timeoutMs });
      const kept = await keptStop(jsm, tenant, run, timeoutMs);
      if (kept !== null) watch.latch(kept);
    } catch (err) {
      watch.lookupError =
        err instanceof FuseboxError
          ? err
          : new TransportError(subjects.stop(tenant, run), describe(err));
    }
    return watch;
  }

  /** The run's stop decision (with its report), once one is known. */
  get stop(): Decision | null {
    return this.current;
  }

  /** Calls `listener` with the stop when it comes (at once if it already came). */
  onStop(listener: StopListener): void {
    if (this.current !== null) listener(this.current);
    else this.listeners.push(listener);
  }

  /** Waits for the stop; null when `timeoutMs` passed first. */
  async wait(timeoutMs?: number): Promise<Decision | null> {
    if (this.current !== null) return this.current;
    await new Promise<void>((resolve) => {
      this.waiters.push(resolve);
      if (timeoutMs !== undefined) setTimeout(resolve, timeoutMs).unref();
    });
    return this.current;
  }

  /** Records a stop learnt here or elsewhere (a gate that answered `stop`). */
  latch(decision: Decision): void {
    if (this.current !== null || decision.action !== "stop") return;
    this.current = decision;
    const listeners = this.listeners;
    this.listeners = [];
    for (const listener of listeners) listener(decision);
    for (const wake of this.waiters.splice(0)) wake();
  }

  close(): void {
    this.sub?.unsubscribe();
    this.sub = null;
  }
}
