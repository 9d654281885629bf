// End-to-end test of hybrid routing: `lilac serve --upstream ...` (the router) in front of a second
// `lilac serve` process (the "cloud"), with a recording proxy between them that keeps every request the
// upstream receives. Driven by the official `openai` npm client, streaming and not. Both servers use the
// scripted backend, so the answer says who produced it ("Hello from local." / "Hello from the cloud.").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { startServer, metrics, postJson } from './helpers.mjs';

const SHARED = process.env.LILAC_SHARED_DIR;
const SOURCE = process.env.LILAC_SOURCE_DIR || path.resolve(import.meta.dirname, '../..');
if (!SHARED) throw new Error('set LILAC_SHARED_DIR (ctest does)');
const require = createRequire(`${SOURCE}/package.json`);
const OpenAI = require('openai');

const KEY = 'sk-hybrid-e2e-SECRET-9f8e7d6c5b4a39281706';

// A model folder for the scripted backend: tokenizer + chat template only.
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-hybrid-'));
const modelDir = path.join(work, 'model');
fs.mkdirSync(modelDir);
for (const f of ['tokenizer.json', 'tokenizer_config.json'])
  fs.copyFileSync(path.join(SHARED, 'fixtures/qwen3-tokenizer', f), path.join(modelDir, f));
fs.copyFileSync(path.join(SHARED, 'fixtures/qwen3.6-template/chat_template.jinja'), path.join(modelDir, 'chat_template.jinja'));
const writeJson = (name, obj) => { const f = path.join(work, name); fs.writeFileSync(f, JSON.stringify(obj)); return f; };
const cloudScript = writeJson('cloud.json', { default: { reply: '</think>\n\nHello from the cloud.' } });
const localScript = writeJson('local.json', {
  rules: [{ match: 'forever', reply: ' tick', repeat: true, delay_ms: 20 }],
  default: { reply: '</think>\n\nHello from local.' },
});
const policy = writeJson('policy.json', {
  default_route: 'cloud',
  rules: [{ name: 'falcon', keywords: ['project falcon'] }],
  upstream: { connect_timeout_ms: 1000, read_timeout_ms: 20000, models_timeout_ms: 1000, models_cache_s: 0 },
});
const busyPolicy = writeJson('busy.json', { default_route: 'local' });
const strictPolicy = writeJson('strict.json', {
  fallback: { upstream_failure_to_local: false },
  upstream: { connect_timeout_ms: 1000, read_timeout_ms: 20000, models_timeout_ms: 1000 },
});

const startLilac = (args, env = {}) => startServer(args, { model: modelDir, env: { LILAC_LOG: 'info', ...env } });

// The recording upstream: keeps every request (method, path, headers, body), then proxies it to the cloud
// server (streams piped as they come) or, depending on `mode`, fails.
function startRecorder(target) {
  const rec = { seen: [], mode: 'proxy', port: 0 };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      rec.seen.push({ method: req.method, url: req.url, headers: req.headers, body });
      if (rec.mode === 'down') { req.socket.destroy(); return; }
      if (rec.mode === 'fail500') {
        res.writeHead(500, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'cloud exploded', type: 'server_error' } }));
        return;
      }
      if (rec.mode === 'fail400') {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'upstream says no', type: 'invalid_request_error', param: 'messages', code: null } }));
        return;
      }
      const u = new URL(target);
      const headers = { ...req.headers, host: u.host };
      delete headers['content-length'];
      const up = http.request({ host: u.hostname, port: u.port, path: req.url, method: req.method, headers }, (ur) => {
        res.writeHead(ur.statusCode, ur.headers);
        ur.pipe(res);
      });
      up.on('error', () => { res.writeHead(502); res.end(); });
      up.end(body);
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
    rec.port = server.address().port;
    rec.url = `http://127.0.0.1:${rec.port}`;
    rec.close = () => new Promise((r) => { server.closeAllConnections?.(); server.close(r); });
    resolve(rec);
  }));
}

