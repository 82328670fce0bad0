"""Run trees (guard contract §6) through the client, against the real fuseboxd: a run
started as a child of another, the tree's budget, a stop that reaches every descendant,
and the caps on fan-out."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fusebox_guard import Action, Fusebox, Run, SyncFusebox, subjects
from fusebox_guard.run import MAX_RUN_ID, child_run_id
from support.guard import TENANT, fresh_run, fusebox_cancel
from support.stack import Stack
from support.trees import children, tree


async def work(run: Run, calls: int, log: list[str]) -> list[Action]:
    """`calls` distinct calls of one run, each executed only when the guard lets it
    (`log` records the executions); the guard's action for each."""
    actions: list[Action] = []
    for step in range(calls):
        gate = await run.tool_call("work", {"run": run.id, "step": step})
        if gate.may_run:
            log.append(f"{run.id}/{step}")
            await run.tool_result(gate.call_id, "work", output={"done": f"{run.id}-{step}"})
        assert gate.action is not None, gate
        actions.append(gate.action)
    return actions


async def test_a_child_run_names_its_parent_and_its_trees_root(stack: Stack) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run("tree-root"), agent="lead")
    child = await root.start_child(agent="Web Researcher")
    assert child.parent == root.id and child.id == f"{root.id}-Web_Researcher-1"
    assert child.stopped is None
    assert (await work(child, 2, [])) == [Action.EXECUTE, Action.EXECUTE]
    # A child's id given explicitly, and a grandchild of it.
    named = await fb.start_run(fresh_run("tree-named"), parent=child)
    grandchild = await named.start_child()
    assert grandchild.id == f"{named.id}-sub-1"
    # Every run of the tree names its root on the wire (a cluster serves the tree whole).
    assert {r.root for r in (root, child, named, grandchild)} == {root.id}
    assert subjects.tree_gate(TENANT, grandchild.root, grandchild.id) == (
        f"fusebox.gate.{TENANT}.{root.id}.{grandchild.id}"
    )
    nodes = await tree(stack, root.id)
    assert nodes[child.id].parent == root.id and nodes[child.id].agent == "Web Researcher"
    assert nodes[child.id].executed == ["work", "work"]
    assert nodes[root.id].parent is None and nodes[root.id].calls == []
    assert [n.parent for n in (await tree(stack, named.id)).values()] == [child.id, named.id]
    await fb.close()


def test_child_ids_stay_run_ids_however_long_the_parent() -> None:
    short = child_run_id("r1", "a b/c", 3)
    assert short == "r1-a_b_c-3"
    long_a, long_b = "a" * 120 + "x", "a" * 120 + "y"
    ids = {child_run_id(parent, "researcher", 1) for parent in (long_a, long_b)}
    assert len(ids) == 2 and all(len(i) <= MAX_RUN_ID for i in ids)


async def test_thirty_children_share_the_root_budget_of_a_hundred_steps(stack: Stack) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(
        fresh_run("fanout"),
        policy={"max_steps": 100, "max_open_children": 30, "max_children": 30},
    )
    kids = [await root.start_child(agent="worker") for _ in range(30)]
    assert all(kid.stopped is None for kid in kids)
    executed: list[str] = []
    # All thirty at once, five calls each: 150 asked, the tree's budget is 100.
    actions = await asyncio.gather(*(work(kid, 5, executed) for kid in kids))
    assert len(executed) == 100
    refused = [a for per_kid in actions for a in per_kid if not a.lets_tool_run]
    assert len(refused) == 50 and set(refused) == {Action.STOP}
    stopped = [kid for kid in kids if kid.stopped is not None]
    assert stopped and {kid.stopped.reason for kid in stopped if kid.stopped} == {"tree_budget"}
    # The root's own budget is the tree's: spent, so its own next call is refused too.
    gate = await root.tool_call("summarize", {})
    assert gate.stopped and gate.report is not None and gate.report.reason == "step_budget"
    # The daemon's view: every child under the root, 100 executions in all.
    nodes = await tree(stack, root.id)
    assert len(children(nodes, root.id)) == 30
    assert sum(len(n.executed) for n in nodes.values()) == 100
    await fb.close()


