"""Temporary session fixture (until the lead's fusebox-stack conftest lands on main):
a real nats-server -js and a real target/debug/fuseboxd on free loopback ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def stack() -> Iterator[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="fusebox-py-"))
    nats_port, metrics_port = _free_port(), _free_port()
    nats = subprocess.Popen(
        [
            "nats-server",
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(nats_port),
            "-sd",
            str(work / "js"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", nats_port), 0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    url = f"nats://127.0.0.1:{nats_port}"
    daemon = subprocess.Popen(
        [
            str(ROOT / "target/debug/fuseboxd"),
            "--config",
            str(ROOT / "config/fusebox.toml"),
            "--nats-url",
            url,
            "--data-dir",
            str(work / "data"),
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            urllib.request.urlopen(
                f"http://127.0.0.1:{metrics_port}/readyz", timeout=0.2
            )
            break
        except OSError:
            time.sleep(0.05)
    yield {
        "nats_url": url,
        "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
        "data_dir": str(work / "data"),
        "config": str(ROOT / "config/fusebox.toml"),
        "bin_dir": str(ROOT / "target/debug"),
    }
    for proc in (daemon, nats):
        proc.terminate()
        proc.wait(10)
    shutil.rmtree(work, ignore_errors=True)
    os.environ.pop("FUSEBOX_PY_STACK", None)
