// End-to-end tests of `lilac serve --backend scripted:FILE`: the scripted backend emits chosen replies
// token by token through the real tokenizer, output parser, scheduler and HTTP layer, so tool calls,
// reasoning, stop strings, cancellation, queue limits and auth can be checked exactly.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, postJson, metrics, sseEvents, assertErrorBody, writeScript, SOURCE } from './helpers.mjs';

const require = createRequire(`${SOURCE}/package.json`);
const OpenAI = require('openai');

const script = writeScript({
  rules: [
    // first: the forced prefix (<function=get_weather>) is part of the text the rules see
    { match: 'FORCED', reply: '<parameter=city>\nRome\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>' },
    { match: 'weather', reply: 'The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>' },
    { match: 'reason', reply: 'Let me think step by step.\n</think>\n\nThe answer is 42.' },
    { match: 'stopword', reply: '</think>\n\nalpha beta STOP gamma delta' },
    { match: 'forever', reply: ' tick', repeat: true, delay_ms: 20 },
    { match: 'slow', reply: ' tock', repeat: true, delay_ms: 50 },
  ],
  default: { reply: '</think>\n\nHello from the script.' },
});
const backend = ['--backend', `scripted:${script}`, '--model-name', 'scripted-model'];
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather forecast for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
}];

let srv, client;
before(async () => {
  srv = await startServer(backend);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
});
after(async () => { await srv?.stop(); });

const user = (content) => [{ role: 'user', content }];

test('tool call parsed into tool_calls (non-streaming)', async () => {
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('What is the weather in Paris?'), tools });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.reasoning_content.trim(), 'The user wants the weather.');
  assert.ok(c.message.content === null || c.message.content.trim() === '', JSON.stringify(c.message));
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3 });
});

test('tool call deltas (streaming) and a follow-up turn with the tool result', async () => {
  const stream = await client.chat.completions.create({ model: 'scripted-model', messages: user('weather in Paris please'), tools, stream: true });
  const deltas = [];
  let finish = null, reasoning = '';
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.tool_calls) deltas.push(...c.delta.tool_calls);
    reasoning += c.delta.reasoning_content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(reasoning.trim(), 'The user wants the weather.');
  assert.equal(deltas[0].index, 0);
  assert.match(deltas[0].id, /^call_/);
  assert.equal(deltas[0].type, 'function');
  assert.equal(deltas[0].function.name, 'get_weather');
  const args = deltas.filter((d) => d.index === 0).map((d) => d.function?.arguments ?? '').join('');
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 3 });
  // Second turn as clients send it: content null, arguments as a JSON string, a tool message.
  const r = await client.chat.completions.create({
    model: 'scripted-model', tools,
    messages: [
      { role: 'user', content: 'weather in Paris please' },
      { role: 'assistant', content: null, tool_calls: [{ id: deltas[0].id, type: 'function', function: { name: 'get_weather', arguments: args } }] },
      { role: 'tool', tool_call_id: deltas[0].id, content: '{"temp": 21}' },
    ],
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, 'Hello from the script.');
});

test('tool_choice: a named function forces the call; none renders without tools', async () => {
  const r = await client.chat.completions.create({
    model: 'scripted-model', messages: user('FORCED call'), tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), { city: 'Rome', days: 1 });
  assert.equal(r.choices[0].message.reasoning_content, undefined);
  const n = await client.chat.completions.create({ model: 'scripted-model', messages: user('hi'), tools, tool_choice: 'none' });
  assert.equal(n.choices[0].message.content, 'Hello from the script.');
  assert.equal(n.choices[0].message.tool_calls, undefined);
});

test('reasoning split, streaming and not', async () => {
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('reason about it') });
  assert.equal(r.choices[0].message.reasoning_content.trim(), 'Let me think step by step.');
  assert.equal(r.choices[0].message.content, 'The answer is 42.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  let reasoning = '', content = '';
  for await (const ch of await client.chat.completions.create({ model: 'scripted-model', messages: user('reason about it'), stream: true })) {
    reasoning += ch.choices[0]?.delta?.reasoning_content ?? '';
    content += ch.choices[0]?.delta?.content ?? '';
  }
  assert.equal(reasoning, r.choices[0].message.reasoning_content);
  assert.equal(content, 'The answer is 42.');
});

