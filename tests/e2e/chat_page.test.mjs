// The chat page (GET /) in a real browser: Debian's chromium, headless, driven by puppeteer-core.
// Against the demo model: a message gets a streamed answer with its time to first token and tokens/s,
// Continue extends an answer cut by max_tokens, and Stop ends a long answer (the server cancels it).
// Against the scripted backend: Markdown, code,
// reasoning and tool calls rendered (HTML in answers stays text), conversations kept across a reload,
// --api-key asked for and kept; in hybrid mode every answer has a local/cloud badge with the reason.
// Screenshots go to LILAC_ARTIFACTS_DIR (build/test-artifacts). Without chromium the test skips, except
// in CI (CI set), where scripts/install-deps.sh installs it and its absence is a failure.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, metrics, writeScript, SOURCE } from './helpers.mjs';

const require = createRequire(`${SOURCE}/package.json`);
const CHROMIUM = [process.env.LILAC_CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome']
  .find((p) => p && fs.existsSync(p));
if (!CHROMIUM && process.env.CI) throw new Error('chromium is not installed, and this is CI: scripts/install-deps.sh must install it');
const skip = CHROMIUM ? false : 'chromium is not installed (bash scripts/install-deps.sh installs it); this test runs in CI';
const ARTIFACTS = process.env.LILAC_ARTIFACTS_DIR || fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-artifacts-'));
fs.mkdirSync(ARTIFACTS, { recursive: true });

const SCRIPT = {
  rules: [
    { match: 'markdown', reply: 'Thinking hard.\n</think>\n\n# Title\n\nSome **bold** and `code` <img src=x onerror="window.pwned=1"> [x](javascript:alert(1))\n\n```js\nconst x = 1 < 2;\n```\n\n- item one\n- item two' },
    { match: 'weather', reply: 'Checking.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>' },
  ],
  default: { reply: 'Hello from the script.' },
};
const TOOLS = JSON.stringify([{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]);

let browser;
const servers = [];
before(async () => {
  if (skip) return;
  const puppeteer = require('puppeteer-core');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-chromium-'));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', `--user-data-dir=${profile}`],
  });
});
after(async () => {
  await browser?.close();
  for (const s of servers) await s.stop();
});

async function serve(args, opts) {
  const s = await startServer(args, opts);
  servers.push(s);
  return s;
}

// A fresh page (its own browser context: empty localStorage) on `url`, ready once the model is known.
async function openPage(url, { key } = {}) {
  const ctx = await browser.createBrowserContext();
  const page = await ctx.newPage();
  page.on('pageerror', (e) => { throw new Error(`page error: ${e.message}`); });
  await page.setViewport({ width: 1200, height: 800 });
  await page.goto(url);
  if (key) {
    await page.waitForSelector('#key-dialog[open]');
    await page.type('#key-input', key);
    await page.click('#key-save');
  }
  await page.waitForSelector('body[data-ready="1"]');
  return page;
}

async function setField(page, id, value) {
  await page.evaluate((i, v) => { document.getElementById(i).value = v; }, id, value);
}

async function send(page, text) {
  const n = await page.$$eval('.msg.assistant', (els) => els.length);
  await page.type('#input', text);
  await page.click('#send');
  await page.waitForFunction((k) => document.querySelectorAll('.msg.assistant').length > k, {}, n);
}

const last = (page, fn) => page.$eval('.msg.assistant:last-of-type', fn);
const waitState = (page, states, timeout = 60000) => page.waitForFunction((ss) => {
  const els = document.querySelectorAll('.msg.assistant');
  return els.length && ss.includes(els[els.length - 1].dataset.state);
}, { timeout }, states);
const shot = (page, name) => page.screenshot({ path: path.join(ARTIFACTS, `chat_page_${name}.png`), fullPage: true });

