"""Quantized KV: what it costs in quality and what it buys in capacity, against f16 KV, in one run.

Quality: the grounded prompts of ../shared/data/grounded/dev.jsonl (real articles, passages and questions) are
scored token by token with each KV type (K/V: f16/f16, q8_0/f16 (tokenomy's default), q8_0/q8_0, q4_0/q4_0):
perplexity, and the mean KL divergence of each position's next-token distribution from the f16 one (llama.cpp's
`llama-perplexity --kl-divergence` measure), on the same tokens in the same chunks. Capacity: KV bytes per token
from the model's shape and each type's block size, and the tokens that fit in 1 GiB.

    .venv/bin/python bench/kv_quality.py [--models smollm2-135m-instruct,gemma3-270m] [--texts 8]
        [--max-tokens 1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import llama_cpp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner, kv_types  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
TYPES = ["f16/f16", "q8_0/f16", "q8_0/q8_0", "q4_0/q4_0"]
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}   # ggml block sizes (32 values per block)
CHUNK = 128


def texts(path: str, n: int) -> list[str]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return [r["turns"][0] for r in rows if r["task"] in ("summarize", "context_qa")][:n]


def log_probs(runner: ModelRunner, ids: list[int]) -> np.ndarray:
    """Log-softmax rows for positions 0..len-2 (each predicting the next token), decoded CHUNK tokens a step."""
    runner.remove(0)
    out = []
    for start in range(0, len(ids) - 1, CHUNK):
        part = ids[start:min(start + CHUNK, len(ids) - 1)]
        rows = np.array(runner.decode([Chunk(0, part, start, len(part))]), dtype=np.float64)
        rows -= rows.max(axis=1, keepdims=True)
        rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
        out.append(rows.astype(np.float32))
    return np.concatenate(out)


def kv_bytes_per_token(runner: ModelRunner, kv: str) -> float:
    """Bytes of K and V for one token across all layers (grouped-query heads)."""
    m = runner.model
    n_layer = llama_cpp.llama_model_n_layer(m)
    n_head, n_head_kv = llama_cpp.llama_model_n_head(m), llama_cpp.llama_model_n_head_kv(m)
    head_dim = llama_cpp.llama_model_n_embd(m) // n_head
    k, v = kv_types(kv)
    per_value = BYTES_PER_VALUE[k] + BYTES_PER_VALUE[v]
    return n_layer * n_head_kv * head_dim * per_value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma3-270m")
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=1024, help="tokens scored per text, at most")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grounded", default=GROUNDED)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = []
    for model in args.models.split(","):
        path = str(resolve_gguf(model))
        base: list[np.ndarray] = []
        for kv in TYPES:
            cfg = EngineConfig(n_ctx=args.max_tokens + CHUNK, max_running=1, max_retired=0, n_threads=args.threads,
                               max_batch_tokens=CHUNK, kv_type=kv, prefix_caching=False)
            runner = ModelRunner(path, cfg)
            nll, kl, n = 0.0, 0.0, 0
            for i, text in enumerate(texts(args.grounded, args.texts)):
                ids = runner.tokenize(text)[: args.max_tokens]
                lp = log_probs(runner, ids)
                target = np.asarray(ids[1:], dtype=np.int64)
                nll -= float(lp[np.arange(len(target)), target].sum())
                n += len(target)
                if kv == TYPES[0]:
                    base.append(lp)
                else:
                    ref = base[i]
                    kl += float((np.exp(ref) * (ref - lp)).sum())
                print(f"{model} {kv} text {i + 1}: {len(ids)} tokens", file=sys.stderr)
            report.append({"model": model, "kv": kv, "tokens": n, "perplexity": round(float(np.exp(nll / n)), 4),
                           "mean_kl_vs_f16": round(kl / n, 5) if kv != TYPES[0] else 0.0,
                           "kv_bytes_per_token": round(kv_bytes_per_token(runner, kv), 1),
                           "tokens_per_gib": int(2**30 / kv_bytes_per_token(runner, kv))})
            runner.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    f16 = {r["model"]: r for r in report if r["kv"] == TYPES[0]}
    print(f"{'model':24} {'K/V':10} {'ppl':>9} {'d ppl':>8} {'KL':>9} {'B/token':>8} {'tokens/GiB':>11} {'x f16':>6}")
    for r in report:
        b = f16[r["model"]]
        print(f"{r['model']:24} {r['kv']:10} {r['perplexity']:>9.4f} {r['perplexity'] - b['perplexity']:>+8.4f} "
              f"{r['mean_kl_vs_f16']:>9.5f} {r['kv_bytes_per_token']:>8.0f} {r['tokens_per_gib']:>11,} "
              f"{r['tokens_per_gib'] / b['tokens_per_gib']:>6.2f}")


if __name__ == "__main__":
    main()
