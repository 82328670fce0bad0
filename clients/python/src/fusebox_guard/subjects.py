"""Subject names of interfaces.md §2 (mirrors crates/fusebox-nats/src/subjects.rs)."""

from __future__ import annotations

STOPS_STREAM = "FUSEBOX_STOPS"


def gate(tenant: str, run: str) -> str:
    return f"fusebox.gate.{tenant}.{run}"


def events(tenant: str, run: str) -> str:
    return f"fusebox.events.{tenant}.{run}"


def tree_gate(tenant: str, root: str, run: str) -> str:
    """A run of a tree on the wire: its tree's root before it (the plain form for the root
    itself), so a cluster serves the whole tree in the root's partition."""
    return gate(tenant, run) if root == run else f"fusebox.gate.{tenant}.{root}.{run}"


def tree_events(tenant: str, root: str, run: str) -> str:
    """`tree_gate`'s form for the events stream."""
    return events(tenant, run) if root == run else f"fusebox.events.{tenant}.{root}.{run}"


def stop(tenant: str, run: str) -> str:
    return f"fusebox.stop.{tenant}.{run}"


def decisions(tenant: str, run: str) -> str:
    return f"fusebox.decisions.{tenant}.{run}"


def stop_direct_get(tenant: str, run: str) -> str:
    """JetStream direct get of the last stop kept for the run (tenant-permitted)."""
    return f"$JS.API.DIRECT.GET.{STOPS_STREAM}.{stop(tenant, run)}"
