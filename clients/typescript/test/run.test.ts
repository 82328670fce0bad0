/**
 * The client against a real fuseboxd (started by the repo's harness): the envelope it
 * owns, every event type of the contract, the daemon's dedup, refusals, both result modes,
 * the kill switch live and kept, and a tenant user of the deploy configs.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Fusebox, newRunId, Refused, RunExists } from "../src/index.js";
import {
  bareNats,
  freePort,
  freshRun,
  fuseboxCancel,
  RUNAWAY_EXECUTIONS,
  runStatus,
  TENANT,
} from "./support/guard.js";
import { binDir, REPO, type Stack, startStack } from "./support/stack.js";

const bytes = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));

describe("the client against fuseboxd", () => {
  let stack: Stack;
  let fb: Fusebox;

  before(async () => {
    stack = await startStack();
    fb = await Fusebox.connect(stack.natsUrl, { tenant: TENANT });
  });
  after(async () => {
    await fb.close();
    await stack.stop();
  });

  test("every event type of the contract is accepted, in seq order", async () => {
    const run = await fb.startRun(freshRun("types"), {
      agent: "researcher",
      tools: ["search"],
      policy: { max_steps: 50 },
    });
    const gate = await run.toolCall(
      "search",
      { query: "x" },
      { opKey: `${run.id}:op`, effect: "write" },
    );
    assert.equal(gate.mayRun, true, String(gate.error));
    const results = [
      await run.toolResult(gate.callId, "search", "SUCCESS", { output: { hits: 1 }, progress: 1 }),
      await run.modelTurn("tool_use", {
        usage: {
          input_tokens: 10,
          output_tokens: 2,
          cache_read_input_tokens: 5,
          cache_creation_input_tokens: 1,
        },
        costUsd: 0.01,
        valid: true,
      }),
      await run.progress(2, "cursor moved"),
      await run.compaction("context full"),
    ];
    // The stack's daemon runs no cloud watchdog: an instance it cannot watch is refused,
    // and the refused event leaves no gap in the run's seq.
    await assert.rejects(
      run.sendEvent(
        "instance_launched",
        { provider: "ec2", region: "us-east-1", instance_id: "i-0123456789abcdef0" },
        true,
      ),
      (err: unknown) => err instanceof Refused && err.reason === "unwatched_provider",
    );
    const hashed = await run.toolCall("search", undefined, { argsHash: "sha256:abc" });
    assert.equal(hashed.mayRun, true);
    results.push(
      await run.toolResult(hashed.callId, "search", "RETRYABLE", {
        code: "rate_limited",
        retryAfterMs: 10,
        outputHash: "sha256:def",
      }),
    );
    results.push(await run.finish("done"));
    assert.ok(results.every((d) => d !== null));
    assert.equal(run.seq, 9);
    // After run_finished the latch answers every call with stop, reason run_closed.
    const late = await run.toolCall("search", { query: "y" });
    assert.equal(late.stopped, true);
    assert.equal(late.decision?.reason, "run_closed");
    run.close();
  });

  test("a retried request is answered from the daemon's dedup", async () => {
    const runId = freshRun("dedup");
    const event = {
      v: 1,
      id: `${runId}-1`,
      tenant: TENANT,
      run: runId,
      seq: 1,
      ts_ms: 1,
      type: "tool_call",
      call_id: "c1",
      tool: "search",
      args: { q: "x" },
      op_key: `${runId}:once`,
    };
    const first = await fb.ask(runId, bytes(event), 2000);
    const again = await fb.ask(runId, bytes(event), 2000);
    assert.equal(first.action, "execute");
    // The same id is the same event: the original decision, not a second execution
    // (which an op_key in flight would have blocked).
    assert.deepEqual(again.raw, first.raw);
  });

  test("a restarted worker reusing a run id is refused run_exists, naming the run", async () => {
    const allow = await Fusebox.connect(stack.natsUrl, { tenant: TENANT, gateOnError: "allow" });
    const runId = freshRun("reuse");
    const first = await fb.startRun(runId, { agent: "researcher" });
    assert.equal((await first.toolCall("search", { query: "x" })).mayRun, true);
    // Another process: a handle of its own for the same run id.
    const again = allow.run(runId, { agent: "researcher" });
    await assert.rejects(again.start(), (err: unknown) => {
      assert.ok(err instanceof RunExists && err instanceof Refused, String(err));
      assert.equal(err.reason, "run_exists");
      assert.equal(err.tenant, TENANT);
      assert.equal(err.run, runId);
      assert.ok(err.message.startsWith(`run ${TENANT}/${runId} already exists:`), err.message);
      return true;
    });
    // Never the old process's decisions, never gateOnError: nothing more is sent.
    const call = await again.toolCall("search", { query: "x" });
    assert.equal(call.mayRun, false);
    assert.ok(call.error instanceof RunExists, String(call.error));
    await assert.rejects(again.finish("completed"), RunExists);
    // The run is still the first process's.
    const status = await runStatus(stack, runId);
    assert.equal((status.summary as { last_seq: number }).last_seq, 2);
    assert.equal((await first.toolCall("search", { query: "y" })).mayRun, true);
    first.close();
    await allow.close();
  });

  test("an event for another tenant is refused, told apart from an outage", async () => {
    const runId = freshRun("kinds");
    const wrong = {
      v: 1,
      id: "x1",
      tenant: "someone-else",
      run: runId,
      ts_ms: 1,
      type: "tool_call",
      call_id: "c",
      tool: "t",
      args: {},
    };
    await assert.rejects(
      fb.ask(runId, bytes(wrong), 2000),
      (err: unknown) => err instanceof Refused && err.reason === "tenant_mismatch",
    );
  });

  test("an event the daemon refuses leaves no gap in seq, and never runs under allow", async () => {
    const allow = await Fusebox.connect(stack.natsUrl, { tenant: TENANT, gateOnError: "allow" });
    const run = await allow.startRun(freshRun("refused"), { agent: "researcher" });
    // The test stack's daemon takes events of at most 8 KiB (tests/harness write_config).
    const big = await run.toolCall("write_file", { content: "x".repeat(20_000) });
    assert.ok(big.error instanceof Refused);
    assert.equal(big.mayRun, false);
    assert.match(big.modelText ?? "", /did not run/);
    const next = await run.toolCall("search", { query: "x" });
    assert.equal(next.mayRun, true);
    assert.equal(next.decision?.seq, 2); // run_started = 1, the refused event gave its seq back
    const status = await runStatus(stack, run.id);
    assert.equal((status.summary as { last_seq: number }).last_seq, 2);
    run.close();
    await allow.close();
  });

  for (const results of ["inline", "passive"] as const) {
    test(`a runaway stops in ${results} result mode, and the kill switch carries it`, async () => {
      const client = await Fusebox.connect(stack.natsUrl, { tenant: TENANT, results });
      const run = await client.startRun(freshRun(`mode-${results}`), { agent: "researcher" });
      let executed = 0;
      for (let i = 0; i < 30; i++) {
        const gate = await run.toolCall("search", { query: "weather tokyo" });
        if (gate.stopped) break;
        if (gate.mayRun) {
          executed += 1;
          const answer = await run.toolResult(gate.callId, "search", "SUCCESS", {
            output: { hits: ["jma.go.jp"] },
          });
          assert.equal(answer === null, results === "passive");
        }
      }
      assert.equal(executed, RUNAWAY_EXECUTIONS);
      assert.equal(run.stopped?.terminal_state, "STOPPED_LOOP_GUARD");
      const watch = await client.watchStop(run.id);
      assert.equal(watch.lookupError, null);
      assert.equal(watch.stop?.report?.terminal_state, "STOPPED_LOOP_GUARD");
      watch.close();
      run.close();
      await client.close();
    });
  }

  test("fusebox cancel reaches the watcher; the next call is refused without a round trip", async () => {
    const run = await fb.startRun(freshRun("cancel"), { agent: "researcher" });
    assert.equal(run.stopped, null);
    await fuseboxCancel(stack, run.id, "budget review");
    const report = await run.waitStopped(10_000);
    assert.equal(report?.terminal_state, "CANCELLED");
    const before = run.seq;
    const gate = await run.toolCall("search", { query: "x" });
    assert.equal(gate.stopped, true);
    assert.equal(gate.mayRun, false);
    assert.equal(run.seq, before);
    run.close();
  });

  test("a watcher learns a stop kept from before it subscribed", async () => {
    const runId = freshRun("kept");
    const first = await fb.startRun(runId, { agent: "researcher" });
    await fuseboxCancel(stack, runId, "stopped before the worker came");
    assert.notEqual(await first.waitStopped(10_000), null);
    first.close();
    // A second worker of the same run, started after the stop: it knows before any call.
    const watch = await fb.watchStop(runId);
    assert.equal(watch.lookupError, null);
    assert.equal(watch.stop?.report?.terminal_state, "CANCELLED");
    watch.close();
    // And a run never stopped has nothing kept.
    const fresh = await fb.watchStop(newRunId("kept-none"));
    assert.equal(fresh.lookupError, null);
    assert.equal(fresh.stop, null);
    fresh.close();
  });
});

describe("a tenant user of deploy/nats/accounts.conf", () => {
  let nats: Awaited<ReturnType<typeof bareNats>>;
  let daemon: ChildProcess;

  before(async () => {
    const work = mkdtempSync(join(tmpdir(), "fusebox-ts-deploy-"));
    for (const name of ["single.conf", "accounts.conf", "partitions.conf"]) {
      copyFileSync(join(REPO, "deploy/nats", name), join(work, name));
    }
    let single = readFileSync(join(work, "single.conf"), "utf8");
    single = single.replace("http: 0.0.0.0:8222", `http: 127.0.0.1:${await freePort()}`);
    // bareNats gives the server its own store dir (-sd); a second one is an error.
    single = single.replace(/^\s*store_dir:.*$/m, "");
    writeFileSync(join(work, "single.conf"), single);
    let config = readFileSync(join(REPO, "config/fusebox.toml"), "utf8").replace(
      "[nats]\n",
      '[nats]\nuser = "fuseboxd"\npassword = "PLACEHOLDER-fuseboxd-change-me"\n',
    );
    // No cloud watchdog here: nothing may look for EC2 credentials off loopback.
    config = config.replace(/(\[watchdog\][^[]*?)enabled = true/, "$1enabled = false");
    writeFileSync(join(work, "fusebox.toml"), config);
    nats = await bareNats(["-c", join(work, "single.conf")]);
    const metrics = await freePort();
    daemon = spawn(
      join(binDir(), "fuseboxd"),
      [
        "--config",
        join(work, "fusebox.toml"),
        "--nats-url",
        nats.url,
        "--data-dir",
        join(work, "data"),
        "--metrics-listen",
        `127.0.0.1:${metrics}`,
      ],
      { stdio: "ignore" },
    );
    const until = Date.now() + 30_000;
    for (;;) {
      assert.equal(daemon.exitCode, null, "fuseboxd exited");
      const ready = await fetch(`http://127.0.0.1:${metrics}/readyz`).then(
        (r) => r.ok,
        () => false,
      );
      if (ready) break;
      assert.ok(Date.now() < until, "fuseboxd not ready within 30 s");
      await new Promise((r) => setTimeout(r, 100));
    }
  });
  after(async () => {
    const exited = new Promise((done) => daemon.once("exit", done));
    daemon.kill("SIGTERM");
    await exited;
    await nats.stop();
  });

  const creds = { user: "tenant-acme", password: "PLACEHOLDER-tenant-acme-change-me" };

  test("gates through its own inbox prefix, inline and passive, and reads its kept stop", async () => {
    const client = await Fusebox.connect(nats.url, { tenant: "acme", timeoutMs: 5000, ...creds });
    const run = await client.startRun(freshRun("deploy"), { agent: "researcher" });
    const gate = await run.toolCall("search", { query: "x" });
    assert.equal(gate.mayRun, true, String(gate.error));
    const watch = await client.watchStop(run.id);
    assert.equal(watch.lookupError, null, "a tenant may direct-get its own run's kept stop");
    watch.close();
    const passive = await client.startRun(freshRun("deploy-passive"), { results: "passive" });
    const pgate = await passive.toolCall("search", { query: "x" });
    assert.equal(pgate.mayRun, true, String(pgate.error));
    assert.equal(
      await passive.toolResult(pgate.callId, "search", "SUCCESS", { output: { hits: 1 } }),
      null,
    );
    run.close();
    passive.close();
    await client.close();
  });

  test("another tenant's subjects and the shared inbox are refused, and say so", async () => {
    const wrong = await Fusebox.connect(nats.url, {
      tenant: "acme",
      inboxPrefix: "_INBOX",
      timeoutMs: 1000,
      ...creds,
    });
    const gate = await wrong.run(freshRun("deploy-wrong")).toolCall("search", { query: "x" });
    assert.equal(gate.mayRun, false);
    assert.ok(gate.error !== null);
    await wrong.close();
    const other = await Fusebox.connect(nats.url, { tenant: "globex", timeoutMs: 1000, ...creds });
    const denied = await other.run(freshRun("deploy-globex")).toolCall("search", { query: "x" });
    assert.equal(denied.mayRun, false);
    assert.equal(denied.error?.name, "PermissionDenied", String(denied.error));
    await other.close();
  });
});
