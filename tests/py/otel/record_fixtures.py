"""Records the OTLP fixtures of `crates/fusebox-otlp/tests/fixtures/` that come from real
instrumentation, as OTLP/JSON (hex ids, integer enums, one span per line):

- `openinference_openai_agents.otlp.json`: the OpenAI Agents SDK under
  `openinference-instrumentation-openai-agents`, scripted models; a lead (session
  `oi-lead`) whose `research` tool runs a researcher under a session of its own, then a
  tool that raises;
- `pydantic_ai_delegation.otlp.json`: Pydantic AI's own instrumentation, a lead
  (`pai-lead`) whose `research` tool runs a researcher (`pai-researcher-1`).

    cd tests/py
    ../../.venv/bin/python -m otel.record_fixtures ../../crates/fusebox-otlp/tests/fixtures

Ids and times change with each recording: re-bless the expected files
(`FUSEBOX_BLESS=1 cargo test -p fusebox-otlp --test mapping`) and read their diff."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

# protobuf ships no type stubs (types-protobuf is not a dependency of the suite).
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from openinference.instrumentation import using_session
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelMessage, ModelResponse, RunContext, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings

KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2}
KINDS |= {"SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
STATUS = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """The spans as one OTLP/JSON request; the resource (the SDK's, with a fresh
    instance id each run) left out: the mapping does not read it."""
    body: dict[str, Any] = MessageToDict(encode_spans(spans))
    lines = ['{"resourceSpans":[']
    for i, resource in enumerate(body["resourceSpans"]):
        lines.append(' {"resource":{},\n  "scopeSpans":[')
        for j, scope in enumerate(resource["scopeSpans"]):
            lines.append(f'   {{"scope":{json.dumps(scope.get("scope", {}))},"spans":[')
            for k, span in enumerate(scope["spans"]):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
                span["kind"] = KINDS[span["kind"]]
                if "code" in span.get("status", {}):
                    span["status"]["code"] = STATUS[span["status"]["code"]]
                span.pop("flags", None)
                comma = "," if k < len(scope["spans"]) - 1 else ""
                lines.append("    " + json.dumps(span, separators=(",", ":")) + comma)
            lines.append("   ]}" + ("," if j < len(resource["scopeSpans"]) - 1 else ""))
        lines.append("  ]}" + ("," if i < len(body["resourceSpans"]) - 1 else ""))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def scripted(turns: Sequence[Sequence[tuple[str, dict[str, Any]]]], answer: str) -> ScriptedModel:
    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        turn = sum(1 for i in items if _as_dict(i).get("type") == "function_call")
        if turn < len(turns):
            return [
                function_call(n, a, call_id=f"call_{n}_{k}") for k, (n, a) in enumerate(turns[turn])
            ]
        return [assistant_message(answer)]

    return ScriptedModel([ModelStep.respond(respond) for _ in range(len(turns) + 1)])


def _as_dict(item: Any) -> dict[str, Any]:
    found: dict[str, Any] = item if isinstance(item, dict) else item.model_dump()
    return found


def openai_agents() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    set_tracing_disabled(False)

    @function_tool
    def search(query: str) -> str:
        """Search the web."""
        return f"page about {query}"

    @function_tool
    def boom(x: int) -> str:
        """Fails."""
        raise RuntimeError("boom")

    researcher = Agent(
        name="researcher",
        model=scripted([[("search", {"query": "weather tokyo"})]], "tokyo: sunny"),
        tools=[search],
    )

    @function_tool
    async def research(topic: str) -> str:
        """Delegate research to the researcher agent."""
        with using_session("oi-lead-researcher-1"):
            result = await Runner.run(researcher, topic)
        return str(result.final_output)

    lead = Agent(
        name="lead",
        model=scripted([[("research", {"topic": "tokyo"})], [("boom", {"x": 1})]], "done"),
        tools=[research, boom],
    )

    async def go() -> None:
        with using_session("oi-lead"):
            await Runner.run(lead, "weather report", max_turns=10)

    try:
        asyncio.run(go())
    finally:
        set_tracing_disabled(True)
        instrumentor.uninstrument()
    return list(memory.get_finished_spans())


def pydantic_ai() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    settings = InstrumentationSettings(tracer_provider=provider)

    def researcher_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("tokyo: sunny")])
        return ModelResponse(parts=[ToolCallPart("search", {"q": "tokyo"}, tool_call_id="s0")])

    researcher: PydanticAgent[None, str] = PydanticAgent(
        FunctionModel(researcher_model), name="researcher"
    )
    researcher.instrument = settings

    @researcher.tool_plain
    def search(q: str) -> str:
        return f"page about {q}"

    def lead_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(
            parts=[ToolCallPart("research", {"topic": "tokyo"}, tool_call_id="r0")]
        )

    lead: PydanticAgent[None, str] = PydanticAgent(FunctionModel(lead_model), name="lead")
    lead.instrument = settings

    @lead.tool
    async def research(ctx: RunContext[None], topic: str) -> str:
        found = await researcher.run(topic, usage=ctx.usage, conversation_id="pai-researcher-1")
        return found.output

    lead.run_sync("weather", conversation_id="pai-lead")
    return list(memory.get_finished_spans())


def main(out: Path) -> None:
    (out / "openinference_openai_agents.otlp.json").write_text(otlp_json(openai_agents()))
    (out / "pydantic_ai_delegation.otlp.json").write_text(otlp_json(pydantic_ai()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
