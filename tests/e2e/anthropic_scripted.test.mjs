// End-to-end tests of POST /v1/messages and /v1/messages/count_tokens with the official
// @anthropic-ai/sdk client against `lilac serve --backend scripted:FILE`: the scripted replies go
// through the real tokenizer, template, output parser and generation core, so blocks, stop reasons,
// tool round trips, thinking on/off and the reasoning budget are asserted exactly.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson } from './helpers.mjs';
import { Anthropic, script, anthropicTools as tools, anthropicClient, collect, SCRIPTED_MODEL, startScripted } from './protocols_common.mjs';

const MODEL = SCRIPTED_MODEL;
let srv, client;
before(async () => {
  srv = await startScripted();
  client = anthropicClient(srv.url);
});
after(async () => { await srv?.stop(); });

const user = (content) => [{ role: 'user', content }];
const thinkingOn = { type: 'enabled', budget_tokens: 50 };

test('non-streaming: thinking and text blocks, end_turn, usage', async () => {
  const m = await client.messages.create({ model: MODEL, max_tokens: 2000, messages: user('reason about it'), thinking: thinkingOn });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, MODEL);
  assert.deepEqual(m.content, [
    { type: 'thinking', thinking: 'Let me think step by step.', signature: '' },
    { type: 'text', text: 'The answer is 42.' },
  ]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.input_tokens > 5);
  assert.ok(m.usage.output_tokens > 10 && m.usage.output_tokens < 30, JSON.stringify(m.usage));
});

test('thinking enabled opens the reasoning; disabled and absent close it', async () => {
  const on = await client.messages.create({ model: MODEL, max_tokens: 100, messages: user('MODE'), thinking: thinkingOn });
  assert.deepEqual(on.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(on.content[0].thinking, 'thinking was on');
  assert.equal(on.content[1].text, 'yes');
  for (const thinking of [{ type: 'disabled' }, undefined]) {
    const off = await client.messages.create({ model: MODEL, max_tokens: 100, messages: user('MODE'), thinking });
    assert.deepEqual(off.content, [{ type: 'text', text: 'thinking was off' }]);
  }
});

test('streaming: the exact event sequence; the stream helper gives the non-streaming message', async () => {
  const req = { model: MODEL, max_tokens: 2000, messages: user('reason about it'), thinking: thinkingOn };
  const evs = await collect(await client.messages.create({ ...req, stream: true }));
  const types = evs.map((e) => (e.type === 'content_block_delta' ? `delta:${e.delta.type}` : e.type));
  const squeeze = types.filter((t, i) => t !== types[i - 1] || !t.startsWith('delta:'));
  assert.deepEqual(squeeze, ['message_start', 'content_block_start', 'delta:thinking_delta', 'content_block_stop',
    'content_block_start', 'delta:text_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  assert.equal(evs[0].message.role, 'assistant');
  assert.deepEqual(evs[0].message.content, []);
  assert.ok(evs[0].message.usage.input_tokens > 5);
  const starts = evs.filter((e) => e.type === 'content_block_start');
  assert.deepEqual(starts.map((e) => [e.index, e.content_block.type]), [[0, 'thinking'], [1, 'text']]);
  const thinking = evs.filter((e) => e.delta?.type === 'thinking_delta').map((e) => e.delta.thinking).join('');
  const text = evs.filter((e) => e.delta?.type === 'text_delta').map((e) => e.delta.text).join('');
  assert.equal(thinking, 'Let me think step by step.');
  assert.equal(text, 'The answer is 42.');
  const md = evs.find((e) => e.type === 'message_delta');
  assert.equal(md.delta.stop_reason, 'end_turn');
  const whole = await client.messages.create(req);
  assert.equal(md.usage.output_tokens, whole.usage.output_tokens);
  const final = await client.messages.stream(req).finalMessage();
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, 'end_turn');
});

test('tool round trip: tool_use (streamed as input_json_delta), then tool_result and the answer', async () => {
  const req = { model: MODEL, max_tokens: 500, tools, thinking: thinkingOn, messages: user('What is the weather in Paris?') };
  const m = await client.messages.create(req);
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(m.content[0].thinking, 'The user wants the weather.');
  const call = m.content[1];
  assert.equal(call.type, 'tool_use');
  assert.match(call.id, /^toolu_/);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(call.input, { city: 'Paris', days: 3 });
  assert.equal(m.content.length, 2);

  const evs = await collect(await client.messages.create({ ...req, stream: true }));
  const start = evs.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
  assert.equal(start.content_block.name, 'get_weather');
  assert.deepEqual(start.content_block.input, {});
  const json = evs.filter((e) => e.delta?.type === 'input_json_delta' && e.index === start.index).map((e) => e.delta.partial_json).join('');
  assert.deepEqual(JSON.parse(json), { city: 'Paris', days: 3 });
  assert.equal(evs.find((e) => e.type === 'message_delta').delta.stop_reason, 'tool_use');

  // The second turn as agents send it: the assistant's blocks back, then the tool result.
  const r = await client.messages.create({
    model: MODEL, max_tokens: 500, tools,
    messages: [...req.messages, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: '{"temp": 21}' }] }],
  });
  assert.equal(r.stop_reason, 'end_turn');
  assert.deepEqual(r.content, [{ type: 'text', text: 'It is 21 degrees.' }]);
  // is_error and block content
  const e = await client.messages.create({
    model: MODEL, max_tokens: 500, tools,
    messages: [...req.messages, { role: 'assistant', content: [call] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, is_error: true, content: [{ type: 'text', text: 'disk full' }] }] }],
  });
  assert.equal(e.content.at(-1).text, 'The tool failed.');
});

