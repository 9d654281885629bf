// End-to-end tests of POST /v1/responses with the official `openai` client's responses.create against
// `lilac serve --backend scripted:FILE`: output items, typed stream events with sequence numbers,
// a function-call round trip, reasoning on/off, max_output_tokens and errors, asserted exactly.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { postJson, assertErrorBody } from './helpers.mjs';
import { OpenAI, responsesTools as tools, openaiClient, collect, SCRIPTED_MODEL, startScripted } from './protocols_common.mjs';

const MODEL = SCRIPTED_MODEL;
let srv, client;
before(async () => {
  srv = await startScripted();
  client = openaiClient(srv.url);
});
after(async () => { await srv?.stop(); });

const off = { effort: 'none' };

test('non-streaming: reasoning and message items, output_text, usage', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'reason about it' });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'completed');
  assert.equal(r.model, MODEL);
  assert.equal(r.store, true);  // OpenAI's default: kept for previous_response_id
  assert.equal(r.output.length, 2);
  const [rs, msg] = r.output;
  assert.equal(rs.type, 'reasoning');
  assert.match(rs.id, /^rs_/);
  assert.deepEqual(rs.content, [{ type: 'reasoning_text', text: 'Let me think step by step.' }]);
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.status, 'completed');
  assert.deepEqual(msg.content.map((c) => [c.type, c.text]), [['output_text', 'The answer is 42.']]);
  assert.equal(r.output_text, 'The answer is 42.');
  const u = r.usage;
  assert.ok(u.input_tokens > 5);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  // "Let me think step by step.\n</think>" is reasoning; "\n\nThe answer is 42." and the end are not.
  assert.ok(u.output_tokens_details.reasoning_tokens >= 7 && u.output_tokens_details.reasoning_tokens < u.output_tokens - 4, JSON.stringify(u));
  assert.equal(u.input_tokens_details.cached_tokens >= 0, true);
});

test('reasoning effort none turns thinking off; other efforts and none given leave it on', async () => {
  const a = await client.responses.create({ model: MODEL, input: 'MODE', reasoning: off });
  assert.deepEqual(a.output.map((o) => o.type), ['message']);
  assert.equal(a.output_text, 'thinking was off');
  assert.equal(a.reasoning.effort, 'none');
  for (const reasoning of [{ effort: 'high' }, undefined]) {
    const b = await client.responses.create({ model: MODEL, input: 'MODE', reasoning });
    assert.deepEqual(b.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(b.output[0].content[0].text, 'thinking was on');
    assert.equal(b.output_text, 'yes');
  }
});

test('instructions and input items are rendered as a conversation', async () => {
  const r = await client.responses.create({
    model: MODEL, instructions: 'Be brief.', reasoning: off,
    input: [
      { role: 'developer', content: 'Answer in English.' },
      { role: 'user', content: [{ type: 'input_text', text: 'first question' }] },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'first answer', annotations: [] }] },
      { role: 'user', content: 'hello again' },
    ],
  });
  assert.equal(r.output_text, 'Hello from the script.');
  assert.equal(r.instructions, 'Be brief.');
});

test('streaming: typed events with consecutive sequence numbers; the stream helper gives the same response', async () => {
  const evs = await collect(await client.responses.create({ model: MODEL, input: 'reason about it', stream: true }));
  evs.forEach((e, i) => assert.equal(e.sequence_number, i, e.type));
  const types = evs.map((e) => e.type).filter((t, i, a) => !(t.endsWith('.delta') && a[i - 1] === t));
  assert.deepEqual(types, [
    'response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta',
    'response.reasoning_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
    'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.completed']);
  assert.equal(evs[0].response.status, 'in_progress');
  const text = evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, 'The answer is 42.');
  assert.equal(evs.find((e) => e.type === 'response.output_text.done').text, 'The answer is 42.');
  assert.equal(evs.find((e) => e.type === 'response.reasoning_text.done').text, 'Let me think step by step.');
  const done = evs.at(-1).response;
  assert.equal(done.status, 'completed');
  assert.equal(done.output[1].content[0].text, 'The answer is 42.');
  assert.ok(done.usage.output_tokens > 0);
  const final = await client.responses.stream({ model: MODEL, input: 'reason about it' }).finalResponse();
  assert.equal(final.status, 'completed');
  assert.equal(final.output[0].content[0].text, 'Let me think step by step.');
  assert.equal(final.output[1].content[0].text, 'The answer is 42.');
});

