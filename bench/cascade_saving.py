"""Cascade saving on the embedded pair: SmolLM2-135M answers first, Gemma-3-270M only when the cascade's
confidence signals fail, vs always Gemma-3-270M. Prices are the packaged models' notional prices (USD per 1M
tokens), so the saving is a share, not a bill. Reports the escalation rate, USD and tokens of both policies, and
how often the cascade's final answer is the one the capable model alone would have given (greedy agreement).

    .venv/bin/python bench/cascade_saving.py [--prompts 24] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tests.conftest import live_server  # noqa: E402

PROMPTS = ["What is the capital of France?", "Name three primary colors.", "What is 12 times 12?",
           "Who wrote Romeo and Juliet?", "Translate 'thank you' to Spanish.", "What is the boiling point of water?",
           "Give a synonym for happy.", "How many days are in a week?", "What planet is closest to the sun?",
           "Name a mammal that can fly.", "What is the largest ocean?", "Spell the word 'necessary'.",
           "What gas do plants absorb?", "What is the square root of 81?", "Name a programming language.",
           "What is the opposite of cold?", "Explain gravity in one sentence.", "What color is a ripe banana?",
           "How many legs does a spider have?", "What is H2O?", "Name the first month of the year.",
           "What is the freezing point of water in Celsius?", "Who painted the Mona Lisa?",
           "What is the chemical symbol for gold?"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engine = {"n_ctx": 4096, "max_model_len": 1024, "max_running": 4, "max_retired": 8}
    cfg = {"engine": engine, "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}},
           "ledger": "sqlite:///" + tempfile.mkdtemp() + "/ledger.db",
           "models": [{"name": "small", "gguf": "smollm2-135m-instruct"}, {"name": "big", "gguf": "gemma3-270m"}],
           "routes": {"cascade": {"strategy": "cascade", "models": ["small", "big"]},
                      "always_big": {"strategy": "fixed", "models": ["big"]}}}
    out = {}
    with live_server(cfg) as gw:
        for route in ("cascade", "always_big"):
            texts, cost, tokens, escalated = [], 0.0, 0, 0
            for p in PROMPTS[:args.prompts]:
                r = httpx.post(gw.base_url + "/chat/completions", timeout=300, json={
                    "model": route, "messages": [{"role": "user", "content": p}], "max_tokens": args.max_tokens,
                    "temperature": 0})
                r.raise_for_status()
                texts.append((r.json()["model"], r.json()["choices"][0]["message"]["content"]))
                cost += float(r.headers["x-tokenomy-cost-usd"])
                tokens += r.json()["usage"]["total_tokens"]
                escalated += "escalated" in r.headers["x-tokenomy-route"]
            out[route] = {"usd": cost, "tokens": tokens, "escalated": escalated, "answers": texts}
    n = args.prompts
    c, b = out["cascade"], out["always_big"]
    agree = sum(1 for (m, t), (_, tb) in zip(c["answers"], b["answers"], strict=True) if m == "big" and t == tb)
    res = {"prompts": n, "escalation_rate": c["escalated"] / n, "cascade_usd": c["usd"], "always_big_usd": b["usd"],
           "saving_share": 1 - c["usd"] / b["usd"] if b["usd"] else 0.0, "cascade_tokens": c["tokens"],
           "always_big_tokens": b["tokens"], "escalated_answers_equal_to_big": agree}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    t = Table(title=f"Cascade SmolLM2-135M -> Gemma-3-270M vs always Gemma-3-270M, {n} prompts (notional prices)")
    for col in ("policy", "USD", "tokens", "escalated"):
        t.add_column(col, justify="right")
    t.add_row("cascade", f"{c['usd']:.8f}", str(c["tokens"]), f"{c['escalated']}/{n}")
    t.add_row("always big", f"{b['usd']:.8f}", str(b["tokens"]), "-")
    Console().print(t)
    Console().print(f"saving {res['saving_share']:.1%} of the always-capable cost; escalation rate "
                    f"{res['escalation_rate']:.1%}; escalated answers identical to big's: {agree}")


if __name__ == "__main__":
    main()
