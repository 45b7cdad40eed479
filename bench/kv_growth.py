"""KV streams that grow (engine.kv_start_cells, docs/engine.md "KV that grows"): the engine's RSS at start, after
grounded prompts, and after each growth, with the pause each growth took, beside what holding every stream's whole
window from the start takes, in one run.

    .venv/bin/python bench/kv_growth.py [--prompts 8]

The default engine as `tokenomy serve` sizes it for SmolLM2-135M (24 streams, the GGUF's 8,192-token window) runs
in this process: it serves the first `--prompts` grounded prompts (../shared/data/grounded/dev.jsonl, 8 answer
tokens each), then prompts of 1,500, 3,000 and 6,000 tokens, which make its streams grow to 2,048, 4,096 and 8,192
cells. Then the same engine with `kv_start_cells: null` is started for its RSS at start. RSS is this process's
(psutil); the pauses are the engine's own log lines ("KV streams grown ... in S s").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="    %(message)s")
    os.environ.setdefault("TOKENOMY_MEMORY_LIMIT", "64G")     # size as on a machine with room for the window
    from tokenomy.engine.engine import Engine, EngineConfig
    from tokenomy.engine.sampling_params import SamplingParams
    from tokenomy.models.catalog import resolve_gguf
    from tokenomy.models.memory import engine_memory, size

    path = str(resolve_gguf("smollm2-135m-instruct"))
    cfg, _ = size(path, EngineConfig())
    est = engine_memory(path, cfg)
    me = psutil.Process()
    data = Path(os.environ.get("TOKENOMY_SHARED_DATA", ROOT.parent / "shared" / "data")) / "grounded" / "dev.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]

    def report(engine: Engine, what: str) -> None:
        print(f"{what:<34} streams of {engine.runner.n_ctx_seq:>5} cells  RSS {me.memory_info().rss / 1e9:.3f} GB",
              flush=True)

    def ask(engine: Engine, ids: list[int]) -> threading.Event:
        done = threading.Event()
        engine.submit(ids, SamplingParams(max_tokens=8, temperature=0), lambda ev: ev.finish_reason and done.set())
        return done

    print(f"estimate (models/memory.engine_memory): at start {est.at_start / 1e9:.3f} GB, weights + KV grown to "
          f"the window + runtime {(est.at_most - est.tier_bytes) / 1e9:.3f} GB")
    engine = Engine(path, cfg, name="smollm2").start()
    report(engine, f"start (window {engine.max_model_len})")
    for done in [ask(engine, engine.tokenizer.encode_chat([{"role": "user", "content": r["turns"][0]}]))
                 for r in rows[:args.prompts]]:
        done.wait(900)
    report(engine, f"after {args.prompts} grounded prompts")
    long = engine.tokenizer.encode_chat([{"role": "user", "content": " ".join(r["turns"][0] for r in rows[:12])}])
    for n in (1500, 3000, 6000):
        ask(engine, long[:n]).wait(900)
        report(engine, f"after a {n}-token prompt")
    engine.stop()
    del engine
    whole = Engine(path, cfg.model_copy(update={"kv_start_cells": None}), name="whole")
    report(whole, "kv_start_cells null: start")
    whole.stop()


if __name__ == "__main__":
    main()
