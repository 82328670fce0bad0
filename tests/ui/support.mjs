// What the browser suite starts, for real, on loopback: the harness's fusebox-stack
// (nats-server + fuseboxd), `fusebox ui`, the test agents (crates/fusebox-ui/examples/
// ui_agent.rs) and the `fusebox` CLI — every child killed when the suite ends.

import { spawn, execFile } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const BIN = process.env.FUSEBOX_BIN_DIR ?? path.join(REPO, 'target/debug');
/** Screenshots are test artifacts: under target/, never committed. */
export const SHOTS = path.join(REPO, 'target/ui-screenshots');
mkdirSync(SHOTS, { recursive: true });

const children = new Set();
export function killAll() {
  // fusebox-stack stops its servers when its stdin closes; the rest stop on SIGTERM.
  for (const child of children) {
    child.stdin.end();
    child.kill('SIGTERM');
  }
}
process.on('exit', killAll);

/** A child whose stdout lines can be awaited; its stderr kept for failure messages. */
export function start(command, args, options = {}) {
  const child = spawn(command, args, { stdio: ['pipe', 'pipe', 'pipe'], ...options });
  children.add(child);
  const lines = [];
  const waiters = [];
  let stderr = '';
  child.stderr.on('data', (chunk) => { stderr += chunk; });
  createInterface({ input: child.stdout }).on('line', (line) => {
    lines.push(line);
    for (const w of [...waiters]) if (w.test(line)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(line); }
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => { children.delete(child); resolve(code); }));
  return {
    child,
    lines,
    exited,
    stderr: () => stderr,
    /** The first line (seen or to come) matching `pattern`. */
    line(pattern, timeoutMs = 20000) {
      const seen = lines.find((l) => pattern.test(l));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const w = { test: (l) => pattern.test(l), resolve };
        waiters.push(w);
        const timer = setTimeout(() => reject(new Error(`${command}: no line matching ${pattern} in ${timeoutMs} ms\nstdout:\n${lines.join('\n')}\nstderr:\n${stderr}`)), timeoutMs);
        timer.unref();
        exited.then(() => setTimeout(() => reject(new Error(`${command} exited before printing ${pattern}\nstdout:\n${lines.join('\n')}\nstderr:\n${stderr}`)), 50));
        const done = w.resolve;
        w.resolve = (l) => { clearTimeout(timer); done(l); };
      });
    },
  };
}

/** nats-server + fuseboxd, as the Python suites start them (`--moto`: with a moto_server
 * the daemon's watchdog watches, sweeping every 2 s). */
export async function startStack(args = []) {
  const stack = start(path.join(BIN, 'fusebox-stack'), args);
  const line = await stack.line(/^\{/, 60000);
  return { ...JSON.parse(line), proc: stack };
}

/** `fusebox ui ARGS`; resolves with its URL once it printed it. */
export async function startUi(args) {
  const ui = start(path.join(BIN, 'fusebox'), ['ui', ...args]);
  const line = await ui.line(/^fusebox ui: http/);
  const url = line.match(/(http:\/\/\S+)/)[1];
  return { ui, url, line };
}

export function agent(natsUrl, mode, run, extra = []) {
  return start(path.join(BIN, 'examples/ui_agent'), ['--nats-url', natsUrl, '--mode', mode, '--tenant', 'ui', '--run', run, ...extra]);
}

/** The `fusebox` CLI's JSON answer (the operator commands the page must agree with). */
export function cli(natsUrl, args) {
  return new Promise((resolve, reject) => {
    execFile(path.join(BIN, 'fusebox'), [...args, '--nats-url', natsUrl, '--json'], (err, stdout, stderr) => {
      if (err) reject(new Error(`fusebox ${args.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)));
    });
  });
}

/** The origin a non-loopback listener is reached at from this machine: its port on 127.0.0.1. */
export function loopbackOf(url) {
  const u = new URL(url);
  u.hostname = '127.0.0.1';
  return u.origin;
}

/** RunInstances on moto (the EC2 Query API, as the AWS CLI sends it; moto checks no
 * signature): one t3.micro with these tags; resolves with its instance id. */
export async function launchInstance(motoUrl, tags) {
  const form = new URLSearchParams({
    Action: 'RunInstances', Version: '2016-11-15', ImageId: 'ami-12c6146b', InstanceType: 't3.micro',
    MinCount: '1', MaxCount: '1', 'TagSpecification.1.ResourceType': 'instance',
  });
  Object.entries(tags).forEach(([key, value], i) => {
    form.set(`TagSpecification.1.Tag.${i + 1}.Key`, key);
    form.set(`TagSpecification.1.Tag.${i + 1}.Value`, value);
  });
  const response = await fetch(motoUrl, {
    method: 'POST',
    body: form,
    headers: { authorization: 'AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0' },
  });
  const xml = await response.text();
  const id = xml.match(/<instanceId>(i-[0-9a-f]+)<\/instanceId>/);
  if (!response.ok || !id) throw new Error(`RunInstances on moto: ${response.status}\n${xml}`);
  return id[1];
}
