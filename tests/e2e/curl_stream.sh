#!/usr/bin/env bash
# `curl -N` against `lilac serve` (scripted backend): the SSE stream arrives chunk by chunk, in order,
# with the role chunk first, the content deltas, the finish chunk and data: [DONE]; a non-streaming
# request and an error answer with the right status. Usage: curl_stream.sh LILAC MODEL_DIR
set -euo pipefail
LILAC="$1"
MODEL="$2"
tmp=$(mktemp -d)
pid=""
cleanup() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; rm -rf "$tmp"; }
trap cleanup EXIT
cat > "$tmp/script.json" <<'JSON'
{"rules": [{"match": "count", "reply": "</think>\n\none two three four five", "delay_ms": 30}],
 "default": {"reply": "</think>\n\nHello from the script."}}
JSON
"$LILAC" serve --model "$MODEL" --port 0 --backend "scripted:$tmp/script.json" --model-name curl-model > "$tmp/out" 2> "$tmp/err" &
pid=$!
url=""
for _ in $(seq 1 300); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/out" | head -1 || true)
  if [ -n "$url" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; then break; fi
  sleep 0.1
done
[ -n "$url" ] || { echo "server did not start"; cat "$tmp/out" "$tmp/err"; exit 1; }

# Streaming: record the arrival time of each line.
curl -sS -N "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"curl-model","messages":[{"role":"user","content":"count please"}],"stream":true}' |
  while IFS= read -r line; do if [ -n "$line" ]; then printf "%s %s\n" "$(date +%s%N)" "$line"; fi; done > "$tmp/stream"
cat "$tmp/stream" | cut -c1-160
n=$(grep -c ' data: ' "$tmp/stream")
[ "$n" -ge 8 ] || { echo "expected >= 8 SSE events, got $n"; exit 1; }
head -1 "$tmp/stream" | grep -q '"role":"assistant"' || { echo "first event is not the role chunk"; exit 1; }
tail -1 "$tmp/stream" | grep -q ' data: \[DONE\]$' || { echo "last event is not [DONE]"; exit 1; }
grep -q '"finish_reason":"stop"' "$tmp/stream" || { echo "no finish_reason stop"; exit 1; }
content=$(grep -o '"content":"[^"]*"' "$tmp/stream" | sed 's/"content":"//; s/"$//' | tr -d '\n')
[ "$content" = "one two three four five" ] || { echo "content '$content'"; exit 1; }
# Incremental delivery: the first and last content events are >= 60 ms apart (30 ms per token).
first=$(grep '"content":"[^"]' "$tmp/stream" | head -1 | cut -d' ' -f1)
last=$(grep '"content":"[^"]' "$tmp/stream" | tail -1 | cut -d' ' -f1)
[ $(( (last - first) / 1000000 )) -ge 60 ] || { echo "events were not streamed incrementally"; exit 1; }

# Non-streaming and an error.
body=$(curl -sS "$url/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"hi"}]}')
echo "$body" | grep -q '"content":"Hello from the script."' || { echo "non-streaming: $body"; exit 1; }
code=$(curl -sS -o "$tmp/err.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages":[]}')
[ "$code" = 400 ] || { echo "expected 400, got $code"; exit 1; }
grep -q '"error"' "$tmp/err.json" && grep -q '"param":"messages"' "$tmp/err.json" || { cat "$tmp/err.json"; exit 1; }
echo "PASS curl streaming"