test('function call round trip (streamed arguments too)', async () => {
  const req = { model: MODEL, tools, input: [{ role: 'user', content: 'What is the weather in Paris?' }] };
  const r = await client.responses.create(req);
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'function_call']);
  const call = r.output[1];
  assert.match(call.id, /^fc_/);
  assert.match(call.call_id, /^call_/);
  assert.equal(call.name, 'get_weather');
  assert.equal(call.status, 'completed');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris', days: 3 });

  const evs = await collect(await client.responses.create({ ...req, stream: true }));
  const args = evs.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 3 });
  const fdone = evs.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(fdone.name, 'get_weather');
  assert.equal(fdone.arguments, args);
  const added = evs.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
  assert.equal(added.item.arguments, '');
  assert.equal(added.output_index, 1);

  // The second turn as agents send it: the output items back, then the function's output.
  const r2 = await client.responses.create({
    model: MODEL, tools, reasoning: off,
    input: [...req.input, ...r.output, { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' }],
  });
  assert.equal(r2.output_text, 'It is 21 degrees.');
});

test('tool_choice: a named function forces the call; none gives text', async () => {
  const r = await client.responses.create({ model: MODEL, tools, input: 'FORCED call', tool_choice: { type: 'function', name: 'get_weather' } });
  assert.deepEqual(r.output.map((o) => o.type), ['function_call']);
  assert.deepEqual(JSON.parse(r.output[0].arguments), { city: 'Rome', days: 1 });
  assert.deepEqual(r.tool_choice, { type: 'function', name: 'get_weather' });
  const n = await client.responses.create({ model: MODEL, tools, input: 'hello', tool_choice: 'none', reasoning: off });
  assert.equal(n.output_text, 'Hello from the script.');
});

test('max_output_tokens: status incomplete (response.incomplete when streaming)', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'forever', max_output_tokens: 5, reasoning: off });
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.output_tokens, 5);
  assert.equal(r.output_text, ' tick'.repeat(5));
  assert.equal(r.max_output_tokens, 5);
  const evs = await collect(await client.responses.create({ model: MODEL, input: 'forever', max_output_tokens: 5, reasoning: off, stream: true }));
  assert.equal(evs.at(-1).type, 'response.incomplete');
  assert.equal(evs.at(-1).response.status, 'incomplete');
});

