/**
 * The guard's answers as typed values (guard contract §3), decoded from the daemon's JSON.
 *
 * Reason codes stay plain strings: the contract lets a new detector bring a new stable
 * code, and a client built before it must still read the decision.
 */

/** What the guard decided. The first five answer a `tool_call`, the rest observe. */
export type Action =
  | "execute"
  | "warn"
  | "use_completed_result"
  | "block"
  | "stop"
  | "continue"
  | "complete"
  | "retry_after"
  | "wait_for_changed_precondition"
  | "poll_bounded";

const ACTIONS: ReadonlySet<string> = new Set<Action>([
  "execute",
  "warn",
  "use_completed_result",
  "block",
  "stop",
  "continue",
  "complete",
  "retry_after",
  "wait_for_changed_precondition",
  "poll_bounded",
]);

export type TerminalState =
  | "STOPPED_LOOP_GUARD"
  | "NEEDS_HUMAN"
  | "FAILED"
  | "CANCELLED"
  | "COMPLETED";

/** How a tool call ended (the `kind` of a `tool_result`). */
export type ResultKind = "SUCCESS" | "PENDING" | "RETRYABLE" | "PRECONDITION" | "FATAL";

export type Effect = "read" | "write";

/**
 * What a tool does when the guard cannot be asked (timeout, no daemon, NATS down):
 * `deny` (the default: an unguarded agent is what fusebox exists to prevent) or `allow`
 * (the tool runs unguarded, by the user's choice).
 */
export type GateOnError = "deny" | "allow";

/**
 * Where a run's non-gate events go: `inline` (request/reply on the gate subject, the
 * observe decision comes back at once) or `passive` (published to JetStream
 * `FUSEBOX_EVENTS`, deduplicated by `Nats-Msg-Id`).
 */
export type ResultMode = "inline" | "passive";

/** Why a run was stopped, and what would let it go on. */
export interface StopReport {
  /** A `TerminalState`, or a newer one this client does not know yet. */
  readonly terminal_state: TerminalState | (string & {});
  readonly reason: string;
  readonly completed_steps: number;
  readonly progress_version: number | null;
  readonly completed_operations: readonly string[];
  readonly last_safe_checkpoint: string | null;
  readonly unmet_precondition: string | null;
  readonly resume_condition: string | null;
  readonly fired_guards: readonly string[];
  readonly detail: string | null;
}

/** One decision, as the daemon sent it (`raw` keeps every field). */
export interface Decision {
  readonly action: Action;
  readonly tenant: string;
  readonly run: string;
  readonly event_id: string;
  readonly seq: number | null;
  readonly call_id: string | null;
  readonly reason: string | null;
  readonly detector: string | null;
  readonly count: number | null;
  readonly message: string | null;
  readonly wait_ms: number | null;
  /** The stored result of a completed operation (`use_completed_result`). */
  readonly result: unknown;
  readonly report: StopReport | null;
  readonly raw: Readonly<Record<string, unknown>>;
}

/** Tokens of one model turn (every field optional, as providers differ). */
export interface Usage {
  input_tokens?: number;
  output_tokens?: number;
  cache_creation_input_tokens?: number;
  cache_read_input_tokens?: number;
}

/** Only `execute` and `warn` let a tool run. */
export function letsToolRun(action: Action): boolean {
  return action === "execute" || action === "warn";
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function optString(value: unknown): string | null {
  return value === undefined || value === null ? null : String(value);
}

function optInt(value: unknown, field: string): number | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new TypeError(`${field} is not an integer: ${JSON.stringify(value)}`);
  }
  return value;
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.map((x) => String(x)) : [];
}

export function parseStopReport(data: Record<string, unknown>): StopReport {
  return {
    terminal_state: String(data.terminal_state ?? ""),
    reason: String(data.reason ?? ""),
    completed_steps: optInt(data.completed_steps, "completed_steps") ?? 0,
    progress_version: optInt(data.progress_version, "progress_version"),
    completed_operations: strings(data.completed_operations),
    last_safe_checkpoint: optString(data.last_safe_checkpoint),
    unmet_precondition: optString(data.unmet_precondition),
    resume_condition: optString(data.resume_condition),
    fired_guards: strings(data.fired_guards),
    detail: optString(data.detail),
  };
}

/** A decision from its JSON; throws `TypeError` when it is not one. */
export function parseDecision(data: unknown): Decision {
  if (!isRecord(data)) throw new TypeError("not a JSON object");
  const action = data.action;
  if (typeof action !== "string" || !ACTIONS.has(action)) {
    throw new TypeError(`unknown action ${JSON.stringify(action)}`);
  }
  return {
    action: action as Action,
    tenant: String(data.tenant ?? ""),
    run: String(data.run ?? ""),
    event_id: String(data.event_id ?? ""),
    seq: optInt(data.seq, "seq"),
    call_id: optString(data.call_id),
    reason: optString(data.reason),
    detector: optString(data.detector),
    count: optInt(data.count, "count"),
    message: optString(data.message),
    wait_ms: optInt(data.wait_ms, "wait_ms"),
    result: data.result ?? null,
    report: isRecord(data.report) ? parseStopReport(data.report) : null,
    raw: data,
  };
}

/** One line for a log or for the model: `STOPPED_LOOP_GUARD (same_call_repeat)`. */
export function summary(report: StopReport): string {
  const text = `${report.terminal_state} (${report.reason})`;
  return report.detail ? `${text}: ${report.detail}` : text;
}

/** A tool output as the model reads it: strings as they are, the rest as JSON. */
export function toText(value: unknown): string {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** A value as JSON: as it is when it serialises, else its text. */
export function jsonable(value: unknown): unknown {
  if (value === undefined) return null;
  try {
    JSON.stringify(value);
    return value;
  } catch {
    return String(value);
  }
}
