"""Spans per second through the OTLP receiver into the durable log, beside JetStream
ingest of the same events, in the same run against the same daemon (issue 46 §1: goal
≥ 0.8x ingest).

    cd tests/py && FUSEBOX_BIN_DIR=… ../../.venv/bin/python -m otel.bench_otlp [SPANS]

Both sides are measured the same way: from the first byte sent until the daemon's
`fusebox_events_total` has counted every event as applied (after the log commit). The
OTLP side POSTs batches of 512 `execute_tool` spans (the Python SDK's default export
batch) over one keep-alive connection, each batch answered only once its events are in
JetStream; the ingest side publishes the very events the receiver maps those spans to
(a `tool_call` and a `tool_result` per span), 512 acks in flight at a time, with
nats-py. Both clients are Python, so the figures compare paths, not client languages.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nats
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from support.stack import Stack, start_stack

TENANT = "bench"
BATCH = 512
RUNS = 64
T0 = 1_764_800_000_000_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def events_applied(stack: Stack) -> int:
    with urllib.request.urlopen(f"{stack.metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("fusebox_events_total{")
    )


def wait_applied(stack: Stack, target: int) -> None:
    while events_applied(stack) < target:
        time.sleep(0.02)


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def span(prefix: str, base: int, i: int) -> Span:
    """The i-th `execute_tool` span of a round: run `<prefix>-<i % RUNS>`, distinct
    arguments (no loop to stop), 1 ms apart; `base` keeps each round's span ids apart
    (ids are the dedup key)."""
    start = T0 + i * 1_000_000
    return Span(
        trace_id=(base + i // BATCH + 1).to_bytes(16, "big"),
        span_id=(base + i + 1).to_bytes(8, "big"),
        name="execute_tool search",
        start_time_unix_nano=start,
        end_time_unix_nano=start + 500_000,
        attributes=[
            kv("gen_ai.operation.name", "execute_tool"),
            kv("gen_ai.tool.name", "search"),
            kv("gen_ai.tool.call.id", f"c{i}"),
            kv("gen_ai.tool.call.arguments", json.dumps({"q": f"topic {i}"})),
            kv("gen_ai.tool.call.result", f"page {i}"),
            kv("gen_ai.conversation.id", f"{prefix}-{i % RUNS}"),
        ],
    )


def otlp_side(stack: Stack, port: int, prefix: str, base: int, spans: int) -> float:
    bodies = []
    for first in range(0, spans, BATCH):
        batch = [span(prefix, base, i) for i in range(first, min(first + BATCH, spans))]
        request = ExportTraceServiceRequest(
            resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=batch)])]
        )
        bodies.append(request.SerializeToString())
    before = events_applied(stack)
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for body in bodies:
        connection.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
    wait_applied(stack, before + 2 * spans)
    return time.perf_counter() - started


def mapped_events(prefix: str, i: int) -> list[tuple[str, str, bytes]]:
    """What the receiver publishes for span i: (subject, Nats-Msg-Id, body), twice."""
    run = f"{prefix}-{i % RUNS}"
    sid = f"{i + 1:016x}"
    start_ms = (T0 + i * 1_000_000) // 1_000_000
    call = {
        "v": 1, "id": f"otlp-{sid}-c", "tenant": TENANT, "run": run, "ts_ms": start_ms,
        "type": "tool_call", "call_id": f"c{i}", "tool": "search",
        "args": {"q": f"topic {i}"},
    }  # fmt: skip
    result = {
        "v": 1, "id": f"otlp-{sid}-r", "tenant": TENANT, "run": run, "ts_ms": start_ms,
        "type": "tool_result", "call_id": f"c{i}", "tool": "search", "kind": "SUCCESS",
        "output": f"page {i}",
    }  # fmt: skip
    subject = f"fusebox.events.{TENANT}.{run}"
    return [(subject, f"{TENANT}.{run}.{e['id']}", json.dumps(e).encode()) for e in (call, result)]


async def ingest_side(stack: Stack, prefix: str, spans: int) -> float:
    messages = [m for i in range(spans) for m in mapped_events(prefix, i)]
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        before = events_applied(stack)
        started = time.perf_counter()
        for first in range(0, len(messages), BATCH):
            await asyncio.gather(
                *(
                    js.publish(subject, body, headers={"Nats-Msg-Id": msg_id})
                    for subject, msg_id, body in messages[first : first + BATCH]
                )
            )
        await asyncio.to_thread(wait_applied, stack, before + len(messages))
        return time.perf_counter() - started
    finally:
        await nc.close()


def main() -> None:
    spans = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    rounds = 2
    port = free_port()
    with start_stack() as plain:
        shipped = plain.config.read_text()
    off = '[otlp]\nlisten = ""\nmax_body_bytes = 4194304\ntenant = "default"\n'
    assert off in shipped, "the test config carries the shipped [otlp] section"
    config = Path(tempfile.mkdtemp(prefix="fusebox-otlp-bench-")) / "fusebox.toml"
    on = f'[otlp]\nlisten = "127.0.0.1:{port}"\nmax_body_bytes = 4194304\ntenant = "{TENANT}"\n'
    config.write_text(shipped.replace(off, on))
    print(f"spans: {spans} per round ({2 * spans} events, {RUNS} runs, batches of {BATCH})")
    with start_stack("--config", str(config)) as stack:
        # Warm both paths (streams, consumer, connections) before timing.
        otlp_side(stack, port, "warm", 0, BATCH)
        for round_ in range(rounds):
            # Alternate which goes first, so neither always runs on a fuller log.
            order = ["ingest", "otlp"] if round_ % 2 == 0 else ["otlp", "ingest"]
            took: dict[str, float] = {}
            for side in order:
                if side == "ingest":
                    took[side] = asyncio.run(ingest_side(stack, f"ingest{round_}", spans))
                else:
                    base = (round_ + 1) * 10**9
                    took[side] = otlp_side(stack, port, f"otlp{round_}", base, spans)
            for side, label in (("ingest", "JetStream ingest"), ("otlp", "OTLP/HTTP receiver")):
                seconds = took[side]
                print(
                    f"round {round_ + 1}: {label} → durable log: {spans / seconds:,.0f} spans/s "
                    f"({2 * spans / seconds:,.0f} events/s)"
                )
            print(f"round {round_ + 1}: OTLP / ingest = {took['ingest'] / took['otlp']:.2f}")
        # And JetStream ingest with a Rust publisher (`fusebox bench gate`'s ingest
        # measurement, the project's own figure) on the same daemon, after the rounds:
        # the Python publisher above may be what bounds the ingest side.
        otlp_events = 2 * spans / otlp_side(stack, port, "otlp-last", 10**12, spans)
        rust = rust_ingest(stack, 2 * spans)
        print(
            f"fusebox bench gate ingest (Rust publisher) → durable log: {rust:,.0f} events/s; "
            f"OTLP receiver, just before: {otlp_events:,.0f} events/s; "
            f"OTLP / ingest = {otlp_events / rust:.2f}"
        )


def rust_ingest(stack: Stack, events: int) -> float:
    """`fusebox bench gate --ingest N`'s events per second into the durable log (its
    table's "JetStream ingest → durable log" row)."""
    done = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "bench",
            "gate",
            "--nats-url",
            stack.nats_url,
            "--serial",
            "100",
            "--parallel",
            "1000",
            "--ingest",
            str(events),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    for line in done.stdout.splitlines():
        if line.startswith("JetStream ingest → durable log"):
            return float(line.split()[-1])
    raise AssertionError(f"no ingest row in:\n{done.stdout}")


if __name__ == "__main__":
    main()
