"""One unified KV buffer (the engine's layout) against one KV stream per sequence (llama-server's), raw batched
`llama_decode` of SmolLM2-135M at the positions of bench/engine_throughput.py: b sequences with 30-token prompts,
128 decode steps. The unified run also holds 16 retired 30-token prompts, as the engine's prefix cache does.
Rounds alternate; the ratio is streams over unified.

    .venv/bin/python bench/kv_streams.py [--rounds 2] [--json]
    .venv/bin/python bench/kv_streams.py --placement     # streams: adjacent vs scattered ids, stream copy costs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tokenomy.engine import tuning  # noqa: E402
from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402


def measure(unified: bool, b: int, steps: int = 128, prompt: int = 30, retired: int = 16) -> float:
    cfg = (EngineConfig(n_ctx=16384, max_running=16, max_retired=32) if unified
           else EngineConfig(n_ctx=512 * b, max_running=b, max_retired=0, kv_unified=False))
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")), cfg)
    toks = r.tokenize("hello world " * 300)
    if unified:
        for s in range(b, b + retired):
            r.decode([Chunk(s, toks[:prompt], 0, True)])
    for s in range(b):
        r.decode([Chunk(s, toks[s:s + prompt], 0, True)])
    t = time.perf_counter()
    for i in range(steps):
        r.decode([Chunk(s, [toks[i]], prompt + i, True) for s in range(b)])
    dt = time.perf_counter() - t
    r.close()
    return b * steps / dt


COPY_TOKENS = (300, 700, 1500, 3000)
SHIPPED_SHARE = tuning.STATE_COPY_SHARE


def placement(rounds: int) -> dict[str, float]:
    """With streams: decode tok/s of 8 sequences on adjacent, split and scattered stream ids (llama.cpp computes one
    ubatch per run of consecutive ids), and what copying a 4,096-cell stream holding n tokens costs: llama.cpp's
    whole-stream copy against the runner's copy of the cells in use through the sequence state."""
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")),
                    EngineConfig(n_ctx=32 * 4096, max_running=32, max_retired=0, kv_unified=False))
    toks = r.tokenize("hello world " * 400)
    out: dict[str, list[float]] = {}
    layouts = {"0-7": list(range(8)), "0-3,20-23": [0, 1, 2, 3, 20, 21, 22, 23], "0,2,..,14": list(range(0, 16, 2))}
    for _ in range(rounds):
        for name, slots in layouts.items():
            for sl in slots:
                r.remove(sl)
                r.decode([Chunk(sl, toks[sl:sl + 30], 0, True)])
            t = time.perf_counter()
            for i in range(48):
                r.decode([Chunk(sl, [toks[i]], 30 + i, True) for sl in slots])
            out.setdefault(name, []).append(8 * 48 / (time.perf_counter() - t))
    toks = r.tokenize("hello world " * 2 * max(COPY_TOKENS))
    for n in COPY_TOKENS:                # a stream holding n tokens copied, both ways, rounds alternating
        r.remove(5)
        for i in range(0, n, 512):
            r.decode([Chunk(5, toks[i:min(n, i + 512)], i, False)])
        for _ in range(rounds + 1):
            for share, name in ((0.0, "whole"), (1.0, "cells")):
                tuning.STATE_COPY_SHARE = share
                r.remove(9)
                t = time.perf_counter()
                r.decode([Chunk(9, [toks[1]], 0, True)])
                plain = time.perf_counter() - t
                t = time.perf_counter()
                r.copy_stream(5, 9)
                r.remove(9, n - 1)
                r.decode([Chunk(9, [toks[n - 1]], n - 1, True)])     # a whole-stream copy happens in here
                out.setdefault(f"copy_{name}_{n}_ms", []).append(1000 * (time.perf_counter() - t - plain))
    tuning.STATE_COPY_SHARE = SHIPPED_SHARE
    r.close()
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--placement", action="store_true", help="streams only: adjacent vs scattered ids, copy cost")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.placement:
        res = placement(args.rounds)
        if args.json:
            print(json.dumps(res, indent=2))
            return
        t = Table(title="8 decoding sequences by stream ids (tok/s, median of rounds)")
        for col in ("streams 0-7", "0-3 and 20-23", "0, 2, .., 14"):
            t.add_column(col, justify="right")
        t.add_row(f"{res['0-7']:.1f}", f"{res['0-3,20-23']:.1f} ({res['0-3,20-23'] / res['0-7']:.2f}x)",
                  f"{res['0,2,..,14']:.1f} ({res['0,2,..,14'] / res['0-7']:.2f}x)")
        Console().print(t)
        c = Table(title="Copying a 4,096-cell stream holding n tokens (ms, median of rounds)")
        for col in ("tokens", "whole stream (llama.cpp)", "cells in use (state)", "ratio", "runner uses"):
            c.add_column(col, justify="right")
        for n in COPY_TOKENS:
            whole, cells = res[f"copy_whole_{n}_ms"], res[f"copy_cells_{n}_ms"]
            c.add_row(str(n), f"{whole:.1f}", f"{cells:.1f}", f"{cells / whole:.2f}x",
                      "cells" if n <= SHIPPED_SHARE * 4096 else "whole")
        Console().print(c)
        return
    batches = [1, 8, 16]
    runs: dict[int, dict[str, list[float]]] = {b: {"unified": [], "streams": []} for b in batches}
    for _ in range(args.rounds):
        for b in batches:
            runs[b]["unified"].append(measure(True, b))
            runs[b]["streams"].append(measure(False, b))
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    t = Table(title="Decode tok/s: one unified KV buffer vs one KV stream per sequence (median of rounds)")
    for col in ("batch", "unified", "per-sequence streams", "ratio"):
        t.add_column(col, justify="right")
    for b in batches:
        u, s = statistics.median(runs[b]["unified"]), statistics.median(runs[b]["streams"])
        t.add_row(str(b), f"{u:.1f}", f"{s:.1f}", f"{s / u:.2f}x")
    Console().print(t)


if __name__ == "__main__":
    main()
