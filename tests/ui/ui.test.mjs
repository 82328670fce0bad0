// The operator's page (`fusebox ui`) in a real browser: Debian's chromium, headless,
// driven by playwright-core, against a real fuseboxd and nats-server on loopback.
//   node --test tests/ui/
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

import { BIN, REPO, SHOTS, agent, cli, killAll, launchInstance, loopbackOf, start, startStack, startUi } from './support.mjs';

const require = createRequire(path.join(REPO, 'tests/npm/package.json'));
const { chromium } = require('playwright-core');

let stack;
let base;
let browser;

before(async () => {
  stack = await startStack(['--moto']);
  ({ url: base } = await startUi(['--nats-url', stack.nats_url, '--listen', '127.0.0.1:0', '--refresh-ms', '300', '--by', 'ui-test']));
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium' });
});

after(async () => {
  await browser?.close();
  killAll();
});

async function newPage(viewport = { width: 1280, height: 900 }) {
  const page = await browser.newPage({ viewport });
  page.dialogs = [];
  page.on('dialog', (d) => { page.dialogs.push(d.message()); d.dismiss(); });
  return page;
}

const row = (page, run) => page.locator(`tr[data-run="ui/${run}"]`);

test('a runaway agent appears live and turns STOPPED_LOOP_GUARD without a reload', async () => {
  const page = await newPage();
  await page.goto(base);
  await page.evaluate(() => { window.notReloaded = true; });
  const runaway = agent(stack.nats_url, 'loop', 'runaway', ['--pause-ms', '700']);
  await row(page, 'runaway').waitFor({ timeout: 20000 });
  assert.equal(await row(page, 'runaway').locator('.state').innerText(), 'OPEN', 'seen while it runs');
  await page.screenshot({ path: path.join(SHOTS, 'runs-live-open.png'), fullPage: true });
  await row(page, 'runaway').locator('.state', { hasText: 'STOPPED_LOOP_GUARD' }).waitFor({ timeout: 30000 });
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  assert.match(await row(page, 'runaway').innerText(), /researcher/);
  assert.match(await page.locator('nav.counts').innerText(), /STOPPED_LOOP_GUARD \(1\)/);
  await page.screenshot({ path: path.join(SHOTS, 'runs.png'), fullPage: true });
  await runaway.line(/^STOPPED STOPPED_LOOP_GUARD/);

  // Filters and search are the daemon's: a state, a run id, a reason that matches nothing.
  await page.goto(`${base}?state=STOPPED_LOOP_GUARD`);
  await row(page, 'runaway').waitFor();
  await page.goto(`${base}?q=unaway`);
  await row(page, 'runaway').waitFor();
  await page.goto(`${base}?reason=no_such_reason`);
  assert.match(await page.locator('#runs-table').innerText(), /No runs match/);
  await page.close();
});

test("a stopped run's page shows the blocks with their reasons, the stop report, markup as text", async () => {
  const page = await newPage();
  const response = await page.goto(`${base}runs/ui/runaway`);
  assert.equal(response.status(), 200);
  const blocks = page.locator('#timeline tr[data-action="block"]');
  assert.ok(await blocks.count() >= 1, 'the blocked calls are on the timeline');
  assert.match(await blocks.first().innerText(), /search[\s\S]*block\s+same_call_repeat\s+exact_repeat\s+\d/, 'with decision, reason, detector, count');
  assert.match(await page.locator('#timeline tr[data-action="stop"]').first().innerText(), /consecutive_blocks/);
  assert.match(await page.locator('#timeline tr[data-action="warn"]').first().innerText(), /same_call_repeat/);
  assert.ok(await page.locator('#timeline tr.e-model_turn').count() === 1, 'the model turn is in place');
  assert.ok(await page.locator('#timeline tr.e-compaction').count() === 1, 'the compaction is in place');
  const report = await page.locator('#stop-report').innerText();
  assert.match(report, /STOPPED_LOOP_GUARD/);
  assert.match(report, /Fired guards/);
  assert.match(report, /verified_precondition_change/);
  // The argument `<script>alert('pwned')</script>` is text on the page, folded (not
  // dropped) with the rest of the call's arguments, and not a script.
  const fold = blocks.first().locator('details').first();
  await fold.locator('summary').click();
  const args = await fold.locator('pre').innerText();
  assert.ok(args.includes("<script>alert('pwned')</script>"), 'the markup shows as text');
  assert.ok(args.includes('x'.repeat(300)), 'folded, not dropped');
  assert.equal(await page.locator('script').count(), 1, 'only the page\'s own script');
  assert.deepEqual(page.dialogs, [], 'no script of the event ran');
  await page.screenshot({ path: path.join(SHOTS, 'run.png'), fullPage: true });
  await page.close();
});

