/** The answer to one tool call, as an adapter acts on it: may the tool run, and what does
 * the model read. */
import { type FuseboxError, GuardUnavailable, Refused } from "./errors.js";
import {
  type Action,
  type Decision,
  letsToolRun,
  type StopReport,
  summary,
  toText,
} from "./types.js";

/**
 * One gated call: the guard's decision, or why there is none. Exactly one of `decision`
 * and `error` is set. With `error`, the tool runs only under `gateOnError: "allow"`; a
 * refusal by the daemon (`Refused`) never lets it run.
 */
export class Gate {
  constructor(
    readonly callId: string,
    readonly tool: string,
    readonly decision: Decision | null,
    readonly error: FuseboxError | null = null,
    readonly allowedOnError = false,
  ) {}

  get action(): Action | null {
    return this.decision?.action ?? null;
  }

  /** May the tool run? Only after `execute` or `warn`, or unguarded by choice. */
  get mayRun(): boolean {
    if (this.decision !== null) return letsToolRun(this.decision.action);
    return this.allowedOnError && this.error instanceof GuardUnavailable;
  }

  /** The run is over: this call and every later one are refused. */
  get stopped(): boolean {
    return this.decision?.action === "stop";
  }

  get report(): StopReport | null {
    return this.decision?.report ?? null;
  }

  /** The stored result of a side effect that already succeeded (`use_completed_result`),
   * which the model reads instead of a second execution. */
  get completedResult(): unknown {
    return this.decision?.action === "use_completed_result" ? this.decision.result : undefined;
  }

  /** A `warn`'s message: the tool runs and the model also reads this. */
  get warning(): string | null {
    return this.decision?.action === "warn" ? this.decision.message : null;
  }

  /**
   * What the model reads in place of the tool's output when the tool does not run (null
   * when it may run). Always a full sentence: a blind refusal makes an agent that retries.
   */
  get modelText(): string | null {
    if (this.mayRun) return null;
    const decision = this.decision;
    if (decision === null) {
      const why = this.error?.message ?? "no decision";
      if (this.error instanceof Refused) {
        return `fusebox refused to gate ${this.tool}: ${why}. The tool did not run.`;
      }
      return `fusebox could not be asked whether ${this.tool} may run (${why}); the tool did not run.`;
    }
    if (decision.action === "use_completed_result") return toText(decision.result);
    if (decision.action === "stop") {
      const what = decision.report ? summary(decision.report) : (decision.reason ?? "stopped");
      const base = `fusebox stopped this run (${what}); ${this.tool} did not run.`;
      return decision.message ? `${base} ${decision.message}` : base;
    }
    const message = decision.message ?? `${this.tool} was refused (${decision.reason}).`;
    return `fusebox blocked ${this.tool}: ${message}`;
  }

  /** What the model reads after the call: the tool's `output` (when it ran) with a
   * warning appended, else `modelText`. A tool that returned nothing (`undefined`, an
   * empty string or no content blocks) reads as the warning alone, not as "undefined". */
  reads(output: unknown): string {
    const text = this.modelText;
    if (text !== null) return text;
    const empty =
      output === undefined || output === "" || (Array.isArray(output) && output.length === 0);
    const body = empty ? "" : toText(output);
    const warning = this.warning;
    if (!warning) return body;
    return body === "" ? `[fusebox warning] ${warning}` : `${body}\n\n[fusebox warning] ${warning}`;
  }
}
