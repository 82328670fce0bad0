"""A coding agent's runs as the operator reads them from the daemon, for any tenant: a
run's status with its place in its tree (`fusebox run TENANT/RUN --json`, the control
API's `fusebox.control.<t>.<r>.status`) and its history
(`fusebox.control.<t>.<r>.history`) as one :class:`support.trees.Node`: whom its
`run_started` named as parent, its calls and the daemon's action on each."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import nats

from .stack import Stack
from .trees import Node, node_of

__all__ = ["children", "node", "run_status"]


def run_status(stack: Stack, tenant: str, run: str) -> dict[str, Any]:
    """The run's status: `summary`, `report`, and `tree` (parent, depth, root,
    stopped_by, its children with their states)."""
    done = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "run",
            f"{tenant}/{run}",
            "--json",
            "--nats-url",
            stack.nats_url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    status: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return status


async def _history(nats_url: str, tenant: str, run: str) -> list[dict[str, Any]]:
    nc = await nats.connect(nats_url, max_reconnect_attempts=0)
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


def node(stack: Stack, tenant: str, run: str) -> Node:
    """The run as the daemon logged it: parent, agent, calls with their actions, the
    decision that closed it."""
    return node_of(run, asyncio.run(_history(stack.nats_url, tenant, run)))


def children(stack: Stack, tenant: str, run: str) -> list[dict[str, Any]]:
    """The runs whose `run_started` named `run` as parent, in the order they started,
    each with its summary fields (`run`, `terminal_state` …)."""
    tree = run_status(stack, tenant, run).get("tree") or {}
    found: list[dict[str, Any]] = tree.get("children", [])
    return found