test('stop strings (string and list), streaming and not; usage counts', async () => {
  const a = await client.chat.completions.create({ model: 'scripted-model', messages: user('stopword test'), stop: 'STOP' });
  assert.equal(a.choices[0].message.content, 'alpha beta ');
  assert.equal(a.choices[0].finish_reason, 'stop');
  const b = await client.chat.completions.create({ model: 'scripted-model', messages: user('stopword test'), stop: ['nothing', 'ta ST'] });
  assert.equal(b.choices[0].message.content, 'alpha be');
  let text = '';
  let usage;
  for await (const ch of await client.chat.completions.create({ model: 'scripted-model', messages: user('stopword test'), stop: ['STOP'], stream: true, stream_options: { include_usage: true } })) {
    text += ch.choices[0]?.delta?.content ?? '';
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(text, 'alpha beta ');
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens < 20);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  const full = await client.chat.completions.create({ model: 'scripted-model', messages: user('stopword test') });
  assert.equal(full.choices[0].message.content, 'alpha beta STOP gamma delta');
  assert.ok(full.usage.completion_tokens > usage.completion_tokens);
});

test('max_tokens gives finish_reason length', async () => {
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('forever'), max_completion_tokens: 4 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 4);
  assert.equal(r.choices[0].message.reasoning_content, ' tick tick tick tick');
});

test('logprobs through the scripted backend', async () => {
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('forever'), max_tokens: 3, logprobs: true, top_logprobs: 2 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 3);
  assert.equal(lp[0].token, ' tick');
  assert.ok(Math.abs(lp[0].logprob - Math.log(0.75)) < 1e-6);
  assert.equal(lp[0].top_logprobs.length, 2);
  assert.equal(lp[0].top_logprobs[0].token, ' tick');
});

test('client disconnect cancels the generation at once; the server keeps serving', async () => {
  const before = await metrics(srv.url);
  const ac = new AbortController();
  const stream = await client.chat.completions.create(
    { model: 'scripted-model', messages: user('forever and ever'), stream: true, max_tokens: 5000 }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const ch of stream) { if (++n === 5) ac.abort(); }
  } catch (e) {
    assert.ok(ac.signal.aborted, `unexpected stream error ${e}`);
  }
  assert.equal(n, 5);
  // 5000 tokens at 20 ms would take 100 s: the generation must stop well before.
  let m;
  const deadline = Date.now() + 3000;
  do {
    await new Promise((r) => setTimeout(r, 50));
    m = await metrics(srv.url);
  } while ((m.lilac_cancelled_total <= before.lilac_cancelled_total || m.lilac_queue_depth !== 0) && Date.now() < deadline);
  assert.equal(m.lilac_cancelled_total, before.lilac_cancelled_total + 1);
  assert.equal(m.lilac_queue_depth, 0);
  assert.ok(m.lilac_generated_tokens_total - before.lilac_generated_tokens_total < 150);
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('hi again') });
  assert.equal(r.choices[0].message.content, 'Hello from the script.');
});

test('a non-streaming client that disconnects cancels its generation too', async () => {
  const before = await metrics(srv.url);
  const ac = new AbortController();
  const done = (async () => {
    const res = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: user('forever, not streamed'), max_tokens: 5000 }),
    });
    await res.text();
  })();
  await new Promise((r) => setTimeout(r, 400));
  ac.abort();
  await assert.rejects(done);
  let m;
  const deadline = Date.now() + 3000;
  do {
    await new Promise((r) => setTimeout(r, 50));
    m = await metrics(srv.url);
  } while ((m.lilac_cancelled_total <= before.lilac_cancelled_total || m.lilac_queue_depth !== 0) && Date.now() < deadline);
  assert.equal(m.lilac_cancelled_total, before.lilac_cancelled_total + 1);
  assert.equal(m.lilac_queue_depth, 0);
  assert.ok(m.lilac_generated_tokens_total - before.lilac_generated_tokens_total < 150);
  // A long non-streaming answer (sent after keep-alive whitespace) parses normally.
  const r = await client.chat.completions.create({ model: 'scripted-model', messages: user('forever'), max_tokens: 30 });
  assert.equal(r.usage.completion_tokens, 30);
  assert.equal(r.choices[0].message.reasoning_content, ' tick'.repeat(30));
});

