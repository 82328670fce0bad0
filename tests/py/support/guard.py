"""Shared pieces of the Python suites: fresh run ids, a NATS server with no fuseboxd
behind it (the "daemon down" case), `fusebox cancel` from another process, a run's
status and history as the operator sees them, and the scenarios every adapter is run
through."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from .stack import Stack

TENANT = "pytest"

#: Default policy (config/fusebox.toml): a read call repeated with the same result runs
#: `read_same_call_limit` = 3 times (the 3rd with a warning), the next ones are blocked,
#: and `consecutive_block_limit` = 3 blocks in a row stop the run. The Rust demo agent's
#: loop is stopped after the same 3 executions.
RUNAWAY_EXECUTIONS = 3


def fresh_run(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def bare_nats(*args: str, jetstream: bool = True) -> Iterator[str]:
    """A nats-server (with JetStream unless told otherwise) and no fuseboxd: every gate
    has no responders. `args` are more nats-server flags (auth, TLS, `-c FILE`)."""
    work = Path(tempfile.mkdtemp(prefix="fusebox-bare-"))
    port = free_port()
    js = ["-js", "-sd", str(work)] if jetstream else []
    proc = subprocess.Popen(
        ["nats-server", *js, "-a", "127.0.0.1", "-p", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def fusebox_cancel(stack: Stack, run: str, reason: str = "operator says stop") -> str:
    """`fusebox cancel TENANT/RUN` as an operator would type it, in another process."""
    out = subprocess.run(
        [
            f"{stack.bin_dir}/fusebox",
            "cancel",
            f"{TENANT}/{run}",
            "--nats-url",
            stack.nats_url,
            "--reason",
            reason,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout


@dataclass
class ToolLog:
    """What the fake tools really executed (the guard's decisions are judged by it)."""

    calls: list[tuple[str, Any]] = field(default_factory=list)

    def count(self, tool: str) -> int:
        return sum(1 for name, _ in self.calls if name == tool)


# --- the tools every scenario uses (the same outputs in every framework) ---------------


def search_output(query: str) -> dict[str, Any]:
    return {"hits": ["jma.go.jp"], "query": query}


def open_page_output(url: str) -> dict[str, Any]:
    return {"title": "Weather", "url": url}


def list_issues_output(page: int) -> dict[str, Any]:
    return {
        "issues": [f"ISSUE-{page * 10}", f"ISSUE-{page * 10 + 1}"],
        "next": page < 12,
    }


def send_email_output(to: str) -> dict[str, Any]:
    return {"sent": True, "to": to}


PAGES = 12


def run_status(stack: Stack, run: str) -> dict[str, Any]:
    """`fusebox run TENANT/RUN --json`: the daemon's counters for the run."""
    out = subprocess.run(
        [
            f"{stack.bin_dir}/fusebox",
            "run",
            f"{TENANT}/{run}",
            "--nats-url",
            stack.nats_url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    status: dict[str, Any] = json.loads(out.stdout.splitlines()[0])
    return status


def run_history(stack: Stack, tenant: str, run: str) -> list[dict[str, Any]]:
    """The run's applied events with their decisions, from the daemon's log: what the
    operator's page shows of one run (`fusebox.control.<t>.<r>.history`)."""

    async def ask() -> bytes:
        nc = await nats.connect(stack.nats_url, max_reconnect_attempts=0)
        try:
            reply = await nc.request(f"fusebox.control.{tenant}.{run}.history", b"{}", timeout=10)
            return reply.data
        finally:
            await nc.close()

    answer: dict[str, Any] = json.loads(asyncio.run(ask()))
    assert "entries" in answer and not answer["more"], answer
    entries: list[dict[str, Any]] = answer["entries"]
    return entries


#: What a `prompt` event may carry: the envelope, never the prompt's words.
ENVELOPE = {"v", "id", "tenant", "run", "seq", "ts_ms", "type"}


def prompt_events(stack: Stack, tenant: str, run: str) -> list[dict[str, Any]]:
    """The `prompt` events the daemon applied to the run, in order (the wire form)."""
    events = [entry["event"] for entry in run_history(stack, tenant, run)]
    return [event for event in events if event["type"] == "prompt"]


def assert_closed(stack: Stack, run: str, status: str = "completed") -> None:
    """The run is closed in the daemon (not left `open` for its time budget to stop) by
    the adapter's `run_finished`, whose status begins with `status`: COMPLETED, or
    FAILED (`agent_failed`) for a status that says the agent failed."""
    reply = run_status(stack, run)
    summary, report = reply["summary"], reply.get("report") or {}
    failed = status.startswith("failed")
    assert summary["open"] is False, summary
    assert summary["terminal_state"] == ("FAILED" if failed else "COMPLETED"), summary
    assert report.get("reason") == ("agent_failed" if failed else "completed"), report
    assert str(report.get("detail", "")).startswith(status), report
