"""Subject names of interfaces.md §2 (mirrors crates/fusebox-nats/src/subjects.rs)."""

from __future__ import annotations

STOPS_STREAM = "FUSEBOX_STOPS"


def gate(tenant: str, run: str) -> str:
    return f"fusebox.gate.{tenant}.{run}"


def events(tenant: str, run: str) -> str:
    return f"fusebox.events.{tenant}.{run}"


def stop(tenant: str, run: str) -> str:
    return f"fusebox.stop.{tenant}.{run}"


def decisions(tenant: str, run: str) -> str:
    return f"fusebox.decisions.{tenant}.{run}"


def stop_direct_get(tenant: str, run: str) -> str:
    """JetStream direct get of the last stop kept for the run (tenant-permitted)."""
    return f"$JS.API.DIRECT.GET.{STOPS_STREAM}.{stop(tenant, run)}"
