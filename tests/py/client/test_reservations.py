"""Reservations through the client, against the real fuseboxd: `run.model_call` before a
model call holds its estimate (else the run's mean per turn) against every token, cost
and model-turn budget above it until the turn's `model_turn` reconciles it, so sub-agents
calling their models at once never reserve past their root's budget."""

from __future__ import annotations

import pytest
from fusebox_guard import Action, Fusebox, RunStopped, SyncFusebox, Usage
from support.guard import TENANT, fresh_run
from support.stack import Stack


def tokens(n: int) -> Usage:
    return Usage(input_tokens=n)


async def test_a_model_call_with_no_room_left_in_the_roots_budget_is_refused(
    stack: Stack,
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run("reserve-root"), policy={"max_tokens": 1000})
    a = await root.start_child(agent="a")
    b = await root.start_child(agent="b")
    first = await a.model_call(estimate_tokens=600)
    assert first is not None and first.action is Action.CONTINUE
    # a's 600 is in flight: b's 500 would pass the root's 1000 before either is spent.
    refused = await b.model_call(estimate_tokens=500)
    assert refused is not None and refused.action is Action.STOP
    assert refused.reason == "tree_budget"
    assert refused.message is not None and "no room for this model call" in refused.message
    with pytest.raises(RunStopped):
        b.raise_if_stopped()
    # The stop is latched: a later model call of b is its stop, without a round trip.
    again = await b.model_call()
    assert again is not None and again.action is Action.STOP and again.event_id == ""
    # A turn in flight never holds up its run's tools.
    gate = await a.tool_call("search", {"q": "x"})
    assert gate.may_run
    await a.tool_result(gate.call_id, "search", output={"hits": 1})
    # a's turn spent 200, not 600: the rest is free again.
    await a.model_turn("end_turn", usage=tokens(200))
    c = await root.start_child(agent="c")
    fits = await c.model_call(estimate_tokens=800)
    assert fits is not None and fits.action is Action.CONTINUE
    # Without an estimate, a reserves its mean (200): 200 spent + 800 held + 200 > 1000.
    mean = await a.model_call()
    assert mean is not None and mean.reason == "tree_budget"
    await fb.close()


async def test_a_closed_childs_reservation_is_released_and_cost_counts_alike(
    stack: Stack,
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run("reserve-cost"), policy={"max_cost_usd": 1.0})
    a = await root.start_child(agent="a")
    b = await root.start_child(agent="b")
    held = await a.model_call(estimate_usd=0.8)
    assert held is not None and held.action is Action.CONTINUE
    refused = await b.model_call(estimate_usd=0.3)
    assert refused is not None and refused.reason == "tree_budget"
    await a.finish()  # closed with its call in flight: its 0.8 is let go
    c = await root.start_child(agent="c")
    fits = await c.model_call(estimate_usd=0.9)
    assert fits is not None and fits.action is Action.CONTINUE
    await fb.close()


def test_the_sync_facade_reserves_and_a_turn_without_a_model_call_counts_as_ever(
    stack: Stack,
) -> None:
    with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
        run = fb.start_run(fresh_run("reserve-sync"), policy={"max_model_turns": 2})
        # A producer that sends no model_call: its turns count after the fact.
        assert run.model_turn("tool_use") is not None
        decision = run.model_call()
        assert decision is not None and decision.action is Action.CONTINUE
        # One turn spent, one in flight: a third would pass max_model_turns.
        third = run.model_call()
        assert third is not None and third.reason == "turn_budget"
        assert run.stopped is not None