let cloud, recorder, router, strict, busy, client;
before(async () => {
  cloud = await startLilac(['--backend', `scripted:${cloudScript}`, '--model-name', 'cloud-model', '--api-key', KEY]);
  recorder = await startRecorder(cloud.url);
  const common = ['--backend', `scripted:${localScript}`, '--model-name', 'local-model',
    '--upstream', recorder.url, '--upstream-model', 'cloud-model', '--upstream-key-env', 'HYBRID_E2E_KEY'];
  router = await startLilac([...common, '--route-policy', policy], { HYBRID_E2E_KEY: KEY });
  strict = await startLilac([...common, '--route-policy', strictPolicy], { HYBRID_E2E_KEY: KEY });
  busy = await startLilac([...common, '--route-policy', busyPolicy, '--max-queue', '1'], { HYBRID_E2E_KEY: KEY });
  client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'client-side-key-unused', maxRetries: 0, timeout: 30000 });
});
after(async () => {
  await router?.stop();
  await strict?.stop();
  await busy?.stop();
  await recorder?.close();
  await cloud?.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

const user = (content) => [{ role: 'user', content }];
const chatPosts = () => recorder.seen.filter((r) => r.method === 'POST');

async function chat(params, options = {}) {
  const { data, response } = await client.chat.completions
    .create({ model: 'local-model', max_tokens: 32, temperature: 0, ...params }, options).withResponse();
  return { data, route: response.headers.get('x-lilac-route') };
}

async function chatStream(params, options = {}) {
  const { data: stream, response } = await client.chat.completions
    .create({ model: 'local-model', max_tokens: 32, temperature: 0, stream: true, stream_options: { include_usage: true }, ...params }, options)
    .withResponse();
  let content = '';
  const routes = new Set();
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    routes.add(chunk.lilac_route);
    if (chunk.choices?.[0]?.delta?.content) content += chunk.choices[0].delta.content;
    if (chunk.usage) usage = chunk.usage;
  }
  return { content, routes: [...routes], usage, chunks, route: response.headers.get('x-lilac-route') };
}

test('GET /v1/models lists the local model and the upstream models, prefixed', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.ok(ids.includes('local-model'), ids.join(','));
  assert.ok(ids.includes('cloud/cloud-model'), ids.join(','));
});

test('a plain request goes to the cloud: model rewritten, lilac field stripped, Bearer key sent', async () => {
  const before = chatPosts().length;
  const { data, route } = await chat({ messages: user('What is the capital of France?'), lilac: { route: 'auto' } });
  assert.equal(route, 'cloud');
  assert.equal(data.lilac_route, 'cloud');
  assert.equal(data.choices[0].message.content, 'Hello from the cloud.');
  assert.ok(data.usage.prompt_tokens > 0 && data.usage.completion_tokens > 0);
  const posts = chatPosts();
  assert.equal(posts.length, before + 1);
  const sent = posts.at(-1);
  assert.equal(sent.url, '/v1/chat/completions');
  assert.equal(sent.headers.authorization, `Bearer ${KEY}`);
  const body = JSON.parse(sent.body);
  assert.equal(body.model, 'cloud-model');
  assert.equal(body.lilac, undefined);
  assert.equal(body.messages[0].content, 'What is the capital of France?');
});

test('streaming from the cloud is passed through, every chunk marked, usage kept', async () => {
  const s = await chatStream({ messages: user('Tell me something nice.') });
  assert.equal(s.route, 'cloud');
  assert.equal(s.content, 'Hello from the cloud.');
  assert.deepEqual(s.routes, ['cloud']);
  assert.ok(s.usage && s.usage.completion_tokens > 0);
  assert.ok(s.chunks >= 3);
  assert.equal(JSON.parse(chatPosts().at(-1).body).stream, true);
});

const SECRETS = {
  email: 'jane.roe@example.org',
  iban: 'DE89 3704 0044 0532 0130 00',
  card: '4111 1111 1111 1111',
  ssn: '078-05-1120',
  keyword: 'Project Falcon',
  apikey: 'ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789',
  phone: '+44 20 7946 0958',
};

test('sensitive data never leaves: every part of a request, streaming or not, explicit cloud or not', async () => {
  const before = chatPosts().length;
  const cases = [
    { messages: user(`Please email ${SECRETS.email} the summary.`) },
    { messages: [{ role: 'system', content: `Pay to ${SECRETS.iban}.` }, ...user('What do I owe?')] },
    {
      messages: [
        ...user('Charge the customer.'),
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'lookup', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: `card on file: ${SECRETS.card}` },
      ],
    },
    {
      messages: [
        ...user('Verify the person.'),
        { role: 'assistant', content: '', tool_calls: [{ id: 'c2', type: 'function', function: { name: 'verify', arguments: JSON.stringify({ ssn: SECRETS.ssn }) } }] },
        { role: 'tool', tool_call_id: 'c2', content: 'ok' },
      ],
    },
    { messages: [{ role: 'user', content: [{ type: 'text', text: `Status of ${SECRETS.keyword}?` }] }] },
    { messages: user(`my token is ${SECRETS.apikey}`), lilac: { route: 'cloud' } },
    { messages: user(`call me at ${SECRETS.phone}`), model: 'cloud/cloud-model' },
  ];
  for (const c of cases) {
    const r = await chat(c);
    assert.equal(r.route, 'local', JSON.stringify(c));
    assert.equal(r.data.lilac_route, 'local');
    assert.equal(r.data.choices[0].message.content, 'Hello from local.');
    const s = await chatStream(c, { headers: { 'x-lilac-route': 'cloud' } });
    assert.equal(s.route, 'local');
    assert.equal(s.content, 'Hello from local.');
    assert.deepEqual(s.routes, ['local']);
  }
  // /v1/completions prompts too.
  const comp = await client.completions.create({ model: 'local-model', prompt: `SSN ${SECRETS.ssn}:`, max_tokens: 8 }).withResponse();
  assert.equal(comp.response.headers.get('x-lilac-route'), 'local');
  assert.equal(chatPosts().length, before, 'the upstream received a request it must not see');
});