test('prefix cache: cached_tokens on a follow-up turn', async () => {
  const msgs = [{ role: 'system', content: 'You are a scripted test.' }, { role: 'user', content: 'first question' }];
  const a = await client.chat.completions.create({ model: 'scripted-model', messages: msgs });
  const b = await client.chat.completions.create({
    model: 'scripted-model',
    messages: [...msgs, { role: 'assistant', content: a.choices[0].message.content }, { role: 'user', content: 'second question' }],
  });
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 10, JSON.stringify(b.usage));
  assert.ok(b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens);
  assert.equal(b.choices[0].message.content, 'Hello from the script.');
});

test('/metrics exposes the Prometheus counters', async () => {
  const text = await (await fetch(`${srv.url}/metrics`)).text();
  for (const name of ['lilac_requests_total', 'lilac_prompt_tokens_total', 'lilac_generated_tokens_total',
    'lilac_prefill_tokens_per_second', 'lilac_decode_tokens_per_second', 'lilac_queue_depth',
    'lilac_prefix_cache_hits_total', 'lilac_prompt_tokens_cached_total'])
    assert.match(text, new RegExp(`^${name}`, 'm'));
  assert.match(text, /# TYPE lilac_requests_total counter/);
});

test('queue full gives 429; the server recovers', async () => {
  const s = await startServer([...backend, '--max-queue', '1']);
  try {
    const ac = new AbortController();
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: user('slow please'), stream: true, max_tokens: 400 }),
    });
    const reader = res.body.getReader();
    await reader.read();  // the generation is running
    const busy = await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi') });
    assertErrorBody(assert, busy, 429, { code: 'queue_full', type: 'rate_limit_error' });
    ac.abort();
    let ok;
    const deadline = Date.now() + 5000;
    do {
      await new Promise((r) => setTimeout(r, 50));
      ok = await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi') });
    } while (ok.status === 429 && Date.now() < deadline);
    assert.equal(ok.status, 200, ok.text);
  } finally { await s.stop(); }
});

test('API key: 401 with an OpenAI error body without it; /health stays open', async () => {
  const s = await startServer([...backend, '--api-key', 'sekrit']);
  try {
    assertErrorBody(assert, await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi') }), 401, { code: 'invalid_api_key' });
    assertErrorBody(assert, await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi') }, { authorization: 'Bearer wrong' }), 401,
                    { code: 'invalid_api_key' });
    assert.equal((await fetch(`${s.url}/v1/models`)).status, 401);
    assert.equal((await fetch(`${s.url}/health`)).status, 200);
    const c = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'sekrit', maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'scripted-model', messages: user('hi') });
    assert.equal(r.choices[0].message.content, 'Hello from the script.');
    const bad = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
  } finally { await s.stop(); }
});

test('body limit gives 413; context limit gives 400; health is 503 while loading', async () => {
  const s = await startServer([...backend, '--max-body-mb', '0.001', '--max-seq', '64']);
  try {
    const big = await postJson(`${s.url}/v1/chat/completions`, { messages: user('x'.repeat(5000)) });
    assertErrorBody(assert, big, 413, { code: 'payload_too_large' });
    const long = await postJson(`${s.url}/v1/chat/completions`, { messages: user('word '.repeat(150)) });
    assertErrorBody(assert, long, 400, { code: 'context_length_exceeded', param: 'messages' });
    const mt = await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi'), max_tokens: 60 });
    assertErrorBody(assert, mt, 400, { code: 'context_length_exceeded', param: 'max_tokens' });
    const ok = await postJson(`${s.url}/v1/chat/completions`, { messages: user('hi'), max_tokens: 20 });
    assert.equal(ok.status, 200, ok.text);
  } finally { await s.stop(); }
  // A server that is still loading answers 503 on /health and on generation endpoints.
  const { spawn } = await import('node:child_process');
  const { LILAC, DEMO } = await import('./helpers.mjs');
  const p = spawn(LILAC, ['serve', '--model', DEMO, '--port', '0', ...backend, '--debug-load-delay-ms', '3000'], { stdio: ['ignore', 'pipe', 'ignore'] });
  try {
    const url = await new Promise((resolve, reject) => {
      let out = '';
      p.stdout.on('data', (d) => { out += d; const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/); if (m) resolve(m[1]); });
      p.on('exit', (c) => reject(new Error(`exited ${c}`)));
    });
    const h = await fetch(`${url}/health`);
    assert.equal(h.status, 503);
    assert.equal((await h.json()).status, 'loading');
    assertErrorBody(assert, await postJson(`${url}/v1/chat/completions`, { messages: user('hi') }), 503, { code: 'model_not_loaded' });
  } finally { p.kill('SIGKILL'); }
});
