"""Both sides over Streamable HTTP: an agent reaching `fusebox mcp --listen` over HTTP,
the gateway reaching its upstream with `--upstream-url`. Each HTTP session is its own run."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import anyio
import httpx2
import pytest
from gateway import COUNTING_SERVER, TENANT, executions, fusebox_bin, text
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from support.stack import Stack

STOPPED = "fusebox stopped this run"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        assert process.poll() is None, f"exited with {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def count_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "executions.jsonl"


@pytest.fixture
def http_gateway(stack: Stack, count_file: pathlib.Path) -> Iterator[str]:
    upstream_port, gateway_port = free_port(), free_port()
    quiet = None if os.environ.get("FUSEBOX_TEST_VERBOSE") else subprocess.DEVNULL
    upstream = subprocess.Popen(
        [sys.executable, str(COUNTING_SERVER), "--http", str(upstream_port)],
        env={**os.environ, "COUNT_FILE": str(count_file)},
        stdout=quiet,
        stderr=quiet,
    )
    gateway = subprocess.Popen(
        [
            fusebox_bin(stack),
            "mcp",
            "--nats-url",
            stack.nats_url,
            "--tenant",
            TENANT,
            "--listen",
            f"127.0.0.1:{gateway_port}",
            "--upstream-url",
            f"http://127.0.0.1:{upstream_port}/mcp",
        ],
        stdout=quiet,
        stderr=quiet,
    )
    try:
        wait_listening(upstream_port, upstream)
        wait_listening(gateway_port, gateway)
        yield f"http://127.0.0.1:{gateway_port}/mcp"
    finally:
        for process in (gateway, upstream):
            process.terminate()
            process.wait(timeout=10)


async def test_an_http_agent_behind_an_http_gateway_is_guarded(
    http_gateway: str, count_file: pathlib.Path
) -> None:
    with anyio.fail_after(60):
        async with httpx2.AsyncClient(timeout=30) as http:
            async with (
                streamable_http_client(http_gateway, http_client=http) as (read, write),
                ClientSession(read, write) as client,
            ):
                init = await client.initialize()
                assert init.server_info.name == "counting-server"
                assert {t.name for t in (await client.list_tools()).tools} >= {
                    "search",
                    "list_page",
                }
                for page in range(3):
                    assert not (await client.call_tool("list_page", {"page": page})).is_error
                answers = []
                for _ in range(40):
                    answers.append(text(await client.call_tool("search", {"query": "again"})))
                    if STOPPED in answers[-1]:
                        break
                assert STOPPED in answers[-1], answers
            # A second HTTP session is a new run: not stopped.
            async with (
                streamable_http_client(http_gateway, http_client=http) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                assert not (await client.call_tool("list_page", {"page": 9})).is_error
    assert len(executions(count_file, "search")) < len(answers)
    assert [e["args"]["page"] for e in executions(count_file, "list_page")] == [
        0,
        1,
        2,
        9,
    ]
