// Shared helpers of the server end-to-end tests: start `lilac serve` on a free port (--port 0; the
// chosen port is read from its first line), wait for /health, stop it (SIGTERM, then SIGKILL).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const LILAC = process.env.LILAC_BINARY;
export const DEMO = process.env.LILAC_DEMO_MODEL;
export const SOURCE = process.env.LILAC_SOURCE_DIR || path.resolve(import.meta.dirname, '../..');
if (!LILAC) throw new Error('set LILAC_BINARY (ctest does)');

const live = new Set();
process.on('exit', () => { for (const p of live) try { p.kill('SIGKILL'); } catch {} });

export function writeScript(obj) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-e2e-'));
  const file = path.join(dir, 'script.json');
  fs.writeFileSync(file, JSON.stringify(obj));
  return file;
}

// `env`: extra environment variables for the server process. The returned object's log() is its stderr,
// output() its stdout and stderr.
export async function startServer(args = [], { model = DEMO, timeoutMs = 60000, env = {} } = {}) {
  if (!model) throw new Error('no model: set LILAC_DEMO_MODEL (ctest does) or pass { model }');
  const proc = spawn(LILAC, ['serve', '--model', model, '--port', '0', '--threads', '2', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  live.add(proc);
  let out = '';
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`lilac serve did not start:\n${out}${log}`)), timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`lilac serve exited ${code}:\n${out}${log}`)); });
  });
  const deadline = Date.now() + timeoutMs;
  let health;
  for (;;) {
    health = await fetch(`${url}/health`).catch(() => null);
    if (health && health.status === 200) break;
    if (Date.now() > deadline) throw new Error(`server never became healthy:\n${out}${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const server = {
    url,
    proc,
    log: () => log,
    output: () => out + log,
    async stop() {
      if (proc.exitCode !== null) return;
      const done = new Promise((r) => proc.on('exit', r));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 5000);
      await done;
      clearTimeout(t);
      live.delete(proc);
    },
  };
  return server;
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: res.status, headers: res.headers, text, json };
}

export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

// Parse an SSE body into its data payloads (JSON objects, and the final '[DONE]').
export function sseEvents(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    for (const line of block.split('\n')) {
      if (!line.startsWith('data: ')) continue;
      const d = line.slice(6);
      out.push(d === '[DONE]' ? d : JSON.parse(d));
    }
  }
  return out;
}

export function assertErrorBody(assert, r, status, { code, param, type } = {}) {
  assert.equal(r.status, status, `status for ${r.text}`);
  assert.ok(r.json && r.json.error, `OpenAI error body expected, got ${r.text}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.ok('type' in e && 'param' in e && 'code' in e, `error has type/param/code: ${r.text}`);
  if (code !== undefined) assert.equal(e.code, code, r.text);
  if (param !== undefined) assert.equal(e.param, param, r.text);
  if (type !== undefined) assert.equal(e.type, type, r.text);
}
