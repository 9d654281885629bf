// Structured outputs end to end: `lilac serve` on the random-weight demo model, sampled at temperature 1
// under response_format json_schema / json_object and strict or forced tool calls, through the official
// `openai` client; every finished output is validated by ajv (JSON Schema 2020-12, ajv-formats' full formats).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, postJson, sseEvents, assertErrorBody, writeScript, SOURCE } from './helpers.mjs';

const require = createRequire(`${SOURCE}/package.json`);
const OpenAI = require('openai');
const Ajv = require('ajv/dist/2020');  // JSON Schema 2020-12 (prefixItems, $defs)
const addFormats = require('ajv-formats');

let srv, client;
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const ask = [{ role: 'user', content: 'Describe a fictional person as JSON.' }];
const noThinking = { enable_thinking: false };  // random weights never close a reasoning block

before(async () => {
  srv = await startServer(['--backend', process.env.LILAC_E2E_BACKEND || 'cpu', '--max-seq', '4096']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => { await srv?.stop(); });

// Schemas whose documents stay short under uniform-ish sampling (bounded strings and arrays).
const schemas = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 8 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      email: { type: 'string', format: 'email', maxLength: 16 },
      tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 2 },
    },
    required: ['name', 'age'],
    additionalProperties: false,
  },
  enums_and_consts: {
    type: 'object',
    properties: {
      status: { enum: ['active', 'inactive', 'banned'] },
      level: { enum: [1, 2, 3, null] },
      kind: { const: 'user' },
      ok: { type: 'boolean' },
    },
    required: ['status', 'level', 'kind', 'ok'],
  },
  formats: {
    type: 'object',
    properties: {
      id: { type: 'string', format: 'uuid' },
      day: { type: 'string', format: 'date' },
      at: { type: 'string', format: 'date-time' },
      code: { type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' },
    },
    required: ['id', 'day', 'at', 'code'],
  },
  nested_anyof: {
    type: 'object',
    properties: {
      result: { anyOf: [{ type: 'null' }, { type: 'object', properties: { v: { type: 'number' }, unit: { enum: ['m', 's'] } }, required: ['v', 'unit'] }] },
      items: { type: 'array', prefixItems: [{ type: 'integer', exclusiveMinimum: -5, exclusiveMaximum: 5 }, { type: 'boolean' }], items: false, minItems: 2 },
    },
    required: ['result', 'items'],
  },
  recursive: {
    $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'] } },
    $ref: '#/$defs/node',
  },
  one_of_tagged: {
    oneOf: [
      { type: 'object', properties: { type: { const: 'a' }, x: { type: 'integer' } }, required: ['type', 'x'], additionalProperties: false },
      { type: 'object', properties: { type: { const: 'b' }, y: { type: 'boolean' } }, required: ['type', 'y'], additionalProperties: false },
    ],
  },
};

function validate(schema, text, what) {
  let doc;
  try { doc = JSON.parse(text); } catch (e) { assert.fail(`${what}: not JSON (${e.message}): ${JSON.stringify(text)}`); }
  const ok = ajv.validate(schema, doc);
  assert.ok(ok, `${what}: ${ajv.errorsText()} in ${text}`);
  return doc;
}

test('chat response_format json_schema at temperature 1: every output validates (ajv)', async () => {
  let finished = 0, total = 0;
  for (const [name, schema] of Object.entries(schemas)) {
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create({
        messages: ask, temperature: 1, seed, max_tokens: 600, chat_template_kwargs: noThinking,
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
      });
      const c = r.choices[0];
      total += 1;
      assert.ok(c.finish_reason === 'stop' || c.finish_reason === 'length', c.finish_reason);
      if (c.finish_reason === 'stop') {
        finished += 1;
        validate(schema, c.message.content, `${name} seed ${seed}`);
      }
      assert.equal(c.message.reasoning_content, undefined);
    }
  }
  assert.ok(finished >= total - 1, `${finished} of ${total} outputs finished within max_tokens`);
});

test('concurrent constrained streams (batched decode steps) each follow their own schema', async () => {
  const names = ['person', 'enums_and_consts', 'formats', 'one_of_tagged'];
  const results = await Promise.all(names.map((name, i) => client.chat.completions.create({
    messages: ask, temperature: 1, seed: 40 + i, max_tokens: 600, chat_template_kwargs: noThinking,
    response_format: { type: 'json_schema', json_schema: { name, schema: schemas[name] } },
  })));
  results.forEach((r, i) => {
    assert.equal(r.choices[0].finish_reason, 'stop', names[i]);
    validate(schemas[names[i]], r.choices[0].message.content, `concurrent ${names[i]}`);
  });
});

