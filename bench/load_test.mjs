#!/usr/bin/env node
// Server load test: N concurrent streaming clients against `lilac serve` over HTTP, for each N of
// --clients. Reports time to first token (TTFT) and inter-token latency (ITL) p50 / p99 and the
// aggregate decode throughput. See bench/BENCHMARKS.md ("Serving many clients") for how it is run.
//
//   node bench/load_test.mjs --model DIR [--lilac build/lilac] [--backend cuda] [--serve-args "..."]
//   node bench/load_test.mjs --url http://127.0.0.1:8080 [--api-key KEY]
//   common: [--clients 1,4,16,64] [--prompt-tokens 1024] [--max-tokens 256] [--json FILE]
//
// With --model it starts `lilac serve` itself (on a free port, --max-batch = the largest N, a queue
// that holds every client, unless --serve-args sets them) and stops it at the end; with --url it
// drives a running server.
// Each client sends its own prompt (about --prompt-tokens tokens of text, different from every other
// client's, so there is no prefix-cache sharing) to /v1/completions with stream: true, temperature 0
// and max_tokens = --max-tokens; the real counts come from the stream's usage chunk.
// TTFT: request sent -> first streamed text. ITL: gaps between consecutive streamed text chunks of one
// stream (one chunk per token, except the rare token whose text is held back, e.g. half a UTF-8
// character). Aggregate tok/s: completion tokens of all clients / wall time of the round (first
// request sent -> last stream done); decode tok/s: streamed tokens per second while all N streams were
// decoding together (after the last first token, before the first stream ended; '-' when the streams
// never overlapped, e.g. with --max-batch 1); stream tok/s: 1000 / ITL p50.
import { spawn } from 'node:child_process';
import fs from 'node:fs';

function parseArgs(argv) {
  const o = { clients: '1,4,16,64', promptTokens: 1024, maxTokens: 256, lilac: 'build/lilac', backend: 'auto',
    serveArgs: '', apiKey: '' };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i], v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--model') o.model = v();
    else if (a === '--url') o.url = v().replace(/\/$/, '');
    else if (a === '--lilac') o.lilac = v();
    else if (a === '--backend') o.backend = v();
    else if (a === '--serve-args') o.serveArgs = v();
    else if (a === '--api-key') o.apiKey = v();
    else if (a === '--clients') o.clients = v();
    else if (a === '--prompt-tokens') o.promptTokens = Number(v());
    else if (a === '--max-tokens') o.maxTokens = Number(v());
    else if (a === '--json') o.json = v();
    else if (a === '--help' || a === '-h') {
      console.log(fs.readFileSync(new URL(import.meta.url), 'utf8').split('\n').filter((l) => l.startsWith('//')).join('\n'));
      process.exit(0);
    } else throw new Error(`unknown argument ${a} (see --help)`);
  }
  if (!o.model === !o.url) throw new Error('give exactly one of --model DIR or --url URL');
  o.clientCounts = o.clients.split(',').map(Number);
  if (o.clientCounts.some((n) => !Number.isInteger(n) || n < 1)) throw new Error(`--clients: bad list ${o.clients}`);
  if (!(o.promptTokens >= 1 && o.maxTokens >= 1)) throw new Error('--prompt-tokens and --max-tokens must be >= 1');
  return o;
}

