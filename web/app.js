// lilac's chat page: conversations kept in this browser (localStorage), answers streamed from
// /v1/chat/completions, rendered as Markdown (web/markdown.mjs), reasoning in a collapsible block, tool
// calls shown, time to first token and tokens/s under each answer, and in hybrid mode a badge saying
// where the answer came from (x-lilac-route) and why (x-lilac-route-reason).
import { renderMarkdown, escapeHtml } from '/markdown.mjs';

const $ = (id) => document.getElementById(id);
const KEYS = { convs: 'lilac.conversations', current: 'lilac.current', settings: 'lilac.settings', apiKey: 'lilac.apiKey' };

function loadJson(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}

let convs = loadJson(KEYS.convs, []);
let currentId = localStorage.getItem(KEYS.current);
let controller = null;  // the running answer's AbortController
let model = null;

const saveConvs = () => {
  localStorage.setItem(KEYS.convs, JSON.stringify(convs));
  if (currentId) localStorage.setItem(KEYS.current, currentId);
};
const current = () => convs.find((c) => c.id === currentId) || null;

// ------------------------------------------------------------------------------------------ settings

const settingFields = [
  ['system', 'set-system', 'text'], ['thinking', 'set-thinking', 'check'], ['temperature', 'set-temperature', 'num'],
  ['top_p', 'set-top-p', 'num'], ['top_k', 'set-top-k', 'int'], ['max_tokens', 'set-max-tokens', 'int'], ['tools', 'set-tools', 'text'],
];

function loadSettings() {
  const s = loadJson(KEYS.settings, {});
  for (const [name, id, kind] of settingFields) {
    if (!(name in s)) continue;
    if (kind === 'check') $(id).checked = !!s[name];
    else $(id).value = s[name] ?? '';
  }
}

function readSettings() {
  const s = {};
  for (const [name, id, kind] of settingFields) s[name] = kind === 'check' ? $(id).checked : $(id).value;
  localStorage.setItem(KEYS.settings, JSON.stringify(s));
  return s;
}

// The request body's sampling fields and tools from the settings (blank = the server's default).
function requestOptions(s) {
  const o = { chat_template_kwargs: { enable_thinking: s.thinking } };
  for (const [k, parse] of [['temperature', parseFloat], ['top_p', parseFloat], ['top_k', (v) => parseInt(v, 10)], ['max_tokens', (v) => parseInt(v, 10)]]) {
    const v = parse(s[k]);
    if (s[k] !== '' && Number.isFinite(v)) o[k] = v;
  }
  if (s.tools.trim()) o.tools = JSON.parse(s.tools);
  return o;
}

// ------------------------------------------------------------------------------------------ API key

