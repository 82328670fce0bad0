/**
 * Connecting, against a real nats-server with no daemon: every credential kind the deploy
 * configs use, TLS, a first connect that fails at once with the reason, the error kinds
 * told apart, and the re-send of an event whose delivery failed.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { createUser } from "@nats-io/nkeys";
import { connect } from "@nats-io/transport-node";
import {
  ConnectError,
  decodeDecision,
  Fusebox,
  GateTimeout,
  NoResponders,
  Refused,
} from "../src/index.js";
import { bareNats, freePort, freshRun, TENANT } from "./support/guard.js";
import { operatorSetup } from "./support/nats-jwt.js";

const work = mkdtempSync(join(tmpdir(), "fusebox-ts-connect-"));

async function withNats<T>(
  args: string[],
  body: (url: string) => Promise<T>,
  jetstream = true,
): Promise<T> {
  const nats = await bareNats(args, jetstream);
  try {
    return await body(nats.url);
  } finally {
    await nats.stop();
  }
}

async function refusedWithin(
  ms: number,
  connecting: () => Promise<unknown>,
): Promise<ConnectError> {
  const started = Date.now();
  const err = await connecting().then(
    () => assert.fail("connected"),
    (e: unknown) => e,
  );
  assert.ok(Date.now() - started < ms, `took ${Date.now() - started} ms`);
  assert.ok(err instanceof ConnectError, String(err));
  return err;
}

describe("connecting", () => {
  test("a refused first connect fails at once with the reason", async () => {
    const url = `nats://127.0.0.1:${await freePort()}`;
    const err = await refusedWithin(5000, () => Fusebox.connect(url, { tenant: TENANT }));
    assert.match(err.message, new RegExp(url.replaceAll(".", "\\.")));
    assert.match(err.message, /refused|connect/i);
  });

  const credentials = [
    {
      kind: "user/password",
      flags: ["--user", "agent", "--pass", "s3cret"],
      good: { user: "agent", password: "s3cret" },
      bad: { user: "agent", password: "wrong" },
    },
    {
      kind: "token",
      flags: ["--auth", "t0ken"],
      good: { token: "t0ken" },
      bad: { token: "other" },
    },
  ];
  for (const { kind, flags, good, bad } of credentials) {
    test(`credentials: ${kind}`, () =>
      withNats(flags, async (url) => {
        const fb = await Fusebox.connect(url, { tenant: TENANT, ...good });
        assert.equal(fb.nats.isClosed(), false);
        await fb.close();
        const err = await refusedWithin(5000, () =>
          Fusebox.connect(url, { tenant: TENANT, ...bad }),
        );
        assert.match(err.message, /authorization/i);
      }));
  }

  test("credentials: nkey seed file", async () => {
    const user = createUser();
    const seedFile = join(work, "user.nk");
    writeFileSync(seedFile, new TextDecoder().decode(user.getSeed()));
    const conf = join(work, "nkey.conf");
    writeFileSync(conf, `authorization { users: [ { nkey: "${user.getPublicKey()}" } ] }\n`);
    await withNats(["-c", conf], async (url) => {
      const fb = await Fusebox.connect(url, { tenant: TENANT, nkeySeedFile: seedFile });
      await fb.close();
      await refusedWithin(5000, () => Fusebox.connect(url, { tenant: TENANT }));
    });
  });

  test("credentials: creds file (operator mode)", async () => {
    const { config, agent, stranger } = operatorSetup(work);
    // Operator mode without a system account: no JetStream (not needed to connect).
    await withNats(
      ["-c", config],
      async (url) => {
        const fb = await Fusebox.connect(url, { tenant: TENANT, credsFile: agent });
        await fb.close();
        const err = await refusedWithin(5000, () =>
          Fusebox.connect(url, { tenant: TENANT, credsFile: stranger }),
        );
        assert.match(err.message, /authorization/i);
      },
      false,
    );
  });

  test("a credentials file that cannot be read is a ConnectError that says so", async () => {
    const err = await refusedWithin(2000, () =>
      Fusebox.connect("nats://127.0.0.1:1", {
        tenant: TENANT,
        credsFile: join(work, "missing.creds"),
      }),
    );
    assert.match(err.message, /cannot read credentials.*missing\.creds/);
  });

  test("mutual TLS", async () => {
    const openssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "ignore" });
    const d = (name: string) => join(work, name);
    openssl(
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-days",
      "2",
      "-subj",
      "/CN=fusebox-test-ca",
      "-keyout",
      d("ca.key"),
      "-out",
      d("ca.pem"),
    );
    writeFileSync(d("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    for (const name of ["server", "client"]) {
      openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        `/CN=${name}`,
        "-keyout",
        d(`${name}.key`),
        "-out",
        d(`${name}.csr`),
      );
      openssl(
        "x509",
        "-req",
        "-in",
        d(`${name}.csr`),
        "-CA",
        d("ca.pem"),
        "-CAkey",
        d("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        d("san.ext"),
        "-out",
        d(`${name}.pem`),
      );
    }
    const flags = [
      "--tlscert",
      d("server.pem"),
      "--tlskey",
      d("server.key"),
      "--tlscacert",
      d("ca.pem"),
      "--tlsverify",
    ];
    await withNats(flags, async (url) => {
      const tlsUrl = url.replace("nats://", "tls://");
      const fb = await Fusebox.connect(tlsUrl, {
        tenant: TENANT,
        tls: { caFile: d("ca.pem"), certFile: d("client.pem"), keyFile: d("client.key") },
      });
      await fb.close();
      // Without a client certificate the server refuses, and the error says so at once.
      await refusedWithin(5000, () =>
        Fusebox.connect(tlsUrl, { tenant: TENANT, tls: { caFile: d("ca.pem") } }),
      );
    });
  });

  test("credential kinds are exclusive, and bad ids are refused before any I/O", async () => {
    await assert.rejects(
      Fusebox.connect("nats://127.0.0.1:1", {
        tenant: TENANT,
        token: "t",
        user: "u",
        password: "p",
      }),
      /at most one/,
    );
    await assert.rejects(
      Fusebox.connect("nats://127.0.0.1:1", { tenant: TENANT, user: "u" }),
      /go together/,
    );
    await assert.rejects(
      Fusebox.connect("nats://127.0.0.1:1", { tenant: "acme corp" }),
      /tenant "acme corp" must be/,
    );
  });
});

describe("error kinds and re-sending", () => {
  test("no responders and timeout are told apart; allow lets a call run by choice", () =>
    withNats([], async (url) => {
      const fb = await Fusebox.connect(url, { tenant: TENANT, timeoutMs: 300 });
      const gate = await fb.run(freshRun("kinds")).toolCall("search", { q: "x" });
      assert.ok(gate.error instanceof NoResponders, String(gate.error));
      assert.equal(gate.mayRun, false);
      assert.match(gate.modelText ?? "", /did not run/);
      // A "daemon" that takes the request and never answers.
      const silent = await connect({ servers: url });
      silent.subscribe("fusebox.gate.>", { callback: () => undefined });
      await silent.flush();
      const allowed = await fb.run(freshRun("kinds"), { gateOnError: "allow" }).toolCall("s");
      assert.ok(allowed.error instanceof GateTimeout, String(allowed.error));
      assert.equal(allowed.mayRun, true);
      await silent.close();
      await fb.close();
    }));

  test("decodeDecision refuses what is not a decision", () => {
    const bytes = (s: string) => new TextEncoder().encode(s);
    assert.throws(() => decodeDecision("s", bytes("nope")), /not JSON/);
    assert.throws(() => decodeDecision("s", bytes('{"action":"explode"}')), /not a decision/);
    assert.throws(
      () => decodeDecision("s", bytes('{"error":{"reason":"malformed_json","message":"bad"}}')),
      (err: unknown) => err instanceof Refused && err.reason === "malformed_json",
    );
  });

  test("an event that failed is re-sent, same id, before the next one", () =>
    withNats([], async (url) => {
      const seen: Array<[number, string]> = [];
      const daemon = await connect({ servers: url });
      daemon.subscribe("fusebox.gate.>", {
        callback: (_err, msg) => {
          const event = msg.json<Record<string, unknown>>();
          seen.push([Number(event.seq), String(event.id)]);
          if (seen.length === 1) return; // the first request is lost
          const action = event.type === "tool_call" ? "execute" : "continue";
          msg.respond(
            JSON.stringify({
              v: 1,
              tenant: event.tenant,
              run: event.run,
              event_id: event.id,
              action,
            }),
          );
        },
      });
      await daemon.flush();
      const fb = await Fusebox.connect(url, { tenant: TENANT, timeoutMs: 300 });
      const run = fb.run(freshRun("resend"));
      await run.start({ watchStop: false }); // run_started (seq 1) is the lost one
      assert.ok(run.startError instanceof GateTimeout);
      const first = await run.toolCall("search", { q: 1 });
      assert.equal(first.mayRun, true);
      assert.deepEqual(
        seen.map(([s]) => s),
        [1, 1, 2],
      );
      assert.equal(seen[0]?.[1], seen[1]?.[1]); // the same id: the daemon dedups it
      await fb.close();
      await daemon.close();
    }));

  test("an argument that is not JSON is refused before it takes a seq", () =>
    withNats([], async (url) => {
      const fb = await Fusebox.connect(url, { tenant: TENANT, timeoutMs: 300 });
      const run = fb.run(freshRun("cyclic"));
      await run.start({ watchStop: false });
      const cyclic: Record<string, unknown> = {};
      cyclic.self = cyclic;
      const before = run.seq;
      await assert.rejects(run.toolCall("t", cyclic), /not JSON/);
      assert.equal(run.seq, before);
      await fb.close();
    }));
});
