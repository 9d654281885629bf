// End-to-end tests of Anthropic's Message Batches (POST /v1/messages/batches and the rest) with the official
// `@anthropic-ai/sdk` client's messages.batches against `lilac serve --backend scripted:FILE`: a batch's results are
// the messages /v1/messages answers for its requests (ids aside), in request order; a request the Messages API
// refuses is an `errored` result with that error; cancel ends the running ones as `canceled`; list, delete; the
// routes' own errors in Anthropic's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { postJson } from './helpers.mjs';
import { Anthropic, anthropicClient, SCRIPTED_MODEL, startScripted } from './protocols_common.mjs';

const MODEL = SCRIPTED_MODEL;
let srv, client;
before(async () => {
  srv = await startScripted();
  client = anthropicClient(srv.url);
});
after(async () => { await srv?.stop(); });

const user = (content) => [{ role: 'user', content }];

async function ended(id, ms = 30000) {
  const t0 = Date.now();
  for (;;) {
    const b = await client.messages.batches.retrieve(id);
    if (b.processing_status === 'ended') return b;
    assert.ok(Date.now() - t0 < ms, `batch ${id} still ${b.processing_status}`);
    await new Promise((f) => setTimeout(f, 25));
  }
}

async function results(id) {
  const out = [];
  for await (const r of await client.messages.batches.results(id)) out.push(r);
  return out;
}

test('a batch: results as /v1/messages answers them, in request order; errored requests', async () => {
  const reqs = [
    { custom_id: 'a', params: { model: MODEL, max_tokens: 200, messages: user('reason about it'), thinking: { type: 'enabled', budget_tokens: 50 } } },
    { custom_id: 'b', params: { model: MODEL, max_tokens: 100, messages: user('MODE') } },
    { custom_id: 'bad-1', params: { model: MODEL, messages: user('x') } },  // max_tokens missing
    { custom_id: 'bad-2', params: { model: 'elsewhere', max_tokens: 10, messages: user('x') } },
    ...Array.from({ length: 12 }, (_, i) => ({ custom_id: `n${i}`, params: { model: MODEL, max_tokens: 50, messages: user('stopword'), stop_sequences: ['STOP'] } })),
  ];
  const b = await client.messages.batches.create({ requests: reqs });
  assert.match(b.id, /^msgbatch_/);
  assert.equal(b.type, 'message_batch');
  assert.ok(['in_progress', 'ended'].includes(b.processing_status));
  assert.equal(Object.values(b.request_counts).reduce((x, y) => x + y), reqs.length);
  const done = await ended(b.id);
  assert.deepEqual(done.request_counts, { processing: 0, succeeded: 14, errored: 2, canceled: 0, expired: 0 });
  assert.match(done.results_url, /\/v1\/messages\/batches\/msgbatch_\w+\/results$/);
  assert.match(done.ended_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  const rs = await results(b.id);
  assert.deepEqual(rs.map((r) => r.custom_id), reqs.map((r) => r.custom_id));
  for (const [i, r] of rs.entries()) {
    if (reqs[i].custom_id.startsWith('bad')) continue;
    assert.equal(r.result.type, 'succeeded', JSON.stringify(r));
    const { id: _a, ...got } = r.result.message;
    const { id: _b, ...want } = await client.messages.create(reqs[i].params);
    assert.deepEqual(got, want, reqs[i].custom_id);
  }
  assert.equal(rs[2].result.type, 'errored');
  assert.equal(rs[2].result.error.type, 'error');
  assert.equal(rs[2].result.error.error.type, 'invalid_request_error');
  assert.match(rs[2].result.error.error.message, /max_tokens/);
  assert.equal(rs[3].result.error.error.type, 'not_found_error');
  assert.equal(rs[4].result.message.stop_reason, 'stop_sequence');
  // listed newest first; deleted once ended
  const b2 = await client.messages.batches.create({ requests: [reqs[1]] });
  await ended(b2.id);
  const listed = [];
  for await (const x of client.messages.batches.list({ limit: 1 })) listed.push(x.id);
  assert.deepEqual(listed.slice(0, 2), [b2.id, b.id]);
  assert.deepEqual(await client.messages.batches.delete(b2.id), { id: b2.id, type: 'message_batch_deleted' });
  await assert.rejects(client.messages.batches.retrieve(b2.id), Anthropic.NotFoundError);
});

test('cancel: the requests still running or waiting end as canceled', async () => {
  const reqs = Array.from({ length: 12 }, (_, i) => ({ custom_id: `f${i}`, params: { model: MODEL, max_tokens: 20000 - i, messages: user('forever') } }));
  const b = await client.messages.batches.create({ requests: reqs });
  await assert.rejects(client.messages.batches.results(b.id), /results_url/);  // not ended yet
  await assert.rejects(client.messages.batches.delete(b.id), Anthropic.BadRequestError);
  const c = await client.messages.batches.cancel(b.id);
  assert.ok(['canceling', 'ended'].includes(c.processing_status));
  assert.ok(c.cancel_initiated_at);
  const done = await ended(b.id);
  assert.equal(done.request_counts.canceled, 12);
  const rs = await results(b.id);
  assert.ok(rs.every((r) => r.result.type === 'canceled'));
  // the server is free at once for interactive requests
  const m = await client.messages.create({ model: MODEL, max_tokens: 100, messages: user('MODE') });
  assert.equal(m.stop_reason, 'end_turn');
});

test('the routes\' errors in Anthropic\'s shape', async () => {
  const bad = async (body) => {
    const r = await postJson(`${srv.url}/v1/messages/batches`, body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    return r.json.error.message;
  };
  assert.match(await bad({}), /requests/);
  assert.match(await bad({ requests: [] }), /requests/);
  assert.match(await bad({ requests: [{ custom_id: 'a b', params: {} }] }), /custom_id/);
  assert.match(await bad({ requests: [{ custom_id: 'a', params: {} }, { custom_id: 'a', params: {} }] }), /twice/);
  assert.match(await bad({ requests: [{ custom_id: 'a' }] }), /params/);
  await assert.rejects(client.messages.batches.retrieve('msgbatch_nothing'), Anthropic.NotFoundError);
});