function authHeaders() {
  const key = localStorage.getItem(KEYS.apiKey);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// Asks for the key (the dialog); resolves once one is saved.
function askKey(refused) {
  return new Promise((resolve) => {
    const dialog = $('key-dialog');
    $('key-error').hidden = !refused;
    $('key-input').value = '';
    $('key-form').onsubmit = () => {
      localStorage.setItem(KEYS.apiKey, $('key-input').value.trim());
      resolve();
    };
    dialog.showModal();
    $('key-input').focus();
  });
}

// fetch with the key; a 401 asks for a key and tries again.
async function apiFetch(path, init = {}) {
  for (let refused = false; ; refused = true) {
    const res = await fetch(path, { ...init, headers: { ...(init.headers || {}), ...authHeaders() } });
    if (res.status !== 401) return res;
    await askKey(refused || !!localStorage.getItem(KEYS.apiKey));
  }
}

// ------------------------------------------------------------------------------------------ rendering

function renderList() {
  const ul = $('conversations');
  ul.textContent = '';
  for (const c of convs) {
    const li = document.createElement('li');
    li.className = c.id === currentId ? 'active' : '';
    li.dataset.id = c.id;
    const t = document.createElement('span');
    t.className = 'title';
    t.textContent = c.title;
    t.onclick = () => { if (!controller) { currentId = c.id; saveConvs(); renderAll(); } };
    const del = document.createElement('button');
    del.className = 'delete';
    del.type = 'button';
    del.title = 'Delete';
    del.textContent = '×';
    del.onclick = () => {
      if (controller && c.id === currentId) return;
      convs = convs.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = convs[0]?.id ?? null;
      saveConvs();
      renderAll();
    };
    li.append(t, del);
    ul.append(li);
  }
}

function statsLine(m) {
  const s = m.stats || {};
  const parts = [];
  if (s.ttft_ms != null) parts.push(`<span class="ttft" data-ms="${Math.round(s.ttft_ms)}">TTFT ${Math.round(s.ttft_ms)} ms</span>`);
  if (s.tps != null) parts.push(`<span class="tps" data-tps="${s.tps.toFixed(2)}">${s.tps.toFixed(1)} tok/s</span>`);
  if (s.tokens != null) parts.push(`<span class="tokens">${s.tokens} tokens</span>`);
  if (s.route) {
    const route = s.route === 'cloud' ? 'cloud' : 'local';
    parts.push(`<span class="badge ${route}" data-route="${route}">${route}</span>` +
               (s.reason ? `<span class="route-reason">${escapeHtml(s.reason)}</span>` : ''));
  }
  if (m.stopped) parts.push('<span class="stopped">stopped</span>');
  return parts.length ? `<div class="stats">${parts.join('')}</div>` : '';
}

function messageHtml(m) {
  if (m.role === 'user') return `<div class="role">You</div><div class="body">${escapeHtml(m.content)}</div>`;
  let h = '<div class="role">Assistant</div><div class="body">';
  if (m.reasoning) {
    h += `<details class="reasoning"${m.state === 'streaming' && !m.content ? ' open' : ''}><summary>Reasoning</summary>` +
         `<div class="reasoning-text">${escapeHtml(m.reasoning)}</div></details>`;
  }
  if (m.content) h += `<div class="content">${renderMarkdown(m.content)}</div>`;
  for (const tc of m.tool_calls || []) {
    h += `<div class="tool-call">Tool call: <span class="name">${escapeHtml(tc.function.name)}</span>` +
         `<pre><code>${escapeHtml(tc.function.arguments)}</code></pre></div>`;
  }
  if (m.error) h += `<div class="error">${escapeHtml(m.error)}</div>`;
  h += '</div>' + statsLine(m);
  if (canContinue(m)) h += '<button type="button" class="continue">Continue</button>';
  return h;
}

// An answer cut by max_tokens or by Stop can be continued: the server continues a conversation that ends
// with an assistant message from that message (a prefill). Only the conversation's last answer, with text.
function canContinue(m) {
  const conv = current();
  return m.role === 'assistant' && !controller && conv?.messages.at(-1) === m && !m.tool_calls?.length &&
         m.content.trim() !== '' && (m.state === 'stopped' || (m.state === 'done' && m.finish === 'length'));
}

function messageElement(m) {
  const div = document.createElement('div');
  div.className = `msg ${m.role}`;
  if (m.role === 'assistant') div.dataset.state = m.state || 'done';
  div.innerHTML = messageHtml(m);
  return div;
}

function renderMessages() {
  const box = $('messages');
  box.textContent = '';
  for (const m of current()?.messages || []) box.append(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderList();
  renderMessages();
}

// Re-renders the last message (the answer being streamed), keeping an opened reasoning block open.
let pending = false;
function updateLast(m) {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const box = $('messages');
    const last = box.lastElementChild;
    const wasOpen = last?.querySelector('details.reasoning')?.open;
    const el = messageElement(m);
    if (wasOpen) el.querySelector('details.reasoning')?.setAttribute('open', '');
    if (last) last.replaceWith(el); else box.append(el);
    box.scrollTop = box.scrollHeight;
  });
}

// ------------------------------------------------------------------------------------------ chatting

function apiMessages(conv, settings) {
  const out = [];
  if (settings.system.trim()) out.push({ role: 'system', content: settings.system });
  for (const m of conv.messages) {
    if (m.role === 'user') out.push({ role: 'user', content: m.content });
    else if (m.state !== 'streaming' && (m.content || m.tool_calls?.length)) {
      const a = { role: 'assistant', content: m.content || '' };
      if (m.tool_calls?.length) a.tool_calls = m.tool_calls;
      out.push(a);
    }
  }
  return out;
}

// Reads the SSE body, calling onChunk with each parsed data payload.
async function readEvents(res, onChunk) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        onChunk(JSON.parse(data));
      }
    }
  }
}

