/**
 * The README's "Connect, and a run" as a script of its own: connect, start a run, gate a
 * call, report it, finish the run, and — unless `--no-close` — `fb.close()`. The
 * README suite runs it as a separate process to show that the close is what lets a
 * script built from the README exit.
 */
import { Fusebox } from "../../src/index.js";

const [url, runId, flag] = process.argv.slice(2);
const fb = await Fusebox.connect(url ?? "", { tenant: "tstest", timeoutMs: 2000 });
const run = await fb.startRun(runId, { agent: "researcher" });
const gate = await run.toolCall("search", { q: "weather tokyo" });
if (gate.mayRun) await run.toolResult(gate.callId, "search", "SUCCESS", { output: { hits: 1 } });
await run.finish("completed");
console.log(gate.action);
if (flag !== "--no-close") await fb.close();
