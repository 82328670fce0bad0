/**
 * Errors, told apart by kind: a caller reacts differently to a daemon that is silent, one
 * that is absent, a NATS server that refuses the subject, and a daemon that refused the
 * event.
 */

import type { Decision } from "./types.js";
import { type StopReport, summary } from "./types.js";

/** Base of every error this package throws. */
export class FuseboxError extends Error {
  override name = "FuseboxError";
}

/** The first connection to NATS failed (refused, unreachable, bad credentials, TLS). */
export class ConnectError extends FuseboxError {
  override name = "ConnectError";
  constructor(
    readonly url: string,
    readonly detail: string,
  ) {
    super(`cannot connect to NATS at ${url}: ${detail}`);
  }
}

/** The guard could not be asked: the decision is the run's `gateOnError`. */
export class GuardUnavailable extends FuseboxError {
  override name = "GuardUnavailable";
  constructor(
    readonly subject: string,
    message: string,
  ) {
    super(message);
  }
}

/** No answer within the request timeout (a hung or overloaded daemon). */
export class GateTimeout extends GuardUnavailable {
  override name = "GateTimeout";
  constructor(
    subject: string,
    readonly timeoutMs: number,
  ) {
    super(subject, `no answer from fuseboxd on ${subject} within ${timeoutMs} ms`);
  }
}

/** Nobody listens on the subject (no daemon running, or none for this partition). */
export class NoResponders extends GuardUnavailable {
  override name = "NoResponders";
  constructor(subject: string, why = "is the daemon running?") {
    super(subject, `no fuseboxd is listening on ${subject} (${why})`);
  }
}

/** NATS refused the subject: this user may not publish there or hear the reply. */
export class PermissionDenied extends GuardUnavailable {
  override name = "PermissionDenied";
  constructor(
    subject: string,
    readonly detail: string,
  ) {
    super(
      subject,
      `NATS refused ${subject}: ${detail} (check the user's permissions and inbox prefix)`,
    );
  }
}

/** NATS itself failed (connection closed or draining, JetStream error). */
export class TransportError extends GuardUnavailable {
  override name = "TransportError";
  constructor(
    subject: string,
    readonly detail: string,
  ) {
    super(subject, `NATS request on ${subject} failed: ${detail}`);
  }
}

/** fuseboxd refused the event itself (malformed, wrong tenant, `seq` backwards …). */
export class Refused extends FuseboxError {
  override name = "Refused";
  constructor(
    readonly reason: string,
    readonly detail: string,
    readonly eventId: string | null = null,
  ) {
    super(`fuseboxd refused the event (${reason}): ${detail}`);
  }
}

/**
 * `Run.start` for a run id the daemon already has events of: another process (a restarted
 * worker) reusing it. Refused, so this process is never answered with the old one's
 * decisions; start the run under a new run id. Every later event of the handle fails
 * with it too.
 */
export class RunExists extends Refused {
  override name = "RunExists";
  constructor(
    readonly tenant: string,
    readonly run: string,
    detail: string,
    eventId: string | null = null,
  ) {
    super("run_exists", detail, eventId);
    this.message = `run ${tenant}/${run} already exists: ${detail}; start it under a new run id`;
  }
}

/** The answer was not a decision (a version mismatch, or not fuseboxd). */
export class BadAnswer extends FuseboxError {
  override name = "BadAnswer";
  constructor(
    readonly subject: string,
    readonly detail: string,
  ) {
    super(`unexpected answer on ${subject}: ${detail}`);
  }
}

/**
 * The guard stopped the run. Adapters throw it to end the framework's run; it carries the
 * stop report an operator acts on.
 */
export class RunStopped extends FuseboxError {
  override name = "RunStopped";
  constructor(
    readonly report: StopReport | null,
    readonly decision: Decision | null = null,
  ) {
    super(`fusebox stopped the run: ${report ? summary(report) : "stopped"}`);
  }
}
