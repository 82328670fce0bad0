/**
 * Connecting to NATS the way fuseboxd's deployments require: every credential kind the
 * deploy configs use (user/password, token, nkey seed, creds file), TLS (mutual too), the
 * per-tenant inbox prefix, and a first connect that fails at once with the reason.
 */
import { readFile } from "node:fs/promises";
import {
  type Authenticator,
  connect,
  credsAuthenticator,
  type NatsConnection,
  type NodeConnectionOptions,
  nkeyAuthenticator,
} from "@nats-io/transport-node";
import { ConnectError } from "./errors.js";

/** TLS to the NATS server. `certFile` + `keyFile` make it mutual TLS. */
export interface TlsConfig {
  caFile?: string;
  certFile?: string;
  keyFile?: string;
  /** The server must be configured with `handshake_first` too. */
  handshakeFirst?: boolean;
}

/** At most one way to authenticate, as in fuseboxd's `[nats]` section. */
export interface Credentials {
  user?: string;
  password?: string;
  token?: string;
  /** A file holding an nkey user seed (`SU…`). */
  nkeySeedFile?: string;
  /** A `.creds` file (user JWT + seed, operator mode). */
  credsFile?: string;
}

export interface ConnectOptions extends Credentials {
  /** The tenant whose agents this connection serves: `[A-Za-z0-9_-]{1,64}`. */
  tenant: string;
  tls?: TlsConfig;
  /**
   * Where replies come back. Defaults to `_INBOX.<tenant>`, the only inboxes a tenant
   * user of deploy/nats/accounts.conf may receive replies on.
   */
  inboxPrefix?: string;
  /** How long the first connect may take, per server (ms). */
  connectTimeoutMs?: number;
  /** The connection's name in the server's monitoring. */
  name?: string;
}

async function authenticator(creds: Credentials): Promise<Authenticator | undefined> {
  if (creds.nkeySeedFile !== undefined) {
    const seed = (await readFile(creds.nkeySeedFile, "utf8")).trim();
    return nkeyAuthenticator(new TextEncoder().encode(seed));
  }
  if (creds.credsFile !== undefined) {
    return credsAuthenticator(await readFile(creds.credsFile));
  }
  return undefined;
}

/** Throws `TypeError` unless at most one credential kind is given, and whole. */
export function checkCredentials(creds: Credentials): void {
  const kinds = [
    creds.user !== undefined || creds.password !== undefined,
    creds.token !== undefined,
    creds.nkeySeedFile !== undefined,
    creds.credsFile !== undefined,
  ].filter(Boolean).length;
  if (kinds > 1) {
    throw new TypeError("set at most one of user/password, token, nkeySeedFile, credsFile");
  }
  if ((creds.user === undefined) !== (creds.password === undefined)) {
    throw new TypeError("user and password go together");
  }
}

/**
 * Connects, or throws `ConnectError` with the server's or the socket's own words as soon
 * as the first attempt failed. Once connected, reconnects are unlimited: a daemon-side or
 * server restart must not kill a long-running agent.
 */
export async function connectNats(
  servers: string | string[],
  opts: ConnectOptions,
): Promise<NatsConnection> {
  const urls = typeof servers === "string" ? [servers] : servers;
  if (urls.length === 0) throw new TypeError("no NATS server given");
  checkCredentials(opts);
  if ((opts.tls?.certFile === undefined) !== (opts.tls?.keyFile === undefined)) {
    throw new TypeError("TLS certFile and keyFile go together");
  }
  let auth: Authenticator | undefined;
  try {
    auth = await authenticator(opts);
  } catch (err) {
    throw new ConnectError(urls.join(", "), `cannot read credentials: ${describe(err)}`);
  }
  const options: NodeConnectionOptions = {
    servers: urls,
    name: opts.name ?? `fusebox-guard:${opts.tenant}`,
    inboxPrefix: opts.inboxPrefix ?? `_INBOX.${opts.tenant}`,
    timeout: opts.connectTimeoutMs ?? 2000,
    waitOnFirstConnect: false,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 1000,
    noRandomize: true,
  };
  if (opts.user !== undefined && opts.password !== undefined) {
    options.user = opts.user;
    options.pass = opts.password;
  }
  if (opts.token !== undefined) options.token = opts.token;
  if (auth !== undefined) options.authenticator = auth;
  if (opts.tls !== undefined) {
    const { caFile, certFile, keyFile, handshakeFirst } = opts.tls;
    options.tls = {
      ...(caFile !== undefined && { caFile }),
      ...(certFile !== undefined && { certFile }),
      ...(keyFile !== undefined && { keyFile }),
      ...(handshakeFirst !== undefined && { handshakeFirst }),
    };
  }
  try {
    return await connect(options);
  } catch (err) {
    throw new ConnectError(urls.join(", "), describe(err));
  }
}

/** An error's own words, with the causes nats.js wraps around them. */
export function describe(err: unknown): string {
  const parts: string[] = [];
  let current: unknown = err;
  while (current instanceof Error && parts.length < 4) {
    const text = current.message ? `${current.name}: ${current.message}` : current.name;
    if (!parts.includes(text)) parts.push(text);
    current = current.cause;
  }
  if (parts.length === 0) parts.push(String(err));
  return parts.join(" <- ");
}
