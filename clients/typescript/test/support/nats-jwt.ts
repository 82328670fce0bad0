/**
 * Operator-mode NATS for the creds-file test: an operator, an account and a user, their
 * JWTs signed with nkeys (Ed25519), as `nsc` would make them.
 */
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createAccount, createOperator, createUser, type KeyPair } from "@nats-io/nkeys";

const b64 = (data: Uint8Array | string): string => Buffer.from(data).toString("base64url");

function base32(data: Uint8Array): string {
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  let bits = 0;
  let value = 0;
  let out = "";
  for (const byte of data) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += alphabet[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += alphabet[(value << (5 - bits)) & 31];
  return out;
}

function jwt(
  issuer: KeyPair,
  subject: string,
  name: string,
  nats: Record<string, unknown>,
): string {
  const claims: Record<string, unknown> = {
    iat: Math.floor(Date.now() / 1000),
    iss: issuer.getPublicKey(),
    sub: subject,
    name,
    nats: { ...nats, version: 2 },
  };
  claims.jti = base32(createHash("sha256").update(JSON.stringify(claims)).digest());
  const head = b64(JSON.stringify({ typ: "JWT", alg: "ed25519-nkey" }));
  const body = b64(JSON.stringify(claims));
  const signature = issuer.sign(new TextEncoder().encode(`${head}.${body}`));
  return `${head}.${body}.${b64(signature)}`;
}

/** Writes a server config (operator, memory resolver with the account), a creds file of a
 * user of that account, and one of a user of an unknown account. */
export function operatorSetup(work: string): { config: string; agent: string; stranger: string } {
  const operator = createOperator();
  const account = createAccount();
  const stranger = createAccount();
  const limits = {
    conn: -1,
    subs: -1,
    data: -1,
    payload: -1,
    imports: -1,
    exports: -1,
    wildcards: true,
  };
  const operatorJwt = jwt(operator, operator.getPublicKey(), "op", { type: "operator" });
  const accountJwt = jwt(operator, account.getPublicKey(), "acc", { type: "account", limits });
  const config = join(work, "operator.conf");
  writeFileSync(
    config,
    `operator: "${operatorJwt}"\nresolver: MEMORY\nresolver_preload: { ${account.getPublicKey()}: "${accountJwt}" }\n`,
  );
  const creds = (issuer: KeyPair, name: string): string => {
    const user = createUser();
    const userJwt = jwt(issuer, user.getPublicKey(), name, {
      type: "user",
      pub: {},
      sub: {},
      subs: -1,
      data: -1,
      payload: -1,
    });
    const seed = new TextDecoder().decode(user.getSeed());
    const path = join(work, `${name}.creds`);
    writeFileSync(
      path,
      `-----BEGIN NATS USER JWT-----\n${userJwt}\n------END NATS USER JWT------\n\n` +
        `-----BEGIN USER NKEY SEED-----\n${seed}\n------END USER NKEY SEED------\n`,
    );
    return path;
  };
  return { config, agent: creds(account, "agent"), stranger: creds(stranger, "stranger") };
}
