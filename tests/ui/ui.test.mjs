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
  const launchMs = Date.parse(await heldRow.locator('td:nth-child(5) time').getAttribute('datetime'));
  const deadlineMs = Date.parse(await heldRow.locator('td.deadline time').getAttribute('datetime'));
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

test('a protected instance past its deadline says so, and a tag naming no known run is not a link', async () => {
  const protectedId = await launchInstance(stack.moto_url, {
    'fusebox:managed': 'true', 'fusebox:tenant': 'ui', 'fusebox:run': 'wd-nobody', 'fusebox:max-lifetime': '1', 'fusebox:protect': 'true',
  });
  const page = await newPage();
  await page.goto(`${base}watchdog`);
  const kept = page.locator(`#instances tr[data-instance="${protectedId}"]`);
  await kept.locator('td.left', { hasText: 'past its deadline' }).waitFor({ timeout: 20000 });
  assert.match(await kept.locator('td.left').innerText(), /^past its deadline by \d+s \(protected: kept\)$/);
  assert.doesNotMatch(await kept.innerText(), /-\d+s/);
  assert.equal(await kept.locator('a').count(), 0, 'fuseboxd knows no run wd-nobody');
  assert.match(await kept.innerText(), /ui\/wd-nobody \(not a run fuseboxd knows\)/);
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
  // The grandchild's model call in flight is held here too, as every budget counts it.
  assert.match(await page.locator('#reserved').innerText(), /^1 call, 1000 tokens, \$0\.0200 \(its own and below/);

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

test("a stopped run's page says why in words first, in the words the model was told", async () => {
  const [status] = await cli(stack.nats_url, ['run', 'ui/runaway']);
  assert.match(status.stop_message, /refused calls kept being retried/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/runaway`);
  const summary = page.locator('#summary');
  // First: before the tree, the timeline and the report's fields.
  const order = await page.evaluate(() => ['summary', 'timeline', 'stop-report']
    .map((id) => document.getElementById(id)).map((el, i, all) => i === 0 || (all[i - 1].compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) !== 0));
  assert.deepEqual(order, [true, true, true], 'the summary comes before the timeline and the report');
  assert.match(await summary.locator('h2').innerText(), /Why it stopped/);
  assert.equal(await page.locator('#stop-message').innerText(), status.stop_message, "the stop's own sentence, whole");
  assert.match(await page.locator('#summary-calls').innerText(), /search \d+ calls, \d+ refused/);
  // Folded where long, and all of it there to unfold.
  const told = await page.locator('#summary-told').evaluate((el) => el.textContent);
  assert.match(told, /warn at step \d+: search\(.*already ran/s, 'the warning the model read');
  assert.match(told, /block at step [\d, ]+(and \d+)?: /, 'the refusals the model read');
  assert.match(await page.locator('#summary-resume').innerText(), /To resume: evidence that something changed.*verified_precondition_change/s);

  // The report's steps are the timeline's: each fired guard links to its row, whose
  // decision is the guard's action.
  const guards = page.locator('#fired-guards li');
  assert.ok(await guards.count() >= 3, 'warn, block and stop fired');
  for (const guard of await guards.all()) {
    const action = await guard.locator('span').first().innerText();
    const href = await guard.locator('a').getAttribute('href');
    const step = href.replace('#step-', '');
    const target = page.locator(`#timeline tr${href}`);
    // A block that escalated to the stop is that step's: its decision is the stop.
    const decided = await target.getAttribute('data-action');
    assert.ok(decided === action || decided === 'stop', `step ${step}: ${action} against ${decided}`);
    assert.equal(await target.locator('td').first().innerText(), step);
  }
  // Times to the millisecond, UTC; a result shows how long after its call it came; the
  // arguments column shows a call's arguments, not the whole event.
  const first = page.locator('#timeline tbody tr').first();
  assert.match(await first.locator('td').nth(1).innerText(), /^\d\d:\d\d:\d\d\.\d{3}$/);
  assert.match(await page.locator('#timeline thead').innerText(), /Time \(UTC\)/);
  assert.match(await page.locator('#timeline tr.e-tool_result .took').first().innerText(), /^\+\d+(\.\d+)? (ms|s)$/);
  const call = page.locator('#timeline tr.e-tool_call').first();
  await call.locator('td.args summary').click();
  const args = JSON.parse(await call.locator('td.args pre').innerText());
  assert.deepEqual(Object.keys(args).sort(), ['notes', 'query']);
  // The stop's sentence on its row is whole, not cut at a fixed width.
  const stopRow = page.locator('#timeline tr[data-action="stop"]').first();
  assert.equal(await stopRow.locator('td').last().innerText(), status.stop_message);
  await page.screenshot({ path: path.join(SHOTS, 'run-summary.png'), fullPage: true });

  // Download history: the same events, as JSON, as a file.
  const exported = await fetch(`${base}runs/ui/runaway/history.json`);
  assert.equal(exported.status, 200);
  assert.match(exported.headers.get('content-disposition'), /attachment; filename="ui-runaway.history.json"/);
  const history = await exported.json();
  assert.equal(history.events.length, await page.locator('#timeline tbody tr').count());
  assert.equal(history.status.stop_message, status.stop_message);
  await page.close();
});

test('a completed run shows how it ended, not a stop report', async () => {
  await agent(stack.nats_url, 'done', 'finished').line(/^FINISHED complete/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/finished`);
  assert.match(await page.locator('#summary h2').innerText(), /How it ended/);
  assert.match(await page.locator('#summary').innerText(), /finished normally after 2 steps: \W?all issues triaged/);
  assert.doesNotMatch(await page.locator('main').innerText(), /Stop report|Why it stopped|To resume/);
  assert.match(await page.locator('#stop-report h2').innerText(), /Final report/);
  await page.close();
});

test("live updates keep the reader's place: focus and what was unfolded", async () => {
  const slow = agent(stack.nats_url, 'loop', 'slow-loop', ['--pause-ms', '900']);
  await slow.line(/^execute/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/slow-loop`);
  const rows = page.locator('#timeline tbody tr');
  const fold = page.locator('#timeline tr.e-tool_call td.args details').first();
  await fold.waitFor();
  const key = await fold.getAttribute('data-key');
  await fold.locator('summary').click();
  await fold.locator('summary').focus();
  const before = await rows.count();
  await page.waitForFunction((n) => document.querySelectorAll('#timeline tbody tr').length > n, before, { timeout: 15000 });
  const kept = page.locator(`details[data-key="${key}"]`);
  assert.equal(await kept.evaluate((d) => d.open), true, 'still unfolded after the update');
  assert.equal(await page.evaluate((k) => document.activeElement?.closest('details')?.dataset.key ?? document.activeElement?.tagName, key), key, 'focus kept');
  // The same on the runs list: a focused link stays focused while rows change.
  await page.goto(base);
  const link = page.locator('tr[data-run="ui/slow-loop"] a').first();
  await link.focus();
  const state = page.locator('tr[data-run="ui/slow-loop"] .state');
  await state.getByText('STOPPED_LOOP_GUARD').waitFor({ timeout: 30000 });
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute('href')), '/runs/ui/slow-loop', 'focus kept on the runs list');
  await page.close();
});

test('bad input is answered at once, as a page with the right status', async () => {
  const started = Date.now();
  const long = await fetch(`${base}runs/ui/${'r'.repeat(4096)}`);
  assert.equal(long.status, 404);
  assert.ok(Date.now() - started < 1500, `answered at once (${Date.now() - started} ms)`);
  assert.match(long.headers.get('content-type'), /text\/html/);
  assert.match(await long.text(), /is not a run id|at most 256/);

  const noToken = await fetch(`${base}runs/ui/runaway/cancel`, { method: 'POST', body: new URLSearchParams({ reason: 'x' }) });
  assert.equal(noToken.status, 403);
  assert.match(noToken.headers.get('content-type'), /text\/html/);
  assert.match(await noToken.text(), /Not sent from this page/);

  const badQuery = await fetch(`${base}runs/ui/runaway?after=abc`);
  assert.equal(badQuery.status, 400);
  assert.match(await badQuery.text(), /Bad input/);

  // A valid token does not make another site's request this page's.
  const form = await (await fetch(`${base}runs/ui/steady/cancel`)).text();
  const csrf = form.match(/name="csrf" value="([^"]+)"/)[1];
  const evil = await fetch(`${base}runs/ui/steady/cancel`, {
    method: 'POST',
    headers: { origin: 'http://evil.example', 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf, reason: 'x' }),
  });
  assert.equal(evil.status, 403);
  assert.match(await evil.text(), /another site/);
  const forged = await fetch(`${base}runs/ui/steady/cancel`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf: `${Math.floor(Date.now() / 1000)}.AAAAAAAAAAAAAAAAAAAAAAAA`, reason: 'x' }),
  });
  assert.equal(forged.status, 403, 'a token this process did not issue');
});

