"""OTLP in (issue 46 §1): a real fuseboxd with its `[otlp]` receiver on, fed by the
Python OpenTelemetry SDK's OTLP/HTTP exporter with Pydantic AI's own instrumentation
driving scripted models (`FunctionModel`: no LLM, no network). Passive watching: the
agent is never refused a call; the guard's stop is published on the kill switch and
the run's state says so. Bad input gets OTLP's answers and loses nothing else."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import urllib.error
import urllib.request
from typing import Any

import nats
import pytest

# protobuf ships no type stubs (types-protobuf is not a dependency of the suite).
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from support.otlp import (
    MAX_BODY,
    TENANT,
    TOKEN,
    Receiver,
    assert_stopped_where_seen,
    receiver,
    scripted_agent,
    status,
    stops_of,
    summary,
    tracer_provider,
    wait_for,
)

__all__ = ["receiver"]  # the module's fixture, shared with the other OTLP suites


def post(url: str, body: bytes, content_type: str, **headers: str) -> tuple[int, bytes, str]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": content_type, "Authorization": f"Bearer {TOKEN}", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read(), refused.headers.get("Content-Type", "")


def recorded_spans(calls: list[dict[str, Any]], conversation: str) -> list[ReadableSpan]:
    """The spans Pydantic AI emits for a scripted run, kept in memory (to build bodies)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    scripted_agent(calls, provider).run_sync("go", conversation_id=conversation)
    return list(memory.get_finished_spans())


def test_a_runaway_search_loop_is_stopped_on_the_kill_switch(
    receiver: Receiver, run_id: str
) -> None:
    provider = tracer_provider(receiver.url)
    # The same search, 12 times, the same answer every time: the loop an agent gets into.
    result = scripted_agent([{"q": "same"}] * 12, provider).run_sync(
        "find it", conversation_id=run_id
    )
    # Passive: nothing stood between the agent and its tools; all 12 calls ran.
    assert result.output == "done"
    assert provider.force_flush(10_000)
    provider.shutdown()

    state = assert_stopped_where_seen(receiver, run_id)
    # The repeat is warned about, then refused; in passive mode the agent runs it
    # anyway, and refusals in a row end the run.
    assert state["reason"] in {"consecutive_blocks", "same_call_repeat", "no_progress"}, state


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_a_legitimate_session_is_untouched(
    receiver: Receiver, run_id: str, compression: Compression
) -> None:
    provider = tracer_provider(receiver.url, compression)
    # Twelve distinct searches with distinct answers: work, not a loop.
    calls = [{"q": f"topic {i}"} for i in range(12)]
    scripted_agent(calls, provider).run_sync("survey", conversation_id=run_id)
    assert provider.force_flush(10_000)
    provider.shutdown()

    # Every call and result arrived (12 tool calls, 12 results, 13 model turns).
    state = wait_for(
        lambda: (s := summary(receiver, run_id))["events"] >= 37 and s, "all events applied"
    )
    assert state["events"] == 37, state
    assert state.get("terminal_state") is None, state
    counters = status(receiver, run_id)["counters"]
    assert (counters["steps"], counters["calls_refused"]) == (12, 0), counters
    assert not asyncio.run(stops_of(receiver.stack.nats_url, run_id, timeout=1))


