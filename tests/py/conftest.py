"""Fixtures of every Python end-to-end suite: one real stack per session, a fresh run id
per test (runs, not daemons, keep the tests apart)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stack import Stack, start_stack

_runs = itertools.count(1)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    with start_stack() as running:
        yield running


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """A run id unique in the session, readable in the daemon's log: the test's name."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:100]
    return f"{name}-{next(_runs)}"


@pytest.fixture(scope="session")
def unpacked_copilot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG cache for Copilot CLI, which unpacks its 235 MB package there on its first
    start: once for the session, not once per test or module."""
    return tmp_path_factory.mktemp("copilot-cache")