test('at 390 px every column is reachable, rows stay one line, and states differ by colour', async () => {
  const page = await newPage({ width: 390, height: 844 });
  await page.goto(base);
  const runaway = row(page, 'runaway');
  await runaway.waitFor();
  const stateBox = await runaway.locator('.state').boundingBox();
  assert.ok(stateBox.x + stateBox.width <= 390, `the state is on screen (right edge ${stateBox.x + stateBox.width})`);
  const height = (await runaway.boundingBox()).height;
  assert.ok(height < 40, `a row is one line tall (${height}px)`);
  const box = page.locator('#runs-table').locator('xpath=..');
  await box.evaluate((el) => { el.scrollLeft = el.scrollWidth; });
  const last = await page.locator('#runs-table thead th').last().boundingBox();
  assert.ok(last.x >= 0 && last.x + last.width <= 391, `the last column scrolls into view (${last.x}..${last.x + last.width})`);
  const colour = (state) => page.evaluate((s) => {
    const probe = document.createElement('span');
    probe.className = `state s-${s}`;
    document.body.append(probe);
    return getComputedStyle(probe).color;
  }, state);
  const colours = await Promise.all(['CANCELLED', 'STOPPED_LOOP_GUARD', 'FAILED', 'OPEN'].map(colour));
  assert.notEqual(colours[0], colours[1], 'CANCELLED is not the colour of STOPPED');
  assert.equal(colours[1], colours[2]);
  await page.screenshot({ path: path.join(SHOTS, 'runs-390.png'), fullPage: true });
  await page.goto(`${base}runs/ui/runaway`);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 1, `the run page fits (overflow ${overflow}px)`);
  await page.screenshot({ path: path.join(SHOTS, 'run-390.png'), fullPage: true });
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

// Last: its 130 runs are the newest, and would push the others off the first page.
test('finding runs: any case, known values offered, a time range, and where the page is', async () => {
  const page = await newPage();
  for (const [query, run] of [['tenant=UI', 'runaway'], ['tenant=u', 'runaway'], ['agent=RESEARCH', 'runaway'],
    ['reason=CONSECUTIVE', 'runaway'], ['q=RUNAWAY', 'runaway'], ['from=1h', 'runaway']]) {
    await page.goto(`${base}?${query}`);
    assert.equal(await row(page, run).count(), 1, query);
  }
  await page.goto(`${base}?from=${encodeURIComponent('2001-01-01 00:00')}&to=${encodeURIComponent('2001-01-02')}`);
  assert.match(await page.locator('#runs-table').innerText(), /No runs match/, 'a range with no activity');
  const bad = await page.goto(`${base}?from=yesterday`);
  assert.equal(bad.status(), 400);
  assert.match(await page.locator('main').innerText(), /not a time/);

  await page.goto(base);
  const known = (id) => page.locator(`#${id} option`).evaluateAll((os) => os.map((o) => o.value));
  assert.ok((await known('known-tenants')).includes('ui'));
  assert.ok((await known('known-agents')).includes('researcher'));
  assert.ok((await known('known-reasons')).includes('consecutive_blocks'));

  // Pages say where they are, and go back as well as on.
  const crowd = agent(stack.nats_url, 'crowd', 'crowd', ['--max-calls', '130']);
  await crowd.line(/^STARTED 130/, 60000);
  await page.goto(`${base}?agent=crowd`);
  assert.equal(await page.locator('#position').innerText(), 'Runs 1–100 of 130, newest activity first.');
  await page.locator('#older').click();
  await page.waitForURL(/after=/);
  assert.equal(await page.locator('#position').innerText(), 'Runs 101–130 of 130, newest activity first.');
  assert.equal(await page.locator('#older').count(), 0, 'the last page');
  await page.locator('#newer').click();
  await page.waitForURL(/before=/);
  assert.equal(await page.locator('#position').innerText(), 'Runs 1–100 of 130, newest activity first.');
  assert.equal(await page.locator('#runs-table tbody tr').count(), 100);

  // The fleet at a glance: the last hour by state, the top stop reasons, the costliest.
  await page.goto(base);
  assert.match(await page.locator('#fleet-states').innerText(), /STOPPED_LOOP_GUARD \d+/);
  assert.match(await page.locator('#fleet-reasons').innerText(), /consecutive_blocks \d+/);
  assert.match(await page.locator('#fleet-costliest').innerText(), /Costing most now/);
  await page.screenshot({ path: path.join(SHOTS, 'runs-fleet.png'), fullPage: true });
  await page.close();
});