test('tool_choice: tool forces the named call, none leaves the tools out', async () => {
  const m = await client.messages.create({ model: MODEL, max_tokens: 200, tools, messages: user('FORCED call'), tool_choice: { type: 'tool', name: 'get_weather' } });
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content, [{ type: 'tool_use', id: m.content[0].id, name: 'get_weather', input: { city: 'Rome', days: 1 } }]);
  const n = await client.messages.create({ model: MODEL, max_tokens: 200, tools, messages: user('hello'), tool_choice: { type: 'none' } });
  assert.equal(n.stop_reason, 'end_turn');
  assert.deepEqual(n.content.map((b) => b.type), ['text']);
});

test('max_tokens and stop_sequences give their stop reasons', async () => {
  const m = await client.messages.create({ model: MODEL, max_tokens: 4, messages: user('forever') });
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 4);
  assert.equal(m.content[0].text, ' tick tick tick tick');
  const s = await client.messages.create({ model: MODEL, max_tokens: 100, messages: user('stopword'), stop_sequences: ['nope', 'STOP'] });
  assert.equal(s.stop_reason, 'stop_sequence');
  assert.equal(s.stop_sequence, 'STOP');
  assert.equal(s.content[0].text, 'alpha beta ');
  const evs = await collect(await client.messages.create({ model: MODEL, max_tokens: 100, messages: user('stopword'), stop_sequences: ['STOP'], stream: true }));
  const md = evs.find((e) => e.type === 'message_delta');
  assert.deepEqual(md.delta, { stop_reason: 'stop_sequence', stop_sequence: 'STOP' });
});

test('thinking.budget_tokens: reasoning cut at the budget and closed, the answer follows within max_tokens', async () => {
  const m = await client.messages.create({ model: MODEL, max_tokens: 12, messages: user('forever'), thinking: { type: 'enabled', budget_tokens: 5 } });
  // the closing markup ("\n</think>\n\n", 3 tokens) is forced as the generation's next tokens, and counts
  assert.deepEqual(m.content, [{ type: 'thinking', thinking: ' tick'.repeat(5), signature: '' }, { type: 'text', text: ' tick'.repeat(4) }]);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 12);
  // Reasoning that ends within the budget: the generation goes on where it stopped (same result and
  // count as without a budget), streamed the same.
  const base = { model: MODEL, max_tokens: 200, messages: user('resume') };
  const free = await client.messages.create({ ...base, thinking: thinkingOn });
  const cut = await client.messages.create({ ...base, thinking: { type: 'enabled', budget_tokens: 6 } });
  assert.deepEqual(free.content, [{ type: 'thinking', thinking: 'Think.', signature: '' }, { type: 'text', text: 'One two three four five six seven eight nine ten.' }]);
  assert.deepEqual(cut.content, free.content);
  assert.equal(cut.usage.output_tokens, free.usage.output_tokens);
  assert.equal(cut.usage.input_tokens, free.usage.input_tokens);
  const streamed = await client.messages.stream({ ...base, thinking: { type: 'enabled', budget_tokens: 6 } }).finalMessage();
  assert.deepEqual(streamed.content, free.content);
});

