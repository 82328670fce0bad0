"""The project's one harness, as a process: ``fusebox-stack`` (tests/harness/bin/).

It starts nats-server and fuseboxd (and, with ``--moto``, a moto_server the daemon's
watchdog watches) on free loopback ports, prints one JSON line of endpoints, and stops
everything when its stdin closes. Python suites never start servers themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class Stack:
    """Where a running stack answers."""

    nats_url: str
    metrics_url: str
    data_dir: Path
    config: Path
    bin_dir: Path
    moto_url: str | None
    daemon_log: Path
    daemon_pid: int
    nats_pid: int

    def bin(self, name: str) -> Path:
        """A binary of the workspace (``fusebox``, ``fuseboxd`` …) from the same build."""
        return self.bin_dir / name

    def daemon_logs(self) -> str:
        return self.daemon_log.read_text(errors="replace") if self.daemon_log.exists() else ""


def stack_binary() -> Path:
    bin_dir = os.environ.get("FUSEBOX_BIN_DIR")
    path = Path(bin_dir) / "fusebox-stack" if bin_dir else REPO / "target/debug/fusebox-stack"
    if not path.is_file():
        raise RuntimeError(
            f"{path} is not built: run `cargo test --workspace --no-run` (scripts/test.sh does)"
        )
    return path


@contextlib.contextmanager
def start_stack(*args: str) -> Iterator[Stack]:
    """Runs ``fusebox-stack ARGS`` for the duration of the ``with`` block."""
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen(
            [str(stack_binary()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert proc.stdout is not None and proc.stdin is not None
        try:
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=30)
                stderr.seek(0)
                raise RuntimeError(f"fusebox-stack exited ({proc.returncode}):\n{stderr.read()}")
            fields = json.loads(line)
            yield Stack(
                nats_url=fields["nats_url"],
                metrics_url=fields["metrics_url"],
                data_dir=Path(fields["data_dir"]),
                config=Path(fields["config"]),
                bin_dir=Path(fields["bin_dir"]),
                moto_url=fields["moto_url"],
                daemon_log=Path(fields["daemon_log"]),
                daemon_pid=int(fields["daemon_pid"]),
                nats_pid=int(fields["nats_pid"]),
            )
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
