/** nats.js errors turned into this package's kinds, so callers can tell them apart. */
import {
  NoRespondersError,
  PermissionViolationError,
  RequestError,
  TimeoutError,
} from "@nats-io/transport-node";
import { describe } from "./connection.js";
import {
  GateTimeout,
  type GuardUnavailable,
  NoResponders,
  PermissionDenied,
  TransportError,
} from "./errors.js";

function inChain<T>(err: unknown, kind: abstract new (...args: never[]) => T): T | null {
  let current: unknown = err;
  for (let depth = 0; current instanceof Error && depth < 4; depth++) {
    if (current instanceof kind) return current;
    current = current.cause;
  }
  return null;
}

/** Why a request on `subject` got no answer, as one of the `GuardUnavailable` kinds. */
export function requestFailure(
  subject: string,
  err: unknown,
  timeoutMs: number,
  noRespondersWhy?: string,
): GuardUnavailable {
  if (err instanceof TimeoutError) return new GateTimeout(subject, timeoutMs);
  if (
    (err instanceof RequestError && err.isNoResponders()) ||
    // JetStream wraps it once more (JetStreamNotEnabled ← RequestError ← NoResponders).
    inChain(err, NoRespondersError) !== null
  ) {
    return new NoResponders(subject, noRespondersWhy);
  }
  const denied = inChain(err, PermissionViolationError);
  if (denied !== null) return new PermissionDenied(subject, denied.message);
  if (inChain(err, TimeoutError) !== null) return new GateTimeout(subject, timeoutMs);
  return new TransportError(subject, describe(err));
}
