"""The client without a framework: gate each call, run the tool only when allowed, report
its result, and tell the model what the guard said otherwise.

    python clients/python/examples/gate_by_hand.py --nats nats://127.0.0.1:4222
"""

from __future__ import annotations

import argparse
import asyncio
import time

from fusebox_guard import Fusebox, ResultKind


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--tenant", default="demo")
    args = parser.parse_args()
    async with await Fusebox.connect(args.nats, tenant=args.tenant) as fb:
        run = await fb.start_run(f"py-hand-{time.time_ns() % 10**8}", agent="researcher")
        for step in range(1, 20):
            gate = await run.tool_call("search", {"query": "weather tokyo"})
            if gate.may_run:
                output = {"hits": ["jma.go.jp"]}  # the real tool would run here
                await run.tool_result(gate.call_id, "search", ResultKind.SUCCESS, output=output)
                print(f"step {step}: ran; the model reads {gate.reads(output)!r}")
            else:
                print(f"step {step}: not run; the model reads {gate.model_text!r}")
            if run.stopped is not None:
                print(f"stopped: {run.stopped.summary()}")
                break
        await run.close()


if __name__ == "__main__":
    asyncio.run(main())
