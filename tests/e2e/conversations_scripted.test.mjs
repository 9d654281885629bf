// End-to-end tests of OpenAI's Conversations API (POST /v1/conversations and its items) and of a Responses request's
// `conversation`, with the official `openai` client's `conversations` resource against `lilac serve --backend
// scripted:FILE`: items stored with ids, listed in pages both ways, added and deleted; a response in a conversation
// reads its items as the turns before its input (the same prompt as sending them by hand) and adds its input and
// output once it completes; errors in OpenAI's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, assertErrorBody } from './helpers.mjs';
import { OpenAI, openaiClient, SCRIPTED_MODEL, startScripted } from './protocols_common.mjs';

const MODEL = SCRIPTED_MODEL;
let srv, client;
before(async () => {
  srv = await startScripted();
  client = openaiClient(srv.url);
});
after(async () => { await srv?.stop(); });

const off = { effort: 'none' };

test('conversations: create with items and metadata, retrieve, update, items in pages, delete', async () => {
  const conv = await client.conversations.create({
    metadata: { topic: 'demo' },
    items: [{ type: 'message', role: 'user', content: 'first question' }, { role: 'assistant', content: 'first answer' }],
  });
  assert.match(conv.id, /^conv_/);
  assert.equal(conv.object, 'conversation');
  assert.deepEqual(conv.metadata, { topic: 'demo' });
  assert.ok(Math.abs(conv.created_at - Date.now() / 1000) < 60);
  assert.deepEqual(await client.conversations.retrieve(conv.id), conv);
  const upd = await client.conversations.update(conv.id, { metadata: { topic: 'changed', more: 'x' } });
  assert.deepEqual(upd.metadata, { topic: 'changed', more: 'x' });
  // stored with ids, a string content as one text part
  const added = await client.conversations.items.create(conv.id, { items: [{ role: 'user', content: 'second question' }] });
  assert.equal(added.data.length, 1);
  assert.match(added.data[0].id, /^msg_/);
  assert.deepEqual(added.data[0].content, [{ type: 'input_text', text: 'second question' }]);
  const asc = [];
  for await (const it of client.conversations.items.list(conv.id, { order: 'asc', limit: 2 })) asc.push(it);  // pages of 2
  assert.deepEqual(asc.map((i) => i.content[0].text), ['first question', 'first answer', 'second question']);
  assert.deepEqual(asc.map((i) => i.content[0].type), ['input_text', 'output_text', 'input_text']);
  const desc = (await client.conversations.items.list(conv.id)).data;  // newest first by default
  assert.deepEqual(desc.map((i) => i.id), asc.map((i) => i.id).reverse());
  const one = await client.conversations.items.retrieve(asc[1].id, { conversation_id: conv.id });
  assert.deepEqual(one, asc[1]);
  const after = await client.conversations.items.delete(asc[1].id, { conversation_id: conv.id });
  assert.equal(after.id, conv.id);
  assert.deepEqual((await client.conversations.items.list(conv.id, { order: 'asc' })).data.map((i) => i.id), [asc[0].id, asc[2].id]);
  await assert.rejects(client.conversations.items.retrieve(asc[1].id, { conversation_id: conv.id }), OpenAI.NotFoundError);
  const del = await client.conversations.delete(conv.id);
  assert.deepEqual(del, { id: conv.id, object: 'conversation.deleted', deleted: true });
  await assert.rejects(client.conversations.retrieve(conv.id), OpenAI.NotFoundError);
  const empty = await client.conversations.create();
  assert.deepEqual(empty.metadata, {});
  assert.deepEqual((await client.conversations.items.list(empty.id)).data, []);
});

