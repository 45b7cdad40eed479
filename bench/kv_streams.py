"""One unified KV buffer (the engine's layout) against one KV stream per sequence (llama-server's), raw batched
`llama_decode` of SmolLM2-135M at the positions of bench/engine_throughput.py: b sequences with 30-token prompts,
128 decode steps. The unified run also holds 16 retired 30-token prompts, as the engine's prefix cache does.
Rounds alternate; the ratio is streams over unified.

    .venv/bin/python bench/kv_streams.py [--rounds 2] [--json]
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

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner  # noqa: E402
from tokenomy.models import resolve_gguf  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
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
