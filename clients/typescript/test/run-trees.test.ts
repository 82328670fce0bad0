/**
 * Run trees (guard contract §6) through the client, against a real fuseboxd: a run
 * started as a child of another, the tree's step budget under concurrent children, a
 * cancel of the root that reaches every descendant's kill switch, the caps on fan-out,
 * and the parent told of a stopped child.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { Action, Run } from "../src/index.js";
import { treeGate } from "../src/subjects.js";
import { connectedStack, freshRun, fuseboxCancel } from "./support/guard.js";
import { children, executed, tree } from "./support/trees.js";

/** `calls` distinct calls of one run, each executed only when the guard lets it (`log`
 * records the executions); the guard's action on each. */
async function work(run: Run, calls: number, log: string[] = []): Promise<Array<Action | null>> {
  const actions: Array<Action | null> = [];
  for (let step = 0; step < calls; step++) {
    const gate = await run.toolCall("work", { run: run.id, step });
    if (gate.mayRun) {
      log.push(`${run.id}/${step}`);
      await run.toolResult(gate.callId, "work", "SUCCESS", { output: { done: step } });
    }
    actions.push(gate.action);
  }
  return actions;
}

describe("run trees against fuseboxd", () => {
  const live = connectedStack();

  test("a child run names its parent and its tree's root, and has its own calls, ids and kill switch", async () => {
    const root = await live.fb.startRun(freshRun("tree-root"), { agent: "lead" });
    const child = await root.startChild({ agent: "Web Researcher" });
    assert.equal(child.parent, root.id);
    assert.equal(child.id, `${root.id}-Web_Researcher-1`);
    assert.equal(child.stopped, null);
    assert.deepEqual(await work(child, 2), ["execute", "execute"]);
    // An explicit parent (named by id, so its tree's root is named too), and a
    // grandchild of it.
    const named = await live.fb.startRun(freshRun("tree-named"), {
      parent: child.id,
      root: child.root,
    });
    const grandchild = await named.startChild();
    assert.equal(grandchild.id, `${named.id}-sub-1`);
    // Every run of the tree names its root on the wire (a cluster serves the tree whole).
    assert.deepEqual(
      new Set([root, child, named, grandchild].map((r) => r.root)),
      new Set([root.id]),
    );
    assert.equal(
      treeGate(root.tenant, grandchild.root, grandchild.id),
      `fusebox.gate.${root.tenant}.${root.id}.${grandchild.id}`,
    );
    const nodes = await tree(live.fb.nats, root.id);
    const node = nodes.get(child.id);
    assert.equal(node?.parent, root.id);
    assert.equal(node?.agent, "Web Researcher");
    assert.deepEqual(node && executed(node), ["work", "work"]);
    assert.deepEqual(nodes.get(root.id)?.calls, []);
    assert.equal(nodes.get(grandchild.id)?.parent, named.id);
    assert.equal(nodes.get(grandchild.id)?.depth, 3);
    for (const run of [root, child, named, grandchild]) run.close();
  });

  test("a child's start waits for its parent's, and child ids stay run ids", async () => {
    // The parent is not started: its child starts it first, so the daemon knows it.
    const root = live.fb.run(freshRun("tree-lazy"), { policy: { max_steps: 1 } });
    const child = await root.startChild({ agent: "helper" });
    assert.equal((await work(child, 2))[1], "stop");
    assert.equal(child.stopped?.reason, "tree_budget");
    const long = live.fb.run(`${"a".repeat(120)}-${freshRun("x").slice(-6)}`);
    const ids = [long.child({ agent: "research er" }).id, long.child().id];
    assert.ok(
      ids.every((id) => id.length <= 128 && id.startsWith("a".repeat(40))),
      `${ids}`,
    );
    assert.match(ids[0] ?? "", /-[0-9a-f]{8}-research_er-1$/);
    assert.match(ids[1] ?? "", /-sub-2$/);
    // A delegation's key in place of the count: kept when it is a plain token, else cut
    // and marked with a hash of it, so two keys never share a child id.
    const keyed = live.fb.run(freshRun("tree-keyed"));
    const byKey = (key: string) => keyed.child({ agent: "researcher", key }).id;
    assert.equal(byKey("call_0_0"), `${keyed.id}-researcher-call_0_0`);
    assert.equal(byKey("call_0_0"), byKey("call_0_0"));
    const odd = [byKey("toolu.01/x"), byKey("toolu_01_x"), byKey(`c${"x".repeat(80)}`)];
    assert.equal(new Set(odd).size, 3);
    assert.match(odd[0] ?? "", /-researcher-toolu_01_x-[0-9a-f]{8}$/);
    assert.match(odd[2] ?? "", /-researcher-cx{54}-[0-9a-f]{8}$/);
    root.close();
    child.close();
  });

  test("thirty children at once under a tree budget of 100 steps execute exactly 100 calls", async () => {
    const root = await live.fb.startRun(freshRun("fanout"), {
      policy: { max_steps: 100, max_open_children: 30, max_children: 30 },
    });
    const kids = await Promise.all(
      Array.from({ length: 30 }, () => root.startChild({ agent: "worker" })),
    );
    assert.ok(kids.every((kid) => kid.stopped === null));
    const log: string[] = [];
    // All thirty at once, five calls each: 150 asked, the tree's budget is 100.
    const actions = (await Promise.all(kids.map((kid) => work(kid, 5, log)))).flat();
    assert.equal(log.length, 100);
    const refused = actions.filter((a) => a !== "execute" && a !== "warn");
    assert.equal(refused.length, 50);
    assert.deepEqual(new Set(refused), new Set(["stop"]));
    const stopped = kids.filter((kid) => kid.stopped !== null);
    assert.deepEqual(new Set(stopped.map((kid) => kid.stopped?.reason)), new Set(["tree_budget"]));
    assert.match(stopped[0]?.stopped?.detail ?? "", /step budget of run .* is spent by its tree/);
    // The root's budget is the tree's: spent, so its own next call is refused too.
    const gate = await root.toolCall("summarize", {});
    assert.equal(gate.stopped, true);
    assert.equal(gate.report?.reason, "step_budget");
    // The daemon's view: thirty children under the root, 100 executions in all.
    const nodes = await tree(live.fb.nats, root.id);
    assert.equal(children(nodes, root.id).length, 30);
    assert.equal(
      [...nodes.values()].reduce((sum, node) => sum + executed(node).length, 0),
      100,
    );
    for (const run of [root, ...kids]) run.close();
  });

  test("a cancel of the root through the operator API ends every descendant", async () => {
    const root = await live.fb.startRun(freshRun("cancel-tree"));
    const mid = await root.startChild({ agent: "planner" });
    const leaves = [await mid.startChild({ agent: "fetcher" }), await mid.startChild()];
    for (const run of [mid, ...leaves]) assert.deepEqual(await work(run, 1), ["execute"]);
    await fuseboxCancel(live.stack, root.id, "tree review");
    assert.equal((await root.waitStopped(10_000))?.reason, "cancelled");
    for (const run of [mid, ...leaves]) {
      // Each descendant's own kill switch fired, before any call of its own asked.
      const report = await run.waitStopped(10_000);
      assert.equal(report?.terminal_state, "CANCELLED", run.id);
      assert.equal(report?.reason, "ancestor_stopped");
      assert.match(report?.detail ?? "", /above this one was closed/);
      const gate = await run.toolCall("work", { after: "cancel" });
      assert.equal(gate.stopped, true);
      assert.equal(gate.mayRun, false);
    }
    const nodes = await tree(live.fb.nats, root.id);
    assert.deepEqual(
      Object.fromEntries([...nodes.values()].map((n) => [n.run, [n.reason, n.stoppedBy]])),
      {
        [root.id]: ["cancelled", null],
        [mid.id]: ["ancestor_stopped", root.id],
        [leaves[0]?.id ?? ""]: ["ancestor_stopped", root.id],
        [leaves[1]?.id ?? ""]: ["ancestor_stopped", root.id],
      },
    );
    for (const run of [root, mid, ...leaves]) run.close();
  });

  test("one child's loop stops that child only, and the parent is told", async () => {
    const boss = await live.fb.startRun(freshRun("loop-boss"));
    const looper = await boss.startChild({ agent: "searcher" });
    const sibling = await boss.startChild({ agent: "searcher" });
    for (let i = 0; i < 10 && looper.stopped === null; i++) {
      const gate = await looper.toolCall("search", { q: "x" });
      if (gate.mayRun) {
        await looper.toolResult(gate.callId, "search", "SUCCESS", { output: { hits: [] } });
      }
    }
    assert.equal(looper.stopped?.reason, "consecutive_blocks");
    assert.deepEqual(await work(sibling, 2), ["execute", "execute"]);
    assert.equal(boss.stopped, null);
    // The parent's model reads it at its next call, which still runs.
    const gate = await boss.toolCall("plan", { next: "merge" });
    assert.equal(gate.mayRun, true);
    assert.equal(gate.decision?.reason, "child_stopped");
    assert.match(gate.warning ?? "", new RegExp(looper.id));
    for (const run of [boss, looper, sibling]) run.close();
  });

  const caps: Array<[string, Record<string, unknown>, (root: Run) => Promise<Run>, RegExp]> = [
    [
      "depth_limit",
      {},
      async (root) => {
        let run = root;
        for (let i = 0; i < 4; i++) run = await run.startChild(); // the 4th level is too deep
        return run;
      },
      /levels below run/,
    ],
    [
      "concurrency_limit",
      { max_open_children: 2 },
      async (root) => {
        await root.startChild();
        await root.startChild();
        return root.startChild();
      },
      /wait for one to finish/,
    ],
    [
      "spawn_limit",
      { max_children: 2 },
      async (root) => {
        const first = await root.startChild();
        await first.finish("completed"); // closed, but started all the same
        await root.startChild();
        return root.startChild();
      },
      /has started 2 sub-agents/,
    ],
  ];
  for (const [reason, policy, build, says] of caps) {
    test(`a cap refuses the spawn with a reason the model can act on: ${reason}`, async () => {
      const root = await live.fb.startRun(freshRun(`cap-${reason}`), { policy });
      const refused = await build(root);
      assert.equal(refused.stopped?.reason, reason);
      assert.match(refused.stopped?.detail ?? "", /sub-agent not started/);
      assert.match(refused.stopped?.detail ?? "", says);
      const gate = await refused.toolCall("work", {});
      assert.equal(gate.stopped, true);
      assert.match(gate.modelText ?? "", says);
      assert.equal(root.stopped, null);
    });
  }

  test("a finished child frees its place among the open ones", async () => {
    const root = await live.fb.startRun(freshRun("cap-free"), { policy: { max_open_children: 1 } });
    const first = await root.startChild();
    assert.notEqual((await root.startChild()).stopped, null);
    await first.finish("completed");
    assert.equal((await root.startChild()).stopped, null);
  });
});
