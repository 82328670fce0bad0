"""The Python gate call beside raw nats-py request/reply to the same fuseboxd, in one run.

    python clients/python/bench/gate_bench.py --nats nats://127.0.0.1:4222 [--calls 4000]

Both sides send a `tool_call` to `fusebox.gate.<tenant>.<run>` and wait for the decision:
`raw` hands nats-py pre-encoded bytes and ignores the answer; `client` is
`Run.tool_call`, i.e. building the envelope, JSON, the request, decoding the decision into
a `Gate`. The difference of the medians is what fusebox_guard adds (goal: ≤ 0.2 ms).
Rounds alternate between the two so both see the same daemon and machine state; each
round uses fresh runs (distinct calls, below `max_steps`). `nats_rtt` is a PING/PONG
round trip for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import nats
from fusebox_guard import Fusebox


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "n": len(ordered)}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--tenant", default="bench")
    parser.add_argument("--calls", type=int, default=4000)
    # Calls per run: below the default max_steps (500), so every call is a plain execute.
    parser.add_argument("--per-run", type=int, default=400)
    args = parser.parse_args()
    per_round = args.per_run
    rounds = max(1, args.calls // per_round)
    fb = await Fusebox.connect(args.nats, tenant=args.tenant)
    raw_nc = await nats.connect(args.nats, inbox_prefix=f"_INBOX.{args.tenant}")
    raw: list[float] = []
    client: list[float] = []
    rtt: list[float] = []

    async def raw_round() -> None:
        run = f"raw-{uuid.uuid4().hex[:10]}"
        subject = f"fusebox.gate.{args.tenant}.{run}"
        payloads = [
            json.dumps(
                {
                    "v": 1,
                    "id": f"{run}-{i}",
                    "tenant": args.tenant,
                    "run": run,
                    "seq": i,
                    "ts_ms": int(time.time() * 1000),
                    "type": "tool_call",
                    "call_id": f"c{i}",
                    "tool": "search",
                    "args": {"query": f"q{i}"},
                }
            ).encode()
            for i in range(1, per_round + 1)
        ]
        for payload in payloads:
            started = time.perf_counter()
            await raw_nc.request(subject, payload, timeout=5)
            raw.append(time.perf_counter() - started)

    async def client_round() -> None:
        run = fb.run(f"cli-{uuid.uuid4().hex[:10]}")
        await run.start(watch_stop=False)
        for i in range(1, per_round + 1):
            started = time.perf_counter()
            gate = await run.tool_call("search", {"query": f"q{i}"})
            client.append(time.perf_counter() - started)
            assert gate.may_run, gate

    # Warm-up: connections, the daemon's first runs, Python's caches.
    await raw_round()
    await client_round()
    raw.clear()
    client.clear()
    for _ in range(rounds):
        await raw_round()
        await client_round()
        for _ in range(50):
            started = time.perf_counter()
            await raw_nc.flush()
            rtt.append(time.perf_counter() - started)
    result: dict[str, object] = {
        "raw_nats_py": quantiles(raw),
        "fusebox_guard": quantiles(client),
        "nats_rtt": quantiles(rtt),
    }
    result["overhead_p50_ms"] = quantiles(client)["p50_ms"] - quantiles(raw)["p50_ms"]
    result["overhead_mean_ms"] = (statistics.fmean(client) - statistics.fmean(raw)) * 1000
    print(json.dumps(result, indent=2))
    await raw_nc.close()
    await fb.close()


if __name__ == "__main__":
    asyncio.run(main())