test('demo model: a streamed answer with TTFT and tokens/s; Stop ends a long answer', { skip }, async () => {
  // The exact fp32 reference: the same greedy tokens on every CPU.
  const srv = await serve(['--backend', 'cpu-ref', '--max-seq', '4096']);
  const page = await openPage(srv.url);
  await page.evaluate(() => { document.getElementById('set-thinking').checked = false; });
  await setField(page, 'set-max-tokens', '12');
  await setField(page, 'set-temperature', '0');
  await send(page, 'Hello! Say something.');
  await waitState(page, ['done']);
  const a = await last(page, (el) => ({
    text: el.querySelector('.content')?.textContent ?? '', ttft: el.querySelector('.ttft')?.dataset.ms,
    tps: el.querySelector('.tps')?.dataset.tps, tokens: el.querySelector('.tokens')?.textContent, error: el.querySelector('.error')?.textContent,
  }));
  assert.equal(a.error, undefined);
  assert.ok(a.text.length > 0, 'the answer has text');
  assert.ok(Number(a.ttft) >= 0, `TTFT shown: ${JSON.stringify(a)}`);
  assert.ok(Number(a.tps) > 0, `tokens/s shown: ${JSON.stringify(a)}`);
  const n = Number(a.tokens?.match(/^(\d+) tokens$/)?.[1]);
  assert.ok(n >= 1 && n <= 12, `token count shown: ${JSON.stringify(a)}`);
  await shot(page, 'demo_answer');

  // Cut by max_tokens: Continue asks for more of the same answer (a prefill of what it has), appended to it.
  assert.equal(await last(page, (el) => el.querySelector('button.continue')?.textContent), 'Continue');
  await page.click('.msg.assistant:last-of-type button.continue');
  await waitState(page, ['done']);
  const more = await last(page, (el) => ({ text: el.querySelector('.content')?.textContent ?? '', error: el.querySelector('.error')?.textContent }));
  assert.equal(more.error, undefined);
  assert.ok(more.text.startsWith(a.text.trimEnd()) && more.text.length > a.text.trimEnd().length, JSON.stringify({ a: a.text, more: more.text }));
  assert.equal(await page.$$eval('.msg.assistant', (els) => els.length), 1, 'the same answer, not a new one');

  // A long answer, stopped while it streams.
  const before = await metrics(srv.url);
  await setField(page, 'set-max-tokens', '3000');
  await send(page, 'Now tell me a very long story.');
  await page.waitForFunction(() => (document.querySelector('.msg.assistant:last-of-type .content')?.textContent.length ?? 0) > 20, { timeout: 60000 });
  await page.click('#stop');
  await waitState(page, ['stopped']);
  const len = await last(page, (el) => el.querySelector('.content').textContent.length);
  let m;
  const deadline = Date.now() + 10000;
  do {
    await new Promise((r) => setTimeout(r, 100));
    m = await metrics(srv.url);
  } while (m.lilac_cancelled_total <= before.lilac_cancelled_total && Date.now() < deadline);
  assert.equal(m.lilac_cancelled_total, before.lilac_cancelled_total + 1, 'the server cancelled the generation');
  assert.ok(m.lilac_generated_tokens_total - before.lilac_generated_tokens_total < 3000);
  assert.equal(await last(page, (el) => el.querySelector('.content').textContent.length), len, 'nothing more after Stop');
  assert.equal(await last(page, (el) => el.querySelector('.stopped')?.textContent), 'stopped');
  assert.equal(await page.$eval('#send', (b) => b.disabled), false);
  assert.equal(await page.$eval('#stop', (b) => b.hidden), true);
  await shot(page, 'demo_stopped');
});

