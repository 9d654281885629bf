// Tool-call arguments stream while the model writes them, in every protocol, read by the official clients'
// streaming helpers: openai's chat.completions.stream (tool_calls.function.arguments.delta) and
// responses.stream (response.function_call_arguments.delta), @anthropic-ai/sdk's messages.stream (inputJson).
// The scripted backend writes a file-writing call token by token through the real tokenizer and parser: the
// file's text arrives in many pieces before the call is complete, and the pieces make the exact arguments.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, writeScript } from './helpers.mjs';
import { anthropicClient, openaiClient } from './protocols_common.mjs';

// A multi-line file with quotes, a backslash, a tab and non-ASCII text: every piece must be escaped JSON.
const FILE = 'def greet(name):\n    print(f"Hello, {name}!")  # say "hi"\n\tpath = "C:\\\\tmp"\n    return "héllo 漢字"\n';
// With reasoning on (the prompt ends with an open <think>) the reply closes it first.
const reply = (think) => `${think ? 'Writing it.\n</think>\n\n' : ''}I will write the file.\n\n<tool_call>\n<function=write_file>\n` +
  `<parameter=path>\nsrc/greet.py\n</parameter>\n<parameter=content>\n${FILE}\n</parameter>\n` +
  '<parameter=overwrite>\ntrue\n</parameter>\n</function>\n</tool_call>';
const WANT = { path: 'src/greet.py', content: FILE, overwrite: true };

const schema = {
  type: 'object',
  properties: { path: { type: 'string' }, content: { type: 'string' }, overwrite: { type: 'boolean' } },
  required: ['path', 'content'],
};
const MODEL = 'scripted-model';
let srv, openai, anthropic;
before(async () => {
  const script = writeScript({
    rules: [{ match: '<think>\n\n</think>\n\n', reply: reply(false) }],
    default: { reply: reply(true) },
  });
  srv = await startServer(['--backend', `scripted:${script}`, '--model-name', MODEL]);
  openai = openaiClient(srv.url);
  anthropic = anthropicClient(srv.url);
});
after(async () => { await srv?.stop(); });

// What every protocol's pieces must show: several pieces, the file's first line before its last, and the
// exact arguments at the end.
function checkPieces(pieces, what) {
  assert.ok(pieces.length >= 10, `${what}: ${pieces.length} argument pieces`);
  const joined = pieces.join('');
  assert.deepEqual(JSON.parse(joined), WANT, what);
  const firstLine = pieces.findIndex((_, i) => pieces.slice(0, i + 1).join('').includes('def greet'));
  const lastLine = pieces.findIndex((_, i) => pieces.slice(0, i + 1).join('').includes('return'));
  assert.ok(firstLine >= 0 && firstLine < lastLine, `${what}: the file's text arrives piece by piece`);
}

test('chat completions: the call is named once, its arguments stream (openai chat.completions.stream)', async () => {
  const stream = openai.chat.completions.stream({
    model: MODEL, messages: [{ role: 'user', content: 'write the greeting file' }],
    tools: [{ type: 'function', function: { name: 'write_file', parameters: schema } }],
  });
  const pieces = [];
  stream.on('tool_calls.function.arguments.delta', (e) => pieces.push(e.arguments_delta));
  const chunks = [];
  stream.on('chunk', (c) => chunks.push(c));
  const done = await stream.finalChatCompletion();
  checkPieces(pieces, 'chat');
  const msg = done.choices[0].message;
  assert.equal(done.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, 'I will write the file.');
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.reasoning_content ?? '').join(''), 'Writing it.');
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].function.name, 'write_file');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), WANT);
  // On the wire: the first tool_calls delta carries id, type and name; the others only argument pieces.
  const deltas = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
  assert.match(deltas[0].id, /^call_/);
  assert.equal(deltas[0].function.name, 'write_file');
  for (const d of deltas.slice(1)) {
    assert.equal(d.index, 0);
    assert.equal(d.id, undefined);
    assert.equal(d.function.name, undefined);
  }
  // Not streamed: the same call whole.
  const whole = await openai.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'write the greeting file' }],
    tools: [{ type: 'function', function: { name: 'write_file', parameters: schema } }],
  });
  assert.deepEqual(JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments), WANT);
});

test('Messages: a tool_use block whose input streams as input_json_delta (anthropic messages.stream)', async () => {
  const stream = anthropic.messages.stream({
    model: MODEL, max_tokens: 1000, messages: [{ role: 'user', content: 'write the greeting file' }],
    tools: [{ name: 'write_file', input_schema: schema }],
  });
  const pieces = [];
  const snapshots = [];
  stream.on('inputJson', (partial, snapshot) => { pieces.push(partial); snapshots.push(snapshot); });
  const msg = await stream.finalMessage();
  checkPieces(pieces, 'messages');
  assert.equal(msg.stop_reason, 'tool_use');
  assert.deepEqual(msg.content.map((b) => b.type), ['text', 'tool_use']);
  assert.equal(msg.content[1].name, 'write_file');
  assert.deepEqual(msg.content[1].input, WANT);
  // The SDK's partial-JSON snapshots (this version keeps only complete values) grow with the input: the path
  // before the file is complete, everything at the end.
  assert.ok(snapshots.some((x) => x?.path === 'src/greet.py' && x.content === undefined), 'a snapshot before the file ends');
  assert.deepEqual(snapshots.at(-1), WANT);
});

test('Responses: function_call_arguments.delta pieces, then .done with the whole (openai responses.stream)', async () => {
  const stream = openai.responses.stream({
    model: MODEL, input: 'write the greeting file', store: false,
    tools: [{ type: 'function', name: 'write_file', parameters: schema }],
  });
  const pieces = [];
  let doneArgs = null;
  stream.on('response.function_call_arguments.delta', (e) => pieces.push(e.delta));
  stream.on('response.function_call_arguments.done', (e) => { doneArgs = e.arguments; });
  const r = await stream.finalResponse();
  checkPieces(pieces, 'responses');
  assert.equal(doneArgs, pieces.join(''));
  const call = r.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'write_file');
  assert.equal(call.status, 'completed');
  assert.deepEqual(JSON.parse(call.arguments), WANT);
});
