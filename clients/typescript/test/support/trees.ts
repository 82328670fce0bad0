/**
 * Run trees as the daemon holds them (tests/py/support/trees.py, the same idea): the runs
 * of one tree from the operator API (`fusebox.control.runs` with `root`), each with the
 * calls its log holds and the daemon's action on each — so a test judges what the daemon
 * saw and decided, not what the client meant to send.
 */
import type { NatsConnection } from "@nats-io/transport-node";
import { TENANT } from "./guard.js";

/** One run of a tree. */
export interface TreeNode {
  run: string;
  parent: string | null;
  agent: string | null;
  depth: number;
  open: boolean;
  /** The stop or close reason, once the run is closed. */
  reason: string | null;
  /** For a run closed by `ancestor_stopped`: the run whose stop reached it. */
  stoppedBy: string | null;
  /** [tool, the daemon's action] of each `tool_call`, in applied order. */
  calls: Array<[string, string]>;
}

/** The tools of the calls the daemon let run. */
export const executed = (node: TreeNode): string[] =>
  node.calls.filter(([, action]) => action === "execute" || action === "warn").map(([t]) => t);

const encode = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));

async function ask(nc: NatsConnection, subject: string, body: unknown): Promise<unknown> {
  const reply = await nc.request(subject, encode(body), { timeout: 10_000 });
  return JSON.parse(new TextDecoder().decode(reply.data));
}

/** Each `tool_call` of the run, as applied, with the daemon's action. */
async function calls(nc: NatsConnection, run: string): Promise<Array<[string, string]>> {
  type Entry = { position: number; event: Record<string, unknown>; decision: { action: string } };
  const out: Array<[string, string]> = [];
  let after: number | undefined;
  for (;;) {
    const page = (await ask(
      nc,
      `fusebox.control.${TENANT}.${run}.history`,
      after === undefined ? {} : { after },
    )) as { entries: Entry[]; more: boolean };
    for (const { event, decision } of page.entries) {
      if (event.type === "tool_call") out.push([String(event.tool), decision.action]);
    }
    const last = page.entries.at(-1);
    if (!page.more || last === undefined) return out;
    after = last.position;
  }
}

/** The root and every run below it, by run id. */
export async function tree(nc: NatsConnection, root: string): Promise<Map<string, TreeNode>> {
  type Row = {
    run: string;
    agent?: string;
    parent?: string;
    depth?: number;
    open: boolean;
    reason?: string;
    stopped_by?: string;
  };
  const page = (await ask(nc, "fusebox.control.runs", { tenant: TENANT, root })) as {
    runs: Row[];
  };
  const nodes = await Promise.all(
    page.runs.map(
      async (row): Promise<TreeNode> => ({
        run: row.run,
        parent: row.parent ?? null,
        agent: row.agent ?? null,
        depth: row.depth ?? 0,
        open: row.open,
        reason: row.reason ?? null,
        stoppedBy: row.stopped_by ?? null,
        calls: await calls(nc, row.run),
      }),
    ),
  );
  return new Map(nodes.map((node) => [node.run, node]));
}

/** The runs whose parent is `parent`, by run id. */
export function children(nodes: Map<string, TreeNode>, parent: string): TreeNode[] {
  return [...nodes.values()]
    .filter((node) => node.parent === parent)
    .sort((a, b) => a.run.localeCompare(b.run));
}