test('scripted: Markdown, code, reasoning and tool calls; HTML stays text; conversations survive a reload', { skip }, async () => {
  const srv = await serve(['--backend', `scripted:${writeScript(SCRIPT)}`]);
  const page = await openPage(srv.url);
  await send(page, 'show me markdown');
  await waitState(page, ['done']);
  const r = await last(page, (el) => ({
    reasoning: el.querySelector('details.reasoning .reasoning-text')?.textContent,
    open: el.querySelector('details.reasoning')?.open,
    h1: el.querySelector('.content h1')?.textContent,
    strong: el.querySelector('.content strong')?.textContent,
    code: el.querySelector('.content pre code')?.textContent,
    lang: el.querySelector('.content pre code')?.dataset.lang,
    items: [...el.querySelectorAll('.content li')].map((li) => li.textContent),
    imgs: el.querySelectorAll('img').length,
    links: [...el.querySelectorAll('a')].map((x) => x.getAttribute('href')),
    text: el.querySelector('.content').textContent,
  }));
  assert.equal(r.reasoning, 'Thinking hard.');
  assert.equal(r.open, false, 'reasoning collapsed once the answer is done');
  assert.equal(r.h1, 'Title');
  assert.equal(r.strong, 'bold');
  assert.equal(r.code, 'const x = 1 < 2;');
  assert.equal(r.lang, 'js');
  assert.deepEqual(r.items, ['item one', 'item two']);
  assert.equal(r.imgs, 0, 'no element from the answer\'s HTML');
  assert.deepEqual(r.links, [], 'no javascript: link');
  assert.match(r.text, /<img src=x onerror="window.pwned=1">/);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  await shot(page, 'markdown');

  await setField(page, 'set-tools', TOOLS);
  await send(page, 'weather in Paris?');
  await waitState(page, ['done']);
  assert.equal(await last(page, (el) => el.querySelector('.tool-call .name')?.textContent), 'get_weather');
  assert.deepEqual(JSON.parse(await last(page, (el) => el.querySelector('.tool-call code').textContent)), { city: 'Paris' });
  await shot(page, 'tool_call');

  await page.reload();
  await page.waitForSelector('body[data-ready="1"]');
  assert.equal(await page.$$eval('#conversations li', (l) => l.length), 1);
  assert.equal(await page.$eval('#conversations li .title', (t) => t.textContent), 'show me markdown');
  assert.equal(await page.$$eval('.msg', (l) => l.length), 4);
  await page.click('#new-chat');
  assert.equal(await page.$$eval('#conversations li', (l) => l.length), 2);
  assert.equal(await page.$$eval('.msg', (l) => l.length), 0);
});

test('--api-key: the page asks for the key, keeps it, and chats', { skip }, async () => {
  const srv = await serve(['--backend', `scripted:${writeScript(SCRIPT)}`, '--api-key', 'page-key']);
  const page = await openPage(srv.url, { key: 'page-key' });
  await page.evaluate(() => { document.getElementById('set-thinking').checked = false; });
  await send(page, 'hello there');
  await waitState(page, ['done']);
  assert.equal(await last(page, (el) => el.querySelector('.content').textContent), 'Hello from the script.');
  assert.equal(await page.evaluate(() => localStorage.getItem('lilac.apiKey')), 'page-key');
  await shot(page, 'api_key');
});

test('hybrid: every answer has a local or cloud badge with the policy reason', { skip }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-page-hybrid-'));
  const policy = path.join(dir, 'policy.json');
  fs.writeFileSync(policy, JSON.stringify({ default_route: 'cloud', rules: [{ name: 'falcon', keywords: ['project falcon'] }] }));
  const cloud = await serve(['--backend', `scripted:${writeScript({ default: { reply: 'Hello from the cloud.' } })}`, '--model-name', 'cloudy']);
  const router = await serve(['--backend', `scripted:${writeScript({ default: { reply: 'Hello from local.' } })}`,
    '--upstream', `${cloud.url}/v1`, '--upstream-model', 'cloudy', '--route-policy', policy]);
  const page = await openPage(router.url);
  await page.evaluate(() => { document.getElementById('set-thinking').checked = false; });
  await send(page, 'hello');
  await waitState(page, ['done']);
  const c = await last(page, (el) => ({ text: el.querySelector('.content').textContent, route: el.querySelector('.badge')?.dataset.route, reason: el.querySelector('.route-reason')?.textContent }));
  assert.deepEqual(c, { text: 'Hello from the cloud.', route: 'cloud', reason: 'default' });
  await send(page, 'what about project falcon?');
  await waitState(page, ['done']);
  const l = await last(page, (el) => ({ text: el.querySelector('.content').textContent, route: el.querySelector('.badge')?.dataset.route, reason: el.querySelector('.route-reason')?.textContent }));
  assert.deepEqual(l, { text: 'Hello from local.', route: 'local', reason: 'sensitive: rule:falcon' });
  await shot(page, 'hybrid_badges');
});
