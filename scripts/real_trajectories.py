#!/usr/bin/env python3
"""Replays labelled real agent trajectories under the default policy and says what the
guard did to them, by label: runs refused (a block or a stop at the gate) and why,
warnings and why, and every labelled run whose verdict breaks its label.

    python3 scripts/real_trajectories.py [--fusebox target/debug/fusebox] [DIR]

DIR holds `traces.jsonl` and `labels.json` (default: ../shared/fixtures/real, the
workplace's copy; the trajectories are other people's and are not in this repository).
A label `complete` means the benchmark scored the run a success: any block or stop
there refused work that succeeded (`block_ok` tolerates a block, never a stop). A label
`stop` names a run that must be stopped. Exit 1 when a label is broken.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", default=str(repo.parent / "shared/fixtures/real"))
    parser.add_argument("--fusebox", default=str(repo / "target/debug/fusebox"))
    args = parser.parse_args()
    traces = Path(args.dir) / "traces.jsonl"
    labels = json.loads((Path(args.dir) / "labels.json").read_text())
    out = subprocess.run(
        [args.fusebox, "replay", str(traces)], capture_output=True, text=True, check=True
    )
    refused: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    warned: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    stopped: dict[str, str] = {}
    for line in out.stdout.splitlines():
        decision = json.loads(line)
        if "summary" in decision:
            continue
        run, action = decision["run"], decision["action"]
        reason = decision.get("reason") or "-"
        if action in ("block", "stop") and decision.get("call_id"):
            refused[run][f"{action} {reason}"] += 1
        if action == "stop" and run not in stopped:
            stopped[run] = reason
        if action == "warn":
            warned[run][reason] += 1

    broken = []
    by_label: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    runs_refused: collections.Counter[str] = collections.Counter()
    for run, label in sorted(labels.items()):
        must = label["must"]
        by_label[must]["runs"] += 1
        if refused[run]:
            runs_refused[must] += 1
        for what, n in refused[run].items():
            by_label[must][what] += n
        for reason, n in warned[run].items():
            by_label[must][f"warn {reason}"] += n
        loop_stop = stopped.get(run) not in (None, "completed", "agent_failed", "run_closed")
        if must == "complete":
            blocks = any(w.startswith("block") for w in refused[run])
            stops = any(w.startswith("stop") for w in refused[run])
            if stops or (blocks and not label.get("block_ok")):
                broken.append(f"{run} (complete): {dict(refused[run])}")
        if must == "stop" and not loop_stop:
            broken.append(f"{run} (stop): not stopped ({stopped.get(run)})")
    for must, counts in sorted(by_label.items()):
        print(f"{must}: {counts['runs']} runs, {runs_refused[must]} refused a call")
        for what, n in sorted(counts.items()):
            if what != "runs":
                print(f"  {what}: {n}")
    for line in broken:
        print(f"BROKEN {line}")
    print(f"{len(broken)} labels broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