test('an unknown run is a 404 page', async () => {
  const page = await newPage();
  for (const missing of ['runs/ui/no-such-run', 'runs/ui/bad.id', 'no/such/page']) {
    const response = await page.goto(`${base}${missing}`);
    assert.equal(response.status(), 404, missing);
  }
  assert.match(await page.locator('main').innerText(), /Not found/);
  const response = await page.goto(`${base}runs/ui/no-such-run`);
  assert.match(await page.locator('main').innerText(), /Unknown run/);
  assert.equal(response.status(), 404);
  await page.screenshot({ path: path.join(SHOTS, 'not-found.png') });
  await page.close();
});

test('the cancel button stops a run that is still going, and the agent sees the stop', async () => {
  const steady = agent(stack.nats_url, 'steady', 'steady', ['--pause-ms', '200']);
  await steady.line(/^execute/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/steady`);
  await page.locator('#cancel').click();
  await page.locator('input[name="reason"]').fill('seen on the page');
  await page.screenshot({ path: path.join(SHOTS, 'cancel-confirm.png') });
  await page.locator('#confirm').click();
  const answer = await page.locator('#answer').innerText();
  assert.match(answer, /fuseboxd answered stop/);
  assert.match(answer, /cancelled/);
  await steady.line(/^STOPPED CANCELLED cancelled/);
  const [status] = await cli(stack.nats_url, ['run', 'ui/steady']);
  assert.equal(status.summary.terminal_state, 'CANCELLED');
  await page.close();
});

test('resume from the page does what `fusebox resume` does', async () => {
  for (const run of ['twin-cli', 'twin-ui']) {
    await agent(stack.nats_url, 'loop', run, ['--pause-ms', '0']).line(/^STOPPED STOPPED_LOOP_GUARD/);
  }
  const [stopped] = await cli(stack.nats_url, ['run', 'ui/twin-cli']);
  const evidence = { progress_version: stopped.report.progress_version + 1 };
  const [byCli] = await cli(stack.nats_url, ['resume', 'ui/twin-cli', '--evidence', JSON.stringify(evidence)]);
  assert.equal(byCli.action, 'continue');
  const page = await newPage();
  await page.goto(`${base}runs/ui/twin-ui`);
  await page.locator('#resume').click();
  assert.match(await page.locator('#resume-condition').innerText(), /verified_precondition_change/);
  assert.deepEqual(JSON.parse(await page.locator('#evidence').inputValue()), evidence, 'the evidence the condition asks for');
  await page.screenshot({ path: path.join(SHOTS, 'resume-confirm.png') });
  await page.locator('#confirm').click();
  assert.match(await page.locator('#answer').innerText(), new RegExp(`fuseboxd answered ${byCli.action}`));
  const [cliRun] = await cli(stack.nats_url, ['run', 'ui/twin-cli']);
  const [uiRun] = await cli(stack.nats_url, ['run', 'ui/twin-ui']);
  assert.equal(uiRun.summary.open, true);
  assert.deepEqual({ ...uiRun.summary, run: 'x', last_ts_ms: 0 }, { ...cliRun.summary, run: 'x', last_ts_ms: 0 });
  assert.deepEqual(uiRun.counters, cliRun.counters);

  // A refusal is shown as such: the run is open now, there is nothing to resume.
  const again = await page.goto(`${base}runs/ui/twin-ui/resume`);
  assert.equal(again.status(), 409);
  await page.close();
});

test('ledger resolve from the page does what `fusebox ledger resolve` does', async () => {
  for (const run of ['hold-cli', 'hold-ui']) {
    await agent(stack.nats_url, 'hold', run).line(/^HOLDING/);
  }
  await cli(stack.nats_url, ['ledger', 'resolve', 'ui', 'hold-cli-invoice', '--completed', '{"sent":true}']);
  const page = await newPage();
  await page.goto(`${base}runs/ui/hold-ui`);
  const key = page.locator('#ledger tr[data-op-key="hold-ui-invoice"]');
  assert.match(await key.innerText(), /in_flight/);
  await key.getByText('Resolve…').click();
  await page.locator('#output').fill('{"sent":true}');
  await page.locator('input[name="reason"]').fill('in the mail log');
  await page.locator('#confirm').click();
  assert.match(await page.locator('#answer').innerText(), /fuseboxd answered/);
  const [byCli] = await cli(stack.nats_url, ['ledger', 'show', 'ui', 'hold-cli-invoice']);
  const [byUi] = await cli(stack.nats_url, ['ledger', 'show', 'ui', 'hold-ui-invoice']);
  assert.equal(byUi.state, 'completed');
  assert.deepEqual(byUi.result, byCli.result);
  await page.goto(`${base}runs/ui/hold-ui`);
  assert.match(await page.locator('#ledger').innerText(), /completed/);
  await page.close();
});

test('the watchdog panel shows the held instances with deadline and reason, and the terminations', async () => {
  const tags = (run, lifetime) => ({ 'fusebox:managed': 'true', 'fusebox:tenant': 'ui', 'fusebox:run': run, 'fusebox:max-lifetime': String(lifetime) });
  const held = await launchInstance(stack.moto_url, tags('wd-held', 3600));
  const page = await newPage();
  await page.goto(`${base}watchdog`);
  await page.evaluate(() => { window.notReloaded = true; });
  const heldRow = page.locator(`#instances tr[data-instance="${held}"]`);
  await heldRow.waitFor({ timeout: 20000 });
  assert.equal(await heldRow.locator('td.reason').innerText(), 'max_lifetime');
  const launchMs = Number(await heldRow.locator('td:nth-child(5) time').getAttribute('title'));
  const deadlineMs = Number(await heldRow.locator('td.deadline time').getAttribute('title'));
  assert.equal(deadlineMs - launchMs, 3600 * 1000, 'the deadline is launch + the max-lifetime tag');
  assert.match(await heldRow.innerText(), /ui\/wd-held/);

  // One second to live: the next sweep (every 2 s) terminates it, and it shows among
  // the recent terminations without a reload.
  const overdue = await launchInstance(stack.moto_url, tags('wd-overdue', 1));
  const gone = page.locator(`#terminations tr[data-instance="${overdue}"]`);
  await gone.waitFor({ timeout: 30000 });
  assert.equal(await gone.locator('td.reason').innerText(), 'max_lifetime');
  assert.match(await gone.locator('td.outcome').innerText(), /^terminated|already_gone/);
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  await page.locator(`#instances tr[data-instance="${overdue}"]`).waitFor({ state: 'detached', timeout: 10000 });
  assert.equal(await heldRow.count(), 1, 'the held one is still held');
  await page.screenshot({ path: path.join(SHOTS, 'watchdog.png'), fullPage: true });
  await page.close();
});

test('by keyboard and at a phone\'s width', async () => {
  const page = await newPage({ width: 390, height: 844 });
  await page.goto(base);
  await row(page, 'runaway').waitFor();
  let focused = '';
  for (let i = 0; i < 60 && focused !== '/runs/ui/runaway'; i++) {
    await page.keyboard.press('Tab');
    focused = await page.evaluate(() => document.activeElement?.getAttribute('href') ?? '');
  }
  assert.equal(focused, '/runs/ui/runaway', 'the run link is reachable by Tab');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 1, `the page fits the phone's width (overflow ${overflow}px): tables scroll in their box`);
  await page.screenshot({ path: path.join(SHOTS, 'runs-phone.png'), fullPage: true });
  await page.keyboard.press('Enter');
  await page.waitForURL(/\/runs\/ui\/runaway$/);
  await page.screenshot({ path: path.join(SHOTS, 'run-phone.png'), fullPage: true });
  await page.close();
});

