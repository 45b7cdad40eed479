"""The ceiling under the engine: raw batched `llama_decode` of SmolLM2-135M through tokenomy's ModelRunner, one
token per sequence, with and without flash attention and for each KV cache type, next to a 512-token prefill; and
the engine itself in-process (its defaults: q8_0/f16 KV, flash attention, one stream per sequence) serving as many
concurrent greedy 128-token answers to short chat prompts, prefill included, with its ratio to the raw row of the
same KV type.

    .venv/bin/python bench/raw_decode.py [--json] [--kv-types f16,q8_0/f16,q8_0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


QUESTIONS = ["Describe the ocean.", "Explain how rain forms.", "Tell a story about a cat.", "Describe a city.",
             "Explain photosynthesis.", "Write about mountains.", "Describe a forest.", "Tell me about bread."]


def measure_engine(batches: list[int], tokens: int = 128) -> dict:
    """Output tok/s of the in-process engine with b concurrent answers of `tokens` tokens (after one warm-up)."""
    import threading

    from tokenomy.engine.engine import Engine
    from tokenomy.engine.sampling_params import SamplingParams

    e = Engine(str(resolve_gguf("smollm2-135m-instruct")), EngineConfig(max_running=max(batches),
                                                                       speculative=False)).start()
    out: dict = {"flash_attn": True, "kv_type": e.cfg.kv_type, "engine": True, "tok_s": {}}
    try:
        for b in [batches[0], *batches]:
            done, left = threading.Event(), [b]

            def on(ev, done=done, left=left) -> None:   # noqa: ANN001
                if ev.finish_reason:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

            t = time.perf_counter()
            for i in range(b):
                q = QUESTIONS[i % len(QUESTIONS)] + f" ({i})"
                e.submit(e.tokenizer.encode_chat([{"role": "user", "content": q}]),
                         SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True), on)
            done.wait(600)
            out["tok_s"][b] = b * tokens / (time.perf_counter() - t)
    finally:
        e.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kv-types", default="f16,q8_0/f16,q8_0")
    ap.add_argument("--engine-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [1, 4, 8, 16]
    if args.engine_only:      # its own process: llama.cpp's thread team belongs to the thread that computed first
        print(json.dumps(measure_engine(batches)))
        return
    # quantized V needs flash attention, so only f16 runs without it
    res = [measure(False, batches, "f16")] + [measure(True, batches, kv) for kv in args.kv_types.split(",")]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine-only"], capture_output=True,
                          text=True, check=True)
    eng = json.loads(proc.stdout.strip().splitlines()[-1])
    eng["tok_s"] = {int(k): v for k, v in eng["tok_s"].items()}
    raw = next((r for r in res if r["flash_attn"] and r["kv_type"] == eng["kv_type"]), None)
    if raw is not None:
        eng["ratio_to_raw"] = {b: eng["tok_s"][b] / raw["tok_s"][b] for b in batches}
    res.append(eng)
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
        if r.get("engine"):
            ratio = r.get("ratio_to_raw", {})
            t.add_row("engine (in-process)", r["kv_type"],
                      *(f"{r['tok_s'][b]:.0f} ({ratio[b]:.2f}x)" if b in ratio else f"{r['tok_s'][b]:.0f}"
                        for b in batches), "")
            continue
        t.add_row(str(r["flash_attn"]), r["kv_type"], *(f"{r['tok_s'][b]:.0f}" for b in batches),
                  f"{r['prefill_512_s']:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
