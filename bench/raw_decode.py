"""The ceiling under the engine: raw batched `llama_decode` of SmolLM2-135M through tokenomy's ModelRunner, one
token per sequence, with and without flash attention and for each KV cache type, next to a 512-token prefill.

    .venv/bin/python bench/raw_decode.py [--json] [--kv-types f16,q8_0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner  # noqa: E402
from tokenomy.models import resolve_gguf  # noqa: E402


def measure(flash: bool, batches: list[int], kv_type: str, steps: int = 20) -> dict:
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")),
                    EngineConfig(n_ctx=1024 * (max(batches) + 1), max_running=max(batches) + 1, max_retired=0,
                                 max_batch_tokens=512, flash_attn=flash, kv_type=kv_type))   # a KV stream each
    toks = r.tokenize("hello world " * 300)[:512]
    t = time.perf_counter()
    r.decode([Chunk(0, toks, 0, True)])
    out = {"flash_attn": flash, "kv_type": kv_type, "prefill_512_s": time.perf_counter() - t, "tok_s": {}}
    for b in batches:
        r.clear()
        for s in range(b):
            r.decode([Chunk(s, toks[:32], 0, True)])
        t = time.perf_counter()
        for i in range(steps):
            r.decode([Chunk(s, [toks[i]], 32 + i, True) for s in range(b)])
        out["tok_s"][b] = b * steps / (time.perf_counter() - t)
    r.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kv-types", default="f16,q8_0")
    args = ap.parse_args()
    batches = [1, 4, 8, 16]
    # quantized V needs flash attention, so only f16 runs without it
    res = [measure(False, batches, "f16")] + [measure(True, batches, kv) for kv in args.kv_types.split(",")]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    t = Table(title="Raw batched llama_decode, SmolLM2-135M Q4_1, one token per sequence (tok/s)")
    t.add_column("flash attention")
    t.add_column("KV")
    for b in batches:
        t.add_column(f"batch {b}", justify="right")
    t.add_column("512-token prefill s", justify="right")
    for r in res:
        t.add_row(str(r["flash_attn"]), r["kv_type"], *(f"{r['tok_s'][b]:.0f}" for b in batches),
                  f"{r['prefill_512_s']:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
