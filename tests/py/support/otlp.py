"""A real fuseboxd with its `[otlp]` receiver on, and what the OTLP suites read back:
the receiver fixture, an exporter pointed at it, a run's summary, its kill switch."""

from __future__ import annotations

import asyncio
import html
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings

from .agent_runs import run_status
from .stack import Stack, start_stack

__all__ = [
    "MAX_BODY",
    "TENANT",
    "TOKEN",
    "Receiver",
    "assert_stopped_where_seen",
    "free_port",
    "operators_page",
    "receiver",
    "receiver_outcomes",
    "receiving",
    "scripted_agent",
    "status",
    "stops_of",
    "summary",
    "tracer_provider",
    "wait_for",
]

TENANT = "otel"
TOKEN = "otlp-test-token-7f3a"
MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class Receiver:
    stack: Stack
    url: str  # http://127.0.0.1:<port>/v1/traces


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def receiving(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory, max_body: int
) -> Iterator[Receiver]:
    """A daemon with the suite's test config plus `[otlp]`: a bearer token for tenant
    `otel` (the credential path, on loopback so the test can reach it) and a body bound
    of `max_body` bytes."""
    port = free_port()
    config = tmp_path_factory.mktemp("otlp") / "fusebox.toml"
    shipped = stack.config.read_text()
    off = '[otlp]\nlisten = ""\nmax_body_bytes = 4194304\n'
    assert off in shipped, "the test config carries the shipped [otlp] section, off"
    on = f'[otlp]\nlisten = "127.0.0.1:{port}"\nmax_body_bytes = {max_body}\n'
    credentials = f'\n[otlp.credentials]\n"{TOKEN}" = "{TENANT}"\n'
    config.write_text(shipped.replace(off, on) + credentials)
    with start_stack("--config", str(config)) as running:
        yield Receiver(running, f"http://127.0.0.1:{port}/v1/traces")


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """A receiver with a small body bound (`MAX_BODY`), for the oversize cases."""
    with receiving(stack, tmp_path_factory, MAX_BODY) as running:
        yield running


def tracer_provider(
    url: str,
    compression: Compression = Compression.NoCompression,
    schedule_delay_millis: float | None = None,
) -> TracerProvider:
    """The SDK's OTLP/HTTP exporter behind its batch processor, as an application sets it
    up; `schedule_delay_millis` long makes one export of everything at `force_flush`."""
    exporter = OTLPSpanExporter(
        endpoint=url, headers={"Authorization": f"Bearer {TOKEN}"}, compression=compression
    )
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_millis)
    )
    return provider


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Polls `check()` until it returns something truthy (the daemon applies passive
    events asynchronously)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def status(receiver: Receiver, run: str) -> dict[str, Any]:
    """The run's status as `fusebox run --json` gives it (`summary`, `tree` …); empty
    for a run the daemon has not seen yet."""
    try:
        return run_status(receiver.stack, TENANT, run)
    except subprocess.CalledProcessError as err:
        if "unknown run" in err.stderr or "no run" in err.stderr:
            return {}
        raise


def summary(receiver: Receiver, run: str) -> dict[str, Any]:
    """The run's summary; a run the daemon has not seen yet has applied no events."""
    found: dict[str, Any] = status(receiver, run).get("summary", {"events": 0})
    return found


async def stops_of(nats_url: str, run: str, timeout: float) -> list[dict[str, Any]]:
    """The kill switch as a late subscriber reads it (the stop is kept in a stream)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        got: list[dict[str, Any]] = []
        sub = await js.subscribe(f"fusebox.stop.{TENANT}.{run}", ordered_consumer=True)
        try:
            msg = await sub.next_msg(timeout=timeout)
            got.append(json.loads(msg.data))
        except nats.errors.TimeoutError:
            pass
        await sub.unsubscribe()
        return got
    finally:
        await nc.close()


def operators_page(stack: Stack, tenant: str, run: str) -> str:
    """The run's page as the person on call opens it: `fusebox ui` against the stack's
    NATS, the page for TENANT/RUN fetched once, its text (tags kept, entities decoded)."""
    port = free_port()
    ui = subprocess.Popen(
        [
            str(stack.bin("fusebox")),
            "ui",
            "--nats-url",
            stack.nats_url,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert ui.stdout is not None
        started = ui.stdout.readline()
        assert started.startswith("fusebox ui: http"), started
        url = f"http://127.0.0.1:{port}/runs/{tenant}/{run}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return html.unescape(answer.read().decode())
    finally:
        ui.terminate()
        ui.wait(10)


def scripted_agent(calls: list[dict[str, Any]], provider: TracerProvider) -> Agent[None, str]:
    """A Pydantic AI agent instrumented into `provider`, whose model (`FunctionModel`: no
    LLM) asks for `search(**calls[i])` on its i-th turn, then answers; the search's answer
    is the same every time for `{"q": "same"}` (a loop), new for anything else."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < len(calls):
            return ModelResponse(
                parts=[ToolCallPart("search", calls[turn], tool_call_id=f"c{turn}")]
            )
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model), name="researcher")
    agent.instrument = InstrumentationSettings(tracer_provider=provider)

    @agent.tool_plain
    def search(q: str) -> str:
        return f"results for {q}: nothing new" if q == "same" else f"page about {q}"

    return agent


def assert_stopped_where_seen(receiver: Receiver, run: str) -> dict[str, Any]:
    """Waits for the run's stop and checks it where it is seen: the run's state
    (`STOPPED_LOOP_GUARD`), the kill switch (for whoever listens, as passive mode can
    only publish the stop), and the operator's page (the state and the stop's own
    words). The run's summary."""
    state: dict[str, Any] = wait_for(
        lambda: (s := summary(receiver, run)).get("terminal_state") and s, "the run's stop"
    )
    assert state["terminal_state"] == "STOPPED_LOOP_GUARD", state
    stops = asyncio.run(stops_of(receiver.stack.nats_url, run, timeout=5))
    assert stops, "the stop is published on the kill switch"
    assert stops[0]["report"]["terminal_state"] == "STOPPED_LOOP_GUARD", stops[0]
    page = operators_page(receiver.stack, TENANT, run)
    stop_message = run_status(receiver.stack, TENANT, run)["stop_message"]
    assert "STOPPED_LOOP_GUARD" in page and stop_message in page, page[-3000:]
    return state


def receiver_outcomes(receiver: Receiver) -> dict[str, dict[str, float]]:
    """What the receiver counted, from the daemon's /metrics: by metric
    (`fusebox_otlp_spans_total`, `fusebox_otlp_log_records_total`), each outcome's count
    (`mapped`, `skipped`, or the reason a span or record was refused)."""
    with urllib.request.urlopen(f"{receiver.stack.metrics_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        name, _, labels = line.partition('{outcome="')
        if labels and name in ("fusebox_otlp_spans_total", "fusebox_otlp_log_records_total"):
            found.setdefault(name, {})[labels.split('"')[0]] = float(line.rsplit(" ", 1)[-1])
    return found
