"""The ceiling under the engine: raw batched `llama_decode` of SmolLM2-135M through tokenomy's ModelRunner, one
token per sequence, with and without flash attention and for each KV cache type, next to a 512-token prefill; and
the engine itself in-process (its defaults: q8_0/f16 KV, flash attention, one stream per sequence) serving as many
concurrent greedy 128-token answers to short chat prompts, prefill included, with its ratio to the raw row of the
same KV type and to the same job done raw.

The raw rows decode 20 steps at positions 32-52: the kernels' speed. "raw, same job" is the engine's job with
nothing around the kernels: the same chat prompts, their common prefix (the chat template's system prompt) computed
once and copied to every sequence's stream, the rest prefilled in one `llama_decode`, then 128 steps of one token per
sequence, each the argmax of its logits row, on a runner configured as the engine's. The engine can only lose to
it; what it loses is the scheduler, sampling, detokenising and events.

    .venv/bin/python bench/raw_decode.py [--json] [--kv-types f16,q8_0/f16,q8_0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.runner import Chunk, ModelRunner  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402


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


def measure_job(batches: list[int], tokens: int = 128) -> dict:
    """Output tok/s of the engine's job (see the module docstring) done with bare runner calls."""
    from tokenomy.engine.tokenizer import Tokenizer

    cfg = EngineConfig(max_running=max(batches), speculative=False)
    r = ModelRunner(str(resolve_gguf("smollm2-135m-instruct")), cfg)
    tok = Tokenizer(r)
    out: dict = {"flash_attn": True, "kv_type": cfg.kv_type, "job": True, "tok_s": {}}
    for k, b in enumerate([batches[0], *batches]):       # the first is a warm-up
        r.clear()
        prompts = [tok.encode_chat([{"role": "user", "content": question(k, i)}]) for i in range(b)]
        shared = len(os.path.commonprefix(prompts)) - 1 if b > 1 else 0   # the chat template's system prompt
        t = time.perf_counter()
        if shared > 0:                      # computed once, copied to the other streams
            r.decode([Chunk(0, prompts[0][:shared], 0, 0)])
            for i in range(1, b):
                r.copy_stream(0, i)
        rows, group, n = [], [], 0       # the rest of each prompt, as many per llama_decode as the batch allows
        for i, p in enumerate(prompts):
            if n + len(p) - shared > cfg.max_batch_tokens:
                rows.append(r.decode(group).copy())
                group, n = [], 0
            group.append(Chunk(i, p[shared:], shared, 1))
            n += len(p) - shared
        rows = np.concatenate([*rows, r.decode(group)])
        pos = [len(p) for p in prompts]
        for _ in range(tokens - 1):
            nxt = rows.argmax(axis=1).tolist()
            rows = r.decode([Chunk(i, [nxt[i]], pos[i], 1) for i in range(b)])
            pos = [p + 1 for p in pos]
        out["tok_s"][b] = b * tokens / (time.perf_counter() - t)
    r.close()
    return out


QUESTIONS = ["Describe the ocean.", "Explain how rain forms.", "Tell a story about a cat.", "Describe a city.",
             "Explain photosynthesis.", "Write about mountains.", "Describe a forest.", "Tell me about bread."]


def question(round_: int, i: int) -> str:
    """The i-th prompt of a round: no two rounds repeat one, so the engine's prefix cache shares only the chat
    template between them, as it does within a round."""
    return QUESTIONS[i % len(QUESTIONS)] + f" ({round_}.{i})"


def measure_engine(batches: list[int], tokens: int = 128) -> dict:
    """Output tok/s of the in-process engine with b concurrent answers of `tokens` tokens (after one warm-up)."""
    import threading

    from tokenomy.engine.engine import Engine
    from tokenomy.engine.sampling_params import SamplingParams

    e = Engine(str(resolve_gguf("smollm2-135m-instruct")), EngineConfig(max_running=max(batches),
                                                                       speculative=False)).start()
    out: dict = {"flash_attn": True, "kv_type": e.cfg.kv_type, "engine": True, "tok_s": {}}
    try:
        for k, b in enumerate([batches[0], *batches]):      # the first is a warm-up
            done, left = threading.Event(), [b]

            def on(ev, done=done, left=left) -> None:   # noqa: ANN001
                if ev.finish_reason:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

            t = time.perf_counter()
            for i in range(b):
                e.submit(e.tokenizer.encode_chat([{"role": "user", "content": question(k, i)}]),
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
    ap.add_argument("--rounds", type=int, default=2, help="engine and same-job rows alternate this many times")
    args = ap.parse_args()
    batches = [1, 4, 8, 16]
    if args.engine_only:      # its own process: llama.cpp's thread team belongs to the thread that computed first
        print(json.dumps(measure_engine(batches)))
        return
    # quantized V needs flash attention, so only f16 runs without it
    res = [measure(False, batches, "f16")] + [measure(True, batches, kv) for kv in args.kv_types.split(",")]
    engines, jobs = [], []
    for _ in range(args.rounds):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine-only"], capture_output=True,
                              text=True, check=True)
        engines.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        jobs.append(measure_job(batches))
    eng, job = engines[0], jobs[0]
    eng["tok_s"] = {b: sum(e["tok_s"][str(b)] for e in engines) / len(engines) for b in batches}
    job["tok_s"] = {b: sum(j["tok_s"][b] for j in jobs) / len(jobs) for b in batches}
    raw = next((r for r in res if r["flash_attn"] and r["kv_type"] == eng["kv_type"]), None)
    if raw is not None:
        eng["ratio_to_raw"] = {b: eng["tok_s"][b] / raw["tok_s"][b] for b in batches}
    eng["ratio_to_job"] = {b: eng["tok_s"][b] / job["tok_s"][b] for b in batches}
    res += [job, eng]
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
        if r.get("job"):
            t.add_row("raw, same job", r["kv_type"], *(f"{r['tok_s'][b]:.0f}" for b in batches), "")
            continue
        if r.get("engine"):
            ratio, job_ratio = r.get("ratio_to_raw", {}), r["ratio_to_job"]
            t.add_row("engine (in-process): tok/s (x raw row, x same job)", r["kv_type"],
                      *(f"{r['tok_s'][b]:.0f} ({ratio[b]:.2f}x, {job_ratio[b]:.2f}x)" if b in ratio
                        else f"{r['tok_s'][b]:.0f} (-, {job_ratio[b]:.2f}x)" for b in batches), "")
            continue
        t.add_row(str(r["flash_attn"]), r["kv_type"], *(f"{r['tok_s'][b]:.0f}" for b in batches),
                  f"{r['prefill_512_s']:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