async def test_a_cancel_of_the_root_ends_every_descendant(stack: Stack) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run("cancel-tree"))
    mid = await root.start_child(agent="planner")
    leaves = [await mid.start_child(agent="fetcher") for _ in range(2)]
    for run in (mid, *leaves):
        assert (await work(run, 1, [])) == [Action.EXECUTE]
    await asyncio.to_thread(fusebox_cancel, stack, root.id, "tree review")
    assert (await root.wait_stopped(10)) is not None
    for run in (mid, *leaves):
        # Each descendant's own kill switch fired, before any call of its own asked.
        report = await run.wait_stopped(10)
        assert report is not None, run.id
        assert (report.state_name, report.reason) == ("CANCELLED", "ancestor_stopped")
        assert "above this one was closed" in (report.detail or "")
        gate = await run.tool_call("work", {"after": "cancel"})
        assert gate.stopped and not gate.may_run
    nodes = await tree(stack, root.id)
    assert {n.run: n.stop_reason for n in nodes.values()} == {
        root.id: "cancelled",
        mid.id: "ancestor_stopped",
        **{leaf.id: "ancestor_stopped" for leaf in leaves},
    }
    await fb.close()


async def test_one_childs_loop_stops_that_child_only(stack: Stack) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    boss = await fb.start_run(fresh_run("loop-boss"))
    looper = await boss.start_child(agent="searcher")
    sibling = await boss.start_child(agent="searcher")
    for _ in range(10):
        gate = await looper.tool_call("search", {"q": "x"})
        if gate.may_run:
            await looper.tool_result(gate.call_id, "search", output={"hits": []})
        if gate.stopped:
            break
    assert looper.stopped is not None and looper.stopped.reason == "consecutive_blocks"
    assert (await work(sibling, 2, [])) == [Action.EXECUTE, Action.EXECUTE]
    assert sibling.stopped is None and boss.stopped is None
    # The parent's model is told at its next call, which still runs.
    gate = await boss.tool_call("plan", {"next": "merge"})
    assert gate.may_run and gate.decision is not None
    assert gate.decision.reason == "child_stopped" and looper.id in (gate.warning or "")
    await fb.close()


Build = Callable[[Run], Awaitable[Run]]


async def _depth(root: Run) -> Run:
    run = root
    for _ in range(4):  # the 4th level below the root is one too deep
        run = await run.start_child()
    return run


async def _concurrent(root: Run) -> Run:
    await root.start_child()
    await root.start_child()
    return await root.start_child()


async def _spawned(root: Run) -> Run:
    first = await root.start_child()
    await first.finish("completed")  # closed: not open, but started all the same
    await root.start_child()
    return await root.start_child()


@pytest.mark.parametrize(
    ("policy", "build", "reason", "says"),
    [
        ({}, _depth, "depth_limit", "levels below run"),
        ({"max_open_children": 2}, _concurrent, "concurrency_limit", "wait for one to finish"),
        ({"max_children": 2}, _spawned, "spawn_limit", "has started 2 sub-agents"),
    ],
    ids=["depth", "open_at_once", "started_in_all"],
)
async def test_a_cap_refuses_the_spawn_with_a_reason_the_model_can_act_on(
    stack: Stack, policy: dict[str, Any], build: Build, reason: str, says: str
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run(f"cap-{reason}"), policy=policy)
    refused = await build(root)
    report = refused.stopped
    assert report is not None and report.reason == reason
    assert "sub-agent not started" in (report.detail or "") and says in (report.detail or "")
    gate = await refused.tool_call("work", {})
    assert gate.stopped and not gate.may_run and says in (gate.model_text or "")
    assert root.stopped is None
    await fb.close()


async def test_a_refused_spawn_frees_nothing_and_a_finished_child_frees_its_place(
    stack: Stack,
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    root = await fb.start_run(fresh_run("cap-free"), policy={"max_open_children": 1})
    first = await root.start_child()
    assert (await root.start_child()).stopped is not None
    await first.finish("completed")
    assert (await root.start_child()).stopped is None
    await fb.close()


def test_the_sync_facade_starts_children_too(stack: Stack) -> None:
    with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
        root = fb.start_run(fresh_run("sync-tree"))
        child = root.start_child(agent="helper")
        assert child.parent == root.id and child.stopped is None
        assert child.tool_call("search", {"q": 1}).may_run
        other = fb.start_run(fresh_run("sync-tree-explicit"), parent=root)
        assert other.parent == root.id
        child.close()
        root.close()