test('explicit local (body or header) and stickiness keep a conversation local', async () => {
  const before = chatPosts().length;
  const turn1 = [{ role: 'system', content: 'You are terse.' }, ...user('Draft a note about my diagnosis.')];
  let r = await chat({ messages: turn1 }, { headers: { 'x-lilac-route': 'local' } });
  assert.equal(r.route, 'local');
  r = await chat({ messages: user('Another private thing.'), lilac: { route: 'local' } });
  assert.equal(r.route, 'local');
  const turn2 = [...turn1, { role: 'assistant', content: r.data.choices[0].message.content }, ...user('Shorter, please.')];
  r = await chat({ messages: turn2 });
  assert.equal(r.route, 'local', 'the continuation of a local conversation went to the cloud');
  const s = await chatStream({ messages: turn2 });
  assert.equal(s.route, 'local');
  assert.equal(chatPosts().length, before);
  // A new conversation is not sticky.
  r = await chat({ messages: [{ role: 'system', content: 'You are terse.' }, ...user('Weather talk.')] });
  assert.equal(r.route, 'cloud');
});

test('completions go upstream too, and a named upstream model is honoured', async () => {
  const { data, response } = await client.completions
    .create({ model: 'cloud/cloud-model', prompt: 'Once upon a time', max_tokens: 8 }).withResponse();
  assert.equal(response.headers.get('x-lilac-route'), 'cloud');
  assert.equal(data.lilac_route, 'cloud');
  const sent = chatPosts().at(-1);
  assert.equal(sent.url, '/v1/completions');
  assert.equal(JSON.parse(sent.body).model, 'cloud-model');
});

test('upstream client errors (4xx) are passed through', async () => {
  recorder.mode = 'fail400';
  try {
    await assert.rejects(chat({ messages: user('hello there') }), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.message, /upstream says no/);
      return true;
    });
  } finally {
    recorder.mode = 'proxy';
  }
});