test('count_tokens equals the input_tokens of the same request', async () => {
  const body = { model: MODEL, system: [{ type: 'text', text: 'Be brief.' }], tools, messages: user('What is the weather in Rome?'), thinking: thinkingOn };
  const c = await client.messages.countTokens(body);
  const m = await client.messages.create({ ...body, max_tokens: 300 });
  assert.equal(c.input_tokens, m.usage.input_tokens);
  const plain = await client.messages.countTokens({ model: MODEL, messages: user('What is the weather in Rome?') });
  assert.ok(plain.input_tokens < c.input_tokens - 50, 'tools and system are counted');
});

test('errors: Anthropic shape and status codes', async () => {
  const bad = async (body, status, re, headers = {}) => {
    const r = await postJson(`${srv.url}/v1/messages`, body, headers);
    assert.equal(r.status, status, r.text);
    assert.equal(r.json.type, 'error', r.text);
    assert.equal(typeof r.json.error.type, 'string');
    assert.match(r.json.error.message, re);
    return r.json.error;
  };
  assert.equal((await bad({ model: MODEL, messages: user('hi') }, 400, /max_tokens/)).type, 'invalid_request_error');
  await bad({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }, 400, /image/);
  await bad({ model: MODEL, max_tokens: 10, messages: [{ role: 'system', content: 'x' }] }, 400, /role/);
  await bad({ model: MODEL, max_tokens: 10, messages: user('hi'), temperature: 1.5 }, 400, /temperature/);
  await bad({ model: MODEL, max_tokens: 10, messages: user('hi'), thinking: { type: 'enabled', budget_tokens: 10 } }, 400, /budget_tokens/);
  await bad({ model: MODEL, max_tokens: 10, messages: user('hi'), tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 400, /web_search/);
  await bad({ model: MODEL, max_tokens: 10, messages: [...user('hi'), { role: 'assistant', content: 'Sure ' }] }, 400, /whitespace/);
  await bad('{not json', 400, /JSON/);
  assert.equal((await bad({ model: 'claude-nope', max_tokens: 10, messages: user('hi') }, 404, /claude-nope/)).type, 'not_found_error');
  await bad({ model: MODEL, max_tokens: 10, messages: user('hi') }, 400, /anthropic-version/, { 'anthropic-version': '1999-01-01' });
  // Through the SDK: typed errors carrying the body.
  await assert.rejects(client.messages.create({ model: MODEL, messages: user('hi') }), (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    return true;
  });
  await assert.rejects(client.messages.create({ model: 'other', max_tokens: 5, messages: user('hi') }), Anthropic.NotFoundError);
  const r = await postJson(`${srv.url}/v1/messages/count_tokens`, { messages: 'x' });
  assert.equal(r.status, 400);
  assert.equal(r.json.type, 'error');
});

test('--api-key: x-api-key or a bearer token; a wrong key is a 401 in Anthropic shape', async () => {
  const keyed = await startServer(['--backend', `scripted:${script()}`, '--model-name', MODEL, '--api-key', 'sekret']);
  try {
    const ok = await anthropicClient(keyed.url, { apiKey: 'sekret' }).messages.create({ model: MODEL, max_tokens: 50, messages: user('hello') });
    assert.equal(ok.content[0].text, 'Hello from the script.');
    const bearer = await anthropicClient(keyed.url, { apiKey: null, authToken: 'sekret' }).messages.create({ model: MODEL, max_tokens: 50, messages: user('hello') });
    assert.equal(bearer.content[0].text, 'Hello from the script.');
    await assert.rejects(anthropicClient(keyed.url, { apiKey: 'wrong' }).messages.create({ model: MODEL, max_tokens: 50, messages: user('hello') }), (e) => {
      assert.ok(e instanceof Anthropic.AuthenticationError);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'authentication_error');
      return true;
    });
  } finally {
    await keyed.stop();
  }
});
