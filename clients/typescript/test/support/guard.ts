/**
 * Shared pieces of the TypeScript suites: fresh run ids, a stack and a client of it for a
 * whole suite, a NATS server with no fuseboxd behind it (the "daemon down" case), `fusebox
 * cancel` / `fusebox run` from another process, and the tools every scenario uses (the
 * same outputs in every framework).
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before } from "node:test";
import { promisify } from "node:util";
import { Fusebox, newRunId } from "../../src/index.js";
import { type Stack, startStack } from "./stack.js";

const run = promisify(execFile);

export const TENANT = "tstest";

/**
 * Default policy (config/fusebox.toml): a read call repeated with the same result runs
 * `read_same_call_limit` = 3 times (the 3rd with a warning), the next ones are blocked,
 * and `consecutive_block_limit` = 3 blocks in a row stop the run. The Rust demo agent's
 * loop is stopped after the same 3 executions.
 */
export const RUNAWAY_EXECUTIONS = 3;
/** A B A B … with the same results: the call that would make the alternating tail
 * `ping_pong_limit` = 5 long (the 6th) is blocked, and the blocks that follow stop the
 * run: 5 executions, as for every Python adapter. */
export const PING_PONG_EXECUTIONS = 5;
export const PAGES = 12;

export const freshRun = (prefix: string): string => newRunId(prefix);

/** A suite's stack and its one client (tenant `TENANT`). */
export interface Connected {
  stack: Stack;
  fb: Fusebox;
}

/** A stack started before the suite it is called in, with a client connected to it, both
 * closed after the suite's last test; read them inside the tests. */
export function connectedStack(): Connected {
  const live = {} as Connected;
  before(async () => {
    live.stack = await startStack();
    live.fb = await Fusebox.connect(live.stack.natsUrl, { tenant: TENANT });
  });
  after(async () => {
    await live.fb.close();
    await live.stack.stop();
  });
  return live;
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => done(port));
    });
  });
}

async function waitForPort(port: number, deadlineMs: number): Promise<void> {
  const until = Date.now() + deadlineMs;
  for (;;) {
    const open = await new Promise<boolean>((done) => {
      const socket = new Socket();
      socket.once("connect", () => {
        socket.destroy();
        done(true);
      });
      socket.once("error", () => done(false));
      socket.connect(port, "127.0.0.1");
    });
    if (open) return;
    if (Date.now() > until) throw new Error(`nothing listens on 127.0.0.1:${port}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface BareNats {
  url: string;
  stop(): Promise<void>;
}

/** A nats-server (with JetStream unless told otherwise) and no fuseboxd: every gate has
 * no responders. `args` are more nats-server flags (auth, TLS, `-c FILE`). */
export async function bareNats(args: string[] = [], jetstream = true): Promise<BareNats> {
  const work = mkdtempSync(join(tmpdir(), "fusebox-ts-bare-"));
  const port = await freePort();
  const js = jetstream ? ["-js", "-sd", work] : [];
  const proc: ChildProcess = spawn(
    "nats-server",
    [...js, "-a", "127.0.0.1", "-p", String(port), ...args],
    {
      stdio: "ignore",
    },
  );
  await waitForPort(port, 10_000);
  return {
    url: `nats://127.0.0.1:${port}`,
    async stop() {
      const exited = new Promise((done) => proc.once("exit", done));
      proc.kill("SIGTERM");
      await exited;
      rmSync(work, { recursive: true, force: true });
    },
  };
}

/** `fusebox cancel TENANT/RUN` as an operator would type it, in another process. */
export async function fuseboxCancel(
  stack: Stack,
  runId: string,
  reason = "operator says stop",
): Promise<string> {
  const { stdout } = await run(
    join(stack.binDir, "fusebox"),
    ["cancel", `${TENANT}/${runId}`, "--nats-url", stack.natsUrl, "--reason", reason],
    { timeout: 30_000 },
  );
  return stdout;
}

/** `fusebox run TENANT/RUN --json`: the daemon's counters for the run. */
export async function runStatus(stack: Stack, runId: string): Promise<Record<string, unknown>> {
  const { stdout } = await run(
    join(stack.binDir, "fusebox"),
    ["run", `${TENANT}/${runId}`, "--nats-url", stack.natsUrl, "--json"],
    { timeout: 30_000 },
  );
  return JSON.parse(stdout.split("\n")[0] ?? "{}") as Record<string, unknown>;
}

/** The daemon's counters for the run (`model_turns`, …), from `runStatus`. */
export async function counters(stack: Stack, runId: string): Promise<Record<string, number>> {
  return (await runStatus(stack, runId)).counters as Record<string, number>;
}

/** What the fake tools really executed (the guard's decisions are judged by it). */
export class ToolLog {
  readonly calls: Array<[string, unknown]> = [];
  count(tool: string): number {
    return this.calls.filter(([name]) => name === tool).length;
  }
}

export const searchOutput = (query: string) => ({ hits: ["jma.go.jp"], query });
export const openPageOutput = (url: string) => ({ title: "Weather", url });
export const listIssuesOutput = (page: number) => ({
  issues: [`ISSUE-${page * 10}`, `ISSUE-${page * 10 + 1}`],
  next: page < PAGES,
});
export const sendEmailOutput = (to: string) => ({ sent: true, to });