test('responses in a conversation: its items come first, the turn is added once it completes', async () => {
  const conv = await client.conversations.create({ items: [{ role: 'user', content: 'first question' }, { role: 'assistant', content: 'first answer' }] });
  const r1 = await client.responses.create({ model: MODEL, input: 'reason about it', conversation: conv.id, instructions: 'Be brief.' });
  assert.deepEqual(r1.conversation, { id: conv.id });
  const byHand = await client.responses.create({
    model: MODEL, instructions: 'Be brief.', store: false,
    input: [{ role: 'user', content: 'first question' }, { role: 'assistant', content: 'first answer' }, { role: 'user', content: 'reason about it' }],
  });
  assert.equal(r1.usage.input_tokens, byHand.usage.input_tokens);
  assert.equal(r1.output_text, byHand.output_text);
  const items = (await client.conversations.items.list(conv.id, { order: 'asc' })).data;
  assert.deepEqual(items.slice(3), r1.output);  // the request's input, then the response's output items
  assert.equal(items[2].content[0].text, 'reason about it');
  assert.equal(items.length, 3 + r1.output.length);
  // the next turn (an object naming it; store: false too) sees all of it
  const r2 = await client.responses.create({ model: MODEL, input: 'and now?', conversation: { id: conv.id }, store: false, reasoning: off });
  const byHand2 = await client.responses.create({
    model: MODEL, store: false, reasoning: off,
    input: [{ role: 'user', content: 'first question' }, { role: 'assistant', content: 'first answer' },
      { role: 'user', content: 'reason about it' }, ...r1.output, { role: 'user', content: 'and now?' }],
  });
  assert.equal(r2.usage.input_tokens, byHand2.usage.input_tokens);
  assert.equal((await client.conversations.items.list(conv.id, { limit: 100 })).data.length, 3 + r1.output.length + 1 + r2.output.length);
  // a streamed response in it is added as well
  const evs = [];
  for await (const e of await client.responses.create({ model: MODEL, input: 'reason about it', conversation: conv.id, stream: true })) evs.push(e);
  const done = evs.at(-1).response;
  const last = (await client.conversations.items.list(conv.id, { limit: done.output.length })).data.reverse();
  assert.deepEqual(last, done.output);
});

test('conversations: errors in OpenAI shape', async () => {
  const bad = async (path, body, status, param, code) => {
    const r = await postJson(`${srv.url}${path}`, body);
    assertErrorBody(assert, r, status, { param, code });
  };
  const conv = await client.conversations.create();
  await bad('/v1/conversations', { items: [{ role: 'robot', content: 'x' }] }, 400, 'items[0].role');
  await bad('/v1/conversations', { items: [{ type: 'web_search_call' }] }, 400, 'items[0].type', 'unsupported_value');
  await bad('/v1/conversations', { items: Array.from({ length: 21 }, () => ({ role: 'user', content: 'x' })) }, 400, 'items');
  await bad('/v1/conversations', { metadata: { a: 1 } }, 400, 'metadata.a');
  await bad('/v1/conversations', { metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, 'v'])) }, 400, 'metadata');
  await bad(`/v1/conversations/${conv.id}/items`, {}, 400, 'items', 'missing_required_parameter');
  await bad('/v1/conversations/conv_nothing/items', { items: [] }, 404, 'conversation_id', 'not_found');
  await bad('/v1/responses', { model: MODEL, input: 'hi', conversation: 'conv_nothing' }, 400, 'conversation', 'conversation_not_found');
  await bad('/v1/responses', { model: MODEL, input: 'hi', conversation: 7 }, 400, 'conversation');
  const r1 = await client.responses.create({ model: MODEL, input: 'reason about it' });
  await bad('/v1/responses', { model: MODEL, input: 'hi', conversation: conv.id, previous_response_id: r1.id }, 400, 'conversation');
  let r = await fetch(`${srv.url}/v1/conversations/${conv.id}/items?limit=0`);
  assertErrorBody(assert, { status: r.status, json: await r.json() }, 400, { param: 'limit' });
  r = await fetch(`${srv.url}/v1/conversations/${conv.id}/items?order=up`);
  assertErrorBody(assert, { status: r.status, json: await r.json() }, 400, { param: 'order' });
  await assert.rejects(client.conversations.retrieve('conv_nothing'), OpenAI.NotFoundError);
});
