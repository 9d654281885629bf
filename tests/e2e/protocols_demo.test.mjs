// One generation underneath every protocol: on the random-weight demo model (real CPU backend, greedy),
// the same conversation through /v1/chat/completions, /v1/messages (@anthropic-ai/sdk) and
// /v1/responses (openai's responses.create) gives the same tokens, streamed or not; Anthropic's
// thinking budget cuts the reasoning exactly where a shorter chat completion ends; a final assistant message
// is continued (a prefill) with exactly the tokens /v1/completions writes after its prompt's ids.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startServer, LILAC, DEMO } from './helpers.mjs';
import { anthropicClient, openaiClient, collect } from './protocols_common.mjs';

let srv, anth, oai, model;
const question = 'Hello! Say something.';

before(async () => {
  srv = await startServer(['--backend', process.env.LILAC_E2E_BACKEND || 'cpu-ref', '--max-seq', '4096']);
  anth = anthropicClient(srv.url);
  oai = openaiClient(srv.url);
  model = (await oai.models.list()).data[0].id;
});
after(async () => { await srv?.stop(); });

const chat = (max_tokens, thinking) => oai.chat.completions.create({
  model, max_tokens, temperature: 0, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: question }],
  chat_template_kwargs: { enable_thinking: thinking },
});
const joined = (blocks, type) => blocks.filter((b) => b.type === type).map((b) => b[type]).join('');

