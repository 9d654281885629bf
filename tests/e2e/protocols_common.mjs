// What the protocol end-to-end tests share: the scripted replies, the tools in each protocol's form,
// and the official clients (@anthropic-ai/sdk, openai) pointed at a server.
import { createRequire } from 'node:module';
import { SOURCE, writeScript, startServer } from './helpers.mjs';

const require = createRequire(`${SOURCE}/package.json`);
export const Anthropic = require('@anthropic-ai/sdk').default;
export const OpenAI = require('openai');

// Rules see the prompt from the last user turn on (its assistant header included), so a rule can
// tell whether the template opened or closed the reasoning, and what a tool result looked like.
// Replies with "</think>" are for requests with reasoning on, the others for reasoning off.
export const script = () => writeScript({
  rules: [
    { match: 'FORCED', reply: '<parameter=city>\nRome\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>' },
    { match: '<tool_response>\nError: disk full\n</tool_response>', reply: 'The tool failed.' },
    { match: '<tool_response>\n{"temp": 21}\n</tool_response>', reply: 'It is 21 degrees.' },
    { match: 'weather', reply: 'The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>' },
    { match: 'MODE<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n', reply: 'thinking was off' },
    { match: 'MODE<|im_end|>\n<|im_start|>assistant\n<think>\n', reply: 'thinking was on</think>\n\nyes' },
    { match: 'reason', reply: 'Let me think step by step.\n</think>\n\nThe answer is 42.' },
    { match: 'resume', reply: 'Think.\n</think>\n\nOne two three four five six seven eight nine ten.' },
    { match: 'stopword', reply: 'alpha beta STOP gamma delta' },
    { match: 'forever', reply: ' tick', repeat: true, delay_ms: 5 },
  ],
  default: { reply: 'Hello from the script.' },
});

export const anthropicTools = [{
  name: 'get_weather',
  description: 'Weather forecast for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
}];

export const responsesTools = [{
  type: 'function',
  name: 'get_weather',
  description: 'Weather forecast for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
}];

export function anthropicClient(url, opts = {}) {
  return new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0, timeout: 60000, ...opts });
}

export function openaiClient(url, opts = {}) {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000, ...opts });
}

// The raw events of a stream (an async iterable), pings left out.
export async function collect(stream) {
  const out = [];
  for await (const ev of stream) if (ev.type !== 'ping') out.push(ev);
  return out;
}

// `lilac serve` on the scripted backend with script(), serving SCRIPTED_MODEL.
export const SCRIPTED_MODEL = 'scripted-model';
export const startScripted = () => startServer(['--backend', `scripted:${script()}`, '--model-name', SCRIPTED_MODEL]);
