#!/usr/bin/env bash
# Install tokenomy into .venv: llama-cpp-python built for this CPU family first (scripts/llama_wheel.py), then the
# package with the extras named as arguments (`bash install.sh test` for the test suite).
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python scripts/llama_wheel.py
extras=$(IFS=,; echo "$*")
.venv/bin/python -m pip install -e ".${extras:+[$extras]}"
