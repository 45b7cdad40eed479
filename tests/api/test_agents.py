"""The real coding agents, installed from npm by `install.sh test`, each complete a one-shot prompt against
`tokenomy serve` on the embedded default (SmolLM2, its trained 8k window): Claude Code over /v1/messages, Codex CLI over
/v1/responses. Their requests carry thousands of tokens of system prompt and tools, which the context stage fits
into the window (docs/agents.md). Skipped only where node is not installed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "agents" / "node_modules" / ".bin"
MODEL = "smollm2-135m-instruct"
TIMEOUT_S = 600

pytestmark = [pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (docs/testing.md)"),
              # an agent's first request is thousands of prompt tokens: on a slow 2-core machine its prefill alone
              # takes minutes, so the test's own budget (TIMEOUT_S per agent run) applies, not the suite's 300 s
              pytest.mark.timeout(TIMEOUT_S + 120), pytest.mark.slow]


def agent(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} is missing: run `bash install.sh test` (it installs the agents with npm)"
    return str(path)


class Served:
    def __init__(self, url: str, home: Path) -> None:
        self.url, self.home = url, home

    def rows(self, api: str) -> list[sqlite3.Row]:
        with sqlite3.connect(self.home / "ledger.db") as db:
            db.row_factory = sqlite3.Row
            return db.execute("SELECT * FROM ledger WHERE api = ? ORDER BY ts", (api,)).fetchall()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`tokenomy serve` as a user starts it: no config file, the embedded default, its own home."""
    home = tmp_path_factory.mktemp("home")
    port = free_port()
    env = {**os.environ, "TOKENOMY_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError("tokenomy serve exited: " + (proc.stderr.read() if proc.stderr else ""))
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, timeout=180)
        yield Served(url, home)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def test_claude_code_answers_a_one_shot_prompt(served: Served, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": served.url,
           "ANTHROPIC_API_KEY": "sk-local", "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
           "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL, "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    before = len(served.rows("messages"))
    done = run([agent("claude"), "-p", "Say hello", "--model", MODEL], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), done.stderr
    rows = served.rows("messages")[before:]
    assert rows and all(r["status"] == 200 for r in rows), [dict(r) for r in rows]
    # the request was fitted into the window: thousands of tokens of tools described briefly
    assert any("fit=" in (r["context_actions"] or "") for r in rows)
    window = httpx.get(served.url + "/v1/models").json()["data"][0]["context_window"]     # the GGUF's 8,192
    assert all(r["prompt_tokens"] < window < r["context_tokens_before"] for r in rows if r["context_tokens_before"])


def test_codex_answers_a_one_shot_prompt(served: Served, tmp_path: Path) -> None:
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(f'''model = "{MODEL}"
model_provider = "tokenomy"

[model_providers.tokenomy]
name = "tokenomy"
base_url = "{served.url}/v1"
wire_api = "responses"
env_key = "TOKENOMY_API_KEY"
''')
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(codex_home),
           "TOKENOMY_API_KEY": "sk-local"}
    before = len(served.rows("responses"))
    done = run([agent("codex"), "exec", "--skip-git-repo-check", "Say hello"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), done.stderr
    rows = served.rows("responses")[before:]
    assert rows and all(r["status"] == 200 for r in rows), [dict(r) for r in rows]