test('upstream down or failing: served locally when the policy allows, else a clear 502', async () => {
  for (const mode of ['down', 'fail500']) {
    recorder.mode = mode;
    try {
      const r = await chat({ messages: user(`plain question (${mode})`) });
      assert.equal(r.route, 'local');
      assert.equal(r.data.choices[0].message.content, 'Hello from local.');
      const s = await chatStream({ messages: user(`plain stream (${mode})`) });
      assert.equal(s.route, 'local');
      assert.equal(s.content, 'Hello from local.');
      const strictClient = new OpenAI({ baseURL: `${strict.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
      for (const stream of [false, true]) {
        await assert.rejects(
          strictClient.chat.completions.create({ model: 'local-model', messages: user('plain'), max_tokens: 8, stream }),
          (e) => {
            assert.equal(e.status, 502);
            assert.match(e.message, /upstream/);
            assert.ok(!e.message.includes(KEY));
            return true;
          });
      }
    } finally {
      recorder.mode = 'proxy';
    }
  }
});

test('local busy: a plain request goes to the cloud, a sensitive one stays local (429)', async () => {
  const busyClient = new OpenAI({ baseURL: `${busy.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 30000 });
  const plain = await busyClient.chat.completions.create({ model: 'local-model', messages: user('idle: plain'), max_tokens: 8 }).withResponse();
  assert.equal(plain.response.headers.get('x-lilac-route'), 'local');  // default_route local while idle
  const ac = new AbortController();
  const long = await busyClient.chat.completions.create(
    { model: 'local-model', messages: user('forever'), max_tokens: 2000, stream: true }, { signal: ac.signal });
  const it = long[Symbol.asyncIterator]();
  await it.next();  // the generation runs: the queue (1) is full
  try {
    const r = await busyClient.chat.completions.create({ model: 'local-model', messages: user('busy: plain'), max_tokens: 8 }).withResponse();
    assert.equal(r.response.headers.get('x-lilac-route'), 'cloud');
    assert.equal(r.data.choices[0].message.content, 'Hello from the cloud.');
    await assert.rejects(
      busyClient.chat.completions.create({ model: 'local-model', messages: user(`busy: ${SECRETS.email}`), max_tokens: 8 }),
      (e) => { assert.equal(e.status, 429); return true; });
  } finally {
    ac.abort();
    await it.return?.().catch(() => {});
  }
  assert.match(busy.output(), /route: cloud \(busy\)/);
});

// Issue 13, 1 and 3: hostile bodies in hybrid mode. Deep JSON killed the router (recursive copy);
// secrets outside message contents, split or encoded, went upstream; a completions prompt object was
// forwarded; a sensitive request naming cloud/... was re-sent over HTTP to lilac's own port.
test('hybrid mode: hostile bodies never crash it and never leak upstream', async () => {
  const before = chatPosts().length;
  const url = `${router.url}/v1/chat/completions`;
  const deep = `{"model":"local-model","messages":[{"role":"user","content":"hi"}],"metadata":${'['.repeat(100000)}${']'.repeat(100000)}}`;
  let r = await postJson(url, deep);
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.code, 'json_too_deep');
  const e = SECRETS.email;
  const cases = [
    { messages: user('Book it.'), tools: [{ type: 'function', function: { name: 'book', description: `cc ${e}` } }] },
    { messages: user('Book it.'), tools: [{ type: 'function', function: { name: 'book',
      parameters: { type: 'object', properties: { to: { type: 'string', enum: [e] } } } } }] },
    { messages: user('hello'), user: e },
    { messages: user('hello'), metadata: { owner: e } },
    { messages: user('hello'), stop: [SECRETS.ssn] },
    { messages: user('hello'), some_future_field: { deep: [SECRETS.iban] } },
    { messages: [...user('my card is 4111 1111'), ...user('1111 1111, thanks')] },
    { messages: [{ role: 'user', content: [{ type: 'text', text: 'jane.roe@' }, { type: 'text', text: 'example.org' }] }] },
    { messages: user('write to jane.roe%40example.org') },
    { messages: user(`note: ${Buffer.from(e).toString('base64')}`) },
    { messages: user('ｊａｎｅ．ｒｏｅ＠ｅｘａｍｐｌｅ．ｏｒｇ') },
    { messages: user('jane.roe [at] example [dot] org') },
    { messages: user('card 4111_1111_1111_1111') },
  ];
  for (const c of cases) {
    const res = await chat(c);
    assert.equal(res.route, 'local', JSON.stringify(c).slice(0, 200));
  }
  // A completions prompt given as an object: answered by the local server (400), not forwarded.
  r = await postJson(`${router.url}/v1/completions`, { model: 'local-model', prompt: { text: 'hi' } });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.headers.get('x-lilac-route'), null);
  // A sensitive request naming an upstream model is served in-process: one request, not two.
  const count = async () => (await metrics(router.url))['lilac_requests_total{endpoint="/v1/chat/completions",status="200"}'] ?? 0;
  const n0 = await count();
  const res = await chat({ model: 'cloud/cloud-model', messages: user(`mail ${e}`) });
  assert.equal(res.route, 'local');
  assert.equal(res.data.choices[0].message.content, 'Hello from local.');
  assert.equal(await count(), n0 + 1, 'the router re-sent the request to its own port');
  assert.equal(chatPosts().length, before, 'the upstream received a request it must not see');
  assert.equal((await fetch(`${router.url}/health`)).status, 200);
});

test('nothing sensitive ever reached the upstream, and the API key is never logged', async () => {
  const all = recorder.seen.map((r) => r.body).join('\n');
  for (const [name, value] of Object.entries(SECRETS)) assert.ok(!all.includes(value), `${name} was sent upstream`);
  assert.ok(!all.toLowerCase().includes('project falcon'));
  for (const srv of [router, strict, busy, cloud]) {
    const log = srv.output();
    assert.ok(!log.includes(KEY), 'the upstream API key appears in a log');
    assert.ok(!log.includes(KEY.slice(0, 20)), 'part of the upstream API key appears in a log');
  }
  assert.match(router.output(), /route: cloud \(default\)/);
  assert.match(router.output(), /route: local \(sensitive: email\)/);
  assert.match(router.output(), /API key from \$HYBRID_E2E_KEY/);
  for (const value of Object.values(SECRETS)) assert.ok(!router.output().includes(value), 'a detected value was logged');
});