test('errors: OpenAI shape naming the field', async () => {
  const bad = async (body, status, param, code) => {
    const r = await postJson(`${srv.url}/v1/responses`, body);
    assertErrorBody(assert, r, status, { param, code });
    return r.json.error;
  };
  await bad({ model: MODEL, input: 'hi', store: 'yes' }, 400, 'store', 'invalid_type');
  await bad({ model: MODEL, input: 'hi', previous_response_id: 'resp_x' }, 400, 'previous_response_id', 'previous_response_not_found');
  // text.format json_schema is enforced by constrained decoding: a keyword outside lilac's subset is a 400
  // naming the Responses field (not chat completions' response_format)
  const e = await bad({ model: MODEL, input: 'hi', text: { format: { type: 'json_schema', name: 'x', schema: { type: 'string', contentMediaType: 'text/html' } } } },
    400, 'text.format.schema', 'invalid_schema');
  assert.match(e.message, /contentMediaType/);
  await bad({ model: MODEL, input: 'hi', text: { format: { type: 'xml' } } }, 400, 'text.format.type', undefined);
  await bad({ model: MODEL, input: 'hi', text: { format: { type: 'json_schema', schema: {} } } }, 400, 'text.format.name', undefined);
  await bad({ model: MODEL }, 400, 'input', 'missing_required_parameter');
  await bad({ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 400, 'input[0].content[0].type', 'unsupported_value');
  await bad({ model: MODEL, input: 'hi', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type', 'unsupported_value');
  await bad({ model: MODEL, input: 'hi', temperature: 3 }, 400, 'temperature', 'invalid_value');
  await bad({ model: MODEL, input: 'hi', max_output_tokens: 0 }, 400, 'max_output_tokens', 'invalid_value');
  await bad({ model: 'nope', input: 'hi' }, 404, 'model', 'model_not_found');
  await assert.rejects(client.responses.create({ model: MODEL, input: 'hi', previous_response_id: 'resp_gone' }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'previous_response_id');
    return true;
  });
});

test('stored responses: previous_response_id continues the conversation; retrieve and delete', async () => {
  const r1 = await client.responses.create({ model: MODEL, input: 'reason about it', instructions: 'Be brief.' });
  assert.equal(r1.store, true);
  const got = await client.responses.retrieve(r1.id);
  assert.deepEqual(got, r1);
  // The follow-up's prompt is the whole conversation: the same input tokens as sending it all by hand
  // (r1's output items as input), with this request's instructions only.
  const r2 = await client.responses.create({ model: MODEL, input: 'and now?', previous_response_id: r1.id, instructions: 'Be brief.', store: false });
  assert.equal(r2.previous_response_id, r1.id);
  // r1's input items: the one user message
  const items1 = await client.responses.inputItems.list(r1.id);
  assert.deepEqual(items1.data.map((i) => i.content), ['reason about it']);
  assert.equal(r2.store, false);
  const byHand = await client.responses.create({
    model: MODEL, instructions: 'Be brief.', store: false,
    input: [{ role: 'user', content: 'reason about it' }, ...r1.output, { role: 'user', content: 'and now?' }],
  });
  assert.equal(r2.usage.input_tokens, byHand.usage.input_tokens);
  assert.deepEqual(r2.output.map((o) => o.type), byHand.output.map((o) => o.type));
  // store: false is not kept; a stream is kept as its completed response
  await assert.rejects(client.responses.retrieve(r2.id), OpenAI.NotFoundError);
  // a stored follow-up's input items are the whole conversation's, newest first (order=asc: oldest first)
  const r3 = await client.responses.create({ model: MODEL, input: 'third', previous_response_id: r1.id });
  const asc = (await client.responses.inputItems.list(r3.id, { order: 'asc' })).data;
  assert.deepEqual(asc, [{ role: 'user', content: 'reason about it' }, ...r1.output, { role: 'user', content: 'third' }]);
  const desc = (await client.responses.inputItems.list(r3.id)).data;
  assert.deepEqual(desc, [...asc].reverse());
  const evs = [];
  for await (const e of await client.responses.create({ model: MODEL, input: 'reason about it', stream: true })) evs.push(e);
  const done = evs.at(-1).response;
  const { output_text: _text, ...kept } = await client.responses.retrieve(done.id);  // (the SDK adds output_text)
  assert.deepEqual(kept, done);
  const del = await client.responses.delete(r1.id);
  await assert.rejects(client.responses.retrieve(r1.id), OpenAI.NotFoundError);
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x', previous_response_id: r1.id }), OpenAI.BadRequestError);
  assert.deepEqual(del, { id: r1.id, object: 'response', deleted: true });
  const raw = await fetch(`${srv.url}/v1/responses/${done.id}`, { method: 'DELETE' });
  assert.deepEqual(await raw.json(), { id: done.id, object: 'response', deleted: true });
});

// Background mode: answered at once ("queued"), polled with retrieve until it ends; the stored object is the one
// a foreground request answers (but for background: true and its id); cancel stops a running one and keeps
// what it generated; cancelling an ended or foreground response is a 400; a DELETE stops a running one.
async function until(id, done, ms = 20000) {
  const t0 = Date.now();
  for (;;) {
    const r = await client.responses.retrieve(id);
    if (done(r)) return r;
    assert.ok(Date.now() - t0 < ms, `response ${id} still ${r.status}`);
    await new Promise((f) => setTimeout(f, 20));
  }
}

test('background: queued at once, then polled until completed, as a foreground response', async () => {
  const fg = await client.responses.create({ model: MODEL, input: 'reason about it', instructions: 'Be brief.' });
  const bg = await client.responses.create({ model: MODEL, input: 'reason about it', instructions: 'Be brief.', background: true });
  assert.match(bg.id, /^resp_/);
  assert.equal(bg.background, true);
  assert.ok(['queued', 'in_progress'].includes(bg.status), bg.status);
  assert.deepEqual(bg.output, []);
  assert.equal(bg.usage, null);
  assert.equal(fg.background, false);
  const done = await until(bg.id, (r) => r.status !== 'queued' && r.status !== 'in_progress');
  assert.equal(done.status, 'completed');
  assert.equal(done.output_text, 'The answer is 42.');
  assert.deepEqual(done.output.map((o) => o.type), fg.output.map((o) => o.type));
  assert.equal(done.usage.input_tokens, fg.usage.input_tokens);
  assert.equal(done.usage.output_tokens, fg.usage.output_tokens);
  // it continues like any stored response
  const next = await client.responses.create({ model: MODEL, input: 'and now?', previous_response_id: bg.id, store: false });
  const byHand = await client.responses.create({
    model: MODEL, store: false, input: [{ role: 'user', content: 'reason about it' }, ...done.output, { role: 'user', content: 'and now?' }],
  });
  assert.equal(next.usage.input_tokens, byHand.usage.input_tokens);
  await assert.rejects(client.responses.cancel(bg.id), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, /status is 'completed'/);
    return true;
  });
  await assert.rejects(client.responses.cancel(fg.id), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, /background/);
    return true;
  });
  await assert.rejects(client.responses.cancel('resp_nothing'), OpenAI.NotFoundError);
});

