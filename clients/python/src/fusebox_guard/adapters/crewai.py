"""CrewAI (`crewai` 1.6.1): every tool call of a crew's agents gated by fuseboxd, through
CrewAI's tool call hooks.

    guard = FuseboxCrew(run)             # or: FuseboxCrew(await session_run(fb, session_id))
    output = guard.kickoff(crew, inputs={...})      # or: await guard.kickoff_async(crew, ...)
    # RunStopped on a stop

CrewAI 1.6.1 is the newest release that installs beside the other frameworks' pins
(later ones pin openai < 3 and mcp < 2); its hook points are global registries
(`register_before_tool_call_hook`, `register_after_tool_call_hook`, the LLM call hooks),
which `kickoff` registers for the crew it runs and removes after. A hook that raises is
logged and the tool runs anyway, and a `False` answer is read by the model as CrewAI's
own fixed sentence, so the adapter never raises in a hook and puts the guard's words
in the result itself:

- The before-tool hook asks the gate for every call the model makes, before CrewAI's
  own checks (its repeated-input refusal and its tool cache answer some calls without
  running the tool: the guard still counts them, so a model that keeps asking is
  stopped although CrewAI does not run the tool again). A call that may not run is
  refused (`False`), and the step callback, which CrewAI hands the `ToolResult` before
  the model reads it, replaces CrewAI's fixed sentence with the guard's (the stored
  result for `use_completed_result`).
- The after-tool hook reports what the model reads (CrewAI gives every result as text)
  and, after a `warn`, returns it with the warning appended.
- A `stop` ends the crew: the step callback raises `RunStopped` (as a `TimeoutError`
  too, the one error CrewAI 1.6.1 lets out of an agent's task without retrying it), and
  `kickoff` raises it. A stop that comes between two calls (`fusebox cancel`, the kill
  switch) refuses the next call the same way, and the LLM call hook does not let the
  model be asked again (CrewAI then fails the task, which `kickoff` raises as the stop).
- `kickoff` closes the run as the crew ends (`run_finished`: completed, or failed with
  the error), unless `finish=False`; the after-LLM hook reports each model response as
  a `model_turn` (CrewAI 1.6.1 hands hooks the text only, so no usage).

Sub-agents: a coworker an agent delegates to (`allow_delegation`: the "Delegate work to
coworker" / "Ask question to coworker" tools run the coworker inside the call) is a
child run of the run that made the call, closed when the call ends; its stop is the
call's result for the delegating agent, which goes on. The agents of a sequential or
hierarchical crew otherwise share the crew's run: CrewAI runs them one task after the
other, which is one agent's work to the guard. `Agent.kickoff` (an agent without a
crew) is not gated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crewai import Crew
from crewai.crews.crew_output import CrewOutput
from crewai.hooks import (
    register_after_llm_call_hook,
    register_after_tool_call_hook,
    register_before_llm_call_hook,
    register_before_tool_call_hook,
    unregister_after_llm_call_hook,
    unregister_after_tool_call_hook,
    unregister_before_llm_call_hook,
    unregister_before_tool_call_hook,
)
from crewai.hooks.llm_hooks import LLMCallHookContext
from crewai.hooks.tool_hooks import ToolCallHookContext
from crewai.tools.tool_types import ToolResult

from ..errors import FuseboxError, RunStopped
from ..gate import Gate
from ..run import Run
from ..sync import SyncRun
from ..types import Effect, ResultKind
from ._common import (
    Bridge,
    Call,
    OpKeyFn,
    finish_run_sync,
    report_failed,
    start_sub_agent_sync,
    sub_agent_stopped,
)


class CrewStopped(RunStopped, TimeoutError):
    """The guard's stop inside a crew. A `TimeoutError` as well only because CrewAI 1.6.1
    lets that one error out of an agent's task without retrying the task
    (`max_retry_limit`); `kickoff` raises it as a plain `RunStopped`."""


@dataclass
class _Frame:
    """An agent at work in one thread: its run, and the call it has under way."""

    agent: Any
    bridge: Bridge
    #: The call the gate let run, until the after-tool hook reports it.
    running: _Running | None = None
    #: The refusal the step callback puts in the model's words.
    refused: Gate | None = None


@dataclass
class _Running:
    gate: Gate
    call: Call
    #: The frames of coworkers started inside this call (their child runs).
    coworkers: list[_Frame] = field(default_factory=list)


class FuseboxCrew:
    """Puts one `Run` behind fuseboxd for the crews this guard kicks off."""

    def __init__(
        self,
        run: Run | SyncRun,
        *,
        op_key: OpKeyFn | None = None,
        effects: Mapping[str, Effect | str] | None = None,
        finish: bool = True,
    ) -> None:
        self._bridge = Bridge(run, op_key=op_key, effects=effects)
        self.finish = finish
        #: The crews under way (the hooks are global: another crew's calls are not ours).
        self._crews: set[int] = set()
        #: Per thread (CrewAI runs an agent's task in one thread, its delegations too):
        #: the agents at work, the innermost last.
        self._local = threading.local()
        self._lock = threading.Lock()

    @property
    def run(self) -> Run:
        return self._bridge.run

    # --- entry points ------------------------------------------------------------------

    def kickoff(self, crew: Crew, inputs: dict[str, Any] | None = None) -> CrewOutput:
        """`crew.kickoff(inputs)` with every tool call gated; `RunStopped` on a stop.
        Call it from a thread other than the run's loop (sync code, or `kickoff_async`)."""
        callbacks = self._install(crew)
        # This thread's agents at work: none yet (a kickoff that ended with an error may
        # have left its own behind).
        self._local.frames = []
        try:
            output = crew.kickoff(inputs=inputs)
        except Exception as err:
            stopped = self.run.stop_decision
            if stopped is not None:
                raise RunStopped(stopped.report, stopped) from None
            if self.finish:
                finish_run_sync(self._bridge, err)
            raise
        finally:
            self._uninstall(crew, callbacks)
        stopped = self.run.stop_decision
        if stopped is not None:
            raise RunStopped(stopped.report, stopped)
        if self.finish:
            finish_run_sync(self._bridge)
        if not isinstance(output, CrewOutput):
            raise TypeError(f"a streaming crew is not supported: {type(output).__name__}")
        return output

    async def kickoff_async(self, crew: Crew, inputs: dict[str, Any] | None = None) -> CrewOutput:
        """`kickoff` in a worker thread (CrewAI's agents are sync)."""
        return await asyncio.to_thread(self.kickoff, crew, inputs)

    # --- hooks in and out --------------------------------------------------------------

    def _install(self, crew: Crew) -> dict[int, Any]:
        """Registers the hooks (once per guard) and chains the step callback of every
        agent of the crew; what each agent had, to put back."""
        with self._lock:
            if not self._crews:
                register_before_tool_call_hook(self._before_tool)
                register_after_tool_call_hook(self._after_tool)
                register_before_llm_call_hook(self._before_llm)
                register_after_llm_call_hook(self._after_llm)
            self._crews.add(id(crew))
        kept: dict[int, Any] = {}
        for agent in crew.agents:
            own = getattr(agent, "step_callback", None)
            kept[id(agent)] = own
            # BaseAgent does not declare it; CrewAI's `Agent` does (crew.py sets it too).
            chained = self._step_callback(own or crew.step_callback)
            agent.step_callback = chained  # type: ignore[attr-defined]
        return kept

    def _uninstall(self, crew: Crew, kept: dict[int, Any]) -> None:
        for agent in crew.agents:
            agent.step_callback = kept.get(id(agent))  # type: ignore[attr-defined]
        with self._lock:
            self._crews.discard(id(crew))
            if not self._crews:
                unregister_before_tool_call_hook(self._before_tool)
                unregister_after_tool_call_hook(self._after_tool)
                unregister_before_llm_call_hook(self._before_llm)
                unregister_after_llm_call_hook(self._after_llm)

    def _ours(self, crew: Any) -> bool:
        return crew is not None and id(crew) in self._crews

    # --- which run ---------------------------------------------------------------------

    def _frames(self) -> list[_Frame]:
        frames: list[_Frame] | None = getattr(self._local, "frames", None)
        if frames is None:
            frames = []
            self._local.frames = frames
        return frames

    def _frame_of(self, agent: Any) -> _Frame:
        """The frame of `agent` in this thread: a coworker started inside the call under
        way of another agent gets a child run of that call's run; otherwise the agent
        works in the crew's run (one task after another)."""
        frames = self._frames()
        for frame in reversed(frames):
            if frame.agent is agent:
                return frame
        while frames and frames[-1].running is None:
            frames.pop()  # an agent whose task ended: the next task's agent follows
        if not frames:
            frames.append(_Frame(agent, self._bridge))
            return frames[-1]
        running = frames[-1].running
        assert running is not None
        child = start_sub_agent_sync(running.call.bridge, getattr(agent, "role", None))
        running.call.children.append(child)
        frame = _Frame(agent, child)
        running.coworkers.append(frame)
        frames.append(frame)
        return frame

    # --- the tools ---------------------------------------------------------------------

    def _before_tool(self, context: ToolCallHookContext) -> bool | None:
        if not self._ours(context.crew):
            return None
        frame = self._frame_of(context.agent)
        bridge, tool, args = frame.bridge, context.tool_name, dict(context.tool_input)
        frame.refused = None
        gate = bridge.call(bridge.run.tool_call(tool, args, **bridge.call_fields(tool, args)))
        if gate.may_run:
            frame.running = _Running(gate, Call(bridge, gate.call_id, tool))
            return None
        frame.refused = gate
        return False

    def _after_tool(self, context: ToolCallHookContext) -> str | None:
        if not self._ours(context.crew):
            return None
        frame = self._frame_of(context.agent)
        running, frame.running = frame.running, None
        if running is None:
            return None
        bridge, gate, call = frame.bridge, running.gate, running.call
        # The coworkers started inside this call are done: close their runs.
        frames = self._frames()
        for coworker in running.coworkers:
            if coworker in frames:
                frames.remove(coworker)
            finish_run_sync(coworker.bridge)
        output = context.tool_result or ""
        child = call.stopped_child()
        if child is not None:
            # A coworker the guard stopped: that is the call's result.
            text = sub_agent_stopped(child.run.agent, child.run)
            self._report(bridge, call, ResultKind.RETRYABLE, text, code="sub_agent_stopped")
            return text
        self._report(bridge, call, ResultKind.SUCCESS, output)
        return gate.reads(output) if gate.warning else None

    def _report(
        self, bridge: Bridge, call: Call, kind: ResultKind, output: str, *, code: str | None = None
    ) -> None:
        retry = 0 if kind is ResultKind.RETRYABLE else None
        try:
            bridge.call(
                bridge.run.tool_result(
                    call.call_id, call.tool, kind, output=output, code=code, retry_after_ms=retry
                )
            )
        except FuseboxError as err:
            report_failed(f"result of {call.tool}", err)

    def _step_callback(self, then: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
        """The agent's step callback, after the guard's: a refused call's `ToolResult`
        says what the guard said, and a stop ends the crew."""

        def step(step_output: Any) -> Any:
            if isinstance(step_output, ToolResult):
                frames = self._frames()
                frame = frames[-1] if frames else None
                gate = frame.refused if frame is not None else None
                if frame is not None and gate is not None:
                    frame.refused = None
                    step_output.result = gate.model_text or f"fusebox refused {gate.tool}."
                bridge = frame.bridge if frame is not None else self._bridge
                if bridge is self._bridge and self._bridge.stopped_by_guard:
                    stopped = self.run.stop_decision
                    assert stopped is not None
                    raise CrewStopped(stopped.report, stopped)
                if bridge is not self._bridge and bridge.run.stopped is not None:
                    # A coworker's stop: its answer is the stop; the delegating agent
                    # reads it as the delegation's result.
                    step_output.result_as_answer = True
            return then(step_output) if then is not None else None

        return step

    # --- the model ---------------------------------------------------------------------

    def _before_llm(self, context: LLMCallHookContext) -> bool | None:
        """A run stopped meanwhile (`fusebox cancel`, the kill switch): the model is not
        asked again."""
        if not self._ours(context.crew):
            return None
        frame = self._frame_of(context.agent)
        return False if frame.bridge.run.stopped is not None else None

    def _after_llm(self, context: LLMCallHookContext) -> str | None:
        """Each model response is a `model_turn`. A stop answered here (a budget) is
        latched by the run: the call the response asks for is refused, which ends the
        crew, and a final answer is the last the model is asked."""
        if not self._ours(context.crew):
            return None
        bridge = self._frame_of(context.agent).bridge
        response = context.response or ""
        calls = "Action:" in response and "Final Answer:" not in response
        try:
            bridge.call(bridge.run.model_turn("tool_use" if calls else "end_turn"))
        except FuseboxError as err:
            report_failed("model turn", err)
        return None


__all__ = ["CrewStopped", "FuseboxCrew"]
