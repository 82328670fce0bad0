"""Fixtures of every Python end-to-end suite: one real stack per session, a fresh run id
per test (runs, not daemons, keep the tests apart)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

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
