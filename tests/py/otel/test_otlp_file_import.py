"""OTLP/JSON files as an event source (`--from otlp`, issue 46 §2, docs/history.md): the
spans Pydantic AI's own instrumentation emits for scripted models (`FunctionModel`: no
LLM, no network) go, batch by batch, both to a real fuseboxd's OTLP receiver and into a
file written as an OpenTelemetry Collector's `file` exporter writes it (one OTLP/JSON
request per line; a collector with two exporters). Then `fusebox replay --from otlp`
reads the file, with no daemon, and must give every event the decision the daemon gave
it live; `whatif` and `tune` take the same import."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from support.agent_runs import run_status
from support.collector_file import CollectorTee, metrics_line
from support.guard import run_history
from support.otlp import Receiver, free_port, scripted_agent, wait_for
from support.stack import Stack, start_stack

TENANT = "otlpfile"


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """The suite's test config with the OTLP receiver on loopback, every request tenant
    `otlpfile`."""
    port = free_port()
    shipped = stack.config.read_text()
    off = '[otlp]\nlisten = ""\nmax_body_bytes = 4194304\ntenant = "default"\n'
    assert off in shipped, "the test config carries the shipped [otlp] section, off"
    on = f'[otlp]\nlisten = "127.0.0.1:{port}"\nmax_body_bytes = 4194304\ntenant = "{TENANT}"\n'
    config = tmp_path_factory.mktemp("otlp-file") / "fusebox.toml"
    config.write_text(shipped.replace(off, on))
    with start_stack("--config", str(config)) as running:
        yield Receiver(running, f"http://127.0.0.1:{port}/v1/traces")


Decisions = dict[str, tuple[str, str | None]]


def live_decisions(stack: Stack, run: str) -> Decisions:
    """Each event's decision as the daemon applied it, by event id."""
    try:
        entries = run_history(stack, TENANT, run)
    except AssertionError:
        return {}
    return {
        entry["event"]["id"]: (entry["decision"]["action"], entry["decision"].get("reason"))
        for entry in entries
    }


