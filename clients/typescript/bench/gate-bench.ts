/**
 * The TypeScript gate call beside a raw nats.js request/reply to the same fuseboxd, in
 * one run:
 *
 *     npm run bench                              # starts its own stack (fusebox-stack)
 *     npm run bench -- --nats nats://127.0.0.1:4222 --calls 4000
 *
 * Both sides send a `tool_call` to `fusebox.gate.<tenant>.<run>` and wait for the
 * decision: `raw` hands nats.js pre-encoded bytes and ignores the answer; `client` is
 * `Run.toolCall`, i.e. building the envelope, JSON, the request, decoding the decision into
 * a `Gate`. The difference of the medians is what fusebox-guard adds (goal: ≤ 0.2 ms p50),
 * and the ratio client/raw is printed beside it. Rounds alternate between the two so both
 * see the same daemon and machine state; each round uses a fresh run (distinct calls,
 * below `max_steps`), started the same way on both sides (`run_started` first; the
 * client's with the kill switch watched, as `Fusebox.startRun` does for a user), so the
 * daemon does the same work for each. `nats_rtt` is a PING/PONG round trip for scale.
 * `cpu_us_per_call` is this process's CPU time (user + system) per call on each side:
 * what the client's own work costs, apart from waiting for the daemon.
 */
import { randomUUID } from "node:crypto";
import { loadavg } from "node:os";
import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import { Fusebox } from "../src/index.js";
import { type Stack, startStack } from "../test/support/stack.js";

const { values } = parseArgs({
  options: {
    nats: { type: "string" },
    tenant: { type: "string", default: "bench" },
    calls: { type: "string", default: "4000" },
    // Calls per run: below the default max_steps (500), so every call is a plain execute.
    "per-run": { type: "string", default: "400" },
  },
});
const tenant = values.tenant;
const perRun = Number(values["per-run"]);
const rounds = Math.max(1, Math.floor(Number(values.calls) / perRun));

function quantiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) =>
    sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
  return { p50_ms: at(0.5), p90_ms: at(0.9), p99_ms: at(0.99), n: sorted.length };
}

const now = () => performance.now();
const fresh = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;

const stack: Stack | null = values.nats === undefined ? await startStack() : null;
const url = values.nats ?? (stack as Stack).natsUrl;
const fb = await Fusebox.connect(url, { tenant, timeoutMs: 5000 });
const rawNc = await connect({ servers: url, inboxPrefix: `_INBOX.${tenant}` });
const raw: number[] = [];
const client: number[] = [];
const rtt: number[] = [];
/** CPU microseconds spent in each side's rounds, and their calls. */
const cpu = { raw: 0, client: 0 };
const cpuSince = (start: NodeJS.CpuUsage) => {
  const used = process.cpuUsage(start);
  return used.user + used.system;
};

async function rawRound(): Promise<void> {
  const run = fresh("raw");
  const subject = `fusebox.gate.${tenant}.${run}`;
  const started = new TextEncoder().encode(
    JSON.stringify({
      v: 1,
      id: `${run}-1.x`,
      tenant,
      run,
      seq: 1,
      ts_ms: Date.now(),
      type: "run_started",
    }),
  );
  await rawNc.request(subject, started, { timeout: 5000 });
  const payloads = Array.from({ length: perRun }, (_, k) => {
    const i = k + 2;
    return new TextEncoder().encode(
      JSON.stringify({
        v: 1,
        id: `${run}-${i}`,
        tenant,
        run,
        seq: i,
        ts_ms: Date.now(),
        type: "tool_call",
        call_id: `c${i}`,
        tool: "search",
        args: { query: `q${i}` },
      }),
    );
  });
  const cpuStart = process.cpuUsage();
  for (const payload of payloads) {
    const started = now();
    await rawNc.request(subject, payload, { timeout: 5000 });
    raw.push(now() - started);
  }
  cpu.raw += cpuSince(cpuStart);
}

async function clientRound(): Promise<void> {
  const run = await fb.startRun(fresh("cli"));
  const cpuStart = process.cpuUsage();
  for (let i = 1; i <= perRun; i++) {
    const started = now();
    const gate = await run.toolCall("search", { query: `q${i}` });
    client.push(now() - started);
    if (!gate.mayRun) throw new Error(`call ${i} refused: ${gate.modelText}`);
  }
  cpu.client += cpuSince(cpuStart);
  run.close();
}

try {
  // Warm-up: connections, the daemon's first runs, V8's JIT.
  await rawRound();
  await clientRound();
  raw.length = 0;
  client.length = 0;
  cpu.raw = 0;
  cpu.client = 0;
  for (let r = 0; r < rounds; r++) {
    await rawRound();
    await clientRound();
    for (let i = 0; i < 50; i++) {
      const started = now();
      await rawNc.flush();
      rtt.push(now() - started);
    }
  }
  const rawQ = quantiles(raw);
  const clientQ = quantiles(client);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  console.log(
    JSON.stringify(
      {
        raw_nats_js: rawQ,
        fusebox_guard: clientQ,
        nats_rtt: quantiles(rtt),
        overhead_p50_ms: clientQ.p50_ms - rawQ.p50_ms,
        overhead_mean_ms: mean(client) - mean(raw),
        ratio_p50: clientQ.p50_ms / rawQ.p50_ms,
        cpu_us_per_call: { raw: cpu.raw / raw.length, client: cpu.client / client.length },
        load_average_1m: loadavg()[0],
        goal: "overhead_p50_ms <= 0.2",
      },
      null,
      2,
    ),
  );
} finally {
  await rawNc.close();
  await fb.close();
  await stack?.stop();
}
