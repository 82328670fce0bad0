"""What an OpenTelemetry Collector's `file` exporter writes (`format: json`, its default):
one OTLP/JSON export request per line — protobuf's JSON mapping with trace and span ids
as hex (not protobuf's base64), enums as integers, lowerCamelCase keys — traces, logs
and metrics requests mixed when one exporter serves several pipelines.

:class:`CollectorTee` stands for a collector with two exporters on one pipeline: each
batch the SDK exports is written to the file and sent on to the live exporter, the same
batch both ways (a collector fans each batch out to its exporters).

Run as a module, it writes the fixture of `fusebox-cli`'s unit test (`--from otlp`)::

    cd tests/py && ../../.venv/bin/python -m support.collector_file \
        ../../crates/fusebox-cli/tests/fixtures/otlp/collector.jsonl

or, with `--big SPANS PER_LINE`, a large file for the import's speed (docs/history.md):
the spans of a real 12-search run copied over fresh runs, trace and span ids, `PER_LINE`
spans to a request (512: the SDK's default export batch)::

    ../../.venv/bin/python -m support.collector_file --big 100000 512 /tmp/big.json
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# protobuf ships no type stubs (types-protobuf is not a dependency of the suite).
from google.protobuf.json_format import MessageToJson  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .otlp import scripted_agent

ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: Any) -> Any:
    """Protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes ids as hex."""
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex()
            if key in ID_KEYS and isinstance(value, str)
            else _hex_ids(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def collector_line(request: Message) -> str:
    """One export request as the file exporter writes it: one line, no newline inside."""
    doc = json.loads(MessageToJson(request, indent=None, use_integers_for_enums=True))
    return json.dumps(_hex_ids(doc), separators=(",", ":"))


def spans_line(spans: Sequence[ReadableSpan]) -> str:
    return collector_line(encode_spans(spans))


def metrics_line() -> str:
    """A metrics request (a counter the application kept): the file exporter writes them
    beside the spans when one exporter serves both pipelines."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("app").create_counter("requests").add(3)
    data = reader.get_metrics_data()
    assert data is not None
    provider.shutdown()
    return collector_line(encode_metrics(data))


class CollectorTee(SpanExporter):
    """Each batch written as one line of `path`, then handed to `live` (if any)."""

    def __init__(self, path: Path, live: SpanExporter | None = None) -> None:
        self.path = path
        self.live = live

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            out.write(spans_line(spans) + "\n")
        return self.live.export(spans) if self.live else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self.live:
            self.live.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def write_fixture(path: Path) -> None:
    """The unit test's file: a runaway (the same search 6 times) and a legitimate run
    (3 distinct searches), one span per line as a SimpleSpanProcessor exports them, then
    a metrics request, a span that is not GenAI (an HTTP client's), the first line again
    (a re-sent batch) and a truncated line."""
    path.write_text("")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(CollectorTee(path)))
    scripted_agent([{"q": "same"}] * 6, provider).run_sync("find it", conversation_id="runaway")
    scripted_agent([{"q": f"topic {i}"} for i in range(3)], provider).run_sync(
        "survey", conversation_id="legit"
    )
    with provider.get_tracer("http.client").start_as_current_span("GET /search"):
        pass
    provider.shutdown()
    lines = path.read_text().splitlines()
    lines.insert(len(lines) - 1, metrics_line())
    lines.append(lines[0])
    lines.append(lines[1][: len(lines[1]) // 2])
    path.write_text("\n".join(lines) + "\n")


def write_big(path: Path, spans: int, per_line: int) -> None:
    """`spans` spans of copies of a real run, `per_line` to a request."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    scripted_agent([{"q": f"topic {i}"} for i in range(12)], provider).run_sync(
        "survey", conversation_id="template"
    )
    provider.shutdown()
    doc = json.loads(spans_line(memory.get_finished_spans()))
    resource = doc["resourceSpans"][0]
    template = [span for scope in resource["scopeSpans"] for span in scope["spans"]]
    scope = resource["scopeSpans"][0]["scope"]

    def copies() -> Iterator[dict[str, Any]]:
        n = 0
        while True:
            run = n // len(template)
            for span in template:
                copy = json.loads(
                    json.dumps(span).replace('"template"', f'"big-{run % 997}-{run}"')
                )
                copy["traceId"] = f"{run + 1:032x}"
                copy["spanId"] = f"{n + 1:016x}"
                copy.pop("parentSpanId", None)
                n += 1
                yield copy

    source = copies()
    with path.open("w") as out:
        for start in range(0, spans, per_line):
            batch = [next(source) for _ in range(min(per_line, spans - start))]
            request = {
                "resourceSpans": [
                    {
                        "resource": resource["resource"],
                        "scopeSpans": [{"scope": scope, "spans": batch}],
                    }
                ]
            }
            out.write(json.dumps(request, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--big":
        write_big(Path(sys.argv[4]), int(sys.argv[2]), int(sys.argv[3]))
    else:
        write_fixture(Path(sys.argv[1]))
