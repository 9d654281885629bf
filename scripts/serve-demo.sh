#!/usr/bin/env bash
# Installs dependencies, builds lilac, makes the random-weight demo model in models/demo if absent and
# serves it on 127.0.0.1:8080 (extra arguments go to `lilac serve`, e.g. --port 9000 --api-key KEY).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
if [ ! -f models/demo/model.safetensors ] || [ ! -f models/demo/tokenizer.json ]; then
  ./build/lilac make-demo --out models/demo
fi
cat <<'BANNER'

  ┌──────────────────────────────────────────────────────────────────────────────────────────────┐
  │ lilac demo: models/demo has RANDOM WEIGHTS (the real Qwen3.6 architecture, tiny sizes).      │
  │ Everything works end to end (API, streaming, tools, reasoning, usage) but the text it        │
  │ generates is MEANINGLESS.                                                                    │
  │                                                                                              │
  │ For the real model (19 GB, MLX 4-bit):                                                       │
  │   huggingface-cli download mlx-community/Qwen3.6-35B-A3B-4bit --local-dir models/qwen3.6     │
  │   ./build/lilac serve --model models/qwen3.6                                                 │
  │ or from the original Hugging Face checkpoint:                                                │
  │   ./build/lilac convert --model <Qwen/Qwen3.6-35B-A3B folder> --out models/qwen3.6           │
  └──────────────────────────────────────────────────────────────────────────────────────────────┘

  Try:  curl -N http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
          -d '{"messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":20}'

BANNER
exec ./build/lilac serve --model models/demo "$@"
