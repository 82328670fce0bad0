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

from .stack import Stack
from .trees import Node, history, node_of

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


def node(stack: Stack, tenant: str, run: str) -> Node:
    """The run as the daemon logged it: parent, agent, calls with their actions, the
    decision that closed it."""
    return node_of(run, asyncio.run(history(stack.nats_url, run, tenant)))


def children(stack: Stack, tenant: str, run: str) -> list[dict[str, Any]]:
    """The runs whose `run_started` named `run` as parent, in the order they started,
    each with its summary fields (`run`, `terminal_state` …)."""
    tree = run_status(stack, tenant, run).get("tree") or {}
    found: list[dict[str, Any]] = tree.get("children", [])
    return found