// Streams the answer `a` (the conversation's last message); `prefill`: `a` holds the start of the answer,
// which the model continues (sent as the final assistant message).
async function answer(conv, a, settings, prefill = false) {
  const messages = apiMessages(conv, settings);
  if (prefill) messages.push({ role: 'assistant', content: a.content });
  const body = { messages, stream: true, stream_options: { include_usage: true }, ...requestOptions(settings) };
  if (model) body.model = model;
  controller = new AbortController();
  $('stop').hidden = false;
  $('send').disabled = true;
  const t0 = performance.now();
  let tFirst = null, chunks = 0;
  try {
    const res = await apiFetch('/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: controller.signal,
    });
    if (res.headers.get('x-lilac-route')) {
      a.stats.route = res.headers.get('x-lilac-route');
      a.stats.reason = res.headers.get('x-lilac-route-reason') || '';
    }
    if (!res.ok) {
      const j = await res.json().catch(() => null);
      throw new Error(j?.error?.message || `HTTP ${res.status}`);
    }
    await readEvents(res, (ch) => {
      if (ch.error) throw new Error(ch.error.message || 'error');
      if (ch.lilac_route && !a.stats.route) a.stats.route = ch.lilac_route;
      if (ch.usage) a.stats.tokens = ch.usage.completion_tokens;
      if (ch.choices?.[0]?.finish_reason) a.finish = ch.choices[0].finish_reason;
      const d = ch.choices?.[0]?.delta;
      if (!d) return;
      const got = d.content || d.reasoning_content || d.tool_calls;
      if (!got) return;
      if (tFirst === null) {
        tFirst = performance.now();
        a.stats.ttft_ms = tFirst - t0;
      }
      ++chunks;
      if (d.reasoning_content) a.reasoning += d.reasoning_content;
      if (d.content) a.content += d.content;
      for (const tc of d.tool_calls || []) {
        const t = (a.tool_calls[tc.index] ??= { id: tc.id, type: 'function', function: { name: '', arguments: '' } });
        if (tc.function?.name) t.function.name = tc.function.name;
        if (tc.function?.arguments) t.function.arguments += tc.function.arguments;
      }
      updateLast(a);
    });
    a.state = 'done';
  } catch (e) {
    if (e.name === 'AbortError') {
      a.stopped = true;
      a.state = 'stopped';
    } else {
      a.error = e.message;
      a.state = 'error';
    }
  } finally {
    const tEnd = performance.now();
    a.stats.tokens ??= chunks || undefined;
    if (tFirst !== null && a.stats.tokens > 1 && tEnd > tFirst) a.stats.tps = (a.stats.tokens - 1) / ((tEnd - tFirst) / 1000);
    controller = null;
    $('stop').hidden = true;
    $('send').disabled = false;
    conv.updated = Date.now();
    saveConvs();
    renderMessages();
  }
}

// The settings, or null (and an alert) when the tools setting is not valid JSON.
function checkedSettings() {
  try {
    const settings = readSettings();
    requestOptions(settings);
    return settings;
  } catch {
    alert('The tools setting is not valid JSON.');
    return null;
  }
}

async function send(ev) {
  ev?.preventDefault();
  const text = $('input').value.trim();
  if (!text || controller) return;
  const settings = checkedSettings();
  if (!settings) return;
  let conv = current();
  if (!conv) conv = newConversation();
  $('input').value = '';
  conv.messages.push({ role: 'user', content: text });
  if (conv.title === 'New chat') conv.title = text.slice(0, 48);
  const a = { role: 'assistant', content: '', reasoning: '', tool_calls: [], stats: {}, state: 'streaming' };
  conv.messages.push(a);
  saveConvs();
  renderAll();
  await answer(conv, a, settings);
}

async function continueAnswer() {
  const conv = current();
  const a = conv?.messages.at(-1);
  if (!a || !canContinue(a)) return;
  const settings = checkedSettings();
  if (!settings) return;
  // The template trims a message's text, and the server refuses a prefill that ends with whitespace.
  a.content = a.content.trimEnd();
  a.state = 'streaming';
  a.stopped = false;
  a.finish = undefined;
  a.stats = {};
  saveConvs();
  renderAll();
  await answer(conv, a, settings, true);
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: 'New chat', messages: [], updated: Date.now() };
  convs.unshift(c);
  currentId = c.id;
  saveConvs();
  renderAll();
  return c;
}

async function loadModel() {
  const res = await apiFetch('/v1/models');
  if (!res.ok) return;
  const j = await res.json();
  model = j.data?.[0]?.id ?? null;
  $('model-name').textContent = model ? `model: ${model}` : '';
}

// ------------------------------------------------------------------------------------------ start

loadSettings();
$('composer').onsubmit = send;
$('input').addEventListener('keydown', (e) => { if (e.key === 'Enter' && !e.shiftKey) send(e); });
$('stop').onclick = () => controller?.abort();
$('messages').addEventListener('click', (e) => { if (e.target.closest('button.continue')) continueAnswer(); });
$('new-chat').onclick = () => { if (!controller) newConversation(); };
$('forget-key').onclick = () => localStorage.removeItem(KEYS.apiKey);
for (const m of convs.flatMap((c) => c.messages)) if (m.state === 'streaming') m.state = 'stopped';
renderAll();
loadModel().then(() => document.body.dataset.ready = '1');
