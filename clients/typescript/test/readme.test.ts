/**
 * What the README promises a new user, as tests: a script built from it exits once it
 * calls `fb.close()` (and does not without it: the connection and the kill switch's
 * subscription keep Node's event loop alive), against the real daemon.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { connectedStack, freshRun, runStatus } from "./support/guard.js";

const SCRIPT = join(dirname(fileURLToPath(import.meta.url)), "support/readme-script.js");

/** Runs the script; its exit code and output, or "running" when it has not exited
 * within `waitMs` (it is then killed). */
function runScript(
  args: string[],
  waitMs: number,
): Promise<{ exit: number | "running"; out: string }> {
  return new Promise((done) => {
    const child = spawn(process.execPath, [SCRIPT, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      done({ exit: "running", out });
    }, waitMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      done({ exit: code ?? -1, out });
    });
  });
}

describe("the README, as a user runs it", () => {
  const live = connectedStack();

  test("a script built from it exits after fb.close(), its run closed", async () => {
    const runId = freshRun("readme");
    const { exit, out } = await runScript([live.stack.natsUrl, runId], 20_000);
    assert.equal(exit, 0, out);
    assert.equal(out.trim(), "execute");
    const status = await runStatus(live.stack, runId);
    assert.equal((status.summary as { open: boolean }).open, false, JSON.stringify(status));
  });

  test("without fb.close() the same script does not exit", async () => {
    const { exit, out } = await runScript(
      [live.stack.natsUrl, freshRun("readme"), "--no-close"],
      3_000,
    );
    assert.equal(exit, "running", out);
    assert.equal(out.trim(), "execute");
  });
});