test("a tree's run page shows each run under its parent, and a cancel from the page cancels the subtree", async () => {
  const forest = agent(stack.nats_url, 'tree', 'fleet', ['--pause-ms', '200']);
  await forest.line(/^execute/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/fleet-a`);
  const runs = page.locator('#tree-table tbody tr');
  await page.locator('#tree-table tr[data-run="fleet-a-1"]').waitFor();
  // The root, then each run under its parent in the order they started.
  assert.deepEqual(
    await runs.evaluateAll((rows) => rows.map((r) => `${r.dataset.depth} ${r.dataset.run}`)),
    ['0 fleet', '1 fleet-a', '2 fleet-a-1', '1 fleet-b'],
  );
  assert.equal(await page.locator('#tree-table tr[aria-current="page"]').getAttribute('data-run'), 'fleet-a');
  // What each subtree spent: a model turn of $0.01 each.
  const cost = (run) => page.locator(`#tree-table tr[data-run="${run}"] td.tree-cost`).innerText();
  assert.equal(await cost('fleet'), '0.0400');
  assert.equal(await cost('fleet-a'), '0.0200');
  assert.match(await page.locator('#run dl.facts').innerText(), /Parent\s+fleet\s/);

  // Cancelling a node cancels its subtree, and the confirmation says so.
  await page.locator('#cancel').click();
  assert.match(await page.locator('#subtree').innerText(), /1 run below it is open: cancelling this run cancels its whole subtree/);
  await page.screenshot({ path: path.join(SHOTS, 'cancel-subtree-confirm.png') });
  await page.locator('#confirm').click();
  assert.match(await page.locator('#answer').innerText(), /fuseboxd answered stop \(cancelled\)/);
  assert.match(await page.locator('#stopped-below').innerText(), /1 run below it was open: each is stopped with it/);

  // The root goes on; its page shows whose stop closed the grandchild, live.
  await page.goto(`${base}runs/ui/fleet`);
  await page.evaluate(() => { window.notReloaded = true; });
  const reason = (run) => page.locator(`#tree-table tr[data-run="${run}"] td.reason`);
  await reason('fleet-a-1').getByText('from fleet-a').waitFor();
  assert.match(await reason('fleet-a-1').innerText(), /^ancestor_stopped from fleet-a$/);
  assert.equal(await page.locator('#tree-table tr[data-run="fleet"] .state').innerText(), 'OPEN');
  assert.equal(await page.locator('#tree-table tr[data-run="fleet-b"] .state').innerText(), 'OPEN');
  assert.match(await page.locator('#tree-summary').innerText(), /3 runs started below this one, 1 open now/);
  const [bStatus] = await cli(stack.nats_url, ['run', 'ui/fleet-b']);
  const [aStatus] = await cli(stack.nats_url, ['run', 'ui/fleet-a-1']);
  assert.equal(aStatus.tree.stopped_by, 'fleet-a');
  assert.equal(bStatus.summary.open, true);
  await cli(stack.nats_url, ['cancel', 'ui/fleet']);
  await reason('fleet-b').getByText('from fleet').waitFor({ timeout: 10000 });
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the tree updated without a reload');
  await page.screenshot({ path: path.join(SHOTS, 'run-tree.png'), fullPage: true });
  for (const line of [/^STOPPED CANCELLED cancelled fleet$/, /^STOPPED CANCELLED cancelled fleet-a$/,
    /^STOPPED CANCELLED ancestor_stopped fleet-b$/, /^STOPPED CANCELLED ancestor_stopped fleet-a-1$/]) {
    await forest.line(line);
  }

  // The runs list filtered to the tree.
  await page.goto(`${base}?root=fleet`);
  assert.deepEqual((await page.locator('#runs-table tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.run))).sort(),
    ['ui/fleet', 'ui/fleet-a', 'ui/fleet-a-1', 'ui/fleet-b']);
  await page.close();
});

test('a non-loopback listener refuses requests without credentials, and needs them to start', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'fusebox-ui-'));
  const open = path.join(dir, 'open.toml');
  writeFileSync(open, `[nats]\nurls = ["${stack.nats_url}"]\n`);
  const refusing = start(path.join(BIN, 'fusebox'), ['ui', '--config', open, '--listen', '0.0.0.0:0']);
  assert.notEqual(await refusing.exited, 0, 'no credentials: it does not start');
  assert.match(refusing.stderr(), /not a loopback address/);

  const secured = path.join(dir, 'secured.toml');
  writeFileSync(secured, `[nats]\nurls = ["${stack.nats_url}"]\n\n[ui]\nuser = "ops"\npassword = "correct horse"\n`);
  const { url, line } = await startUi(['--config', secured, '--listen', '0.0.0.0:0']);
  assert.match(line, /basic auth/, 'it says so at start');
  const origin = loopbackOf(url);
  const without = await fetch(`${origin}/`);
  assert.equal(without.status, 401);
  assert.match(without.headers.get('www-authenticate'), /Basic/);
  const wrong = await fetch(`${origin}/`, { headers: { authorization: `Basic ${Buffer.from('ops:wrong').toString('base64')}` } });
  assert.equal(wrong.status, 401);
  const context = await browser.newContext({ httpCredentials: { username: 'ops', password: 'correct horse' } });
  const page = await context.newPage();
  const response = await page.goto(`${origin}/`);
  assert.equal(response.status(), 200);
  await row(page, 'runaway').waitFor();
  // Actions are recorded as the basic-auth user.
  await page.goto(`${origin}/runs/ui/runaway/cancel`);
  assert.match(await page.locator('main').innerText(), /done by ops/);
  await context.close();
});