def fusebox(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(stack.bin("fusebox")), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def imported_decisions(stack: Stack, *paths: Path) -> tuple[dict[str, Decisions], str, int]:
    """`fusebox replay --from otlp PATHS`: each event's decision by run and event id,
    the stderr, the exit status."""
    done = fusebox(stack, "replay", "--from", "otlp", "--tenant", TENANT, *map(str, paths))
    runs: dict[str, Decisions] = {}
    for line in done.stdout.splitlines():
        decision = json.loads(line)
        if "event_id" in decision:
            runs.setdefault(decision["run"], {})[decision["event_id"]] = (
                decision["action"],
                decision.get("reason"),
            )
    return runs, done.stderr, done.returncode


@dataclass(frozen=True)
class Recorded:
    file: Path
    runaway: str
    legit: str


@pytest.fixture(scope="module")
def recorded(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """A runaway (the same search 12 times, the same answer) and a legitimate run (12
    distinct searches), exported live and to the file, batch by batch the same; then a
    metrics request in the file, as a collector serving both pipelines writes it."""
    file = tmp_path_factory.mktemp("collector") / "otel.json"
    provider = TracerProvider()
    live = OTLPSpanExporter(endpoint=receiver.url)
    # Small batches, so each run's spans spread over many lines (requests), as a busy
    # collector's would.
    provider.add_span_processor(
        BatchSpanProcessor(CollectorTee(file, live), max_export_batch_size=8)
    )
    runaway, legit = "file-runaway", "file-legit"
    scripted_agent([{"q": "same"}] * 12, provider).run_sync("find it", conversation_id=runaway)
    scripted_agent([{"q": f"topic {i}"} for i in range(12)], provider).run_sync(
        "survey", conversation_id=legit
    )
    assert provider.force_flush(10_000)
    provider.shutdown()
    with file.open("a") as out:
        out.write(metrics_line() + "\n")
    return Recorded(file, runaway, legit)


def test_an_imported_collector_file_gets_the_decisions_the_receiver_gave_live(
    receiver: Receiver, recorded: Recorded
) -> None:
    imported, stderr, status = imported_decisions(receiver.stack, recorded.file)
    assert status == 0, stderr
    # The person's summary comes first: two runs, the metrics request said skipped.
    assert stderr.startswith("otlp: 2 runs in 1 files, "), stderr
    assert "(52 spans)" in stderr, stderr  # 2 x (12 tools, 13 chats, 1 agent run)
    assert "1 metrics requests skipped" in stderr, stderr
    assert "24 tool calls, 24 results, 26 model turns" in stderr, stderr
    assert set(imported) == {recorded.runaway, recorded.legit}, imported

    # Each run's import, less the run_finished the import closes it with (the receiver
    # keeps OTLP runs open), must be what the daemon applied live, decision for decision:
    # replay prints every call's and result's decision, and any other event's that is
    # not `continue`; the daemon applied all 37 events of each run (12 calls, 12 results,
    # 13 model turns).
    for run in (recorded.runaway, recorded.legit):
        events = {i: d for i, d in imported[run].items() if i != "otlp-import-end"}
        assert sum(1 for i in events if i.endswith(("-c", "-r"))) == 24, events

        def applied(run: str = run) -> Decisions | None:
            decided = live_decisions(receiver.stack, run)
            return decided if len(decided) >= 37 else None

        live = wait_for(applied, f"the daemon to apply run {run}")
        assert len(live) == 37, live
        shown = {i: d for i, d in live.items() if i.endswith(("-c", "-r")) or d[0] != "continue"}
        assert shown == events, run

    # What those decisions are: the runaway stopped by the loop guard, the legitimate
    # run never refused (closed as completed at the end of the import).
    runaway = imported[recorded.runaway]
    stops = [d for d in runaway.values() if d[0] == "stop"]
    assert stops and stops[0][1] in {"consecutive_blocks", "same_call_repeat", "no_progress"}
    assert imported[recorded.legit]["otlp-import-end"] == ("complete", "completed")
    assert all(a not in ("block", "stop") for a, _ in imported[recorded.legit].values())
    live_state = run_status(receiver.stack, TENANT, recorded.runaway)["summary"]
    assert live_state["terminal_state"] == "STOPPED_LOOP_GUARD", live_state
    assert live_state["reason"] == stops[0][1], (live_state, stops)


def test_a_bad_line_is_reported_with_its_place_and_the_rest_is_read(
    receiver: Receiver, recorded: Recorded, tmp_path: Path
) -> None:
    lines = recorded.file.read_text().splitlines()
    # A line cut short (a collector killed mid-write), between two good ones.
    damaged = tmp_path / "damaged.json"
    cut = lines[1][: len(lines[1]) // 3]
    damaged.write_text("\n".join([lines[0], cut, *lines[1:]]) + "\n")
    imported, stderr, status = imported_decisions(receiver.stack, damaged)
    assert status == 2, stderr
    assert f"{damaged}:2: not an OTLP ExportTraceServiceRequest: " in stderr, stderr
    assert "1 bad lines skipped" in stderr, stderr
    whole, _, _ = imported_decisions(receiver.stack, recorded.file)
    assert imported == whole, "every other line read as if the bad one were not there"


def test_whatif_and_tune_take_the_import(receiver: Receiver, recorded: Recorded) -> None:
    done = fusebox(
        receiver.stack,
        "whatif",
        "--from",
        "otlp",
        "--tenant",
        TENANT,
        "--preset",
        "strict",
        "--json",
        str(recorded.file),
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["source"].startswith(f"otlp files in {recorded.file} — otlp: 2 runs"), report
    # The strict preset stops the runaway sooner; the legitimate run is untouched.
    changed = {change["run"]: change for change in report["changes"]}
    assert set(changed) == {recorded.runaway}, report["changes"]
    assert changed[recorded.runaway]["kind"] == "stops_earlier", changed

    tuned = fusebox(
        receiver.stack, "tune", "--from", "otlp", "--tenant", TENANT, str(recorded.file)
    )
    assert tuned.returncode in (0, 1), tuned.stderr
    assert tuned.stdout.startswith(f"# fusebox tune: calibrated on otlp files in {recorded.file}")
    assert "# 1 completed runs, 1 runaways." in tuned.stdout, tuned.stdout[:2000]
