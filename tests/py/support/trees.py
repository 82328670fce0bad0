"""Run trees as the daemon holds them: each run's applied events with their decisions
(`fusebox.control.<tenant>.<run>.history`), so a test judges what the daemon saw, not
what the client meant to send."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

import nats

from .guard import TENANT
from .stack import Stack


@dataclass
class Node:
    """One run of a tree: whom its `run_started` named as parent, and its calls."""

    run: str
    parent: str | None = None
    agent: str | None = None
    #: (tool, the daemon's action) of each `tool_call`, in applied order.
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: The decision that closed the run, if one did (a stop, or a `run_finished`'s).
    closed: dict[str, Any] | None = None

    @property
    def executed(self) -> list[str]:
        return [tool for tool, action in self.calls if action in ("execute", "warn")]

    @property
    def stop_reason(self) -> str | None:
        report = (self.closed or {}).get("report") or {}
        reason = report.get("reason")
        return str(reason) if reason is not None else None


async def history(nats_url: str, run: str, tenant: str = TENANT) -> list[dict[str, Any]]:
    """The applied events of `tenant`'s run, each `{"event": …, "decision": …}`, oldest
    first."""
    nc = await nats.connect(nats_url)
    try:
        entries: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            query = {} if after is None else {"after": after}
            msg = await nc.request(
                f"fusebox.control.{tenant}.{run}.history", json.dumps(query).encode(), timeout=10
            )
            page = json.loads(msg.data)
            entries.extend(page["entries"])
            if not page.get("more") or not page["entries"]:
                return entries
            after = page["entries"][-1]["position"]
    finally:
        await nc.close()


def node_of(run: str, entries: list[dict[str, Any]]) -> Node:
    node = Node(run)
    for entry in entries:
        event, decision = entry["event"], entry["decision"]
        if event["type"] == "run_started":
            node.parent = event.get("parent")
            node.agent = event.get("agent")
        elif event["type"] == "tool_call":
            node.calls.append((event["tool"], decision["action"]))
        if node.closed is None and (decision.get("report") or decision["action"] == "complete"):
            node.closed = decision
    return node


def _runs(stack: Stack) -> list[str]:
    out = subprocess.run(
        [f"{stack.bin_dir}/fusebox", "runs", "--nats-url", stack.nats_url, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [json.loads(line)["run"] for line in out.stdout.splitlines() if line.strip()]


async def tree(stack: Stack, root: str) -> dict[str, Node]:
    """The root and every run whose id extends it (`Run.child`'s default ids do), as the
    daemon logged them."""
    ids = [run for run in await asyncio.to_thread(_runs, stack) if run.startswith(root)]
    histories = await asyncio.gather(*(history(stack.nats_url, run) for run in ids))
    return {run: node_of(run, entries) for run, entries in zip(ids, histories, strict=True)}


def children(nodes: dict[str, Node], parent: str) -> list[Node]:
    """The runs whose `run_started` named `parent`, by run id."""
    return sorted((n for n in nodes.values() if n.parent == parent), key=lambda n: n.run)
