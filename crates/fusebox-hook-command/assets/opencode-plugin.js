// fusebox for OpenCode: every tool call is asked of fuseboxd before it runs, and its
// result reported, by running the `fusebox-hook opencode` command (printed by
// `fusebox-hook opencode --print-plugin`; docs/agents/opencode.md). This plugin decides
// nothing: it forwards OpenCode's hook fields and does what the answer says —
// `deny` throws (the model reads the guard's words as the tool's error), `stop` throws
// and aborts the session, `context` is added to the call's result for the model.
// When the hook cannot answer at all, the call is refused (closed on failure), unless
// the user chose `--on-error allow`.
import { spawn } from "node:child_process";

const COMMAND = {{COMMAND}};
const ON_ERROR_ALLOW = {{ON_ERROR_ALLOW}};
// Past the hook's own deadline (its --timeout plus a margin): a hook still running then
// is killed and the call refused.
const KILL_AFTER_MS = 15000;

function ask(payload) {
  return new Promise((resolve) => {
    let out = "";
    let err = "";
    let done = false;
    const finish = (answer) => {
      if (!done) {
        done = true;
        resolve(answer);
      }
    };
    const failed = (why) =>
      finish(
        ON_ERROR_ALLOW
          ? { action: "allow", context: `fusebox: ${why}; the call runs unguarded (--on-error allow).` }
          : {
              action: "deny",
              reason: `fusebox: ${why}; the call is refused because the guard could not be asked. Do not retry it until the guard is back.`,
            },
      );
    let child;
    try {
      child = spawn(COMMAND[0], COMMAND.slice(1), { stdio: ["pipe", "pipe", "pipe"] });
    } catch (e) {
      return failed(`cannot run ${COMMAND[0]}: ${e.message}`);
    }
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      failed("the hook did not answer in time");
    }, KILL_AFTER_MS);
    child.stdout.on("data", (chunk) => (out += chunk));
    child.stderr.on("data", (chunk) => (err += chunk));
    child.on("error", (e) => {
      clearTimeout(timer);
      failed(`cannot run ${COMMAND[0]}: ${e.message}`);
    });
    child.on("close", () => {
      clearTimeout(timer);
      if (err.trim()) process.stderr.write(err);
      try {
        finish(JSON.parse(out));
      } catch {
        failed(`the hook gave no answer (${err.trim() || "no output"})`);
      }
    });
    child.stdin.on("error", () => {});
    child.stdin.end(JSON.stringify(payload));
  });
}

export const FuseboxGuard = async ({ client }) => {
  // Child sessions (sub-agents) by id → their parent session, from session.created.
  const parents = new Map();
  // A session's start, asked before anything else of it is.
  const starts = new Map();
  // Words for a call's result (a warning given before it ran), by call id.
  const pending = new Map();

  const started = (sessionID) => starts.get(sessionID) ?? Promise.resolve();
  // A child session's payloads name its parent and its tree's root session (the top of
  // its parents): the root's run is what a cluster routes the whole tree by.
  const rootOf = (sessionID) => {
    let root = sessionID;
    for (let hops = 0; parents.has(root) && hops < 64; hops++) root = parents.get(root);
    return root;
  };
  const withParent = (payload) => {
    const parentID = parents.get(payload.sessionID);
    return parentID ? { ...payload, parentID, rootID: rootOf(parentID) } : payload;
  };
  const abort = async (sessionID) => {
    try {
      await client.session.abort({ path: { id: sessionID }, sessionID });
    } catch (e) {
      process.stderr.write(`fusebox: cannot abort session ${sessionID}: ${e}\n`);
    }
  };

  return {
    event: async ({ event }) => {
      const info = event.properties?.info;
      if (event.type === "session.created" && info?.id) {
        if (info.parentID) parents.set(info.id, info.parentID);
        const start = started(info.parentID).then(() =>
          ask(withParent({ hook: "session.created", sessionID: info.id })),
        );
        starts.set(info.id, start);
        await start;
      } else if (event.type === "session.idle" && event.properties?.sessionID) {
        const sessionID = event.properties.sessionID;
        await started(sessionID);
        await ask(withParent({ hook: "session.idle", sessionID }));
      } else if (event.type === "session.deleted" && info?.id) {
        await ask(withParent({ hook: "session.deleted", sessionID: info.id }));
      }
    },
    "chat.message": async (input, output) => {
      await started(input.sessionID);
      const answer = await ask(
        withParent({
          hook: "chat.message",
          sessionID: input.sessionID,
          messageID: input.messageID ?? output?.message?.id,
        }),
      );
      if (answer.action === "stop") {
        await abort(input.sessionID);
        throw new Error(answer.reason);
      }
    },
    "tool.execute.before": async (input, output) => {
      await started(input.sessionID);
      const answer = await ask(
        withParent({
          hook: "tool.execute.before",
          sessionID: input.sessionID,
          callID: input.callID,
          tool: input.tool,
          args: output.args,
        }),
      );
      if (answer.action === "deny") throw new Error(answer.reason);
      if (answer.action === "stop") {
        // Thrown first so the model reads why; the abort then ends the session's loop.
        setTimeout(() => abort(input.sessionID), 0);
        throw new Error(answer.reason);
      }
      if (answer.context) pending.set(input.callID, answer.context);
    },
    "tool.execute.after": async (input, output) => {
      const warned = pending.get(input.callID);
      pending.delete(input.callID);
      const answer = await ask(
        withParent({
          hook: "tool.execute.after",
          sessionID: input.sessionID,
          callID: input.callID,
          tool: input.tool,
          args: input.args,
          output: output.output,
        }),
      );
      const words = [warned, answer.context].filter(Boolean).join("\n");
      if (words && typeof output.output === "string") output.output = `${output.output}\n${words}`;
      if (answer.action === "stop") await abort(input.sessionID);
    },
  };
};
