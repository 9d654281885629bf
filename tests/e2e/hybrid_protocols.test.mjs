// Hybrid routing of the Anthropic Messages and OpenAI Responses endpoints: one policy for every
// protocol. A router `lilac serve --upstream` in front of a "cloud" `lilac serve` (both scripted): plain
// requests go to the cloud in their own protocol (the cloud counts /v1/messages and /v1/responses
// requests), sensitive ones (anywhere in the body) stay local, the reason travels in
// x-lilac-route-reason, and the router's own errors on /v1/messages are in Anthropic's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJson, metrics, writeScript } from './helpers.mjs';
import { anthropicClient, openaiClient, collect } from './protocols_common.mjs';

let cloud, router;
before(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lilac-hybrid-proto-'));
  const policy = path.join(dir, 'policy.json');
  fs.writeFileSync(policy, JSON.stringify({ default_route: 'cloud', rules: [{ name: 'falcon', keywords: ['project falcon'] }] }));
  cloud = await startServer(['--backend', `scripted:${writeScript({ default: { reply: 'Hello from the cloud.' } })}`,
    '--model-name', 'cloudy', '--api-key', 'cloud-key']);
  router = await startServer(['--backend', `scripted:${writeScript({ default: { reply: 'Hello from local.' } })}`,
    '--model-name', 'local', '--upstream', `${cloud.url}/v1`, '--upstream-model', 'cloudy', '--route-policy', policy],
  { env: { LILAC_UPSTREAM_API_KEY: 'cloud-key' } });
});
after(async () => { await router?.stop(); await cloud?.stop(); });

const cloudCount = async (endpoint) => (await metrics(cloud.url))[`lilac_requests_total{endpoint="${endpoint}",status="200"}`] ?? 0;

test('Messages: plain to the cloud in the Messages protocol, sensitive stays local', async () => {
  const c = anthropicClient(router.url);
  const n0 = await cloudCount('/v1/messages');
  const r = await c.messages.create({ model: 'local', max_tokens: 50, messages: [{ role: 'user', content: 'hello' }] }).withResponse();
  assert.equal(r.data.content[0].text, 'Hello from the cloud.');
  assert.equal(r.response.headers.get('x-lilac-route'), 'cloud');
  assert.equal(r.response.headers.get('x-lilac-route-reason'), 'default');
  assert.equal(r.data.lilac_route, 'cloud');
  assert.equal(await cloudCount('/v1/messages'), n0 + 1);
  // streamed through, events intact
  const evs = await collect(await c.messages.create({ model: 'local', max_tokens: 50, messages: [{ role: 'user', content: 'hello' }], stream: true }));
  assert.equal(evs.filter((e) => e.delta?.type === 'text_delta').map((e) => e.delta.text).join(''), 'Hello from the cloud.');
  assert.equal(evs.at(-1).type, 'message_stop');
  // sensitive: in a tool result block
  const s = await c.messages.create({
    model: 'local', max_tokens: 50,
    messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'mail ann@corp.example' }, { type: 'text', text: 'and?' }] }],
  }).withResponse();
  assert.equal(s.data.content[0].text, 'Hello from local.');
  assert.equal(s.response.headers.get('x-lilac-route'), 'local');
  assert.equal(s.response.headers.get('x-lilac-route-reason'), 'sensitive: email');
  assert.equal(s.data.lilac_route, 'local');
  const k = await c.messages.create({ model: 'local', max_tokens: 50, system: 'About project falcon.', messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(k.content[0].text, 'Hello from local.');
});

test('Responses: plain to the cloud in the Responses protocol, sensitive stays local', async () => {
  const c = openaiClient(router.url);
  const n0 = await cloudCount('/v1/responses');
  const r = await c.responses.create({ model: 'local', input: 'hello', reasoning: { effort: 'none' } }).withResponse();
  assert.equal(r.data.output_text, 'Hello from the cloud.');
  assert.equal(r.response.headers.get('x-lilac-route'), 'cloud');
  assert.equal(await cloudCount('/v1/responses'), n0 + 1);
  const s = await c.responses.create({ model: 'local', instructions: 'The card is 4111 1111 1111 1111.', input: 'hello', reasoning: { effort: 'none' } }).withResponse();
  assert.equal(s.data.output_text, 'Hello from local.');
  assert.equal(s.response.headers.get('x-lilac-route-reason'), 'sensitive: card');
  const evs = await collect(await c.responses.create({ model: 'local', input: 'tell me about project falcon', reasoning: { effort: 'none' }, stream: true }));
  assert.equal(evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join(''), 'Hello from local.');
  evs.forEach((e, i) => assert.equal(e.sequence_number, i));
});

test('the router\'s errors on /v1/messages are in Anthropic\'s shape', async () => {
  const r = await postJson(`${router.url}/v1/messages`, { model: 'local', max_tokens: 5, messages: [{ role: 'user', content: 'x' }], lilac: { route: 'sideways' } });
  assert.equal(r.status, 400);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, 'invalid_request_error');
  assert.match(r.json.error.message, /lilac.route/);
  const o = await postJson(`${router.url}/v1/responses`, { model: 'local', input: 'x', lilac: { route: 'sideways' } });
  assert.equal(o.status, 400);
  assert.equal(o.json.error.param, 'lilac.route');
});