def test_a_delegated_agent_is_the_leads_child_and_stopped_alone(
    receiver: Receiver, run_id: str
) -> None:
    """Pydantic AI agent delegation: the lead's tool runs a researcher under its own
    conversation id. Spans are sent as they end, the researcher's before the lead's tool
    span around them; a batch that holds them all (a short run at the default schedule;
    here `force_flush`) says where the researcher ran: its run starts naming the lead."""
    provider = tracer_provider(receiver.url, schedule_delay_millis=600_000)
    child = f"{run_id}-researcher"
    researcher = scripted_agent([{"q": "same"}] * 12, provider)

    def lead_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("research", {"topic": "tokyo"}, "r0")])

    lead: Agent[None, str] = Agent(FunctionModel(lead_model), name="lead")
    lead.instrument = InstrumentationSettings(tracer_provider=provider)

    @lead.tool_plain
    async def research(topic: str) -> str:
        return (await researcher.run(topic, conversation_id=child)).output

    assert lead.run_sync("weather report", conversation_id=run_id).output == "done"
    assert provider.force_flush(10_000)
    provider.shutdown()

    state = wait_for(
        lambda: (s := status(receiver, child)).get("summary", {}).get("terminal_state") and s,
        "the researcher's stop",
    )
    assert state["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", state["summary"]
    assert state["tree"]["parent"] == run_id, state["tree"]
    assert asyncio.run(stops_of(receiver.stack.nats_url, child, timeout=5))
    # The lead's two model turns and its one delegation applied; the lead still open.
    lead_state = wait_for(
        lambda: (s := status(receiver, run_id)).get("summary", {}).get("events", 0) >= 4 and s,
        "the lead's events",
    )
    assert lead_state["summary"]["events"] == 4, lead_state["summary"]
    assert lead_state["summary"].get("terminal_state") is None, lead_state["summary"]
    assert [c["run"] for c in lead_state["tree"]["children"]] == [child], lead_state["tree"]
    assert not asyncio.run(stops_of(receiver.stack.nats_url, run_id, timeout=1))


def test_bad_input_gets_otlp_answers_and_loses_nothing_else(
    receiver: Receiver, run_id: str
) -> None:
    spans = recorded_spans([{"q": "alpha"}, {"q": "beta"}], run_id)
    good = encode_spans(spans).SerializeToString()

    # A truncated protobuf body: 400, with a google.rpc.Status saying why.
    status, body, kind = post(receiver.url, good[: len(good) // 2], "application/x-protobuf")
    assert status == 400 and kind == "application/x-protobuf", (status, body)
    assert b"ExportTraceServiceRequest" in body
    # Not JSON either: 400.
    status, body, _ = post(receiver.url, b'{"resourceSpans": [', "application/json")
    assert status == 400, body
    # A content type OTLP does not define: 415.
    status, body, _ = post(receiver.url, good, "text/plain")
    assert status == 415, body
    # An encoding OTLP/HTTP does not name: 415, saying what to send.
    status, body, _ = post(
        receiver.url, good, "application/x-protobuf", **{"Content-Encoding": "br"}
    )
    assert status == 415 and b"gzip or uncompressed" in body, body
    # Said to be gzip, but not: 400.
    status, body, _ = post(
        receiver.url, good, "application/x-protobuf", **{"Content-Encoding": "gzip"}
    )
    assert status == 400 and b"not gzip" in body, body
    # A small gzip body that expands past the bound (a zip bomb): 413, not a decode.
    bomb = gzip.compress(b"\0" * (MAX_BODY * 4))
    assert len(bomb) < MAX_BODY
    status, body, _ = post(
        receiver.url, bomb, "application/x-protobuf", **{"Content-Encoding": "gzip"}
    )
    assert status == 413 and b"decompressed" in body, body
    # Past the body bound: 413.
    status, body, _ = post(receiver.url, b"\0" * (MAX_BODY + 1), "application/x-protobuf")
    assert status == 413, body
    # No credential, or a wrong one: 401.
    request = urllib.request.Request(
        receiver.url, data=good, method="POST", headers={"Content-Type": "application/x-protobuf"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    status, _, _ = post(receiver.url, good, "application/x-protobuf", Authorization="Bearer wrong")
    assert status == 401
    assert summary(receiver, run_id)["events"] == 0, "nothing refused was applied"

    # A batch with one execute_tool span stripped of its tool name: that span refused
    # (partial success, a dead letter), every other span of the batch applied.
    request_pb = encode_spans(spans)
    nameless = None
    for scope in request_pb.resource_spans[0].scope_spans:
        for span in scope.spans:
            names = [kv.key for kv in span.attributes]
            if nameless is None and "gen_ai.tool.name" in names:
                nameless = span.span_id.hex()
                keep = [kv for kv in span.attributes if kv.key != "gen_ai.tool.name"]
                del span.attributes[:]
                span.attributes.extend(keep)
    assert nameless is not None

    async def send_and_read_dead_letter() -> tuple[int, bytes, dict[str, Any]]:
        nc = await nats.connect(receiver.stack.nats_url)
        try:
            sub = await nc.subscribe(f"fusebox.dlq.{TENANT}")
            await nc.flush()
            answer = await asyncio.to_thread(
                post, receiver.url, request_pb.SerializeToString(), "application/x-protobuf"
            )
            letter = json.loads((await sub.next_msg(timeout=5)).data)
            return answer[0], answer[1], letter
        finally:
            await nc.close()

    status, body, letter = asyncio.run(send_and_read_dead_letter())
    assert status == 200, body
    answer = ExportTraceServiceResponse.FromString(body)
    assert answer.partial_success.rejected_spans == 1, answer
    assert "no_tool_name" in answer.partial_success.error_message
    assert letter["error"]["reason"] == "no_tool_name", letter
    assert json.loads(letter["payload"])["span_id"] == nameless, letter
    # 2 calls with 2 results minus the refused span's pair, and 3 model turns.
    state = wait_for(lambda: (s := summary(receiver, run_id))["events"] >= 5 and s, "the rest")
    assert state["events"] == 5, state

    # The same batch again (an exporter's retry): stored once, nothing applied twice.
    status, _, _ = post(receiver.url, request_pb.SerializeToString(), "application/x-protobuf")
    assert status == 200
    # And as OTLP/JSON, the other encoding, for a fresh conversation: all applied.
    other = recorded_spans([{"q": "gamma"}], run_id + "-json")
    assert other
    json_body = otlp_json(encode_spans(other))
    status, body, kind = post(receiver.url, json_body, "application/json")
    assert status == 200 and kind == "application/json", body
    assert json.loads(body) == {}, "no partial success: every span taken"
    state = wait_for(
        lambda: (s := summary(receiver, run_id + "-json"))["events"] >= 4 and s, "json"
    )
    assert state["events"] == 4, state
    assert summary(receiver, run_id)["events"] == 5, "the retried batch was deduplicated"


def otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the specification writes it: protobuf's JSON mapping with trace and
    span ids as hex (not base64), enums as integers and lowerCamelCase keys."""
    doc = MessageToDict(request, use_integers_for_enums=True)
    for resource in doc.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()
