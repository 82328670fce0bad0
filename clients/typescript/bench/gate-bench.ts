/**
 * `npm run bench`: the gate call beside a raw nats.js request/reply to the same fuseboxd,
 * in one run (gate-latency.ts says what is measured and how).
 *
 *     npm run bench                              # starts its own stack (fusebox-stack)
 *     npm run bench -- --nats nats://127.0.0.1:4222 --calls 4000
 *
 * With its own stack, `fusebox-stack` and the daemon it starts come from
 * `FUSEBOX_BIN_DIR` (the workspace's debug build by default): to measure the release
 * daemon, point it at a directory holding `cargo build --release`'s `fuseboxd` beside
 * `fusebox-stack`, or start the release daemon yourself and pass `--nats`.
 */
import { parseArgs } from "node:util";
import { type Stack, startStack } from "../test/support/stack.js";
import { measureGate } from "./gate-latency.js";

const { values } = parseArgs({
  options: {
    nats: { type: "string" },
    tenant: { type: "string", default: "bench" },
    calls: { type: "string", default: "4000" },
    "per-run": { type: "string", default: "400" },
  },
});

const stack: Stack | null = values.nats === undefined ? await startStack() : null;
try {
  const figures = await measureGate({
    url: values.nats ?? (stack as Stack).natsUrl,
    tenant: values.tenant,
    calls: Number(values.calls),
    perRun: Number(values["per-run"]),
  });
  console.log(JSON.stringify(figures, null, 2));
} finally {
  await stack?.stop();
}