test('json_object mode gives a JSON object; /v1/completions honours response_format', async () => {
  let objects = 0;
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({
      messages: ask, temperature: 1, seed, max_tokens: 500, chat_template_kwargs: noThinking, response_format: { type: 'json_object' },
    });
    const c = r.choices[0];
    assert.equal(c.message.content.trimStart()[0], '{', c.message.content);
    if (c.finish_reason === 'stop') {
      const doc = JSON.parse(c.message.content);
      assert.equal(typeof doc, 'object');
      assert.ok(doc !== null && !Array.isArray(doc));
      objects += 1;
    }
  }
  assert.ok(objects >= 1, 'at least one json_object output finished');
  const schema = schemas.enums_and_consts;
  for (const seed of [5, 6]) {
    const r = await client.completions.create({
      prompt: 'The record: ', temperature: 1, seed, max_tokens: 300,
      response_format: { type: 'json_schema', json_schema: { name: 'record', schema } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    validate(schema, r.choices[0].text, `completions seed ${seed}`);
  }
});

test('streaming: the content deltas form a valid document; max_tokens cuts with finish_reason length', async () => {
  const schema = schemas.person;
  const res = await postJson(`${srv.url}/v1/chat/completions`, {
    messages: ask, temperature: 1, seed: 9, max_tokens: 600, stream: true, chat_template_kwargs: noThinking,
    response_format: { type: 'json_schema', json_schema: { name: 'p', schema } },
  });
  assert.equal(res.status, 200);
  const events = sseEvents(res.text).filter((e) => e !== '[DONE]');
  const text = events.map((e) => e.choices?.[0]?.delta?.content || '').join('');
  assert.equal(events.at(-1).choices[0].finish_reason, 'stop');
  validate(schema, text, 'streamed');
  const cut = await client.chat.completions.create({
    messages: ask, temperature: 1, seed: 9, max_tokens: 3, chat_template_kwargs: noThinking, logprobs: true,
    response_format: { type: 'json_schema', json_schema: { name: 'p', schema } },
  });
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.throws(() => JSON.parse(cut.choices[0].message.content));
  // Logprobs are those of the model's raw distribution (the chosen token's, even when masked choices
  // were likelier).
  for (const lp of cut.choices[0].logprobs.content) assert.ok(lp.logprob <= 0);
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'set_alarm', strict: true, description: 'Set an alarm',
      parameters: {
        type: 'object',
        properties: {
          label: { type: 'string', maxLength: 6 },
          hour: { type: 'integer', minimum: 0, maximum: 23 },
          days: { type: 'array', items: { enum: ['mon', 'tue', 'sun'] }, maxItems: 2 },
          loud: { type: 'boolean' },
          note: { type: ['string', 'null'], maxLength: 4 },
        },
        required: ['label', 'hour'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'lookup', strict: true,
      parameters: { type: 'object', properties: { query: { type: 'string', minLength: 1, maxLength: 5 }, limit: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['query'] },
    },
  },
];
const toolSchema = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));

test('forced tool calls (required / named): the arguments validate against the tool schema (ajv)', async () => {
  let calls = 0;
  for (const choice of ['required', { type: 'function', function: { name: 'set_alarm' } }]) {
    for (const seed of [1, 2, 3]) {
      const r = await client.chat.completions.create({
        messages: [{ role: 'user', content: 'Wake me up at 7.' }], tools, tool_choice: choice, temperature: 1, seed,
        max_tokens: 400, parallel_tool_calls: false,
      });
      const c = r.choices[0];
      if (c.finish_reason === 'length') continue;
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
      assert.equal(c.message.tool_calls.length, 1);
      const call = c.message.tool_calls[0];
      if (typeof choice === 'object') assert.equal(call.function.name, 'set_alarm');
      validate(toolSchema[call.function.name], call.function.arguments, `${call.function.name} seed ${seed}`);
      calls += 1;
    }
  }
  assert.ok(calls >= 4, `${calls} forced calls finished`);
});

test('schemas that cannot be enforced are 400 naming the keyword and where it is', async () => {
  const url = `${srv.url}/v1/chat/completions`;
  const rf = (schema) => ({ messages: ask, max_tokens: 5, response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
  let r = await postJson(url, rf({ type: 'object', properties: { a: { type: 'string', minProperties: 1 } } }));
  assertErrorBody(assert, r, 400, { param: 'response_format.json_schema.schema', code: 'invalid_schema' });
  assert.match(r.json.error.message, /minProperties/);
  assert.match(r.json.error.message, /#\/properties\/a\/minProperties/);
  r = await postJson(url, rf({ type: 'string', minLength: 3, maxLength: 1 }));
  assertErrorBody(assert, r, 400, { param: 'response_format.json_schema.schema' });
  r = await postJson(url, rf({ oneOf: [{ type: 'string' }, { type: 'string', maxLength: 2 }] }));
  assertErrorBody(assert, r, 400, { param: 'response_format.json_schema.schema' });
  assert.match(r.json.error.message, /oneOf/);
  r = await postJson(url, { messages: ask, max_tokens: 5, response_format: { type: 'json_schema', json_schema: { schema: {} } } });
  assertErrorBody(assert, r, 400, { param: 'response_format.json_schema.name' });
  r = await postJson(url, { messages: ask, max_tokens: 5, response_format: { type: 'xml' } });
  assertErrorBody(assert, r, 400, { param: 'response_format.type' });
  const badTool = [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', properties: { x: { type: 'integer', multipleOf: 3 } } } } }];
  r = await postJson(url, { messages: ask, max_tokens: 5, tools: badTool });
  assertErrorBody(assert, r, 400, { param: 'tools[0].function.parameters', code: 'invalid_schema' });
  assert.match(r.json.error.message, /multipleOf/);
  // The same tool without strict is not enforced unless forced: accepted.
  r = await postJson(url, { messages: ask, max_tokens: 2, tools: [{ type: 'function', function: { ...badTool[0].function, strict: false } }] });
  assert.equal(r.status, 200, r.text);
});

test('scripted replies go through the mask: reasoning stays free, the content must follow the schema', async () => {
  const script = writeScript({
    rules: [
      { match: 'GOOD', reply: 'Let me think.\n</think>\n\n{"a": 7, "b": "x<y"}' },
      { match: 'BAD', reply: 'Hmm.\n</think>\n\n{"a": "seven"}' },
    ],
    default: { reply: 'plain text' },
  });
  const s = await startServer(['--backend', `scripted:${script}`]);
  try {
    const schema = { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'string' } }, required: ['a'] };
    const body = (content) => ({ messages: [{ role: 'user', content }], response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
    const good = await postJson(`${s.url}/v1/chat/completions`, body('GOOD'));
    assert.equal(good.status, 200, good.text);
    const m = good.json.choices[0].message;
    assert.equal(m.reasoning_content.trim(), 'Let me think.');  // thinking on: free text up to </think>
    assert.deepEqual(validate(schema, m.content, 'scripted'), { a: 7, b: 'x<y' });
    // The error comes after tokens were produced: a 500, or (when the response had already started)
    // an error body in the 200 response, depending on timing.
    const bad = await postJson(`${s.url}/v1/chat/completions`, body('BAD'));
    assert.ok(bad.status === 500 || bad.status === 200, bad.text);
    assert.match(bad.json.error.message, /not allowed by the token mask/);
  } finally {
    await s.stop();
  }
});


// The other protocols share the generation core, so the same constraints hold there: Responses'
// text.format json_schema and strict tools, Anthropic's forced tool calls (tool_choice any / tool), each
// through its official client, at temperature 1 on the demo model.
test('Responses text.format json_schema and Anthropic forced tool calls validate (official clients, ajv)', async () => {
  const Anthropic = require('@anthropic-ai/sdk').default;
  const model = (await client.models.list()).data[0].id;
  const schema = schemas.enums_and_consts;
  let finished = 0;
  for (const seed of [1, 2]) {
    const r = await client.responses.create({
      model, input: 'Describe the record.', temperature: 1, max_output_tokens: 400, seed,
      reasoning: { effort: 'none' }, text: { format: { type: 'json_schema', name: 'record', schema, strict: true } },
    });
    assert.deepEqual(r.text.format, { type: 'json_schema', name: 'record', schema, strict: true });  // echoed
    if (r.status !== 'completed') continue;
    validate(schema, r.output_text, `responses seed ${seed}`);
    finished += 1;
  }
  assert.ok(finished >= 1, 'a Responses output finished');
  const anthropic = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  const alarm = tools[0].function;
  let calls = 0;
  for (const [seed, tool_choice] of [[1, { type: 'any' }], [2, { type: 'tool', name: 'set_alarm', disable_parallel_tool_use: true }]]) {
    const m = await anthropic.messages.create({
      model, max_tokens: 400, temperature: 1, metadata: { user_id: `seed-${seed}` },
      messages: [{ role: 'user', content: 'Wake me up at 7.' }], tool_choice,
      tools: [{ name: alarm.name, description: alarm.description, input_schema: alarm.parameters }],
    });
    if (m.stop_reason === 'max_tokens') continue;
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1);
    if (tool_choice.disable_parallel_tool_use) assert.equal(uses.length, 1);  // enforced by the call grammar
    for (const u of uses) {
      assert.equal(u.name, 'set_alarm');
      assert.ok(ajv.validate(alarm.parameters, u.input), `${ajv.errorsText()} in ${JSON.stringify(u.input)}`);
    }
    calls += 1;
  }
  assert.ok(calls >= 1, 'an Anthropic forced call finished');
});
