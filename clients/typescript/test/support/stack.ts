/**
 * The project's one harness, as a process: `fusebox-stack` (tests/harness/bin/). It starts
 * nats-server and fuseboxd on free loopback ports, prints one JSON line of endpoints, and
 * stops everything when its stdin closes. The TypeScript suites never start servers
 * themselves (tests/py/support/stack.py does the same for Python).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The repository's root (this file is clients/typescript/build/test/support/stack.js). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../../..");

export interface Stack {
  natsUrl: string;
  metricsUrl: string;
  dataDir: string;
  config: string;
  binDir: string;
  daemonPid: number;
  natsPid: number;
  /** Stops the stack (closes its stdin) and waits for it to exit. */
  stop(): Promise<void>;
}

/** `FUSEBOX_BIN_DIR`, else the workspace's debug build (what scripts/test.sh builds). */
export function binDir(): string {
  return process.env.FUSEBOX_BIN_DIR ?? join(REPO, "target/debug");
}

export async function startStack(...args: string[]): Promise<Stack> {
  const binary = join(binDir(), "fusebox-stack");
  if (!existsSync(binary)) {
    throw new Error(
      `${binary} is not built: run \`cargo test --workspace --no-run\` (scripts/test.sh does)`,
    );
  }
  const proc: ChildProcess = spawn(binary, args, { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<void>((done) => proc.once("exit", () => done()));
  const line = await new Promise<string | null>((done) => {
    const lines = createInterface({ input: proc.stdout as NodeJS.ReadableStream });
    lines.once("line", (first) => {
      lines.close();
      done(first);
    });
    proc.once("exit", () => done(null));
  });
  if (line === null) throw new Error(`fusebox-stack exited (${proc.exitCode}):\n${stderr}`);
  const fields = JSON.parse(line) as Record<string, unknown>;
  return {
    natsUrl: String(fields.nats_url),
    metricsUrl: String(fields.metrics_url),
    dataDir: String(fields.data_dir),
    config: String(fields.config),
    binDir: String(fields.bin_dir),
    daemonPid: Number(fields.daemon_pid),
    natsPid: Number(fields.nats_pid),
    async stop() {
      proc.stdin?.end();
      const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
