"""Past the window: what a context shift (engine.context_overflow: shift) costs in quality, against the other ways
of going on when a sequence fills its window, on the same real text in one run.

A text of --tokens tokens (articles from ../shared/data/grounded/dev.jsonl, joined) is fed through one KV stream
of --window cells in chunks of 64, and every next token is scored. When the next chunk would not fit:

- shift:     the engine's rule (Scheduler.shift): keep the first 4 tokens, drop the older half of the rest, shift
             positions (StreamingLLM);
- restart:   truncation: drop the whole context and go on from nothing;
- recompute: drop the context and prefill the most recent half of the window again (exact attention over what
             is kept; costs a re-prefill at every overflow);
- full:      a window as long as the text (the ceiling, no overflow).

Perplexity over the tokens after the first window (where the modes differ), and the seconds each took.

    .venv/bin/python bench/context_shift.py [--window 512] [--tokens 2048] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner  # noqa: E402
from tokenomy.engine.tuning import SINK_TOKENS  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
MODES = ("full", "shift", "recompute", "restart")
CHUNK = 64


def text_tokens(runner: ModelRunner, n: int) -> list[int]:
    rows = [json.loads(line) for line in open(GROUNDED, encoding="utf-8") if line.strip()]
    texts = [r["turns"][0] for r in rows if r["task"] == "summarize"]
    ids: list[int] = []
    for t in texts:
        ids += runner.tokenize(t, add_special=not ids, parse_special=False)
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit("not enough text")


def log_probs(rows: np.ndarray, targets: list[int]) -> np.ndarray:
    rows = rows.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    return rows[np.arange(len(targets)), targets] - lse


def score(runner: ModelRunner, ids: list[int], window: int, mode: str, first_scored: int) -> tuple[float, float]:
    """Perplexity over ids[first_scored:] (each token predicted from what the mode kept), and seconds."""
    runner.clear()
    nll, n_scored = 0.0, 0
    kv: list[int] = []          # the tokens whose KV the stream holds, in position order
    i = 0
    t0 = time.perf_counter()
    while i < len(ids) - 1:
        chunk = ids[i:min(i + CHUNK, len(ids) - 1)]
        if mode != "full" and len(kv) + len(chunk) > window:
            if mode == "shift":
                keep = SINK_TOKENS
                discard = (len(kv) - keep) // 2
                runner.shift(0, keep, discard)
                kv = kv[:keep] + kv[keep + discard:]
            elif mode == "restart":
                runner.remove(0)
                kv = []
            else:
                recent = kv[-window // 2:]
                runner.remove(0)
                for j in range(0, len(recent), CHUNK):
                    runner.decode([Chunk(0, recent[j:j + CHUNK], j, 0)])
                kv = recent
        rows = runner.decode([Chunk(0, chunk, len(kv), len(chunk))])
        targets = ids[i + 1:i + 1 + len(chunk)]
        lp = log_probs(rows, targets)
        for k, v in enumerate(lp):
            if i + 1 + k >= first_scored:
                nll -= float(v)
                n_scored += 1
        kv += chunk
        i += len(chunk)
    return math.exp(nll / n_scored), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = str(resolve_gguf("smollm2-135m-instruct"))
    out: dict[str, dict[str, float]] = {}
    ids: list[int] = []
    for mode in MODES:
        n_ctx = args.tokens + 256 if mode == "full" else args.window
        runner = ModelRunner(path, EngineConfig(n_ctx=n_ctx, max_running=1, max_retired=0, max_batch_tokens=CHUNK,
                                                n_threads=args.threads, max_model_len=n_ctx))
        try:
            ids = ids or text_tokens(runner, args.tokens)
            ppl, secs = score(runner, ids, args.window, mode, args.window)
        finally:
            runner.close()
        out[mode] = {"perplexity": ppl, "seconds": secs}
        print(f"{mode:9s} perplexity {ppl:8.3f}  {secs:6.1f} s", file=sys.stderr)
    result = {"window": args.window, "tokens": args.tokens, "scored": args.tokens - args.window, "modes": out}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    full = out["full"]["perplexity"]
    print(f"{args.tokens} tokens through a {args.window}-token window; perplexity over the last "
          f"{args.tokens - args.window}")
    print(f"{'mode':10s} {'perplexity':>10s} {'x full':>7s} {'seconds':>8s}")
    for m, v in out.items():
        print(f"{m:10s} {v['perplexity']:10.3f} {v['perplexity'] / full:7.3f} {v['seconds']:8.1f}")


if __name__ == "__main__":
    main()
