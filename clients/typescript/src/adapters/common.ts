/** What every adapter shares: which fields a call carries on the wire, reporting results
 * without letting a silent daemon break the framework's run, and a sub-agent's child run. */
import type { ChildRunOptions, Run, ToolCallOptions } from "../run.js";
import type { Effect, ResultKind, Usage } from "../types.js";
import { jsonable, summary } from "../types.js";

/** The business-operation identity of a side-effecting call, from the tool and its args. */
export type OpKeyFn = (tool: string, args: unknown) => string | undefined | null;

export interface GuardOptions {
  /** Gives a side effect its `op_key`: it executes once per key, across retries and runs. */
  opKey?: OpKeyFn;
  /** `read` / `write` per tool name, when the daemon's per-tool policy does not say. */
  effects?: Record<string, Effect>;
}

export function callOptions(
  opts: GuardOptions,
  tool: string,
  args: unknown,
  callId: string,
): ToolCallOptions {
  const fields: ToolCallOptions = { callId };
  const key = opts.opKey?.(tool, args);
  if (key !== undefined && key !== null) fields.opKey = key;
  const effect = opts.effects?.[tool];
  if (effect !== undefined) fields.effect = effect;
  return fields;
}

/**
 * Reports how a call ended. A result that cannot be delivered now is re-sent before the
 * run's next event (the run handle keeps it queued); the framework's run goes on, and the
 * next gate still asks.
 */
export async function report(
  run: Run,
  callId: string,
  tool: string,
  kind: ResultKind,
  output: unknown,
): Promise<void> {
  try {
    await run.toolResult(callId, tool, kind, { output: jsonable(output) });
  } catch {
    // Kept queued by the run handle; see above.
  }
}

/** Sends an event whose loss must not end the agent's run (it stays queued, in order). */
export async function bestEffort(send: () => Promise<unknown>): Promise<void> {
  try {
    await send();
  } catch {
    // Kept queued by the run handle and re-sent before the next event.
  }
}

/** A JSON argument string as the framework got it from the model; its value. */
export function parseArgs(raw: unknown): unknown {
  if (typeof raw !== "string") return raw ?? {};
  if (raw.trim() === "") return {};
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/** Drops the fields a provider left out (the contract sums cached tokens apart). */
export function usage(fields: Record<keyof Usage, number | undefined | null>): Usage {
  const out: Usage = {};
  for (const [key, value] of Object.entries(fields) as [keyof Usage, number | undefined | null][]) {
    if (typeof value === "number" && Number.isFinite(value)) out[key] = value;
  }
  return out;
}

/**
 * What the parent's model reads in place of a sub-agent's answer when the guard stopped
 * the sub-agent's run, or refused to start it: which one, why (the guard's report), and
 * what to do instead of starting it again — never a crash of the parent's run. (The
 * Python client's words, so both read the same.)
 */
export function childStopText(child: Run): string {
  const report = child.stopped;
  const why = report === null ? "stopped" : summary(report);
  const name = child.agent === undefined ? "sub-agent" : `sub-agent ${child.agent}`;
  return (
    `fusebox stopped the ${name} (run ${child.id}): ${why}. Its task is not done: do it ` +
    "another way or report that it could not be done, rather than starting the same " +
    "sub-agent again."
  );
}

/**
 * Runs a sub-agent as a child run of `parent` (guard contract §6): starts the child, runs
 * `body` with it, and closes it (`completed`, or `failed` when `body` throws) when the
 * sub-agent ends on its own. A child the guard refused at its start (a cap of a run
 * above, a stopped ancestor) never runs `body`; one stopped while it runs (its own
 * budget, a loop, a tree budget, its kill switch) ends the framework's way inside `body`.
 * Either way `stopped(childStopText(child))` is the outcome instead: the parent's model
 * reads it as the sub-agent's answer, and the parent's run goes on.
 */
export async function asChild<T, U>(
  parent: Run,
  opts: ChildRunOptions,
  body: (child: Run) => Promise<T>,
  stopped: (text: string, child: Run) => U,
): Promise<T | U> {
  const child = await parent.startChild(opts);
  try {
    if (child.stopped !== null) return stopped(childStopText(child), child);
    let outcome: T;
    try {
      outcome = await body(child);
    } catch (err) {
      if (child.stopped !== null) return stopped(childStopText(child), child);
      await bestEffort(() => child.finish("failed"));
      throw err;
    }
    if (child.stopped !== null) return stopped(childStopText(child), child);
    await bestEffort(() => child.finish("completed"));
    return outcome;
  } finally {
    child.close();
  }
}
