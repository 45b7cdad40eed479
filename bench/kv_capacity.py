"""What quantized KV buys: with a fixed KV memory budget, the sequences of a given length each KV type fits, and
the engine's throughput at that concurrency, in one run.

For each K/V type the engine gets KV streams of --length cells, as many as --budget-mib of KV holds (bytes per
token from the model's shape and ggml's block sizes, as bench/kv_quality.py computes them), and serves that many
concurrent requests: real article prompts (../shared/data/grounded/dev.jsonl) cut to --length - --max-tokens
tokens, --max-tokens greedy answers with EOS ignored. Output tokens per second over the whole run (prefill
included) and over the decode phase, against f16/f16, rounds alternating the order of the types.

    .venv/bin/python bench/kv_capacity.py [--budget-mib 64] [--length 512] [--max-tokens 64] [--rounds 2]
        [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kv_quality import TYPES, kv_bytes_per_token, texts  # noqa: E402

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.runner import ModelRunner  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")


def serve_all(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """All prompts at once; output tok/s over the run and over the decode phase (after the last first token)."""
    done = threading.Event()
    left = [len(prompts)]
    firsts: list[float] = []
    lock = threading.Lock()
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, speculative=False)

    def on(ev: Any) -> None:
        with lock:
            if ev.finish_reason:
                firsts.append(ev.first_token_at or time.perf_counter())
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    t0 = time.perf_counter()
    for p in prompts:
        engine.submit(p, params, on)
    assert done.wait(1800), "the run did not finish"
    end = time.perf_counter()
    out = len(prompts) * max_tokens
    decode_start = max(firsts)
    return {"tok_s": out / (end - t0), "seconds": end - t0,
            "decode_tok_s": len(prompts) * (max_tokens - 1) / max(end - decode_start, 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-mib", type=float, default=64)
    ap.add_argument("--length", type=int, default=512, help="cells per sequence (prompt + answer)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = str(resolve_gguf("smollm2-135m-instruct"))
    probe = ModelRunner(path, EngineConfig(n_ctx=256, max_running=1, max_retired=0))
    per_token = {kv: kv_bytes_per_token(probe, kv) for kv in TYPES}
    budget = args.budget_mib * 2**20
    fits = {kv: int(budget // (per_token[kv] * args.length)) for kv in TYPES}
    arts = texts(GROUNDED, max(fits.values()))
    prompts_all = [probe.tokenize(a, add_special=True, parse_special=False)[: args.length - args.max_tokens - 1]
                   for a in arts]
    probe.close()
    runs: dict[str, list[dict[str, float]]] = {kv: [] for kv in TYPES}
    for r in range(args.rounds):
        for kv in TYPES if r % 2 == 0 else list(reversed(TYPES)):
            n = fits[kv]
            cfg = EngineConfig(n_ctx=n * args.length, max_running=n, max_retired=0, kv_type=kv,
                               max_model_len=args.length, n_threads=args.threads, kv_tier_ram_mb=0,
                               max_batch_tokens=512)
            engine = Engine(path, cfg).start()
            try:
                res = serve_all(engine, prompts_all[:n], args.max_tokens)
            finally:
                engine.stop()
            runs[kv].append(res)
            print(f"round {r} {kv:10s} {n:3d} sequences: {res['tok_s']:6.1f} tok/s "
                  f"(decode {res['decode_tok_s']:6.1f})", file=sys.stderr)
    base = statistics.median(x["tok_s"] for x in runs["f16/f16"])
    base_d = statistics.median(x["decode_tok_s"] for x in runs["f16/f16"])
    result = {"budget_mib": args.budget_mib, "length": args.length, "max_tokens": args.max_tokens,
              "types": {kv: {"bytes_per_token": per_token[kv], "sequences": fits[kv],
                             "tok_s": statistics.median(x["tok_s"] for x in runs[kv]),
                             "decode_tok_s": statistics.median(x["decode_tok_s"] for x in runs[kv])}
                        for kv in TYPES}}
    for v in result["types"].values():
        v["tok_s_ratio"] = v["tok_s"] / base
        v["decode_ratio"] = v["decode_tok_s"] / base_d
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"KV budget {args.budget_mib:g} MiB, {args.length}-token sequences ({args.max_tokens}-token answers), "
          f"median of {args.rounds} rounds")
    print(f"{'K/V':10s} {'bytes/token':>11s} {'sequences':>9s} {'tok/s':>7s} {'x f16':>6s} {'decode tok/s':>12s} "
          f"{'x f16':>6s}")
    for kv, v in result["types"].items():
        print(f"{kv:10s} {v['bytes_per_token']:11.0f} {v['sequences']:9d} {v['tok_s']:7.1f} {v['tok_s_ratio']:6.2f} "
              f"{v['decode_tok_s']:12.1f} {v['decode_ratio']:6.2f}")


if __name__ == "__main__":
    main()
