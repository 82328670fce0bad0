/**
 * The TypeScript gate call beside a raw nats.js request/reply to the same fuseboxd, in
 * one run (used by `npm run bench` and by the latency test).
 *
 * Both sides send a `tool_call` to `fusebox.gate.<tenant>.<run>` and wait for the
 * decision: `raw` hands nats.js pre-encoded bytes and ignores the answer; `client` is
 * `Run.toolCall`, i.e. building the envelope, JSON, the request, decoding the decision into
 * a `Gate`. The difference of the medians is what fusebox-guard adds (goal: ≤ 0.2 ms p50),
 * and the ratio client/raw is given beside it. Rounds alternate between the two so both
 * see the same daemon and machine state; each round uses a fresh run (distinct calls,
 * below `max_steps`), started the same way on both sides (`run_started` first; the
 * client's with the kill switch watched, as `Fusebox.startRun` does for a user), so the
 * daemon does the same work for each. `nats_rtt` is a PING/PONG round trip for scale.
 * `cpu_us_per_call` is this process's CPU time (user + system) per call on each side:
 * what the client's own work costs, apart from waiting for the daemon.
 */
import { randomUUID } from "node:crypto";
import { loadavg } from "node:os";
import { connect } from "@nats-io/transport-node";
import { Fusebox } from "../src/index.js";

export interface LatencyOptions {
  url: string;
  tenant: string;
  /** Calls per side, in rounds of `perRun`. */
  calls: number;
  /** Calls per run: below the default max_steps (500), so every call is a plain execute. */
  perRun: number;
}

export function quantiles(samples: number[]) {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) =>
    sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
  return { p50_ms: at(0.5), p90_ms: at(0.9), p99_ms: at(0.99), n: sorted.length };
}

const now = () => performance.now();
const fresh = (prefix: string) => `${prefix}-${randomUUID().slice(0, 8)}`;
const cpuSince = (start: NodeJS.CpuUsage) => {
  const used = process.cpuUsage(start);
  return used.user + used.system;
};

export async function measureGate({ url, tenant, calls, perRun }: LatencyOptions) {
  const rounds = Math.max(1, Math.floor(calls / perRun));
  const fb = await Fusebox.connect(url, { tenant, timeoutMs: 5000 });
  const rawNc = await connect({ servers: url, inboxPrefix: `_INBOX.${tenant}` });
  const raw: number[] = [];
  const client: number[] = [];
  const rtt: number[] = [];
  /** CPU microseconds spent in each side's rounds. */
  const cpu = { raw: 0, client: 0 };

  async function rawRound(): Promise<void> {
    const run = fresh("raw");
    const subject = `fusebox.gate.${tenant}.${run}`;
    const envelope = (seq: number, id: string) => ({
      v: 1,
      id,
      tenant,
      run,
      seq,
      ts_ms: Date.now(),
    });
    const started = { ...envelope(1, `${run}-1.x`), type: "run_started" };
    await rawNc.request(subject, new TextEncoder().encode(JSON.stringify(started)), {
      timeout: 5000,
    });
    const payloads = Array.from({ length: perRun }, (_, k) => {
      const i = k + 2;
      const call = { ...envelope(i, `${run}-${i}`), type: "tool_call", call_id: `c${i}` };
      return new TextEncoder().encode(
        JSON.stringify({ ...call, tool: "search", args: { query: `q${i}` } }),
      );
    });
    const cpuStart = process.cpuUsage();
    for (const payload of payloads) {
      const at = now();
      await rawNc.request(subject, payload, { timeout: 5000 });
      raw.push(now() - at);
    }
    cpu.raw += cpuSince(cpuStart);
  }

  async function clientRound(): Promise<void> {
    const run = await fb.startRun(fresh("cli"));
    const cpuStart = process.cpuUsage();
    for (let i = 1; i <= perRun; i++) {
      const at = now();
      const gate = await run.toolCall("search", { query: `q${i}` });
      client.push(now() - at);
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
        const at = now();
        await rawNc.flush();
        rtt.push(now() - at);
      }
    }
  } finally {
    await rawNc.close();
    await fb.close();
  }
  const rawQ = quantiles(raw);
  const clientQ = quantiles(client);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  return {
    raw_nats_js: rawQ,
    fusebox_guard: clientQ,
    nats_rtt: quantiles(rtt),
    overhead_p50_ms: clientQ.p50_ms - rawQ.p50_ms,
    overhead_mean_ms: mean(client) - mean(raw),
    ratio_p50: clientQ.p50_ms / rawQ.p50_ms,
    cpu_us_per_call: { raw: cpu.raw / raw.length, client: cpu.client / client.length },
    load_average_1m: loadavg()[0],
    goal: "overhead_p50_ms <= 0.2",
  };
}
