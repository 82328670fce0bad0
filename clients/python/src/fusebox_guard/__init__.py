"""fusebox-guard: put an AI agent behind fuseboxd, the loop guard.

    fb = await Fusebox.connect("nats://127.0.0.1:4222", tenant="acme")
    run = await fb.start_run("research-42", agent="researcher")
    gate = await run.tool_call("search", {"q": "weather tokyo"})
    if gate.may_run:
        output = search(q="weather tokyo")
        await run.tool_result(gate.call_id, "search", output=output)
    else:
        tell_the_model(gate.model_text)

The client never decides: every answer is fuseboxd's. `SyncFusebox` is the same for sync
code; framework adapters live in `fusebox_guard.adapters`.
"""

from .client import Fusebox
from .connection import Credentials, TLSConfig
from .errors import (
    BadAnswer,
    ConnectError,
    FuseboxError,
    GateTimeout,
    GuardUnavailable,
    NoResponders,
    Refused,
    RunExists,
    RunStopped,
    TransportError,
)
from .gate import Gate
from .killswitch import StopWatch
from .run import Run
from .sync import SyncFusebox, SyncRun
from .types import (
    Action,
    Decision,
    Effect,
    GateOnError,
    ResultKind,
    ResultMode,
    StopReport,
    TerminalState,
    Usage,
)

__all__ = [
    "Action",
    "BadAnswer",
    "ConnectError",
    "Credentials",
    "Decision",
    "Effect",
    "Fusebox",
    "FuseboxError",
    "Gate",
    "GateOnError",
    "GateTimeout",
    "GuardUnavailable",
    "NoResponders",
    "Refused",
    "ResultKind",
    "ResultMode",
    "Run",
    "RunExists",
    "RunStopped",
    "StopReport",
    "StopWatch",
    "SyncFusebox",
    "SyncRun",
    "TLSConfig",
    "TerminalState",
    "TransportError",
    "Usage",
]
