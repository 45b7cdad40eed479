"""A conversation across a swap: the next turn's TTFT after its model was unloaded and loaded again, against a cold
prefill of the same context.

    python bench/fleet_swap.py [--conversations 4] [--tokenomy .venv/bin/tokenomy] [--json]

One `tokenomy serve` with two copies of the packaged SmolLM2 (`a`, `b`: the same weights under two names) with a
KV tier in RAM (`engine.kv_tier_ram_mb: 256`) and fleet.keep_conversations on. For each conversation (a grounded
prompt, ../shared/data/grounded/dev.jsonl, first turn; about 300 to 1,500 tokens): `a` answers the first turn
(32 tokens), `a` is unloaded and loaded again (POST /admin/models/a/unload, /load: its KV tier's prefixes go to
disk and come back), `b` is unloaded and loaded (so it has never seen the context: a cold prefill), then the next
turn (the history, the answer and a short question; 8 tokens) goes to both, alternating which goes first; TTFT is
read from the client (streamed) and the usage's cached tokens. Printed per conversation and as medians: prompt
tokens, TTFT after the swap, cold TTFT, and swap / cold (issue 51's target: at most 0.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import free_port, wait_up  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINE = {"n_ctx": 12288, "max_model_len": 2048, "max_running": 2, "max_retired": 4, "max_batch_tokens": 512,
          "kv_tier_ram_mb": 256}
NEXT = "In one sentence, what is it about?"


def conversations(n: int) -> list[list[dict[str, Any]]]:
    from tokenomy.tools.bench.workload import DEFAULT_GROUNDED, grounded

    shared = os.environ.get("TOKENOMY_SHARED_DATA")
    path = os.path.join(shared, "grounded", "dev.jsonl") if shared else str(ROOT / DEFAULT_GROUNDED)
    found = [r.body["messages"] for r in grounded({"path": path, "tasks": "summarize+context_qa"}, None)]  # type: ignore[arg-type]
    return found[:n]


def turn(base: str, model: str, messages: list[dict[str, Any]], max_tokens: int) -> tuple[float, str, dict]:
    """(TTFT seconds, the answer, usage) of one streamed chat turn."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, ttft, text, usage = time.perf_counter(), None, "", {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: {r.status_code} {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text += piece
            usage = chunk.get("usage") or usage
    return (ttft if ttft is not None else time.perf_counter() - t0), text, usage


def reload(base: str, name: str) -> None:
    for action in ("unload", "load"):
        r = httpx.post(f"{base}/admin/models/{name}/{action}", timeout=300)
        r.raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--tokenomy", default=str(ROOT / ".venv" / "bin" / "tokenomy"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="fleet-swap-"))
    models = [{"name": n, "gguf": "smollm2-135m-instruct", "engine": ENGINE, "keep_alive": -1} for n in "ab"]
    cfg = home / "tokenomy.yaml"
    cfg.write_text(yaml.safe_dump({"models": models, "fleet": {"keep_conversations": True},
                                   "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}}}))
    port = free_port()
    server = subprocess.Popen([a.tokenomy, "serve", "--config", str(cfg), "--port", str(port)],
                              env={**os.environ, "TOKENOMY_HOME": str(home)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        wait_up(base + "/health", [server])
        for i, first in enumerate(conversations(a.conversations)):
            _, answer, _ = turn(base, "a", first, 32)
            reload(base, "a")
            reload(base, "b")
            nxt = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": NEXT}]
            got = {}
            for name in (("a", "b") if i % 2 == 0 else ("b", "a")):
                got[name] = turn(base, name, nxt, 8)
            (swap, _, su), (cold, _, cu) = got["a"], got["b"]
            rows.append({"prompt_tokens": su.get("prompt_tokens"),
                         "cached_after_swap": (su.get("prompt_tokens_details") or {}).get("cached_tokens"),
                         "cached_cold": (cu.get("prompt_tokens_details") or {}).get("cached_tokens"),
                         "ttft_swap_s": swap, "ttft_cold_s": cold, "ratio": swap / cold})
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(home, ignore_errors=True)
    median = statistics.median(r["ratio"] for r in rows)
    if a.json:
        print(json.dumps({"rows": rows, "median_ratio": median}, indent=2))
        return
    print(f"{'prompt':>7}{'cached (swap)':>15}{'cached (cold)':>15}{'TTFT swap':>11}{'TTFT cold':>11}{'swap/cold':>11}")
    for r in rows:
        print(f"{r['prompt_tokens']:>7}{r['cached_after_swap']:>15}{r['cached_cold']:>15}{r['ttft_swap_s']:>11.3f}"
              f"{r['ttft_cold_s']:>11.3f}{r['ratio']:>11.2f}")
    print(f"median swap / cold: {median:.2f}")


if __name__ == "__main__":
    main()