test('background: cancel stops a running generation and keeps its output; delete stops one too', async () => {
  const bg = await client.responses.create({ model: MODEL, input: 'forever', reasoning: off, background: true });
  const running = await until(bg.id, (r) => r.status === 'in_progress' && r.output.length > 0 && r.output[0].content?.[0]?.text.length > 0);
  assert.equal(running.usage, null);
  const c = await client.responses.cancel(bg.id);
  assert.equal(c.status, 'cancelled');
  assert.equal(c.background, true);
  assert.match(c.output_text ?? c.output[0].content[0].text, /^( tick)+$/);
  assert.ok(c.usage.output_tokens > 0);
  const again = await client.responses.cancel(bg.id);  // cancelled already: answered as it is
  assert.equal(again.status, 'cancelled');
  const kept = await client.responses.retrieve(bg.id);
  assert.equal(kept.status, 'cancelled');
  assert.equal(kept.output[0].content[0].text, c.output[0].content[0].text);
  // a DELETE of a running one stops it: the server is free for the next request at once
  const bg2 = await client.responses.create({ model: MODEL, input: 'forever', reasoning: off, background: true });
  await until(bg2.id, (r) => r.status === 'in_progress');
  assert.deepEqual(await client.responses.delete(bg2.id), { id: bg2.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(bg2.id), OpenAI.NotFoundError);
  const quick = await client.responses.create({ model: MODEL, input: 'reason about it' });
  assert.equal(quick.status, 'completed');
});

test('background: needs store (400 naming background)', async () => {
  const r = await postJson(`${srv.url}/v1/responses`, { model: MODEL, input: 'hi', background: true, store: false });
  assertErrorBody(assert, r, 400, { param: 'background' });
});

// A streamed background response: its events as a foreground stream's (sequence numbers 0..n-1), read again from
// any point with retrieve({stream: true, starting_after}); a client that goes away does not stop it, and resumes.
test('background + stream: the events, read again after any sequence number; a lost connection resumes', async () => {
  const evs = await collect(await client.responses.create({ model: MODEL, input: 'reason about it', background: true, stream: true }));
  assert.deepEqual(evs.map((e) => e.sequence_number), evs.map((_, i) => i));
  assert.equal(evs[0].type, 'response.created');
  const last = evs.at(-1);
  assert.equal(last.type, 'response.completed');
  assert.equal(last.response.background, true);
  const fg = await collect(await client.responses.create({ model: MODEL, input: 'reason about it', stream: true }));
  assert.deepEqual(evs.map((e) => e.type), fg.map((e) => e.type));
  const { output_text: _t, ...stored } = await client.responses.retrieve(last.response.id);
  assert.deepEqual(stored, last.response);
  const again = await collect(await client.responses.retrieve(last.response.id, { stream: true, starting_after: 3 }));
  assert.deepEqual(again, evs.slice(4));
  assert.deepEqual(await collect(await client.responses.retrieve(last.response.id, { stream: true })), evs);
  // a connection lost mid-stream: the generation goes on; the client resumes after the last event it saw
  const ac = new AbortController();
  const seen = [];
  const s = await client.responses.create({ model: MODEL, input: 'forever', reasoning: off, background: true, stream: true }, { signal: ac.signal });
  try {
    for await (const e of s) {
      seen.push(e);
      if (seen.length >= 8) ac.abort();
    }
  } catch (e) {
    assert.ok(e.name === 'AbortError' || e instanceof OpenAI.APIUserAbortError, String(e));
  }
  const id = seen[0].response.id;
  await new Promise((f) => setTimeout(f, 100));
  assert.equal((await client.responses.retrieve(id)).status, 'in_progress');
  const resumed = await client.responses.retrieve(id, { stream: true, starting_after: seen.at(-1).sequence_number });
  const more = [];
  for await (const e of resumed) {
    more.push(e);
    if (more.length === 5) await client.responses.cancel(id);  // the stream ends once it is cancelled
  }
  assert.equal(more[0].sequence_number, seen.at(-1).sequence_number + 1);
  assert.deepEqual(more.map((e) => e.sequence_number), more.map((_, i) => seen.at(-1).sequence_number + 1 + i));
  assert.ok(more.filter((e) => e.type === 'response.output_text.delta').every((e) => e.delta === ' tick'));
  // it ends with one terminal event, response.cancelled, carrying the response as retrieve shows it
  const ends = ['response.completed', 'response.incomplete', 'response.failed', 'response.cancelled'];
  assert.deepEqual(more.filter((e) => ends.includes(e.type)).map((e) => e.type), ['response.cancelled']);
  assert.equal(more.at(-1).type, 'response.cancelled');
  const { output_text: _c, ...cancelled } = await client.responses.retrieve(id);
  assert.equal(cancelled.status, 'cancelled');
  assert.deepEqual(more.at(-1).response, cancelled);
  // not streamed, or a bad starting_after: 400
  const plain = await client.responses.create({ model: MODEL, input: 'reason about it', background: true });
  await until(plain.id, (r) => r.status === 'completed');
  let r = await fetch(`${srv.url}/v1/responses/${plain.id}?stream=true`);
  assertErrorBody(assert, { status: r.status, json: await r.json() }, 400, { param: 'stream' });
  r = await fetch(`${srv.url}/v1/responses/${id}?stream=true&starting_after=x`);
  assertErrorBody(assert, { status: r.status, json: await r.json() }, 400, { param: 'starting_after' });
});
