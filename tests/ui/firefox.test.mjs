// The operator's page in Firefox: Debian's firefox-esr, headless, driven by
// puppeteer-core over WebDriver BiDi (playwright-core drives only Playwright's own
// patched Firefox, which is not reachable here). The core checks of ui.test.mjs: the
// runs page updates live, a run's page shows its blocks and stop report, markup from
// an event is text.
//   node --test tests/ui/firefox.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

import { REPO, SHOTS, agent, killAll, startStack, startUi } from './support.mjs';

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