test('Messages (thinking off) = chat completions, streamed or not; count_tokens = prompt_tokens', async () => {
  const c = await chat(6, false);
  const req = { model, max_tokens: 6, temperature: 0, system: 'Be brief.', messages: [{ role: 'user', content: question }] };
  const m = await anth.messages.create(req);
  assert.equal(joined(m.content, 'text'), c.choices[0].message.content);
  assert.equal(joined(m.content, 'thinking'), '');
  assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
  assert.equal(m.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(m.stop_reason, c.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  const s = await anth.messages.stream(req).finalMessage();
  assert.deepEqual(s.content, m.content);
  assert.equal(s.usage.output_tokens, m.usage.output_tokens);
  const n = await anth.messages.countTokens({ model, system: 'Be brief.', messages: req.messages });
  assert.equal(n.input_tokens, c.usage.prompt_tokens);
});

// The closing markup ("\n</think>\n\n", 3 tokens) is forced after the budget and counts as output; a budget that
// leaves it no room before max_tokens is shortened so that the block still closes (engine/reasoning_budget.h).
test('Messages thinking budget: the reasoning is the first budget_tokens of the same generation', async () => {
  const messages = [{ role: 'user', content: question }];
  for (const [max_tokens, budget, kept] of [[10, 5, 5], [7, 5, 4]]) {
    const c = await chat(kept, true);
    assert.equal(c.choices[0].finish_reason, 'length');
    const m = await anth.messages.create({
      model, max_tokens, temperature: 0, system: 'Be brief.', messages, thinking: { type: 'enabled', budget_tokens: budget },
    });
    assert.equal(joined(m.content, 'thinking'), c.choices[0].message.reasoning_content, `max_tokens ${max_tokens}`);
    assert.equal(m.content[0].type, 'thinking');
    assert.equal(m.usage.output_tokens, max_tokens);
    assert.equal(m.stop_reason, 'max_tokens');
  }
});

test('Responses (reasoning off) = chat completions, streamed or not', async () => {
  const c = await chat(6, false);
  const req = { model, max_output_tokens: 6, temperature: 0, instructions: 'Be brief.', input: question, reasoning: { effort: 'none' } };
  const r = await oai.responses.create(req);
  assert.equal(r.output_text, c.choices[0].message.content);
  assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(r.status, c.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  const evs = await collect(await oai.responses.create({ ...req, stream: true }));
  const text = evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, r.output_text);
  evs.forEach((e, i) => assert.equal(e.sequence_number, i));
});

test('Responses (reasoning on) = chat completions with thinking', async () => {
  const c = await chat(5, true);
  const r = await oai.responses.create({ model, max_output_tokens: 5, temperature: 0, instructions: 'Be brief.', input: question });
  const reasoning = r.output.filter((o) => o.type === 'reasoning').map((o) => o.content[0].text).join('');
  assert.equal(reasoning, c.choices[0].message.reasoning_content);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 5);
});

test('tool round trips render through the real template and model (both protocols)', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const body = {
    model, system: 'Be brief.', tools,
    messages: [{ role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp": 21}' }] }],
  };
  const m = await anth.messages.create({ ...body, max_tokens: 4, temperature: 0 });
  assert.equal(m.role, 'assistant');
  assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(m.stop_reason));
  assert.equal(m.usage.output_tokens <= 4, true);
  assert.equal(m.usage.input_tokens, (await anth.messages.countTokens(body)).input_tokens);
  // The same conversation as chat completions messages: the same prompt.
  const c = await oai.chat.completions.create({
    model, max_tokens: 1, temperature: 0, chat_template_kwargs: { enable_thinking: false },
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather', parameters: tools[0].input_schema } }],
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: 'Let me check.', tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'toolu_1', content: '{"temp": 21}' }],
  });
  assert.equal(m.usage.input_tokens, c.usage.prompt_tokens);
  const r = await oai.responses.create({
    model, max_output_tokens: 4, temperature: 0, instructions: 'Be brief.', reasoning: { effort: 'none' },
    tools: [{ type: 'function', name: 'get_weather', description: 'Weather', parameters: tools[0].input_schema }],
    input: [{ role: 'user', content: 'Weather in Paris?' },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Let me check.' }] },
      { type: 'function_call', call_id: 'toolu_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'toolu_1', output: '{"temp": 21}' }],
  });
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
  assert.ok(['completed', 'incomplete'].includes(r.status));
});

test('a final assistant message is continued (prefill): chat, Responses, Messages = completions of the open prompt', async () => {
  const messages = [{ role: 'user', content: question }, { role: 'assistant', content: 'Sure, here' }];
  // The prompt a prefill must be: rendered without a generation prompt, the last end of turn removed.
  const rendered = execFileSync(LILAC, ['render-chat', '--tokenizer', DEMO],
    { input: JSON.stringify({ messages, add_generation_prompt: false }) }).toString();
  assert.ok(rendered.endsWith('</think>\n\nSure, here<|im_end|>\n'), rendered);
  const open = rendered.slice(0, -'<|im_end|>\n'.length);
  const ids = JSON.parse(execFileSync(LILAC, ['tokenize', '--tokenizer', DEMO], { input: `${JSON.stringify(open)}\n` }).toString());
  const ref = await oai.completions.create({ model, prompt: ids, max_tokens: 8, temperature: 0 });
  assert.equal(ref.usage.prompt_tokens, ids.length);
  assert.equal(ref.usage.completion_tokens, 8);  // a continuation to compare, not an immediate end
  const c = await oai.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
  assert.equal(c.usage.prompt_tokens, ids.length);
  assert.equal(c.usage.completion_tokens, ref.usage.completion_tokens);
  assert.equal(c.choices[0].message.content, ref.choices[0].text);
  const r = await oai.responses.create({ model, max_output_tokens: 8, temperature: 0, store: false,
    input: [messages[0], { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Sure, here' }] }] });
  assert.equal(r.output_text, ref.choices[0].text);
  assert.equal(r.usage.input_tokens, ids.length);
  const req = { model, max_tokens: 8, temperature: 0, messages: [messages[0], { role: 'assistant', content: [{ type: 'text', text: 'Sure, here' }] }] };
  const m = await anth.messages.create(req);
  assert.equal(joined(m.content, 'text'), ref.choices[0].text);
  assert.equal(m.usage.input_tokens, ids.length);
  const s = await anth.messages.stream(req).finalMessage();
  assert.deepEqual(s.content, m.content);
  assert.equal((await anth.messages.countTokens({ model, messages: req.messages })).input_tokens, ids.length);
  await assert.rejects(anth.messages.create({ ...req, messages: [messages[0], { role: 'assistant', content: 'Sure, here ' }] }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.error.type, 'invalid_request_error');
    return true;
  });
});

test('Responses previous_response_id = the whole conversation sent by hand (same tokens)', async () => {
  const base = { model, max_output_tokens: 6, temperature: 0, reasoning: { effort: 'none' } };
  const r1 = await oai.responses.create({ ...base, instructions: 'Be brief.', input: question });
  const r2 = await oai.responses.create({ ...base, instructions: 'Be brief.', input: 'And then?', previous_response_id: r1.id });
  const byHand = await oai.responses.create({
    ...base, instructions: 'Be brief.', store: false, input: [{ role: 'user', content: question }, ...r1.output, { role: 'user', content: 'And then?' }],
  });
  assert.equal(r2.output_text, byHand.output_text);
  assert.equal(r2.usage.input_tokens, byHand.usage.input_tokens);
  assert.equal(r2.usage.output_tokens, byHand.usage.output_tokens);
});

test('errors from the generation core in each protocol\'s shape (context too long)', async () => {
  await assert.rejects(anth.messages.create({ model, max_tokens: 100000, messages: [{ role: 'user', content: question }] }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.match(e.error.error.message, /max_tokens/);
    return true;
  });
  await assert.rejects(oai.responses.create({ model, max_output_tokens: 100000, input: question }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'max_output_tokens');
    assert.equal(e.code, 'context_length_exceeded');
    return true;
  });
});