async function startServer(o) {
  const maxN = Math.max(...o.clientCounts);
  const extra = o.serveArgs.split(/\s+/).filter(Boolean);
  const dflt = (flag, value) => (extra.includes(flag) ? [] : [flag, value]);  // --serve-args wins
  const args = ['serve', '--model', o.model, '--port', '0', '--backend', o.backend, ...dflt('--max-batch', String(maxN)),
    ...dflt('--max-queue', String(Math.max(64, 2 * maxN))),
    ...dflt('--max-seq', String(o.promptTokens * 2 + o.maxTokens + 256)), ...extra];
  const proc = spawn(o.lilac, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LILAC_LOG: process.env.LILAC_LOG ?? 'warn' } });
  let out = '';
  proc.stderr.on('data', (d) => { out += d; });
  const url = await new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
      if (m) resolve(m[1]);
    });
    proc.on('exit', (code) => reject(new Error(`lilac serve exited ${code}:\n${out}`)));
  });
  for (;;) {
    const h = await fetch(`${url}/health`).catch(() => null);
    if (h && h.status === 200) break;
    if (proc.exitCode !== null) throw new Error(`lilac serve exited:\n${out}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const ready = out.match(/lilac: ready: [^\n]*/);
  return { url, proc, ready: ready ? ready[0] : '' };
}

// About n tokens of English prose (~0.75 words per token), unique to the client.
function promptFor(client, round, n) {
  const words = ['the', 'river', 'keeper', 'walked', 'along', 'a', 'quiet', 'road', 'toward', 'old', 'harbour',
    'where', 'boats', 'rested', 'under', 'grey', 'morning', 'light', 'and', 'gulls', 'called', 'over', 'water'];
  const parts = [`Story ${round}-${client}.`];
  let k = client * 7919 + round * 104729;
  for (let i = 0; i < Math.round(n * 0.75); i++) {
    k = (k * 1103515245 + 12345) % 2147483648;
    parts.push(words[k % words.length] + (i % 12 === 11 ? '.' : ''));
  }
  return parts.join(' ') + '\nContinue the story at length:';
}

async function oneClient(o, url, client, round) {
  const headers = { 'content-type': 'application/json' };
  if (o.apiKey) headers.authorization = `Bearer ${o.apiKey}`;
  const body = { prompt: promptFor(client, round, o.promptTokens), max_tokens: o.maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true } };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`client ${client}: HTTP ${res.status}: ${await res.text()}`);
  const times = [];
  let usage = null, buf = '';
  const dec = new TextDecoder();
  for await (const part of res.body) {
    const now = performance.now();
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) throw new Error(`client ${client}: ${j.error.message}`);
      if (j.usage) usage = j.usage;
      if (j.choices?.[0]?.text) times.push(now);
    }
  }
  const t1 = performance.now();
  return { t0, t1, times, usage };
}

function pct(xs, p) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

async function round(o, url, n, r) {
  const start = performance.now();
  const rs = await Promise.all(Array.from({ length: n }, (_, c) => oneClient(o, url, c, r)));
  const end = performance.now();
  const ttft = rs.filter((x) => x.times.length).map((x) => x.times[0] - x.t0);
  const itl = rs.flatMap((x) => x.times.slice(1).map((t, i) => t - x.times[i]));
  const tokens = rs.reduce((s, x) => s + (x.usage?.completion_tokens ?? x.times.length), 0);
  const prompt = rs.reduce((s, x) => s + (x.usage?.prompt_tokens ?? 0), 0) / n;
  // The window in which all N streams were decoding together: after the last first token, before the
  // first stream ended.
  const w0 = Math.max(...rs.map((x) => x.times[0] ?? x.t1)), w1 = Math.min(...rs.map((x) => x.times.at(-1) ?? x.t0));
  const inWindow = rs.reduce((s, x) => s + x.times.filter((t) => t > w0 && t <= w1).length, 0);
  return {
    clients: n, prompt_tokens_avg: prompt, completion_tokens: tokens, wall_s: (end - start) / 1e3,
    ttft_p50_ms: pct(ttft, 50), ttft_p99_ms: pct(ttft, 99), itl_p50_ms: pct(itl, 50), itl_p99_ms: pct(itl, 99),
    aggregate_tok_s: tokens / ((end - start) / 1e3),
    decode_tok_s: w1 > w0 && inWindow >= n ? inWindow / ((w1 - w0) / 1e3) : NaN,
    per_stream_tok_s: pct(itl, 50) > 0 ? 1e3 / pct(itl, 50) : NaN,
  };
}

async function main() {
  const o = parseArgs(process.argv);
  let srv = null, url = o.url;
  if (o.model) {
    srv = await startServer(o);
    url = srv.url;
    console.log(srv.ready);
  }
  try {
    await oneClient({ ...o, promptTokens: 16, maxTokens: 4 }, url, 0, 0);  // warm-up
    const results = [];
    const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
    console.log(`prompt ~${o.promptTokens} tokens, max_tokens ${o.maxTokens}`);
    console.log('clients  prompt  tokens   wall s  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  agg tok/s  decode tok/s  stream tok/s');
    for (const [i, n] of o.clientCounts.entries()) {
      const r = await round(o, url, n, i + 1);
      results.push(r);
      console.log(`${String(n).padStart(7)} ${f(r.prompt_tokens_avg, 0).padStart(7)} ${String(r.completion_tokens).padStart(7)} ` +
        `${f(r.wall_s, 2).padStart(8)} ${f(r.ttft_p50_ms).padStart(12)} ${f(r.ttft_p99_ms).padStart(12)} ` +
        `${f(r.itl_p50_ms).padStart(11)} ${f(r.itl_p99_ms).padStart(11)} ${f(r.aggregate_tok_s).padStart(10)} ` +
        `${f(r.decode_tok_s).padStart(13)} ${f(r.per_stream_tok_s).padStart(13)}`);
    }
    if (o.json) fs.writeFileSync(o.json, JSON.stringify({ url, server: srv?.ready, prompt_tokens: o.promptTokens,
      max_tokens: o.maxTokens, results }, null, 2) + '\n');
  } finally {
    if (srv) {
      srv.proc.kill('SIGTERM');
      await new Promise((r) => srv.proc.on('exit', r));
    }
  }
}

main().catch((e) => {
  console.error(`load_test: ${e.message}`);
  process.exit(1);
});
