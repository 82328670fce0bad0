"""The gateway's added latency per tools/call: the same upstream server, the same
calls, once through a direct MCP session and once through `fusebox mcp`, in one run.

    PYTHONPATH=tests/py python tests/py/mcp/bench_latency.py \
        --nats-url nats://127.0.0.1:4222 [--calls 300] [--rows N]

needs a fuseboxd on that NATS (target/debug/fusebox-stack starts both). Prints one JSON
line: p50/p99 of each path in ms and the gateway's added p50/p99. `--rows N` calls
`export_report` with N rows (~19 bytes each) instead of `list_page`: the cost of a large
result, which the gateway copies into the guard's `tool_result` (hashed past 32 KiB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from gateway import counting_server, direct, session
from mcp import StdioServerParameters


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(params: StdioServerParameters, calls: int, warmup: int, rows: int) -> list[float]:
    """Per-call round trips in ms; every call is a new page (or report), so the guard
    executes all."""
    samples = []
    async with session(params) as client:
        for page in range(warmup + calls):
            started = time.perf_counter()
            if rows:
                args: dict[str, Any] = {"report_id": f"r{page}", "rows": rows}
                result = await client.call_tool("export_report", args)
            else:
                result = await client.call_tool("list_page", {"page": page})
            elapsed = (time.perf_counter() - started) * 1000
            assert not result.is_error, result
            if page >= warmup:
                samples.append(elapsed)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--fusebox", default="target/debug/fusebox")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rows", type=int, default=0, help="export_report rows per call")
    args = parser.parse_args()
    through = StdioServerParameters(
        command=args.fusebox,
        args=[
            "mcp",
            "--nats-url",
            args.nats_url,
            "--tenant",
            "bench",
            "--",
            *counting_server(),
        ],
    )
    # Interleave two rounds of each so drift on a shared machine hits both paths.
    direct_ms: list[float] = []
    gateway_ms: list[float] = []
    for _ in range(2):
        direct_ms += await measure(
            direct(counting_server()), args.calls // 2, args.warmup, args.rows
        )
        gateway_ms += await measure(through, args.calls // 2, args.warmup, args.rows)
    report: dict[str, Any] = {
        "calls_each": len(direct_ms),
        "rows": args.rows,
        "direct": summary(direct_ms),
        "gateway": summary(gateway_ms),
    }
    report["added"] = {
        "p50_ms": round(report["gateway"]["p50_ms"] - report["direct"]["p50_ms"], 3),
        "p99_ms": round(report["gateway"]["p99_ms"] - report["direct"]["p99_ms"], 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
