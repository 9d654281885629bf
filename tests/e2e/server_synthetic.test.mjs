// `lilac serve --synthetic-layers N`: random weights of the real model's shape behind a model folder's
// tokenizer and chat template, for benchmarks over HTTP without a checkpoint (bench/load_test.mjs
// --serve-args "--synthetic-layers 40" on the GPU). Here one real-width layer on the fast CPU path: the
// server says the weights are random, answers with the number of tokens asked for, and rejects a bad count.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, LILAC, DEMO } from './helpers.mjs';

let srv;
after(async () => { await srv?.stop(); });

test('serves random weights of the real shape with the folder\'s tokenizer', async () => {
  srv = await startServer(['--backend', 'cpu', '--synthetic-layers', '1', '--max-seq', '256', '--max-batch', '2'],
    { timeoutMs: 240000 });
  assert.match(srv.output(), /random weights of the Qwen3\.6-35B-A3B shape, 1 layers/);
  const res = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'demo', prompt: 'Hello there, how are you today?', max_tokens: 5, temperature: 0 }),
  });
  const body = await res.json();
  assert.equal(res.status, 200, JSON.stringify(body));
  assert.ok(body.usage.prompt_tokens >= 5, JSON.stringify(body.usage));
  assert.ok(body.usage.completion_tokens >= 1 && body.usage.completion_tokens <= 5, JSON.stringify(body.usage));
  assert.equal(typeof body.choices[0].text, 'string');
});

test('a bad --synthetic-layers is refused with a message naming the flag', () => {
  const r = spawnSync(LILAC, ['serve', '--model', DEMO, '--synthetic-layers', '-1', '--port', '0'], { encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr + r.stdout, /--synthetic-layers/);
});
