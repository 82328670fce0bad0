// The operator's page in Firefox: Debian's firefox-esr, headless, driven by
// puppeteer-core over WebDriver BiDi (playwright-core drives only Playwright's own
// patched Firefox, which is not reachable here). The core checks of ui.test.mjs: the
// runs page updates live, a run's page shows its blocks and stop report, markup from
// an event is text; the summary says why in words and its steps are the timeline's; a
// live update keeps what was unfolded and the focus; filters match in any case; bad
// input is a page at once; this daemon runs without a watchdog, and its page says so.
//   node --test tests/ui/firefox.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

import { REPO, SHOTS, agent, cli, killAll, startStack, startUi } from './support.mjs';

const require = createRequire(path.join(REPO, 'tests/npm/package.json'));
const puppeteer = require('puppeteer-core');

let stack;
let base;
let browser;

before(async () => {
  stack = await startStack();
  ({ url: base } = await startUi(['--nats-url', stack.nats_url, '--listen', '127.0.0.1:0', '--refresh-ms', '300']));
  browser = await puppeteer.launch({
    browser: 'firefox',
    executablePath: process.env.FIREFOX ?? '/usr/bin/firefox-esr',
    headless: true,
  });
});

after(async () => {
  await browser?.close();
  killAll();
});

async function newPage() {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.dialogs = [];
  page.on('dialog', (d) => { page.dialogs.push(d.message()); d.dismiss(); });
  return page;
}

const row = (run) => `tr[data-run="ui/${run}"]`;
const text = (page, selector) => page.$eval(selector, (e) => e.innerText);

test('Firefox: a runaway agent appears live and turns STOPPED_LOOP_GUARD without a reload', async () => {
  const page = await newPage();
  await page.goto(base);
  await page.evaluate(() => { window.notReloaded = true; });
  const runaway = agent(stack.nats_url, 'loop', 'runaway', ['--pause-ms', '700']);
  await page.waitForSelector(row('runaway'), { timeout: 20000 });
  assert.equal(await text(page, `${row('runaway')} .state`), 'OPEN', 'seen while it runs');
  await page.waitForFunction(
    (selector) => document.querySelector(selector)?.innerText === 'STOPPED_LOOP_GUARD',
    { timeout: 30000 },
    `${row('runaway')} .state`,
  );
  assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was not reloaded');
  assert.match(await text(page, 'nav.counts'), /STOPPED_LOOP_GUARD \(1\)/);
  await page.screenshot({ path: path.join(SHOTS, 'firefox-runs.png'), fullPage: true });
  await runaway.line(/^STOPPED STOPPED_LOOP_GUARD/);
  await page.close();
});

test("Firefox: a stopped run's page shows the blocks, the stop report, and markup as text", async () => {
  const page = await newPage();
  const response = await page.goto(`${base}runs/ui/runaway`);
  assert.equal(response.status(), 200);
  const block = '#timeline tr[data-action="block"]';
  assert.match(await text(page, block), /search[\s\S]*block\s+same_call_repeat\s+exact_repeat\s+\d/);
  const report = await text(page, '#stop-report');
  assert.match(report, /STOPPED_LOOP_GUARD/);
  assert.match(report, /Fired guards/);
  await page.click(`${block} details summary`);
  const args = await text(page, `${block} details pre`);
  assert.ok(args.includes("<script>alert('pwned')</script>"), 'the markup shows as text');
  assert.equal(await page.$$eval('script', (s) => s.length), 1, "only the page's own script");
  assert.deepEqual(page.dialogs, [], 'no script of the event ran');
  await page.screenshot({ path: path.join(SHOTS, 'firefox-run.png'), fullPage: true });
  await page.close();
});

test("Firefox: the summary says why in words, and the report's steps are the timeline's", async () => {
  const [status] = await cli(stack.nats_url, ['run', 'ui/runaway']);
  const page = await newPage();
  await page.goto(`${base}runs/ui/runaway`);
  assert.equal(await text(page, '#stop-message'), status.stop_message);
  assert.match(await text(page, '#summary-told'), /warn at step \d+:\s*search\(/);
  const guards = await page.$$eval('#fired-guards li', (items) => items.map((li) => [li.querySelector('span').innerText, li.querySelector('a').getAttribute('href')]));
  assert.ok(guards.length >= 3);
  for (const [action, href] of guards) {
    // A block that escalated to the stop is that step's: its decision is the stop.
    const decided = await page.$eval(`#timeline tr${href}`, (tr) => tr.dataset.action);
    assert.ok(decided === action || decided === 'stop', `${href}: ${action} against ${decided}`);
  }
  await page.screenshot({ path: path.join(SHOTS, 'firefox-summary.png'), fullPage: true });
  await page.close();
});

test("Firefox: a live update keeps the unfolded argument and the focus", async () => {
  const slow = agent(stack.nats_url, 'loop', 'ff-slow', ['--pause-ms', '900']);
  await slow.line(/^execute/);
  const page = await newPage();
  await page.goto(`${base}runs/ui/ff-slow`);
  const fold = '#timeline tr.e-tool_call td.args details';
  await page.waitForSelector(fold);
  const key = await page.$eval(fold, (d) => d.dataset.key);
  await page.click(`${fold} summary`);
  await page.focus(`details[data-key="${key}"] summary`);
  const before = await page.$$eval('#timeline tbody tr', (rows) => rows.length);
  await page.waitForFunction((n) => document.querySelectorAll('#timeline tbody tr').length > n, { timeout: 15000 }, before);
  assert.equal(await page.$eval(`details[data-key="${key}"]`, (d) => d.open), true, 'still unfolded');
  assert.equal(await page.evaluate(() => document.activeElement?.closest('details')?.dataset.key), key, 'focus kept');
  await page.close();
});

test('Firefox: filters in any case; bad input a page at once; the watchdog page of a daemon without one', async () => {
  const page = await newPage();
  await page.goto(`${base}?tenant=UI&reason=Consecutive`);
  await page.waitForSelector(row('runaway'));
  assert.match(await text(page, '#position'), /^Runs 1–1 of 1/);
  const started = Date.now();
  const long = await page.goto(`${base}runs/ui/${'r'.repeat(4096)}`);
  assert.equal(long.status(), 404);
  assert.ok(Date.now() - started < 1500, 'at once');
  const watchdog = await page.goto(`${base}watchdog`);
  assert.equal(watchdog.status(), 200);
  assert.match(await text(page, '#watchdog-disabled'), /disabled on this daemon/);
  const [answer] = await cli(stack.nats_url, ['watchdog', 'status']);
  assert.equal(answer.enabled, false);
  await page.screenshot({ path: path.join(SHOTS, 'firefox-watchdog-off.png'), fullPage: true });
  await page.close();
});
