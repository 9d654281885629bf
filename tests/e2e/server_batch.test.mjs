// Continuous batching end to end: `lilac serve --max-batch 4` on the demo model (CPU backend), driven
// by concurrent streaming clients (the official `openai` npm package). The streams are answered
// concurrently (every stream's first token arrives before any stream finishes: each prompt is one
// prefill chunk, so all four have a first token within four scheduler steps) and each stream is
// token for token (and logprob for logprob) what the same request gets alone; a client that goes away
// frees its session.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, metrics, SOURCE } from './helpers.mjs';

const require = createRequire(`${SOURCE}/package.json`);
const OpenAI = require('openai');

let srv, client;

before(async () => {
  srv = await startServer(['--backend', 'cpu', '--max-seq', '2048', '--max-batch', '4', '--prefill-chunk', '64']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

// Four requests of different shapes: greedy, seeded sampling with penalties, logprobs, a stop string.
const requests = [
  { messages: [{ role: 'user', content: 'Write a long story about a lighthouse keeper.' }], max_tokens: 28, temperature: 0 },
  { messages: [{ role: 'user', content: 'List some rivers of Europe, please.' }], max_tokens: 24, temperature: 0.9, top_p: 0.95,
    seed: 1234, presence_penalty: 0.5, frequency_penalty: 0.3 },
  { messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Why is the sky blue?' }],
    max_tokens: 24, temperature: 0.7, seed: 99, logprobs: true, top_logprobs: 2 },
  { messages: [{ role: 'user', content: 'Count slowly from one to twenty.' }], max_tokens: 26, temperature: 0 },
];

// Streams one request; `log` records (index, kind) in arrival order across concurrent streams.
async function stream(i, req, log) {
  const s = await client.chat.completions.create({ model: 'demo', ...req, stream: true });
  const out = { text: '', logprobs: [], finish: null, tokens: 0 };
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    const piece = (c.delta?.content ?? '') + (c.delta?.reasoning_content ?? '');
    if (piece) {
      if (out.tokens === 0) log?.push([i, 'first']);
      out.text += piece;
      out.tokens++;
    }
    for (const lp of c.logprobs?.content ?? []) out.logprobs.push([lp.token, lp.logprob, lp.top_logprobs.map((t) => [t.token, t.logprob])]);
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  log?.push([i, 'end']);
  return out;
}

test('concurrent streams are served together, each token for token as alone', async () => {
  const models = await client.models.list();
  const id = models.data[0].id;
  for (const r of requests) r.model = id;
  // Alone: one after the other. Request 3 gets a stop string cut from its own free-running text.
  const free = await stream(3, requests[3]);
  assert.ok(free.text.length > 12, free.text);
  // (late in the text, so that this stream still runs most of its tokens)
  const cut = Math.floor(free.text.length * 0.7);
  requests[3].stop = [free.text.slice(cut, cut + 3)];
  const alone = [];
  for (let i = 0; i < requests.length; i++) alone.push(await stream(i, requests[i]));
  assert.equal(alone[3].finish, 'stop');
  assert.ok(alone[2].logprobs.length > 0);

  const before = await metrics(srv.url);
  const log = [];
  const together = await Promise.all(requests.map((r, i) => stream(i, r, log)));
  for (let i = 0; i < requests.length; i++) {
    assert.equal(together[i].text, alone[i].text, `request ${i}`);
    assert.deepEqual(together[i].logprobs, alone[i].logprobs, `request ${i}`);
    assert.equal(together[i].finish, alone[i].finish, `request ${i}`);
  }
  // Interleaved: all four streams had produced text before the first one ended.
  const firstEnd = log.findIndex(([, kind]) => kind === 'end');
  const startedBefore = new Set(log.slice(0, firstEnd).filter(([, k]) => k === 'first').map(([i]) => i));
  assert.equal(startedBefore.size, 4, JSON.stringify(log));
  const after = await metrics(srv.url);
  const steps = after.lilac_decode_steps_total - before.lilac_decode_steps_total;
  const single = after['lilac_decode_batch_size_bucket{le="1"}'] - before['lilac_decode_batch_size_bucket{le="1"}'];
  assert.ok(steps > 0 && single < steps, `decode steps ${steps}, of batch size 1: ${single}`);
  assert.ok(after['lilac_decode_batch_size_bucket{le="4"}'] - before['lilac_decode_batch_size_bucket{le="2"}'] > 0);
  assert.equal(after.lilac_sequence_pool_capacity, 4);
  assert.equal(after.lilac_sequence_pool_in_use, 0);
});

test('a client that goes away frees its session; the others are unaffected', async () => {
  const models = await client.models.list();
  const id = models.data[0].id;
  const req = { model: id, messages: [{ role: 'user', content: 'Tell me everything about bridges.' }], max_tokens: 400, temperature: 0 };
  const other = { model: id, messages: [{ role: 'user', content: 'And about tunnels?' }], max_tokens: 16, temperature: 0 };
  const otherAlone = await stream(0, other);
  const ctl = new AbortController();
  const s = await client.chat.completions.create({ ...req, stream: true }, { signal: ctl.signal });
  const otherTogether = stream(1, other);
  let n = 0;
  try {
    for await (const ch of s) {
      const c = ch.choices[0];
      if ((c?.delta?.reasoning_content || c?.delta?.content) && ++n === 3) {
        ctl.abort();
        break;
      }
    }
  } catch (e) {
    assert.equal(e.name, 'APIUserAbortError', String(e));
  }
  assert.equal(n, 3);
  assert.equal((await otherTogether).text, otherAlone.text);
  // The server notices at its next write and cancels the generation, which frees the session.
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(srv.url);
    if (m.lilac_sequence_pool_in_use === 0 && m.lilac_cancelled_total >= 1) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(m.lilac_sequence_pool_in_use, 0);
  assert.ok(m.lilac_cancelled_total >= 1);
  assert.ok(m.lilac_generated_tokens_total > 0);
});
