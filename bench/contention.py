"""Threads on a shared machine: one 32-token answer in-process with the engine on every core and on one core
fewer, idle and with another process busy on one core, side by side in one run.

    .venv/bin/python bench/contention.py [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402


def answer(engine: Engine, tokens: int) -> float:
    done = threading.Event()
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": "Describe the ocean."}])
    t0 = time.perf_counter()
    engine.submit(ids, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True),
                  lambda ev: ev.finish_reason and done.set())
    done.wait(600)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    table = Table(title=f"{args.tokens}-token answer, SmolLM2-135M, {cores} cores")
    for col in ("n_threads", "idle s", "one core busy s", "ratio"):
        table.add_column(col, justify="right")
    for threads in sorted({cores, max(cores - 1, 1)}, reverse=True):
        engine = Engine(str(resolve_gguf("smollm2-135m-instruct")), EngineConfig(n_threads=threads)).start()
        answer(engine, 4)                                      # warm-up
        idle = answer(engine, args.tokens)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        busy = answer(engine, args.tokens)
        hog.kill()
        hog.wait()
        engine.stop()
        table.add_row(str(threads), f"{idle:.2f}", f"{busy:.2f}", f"{busy / idle:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
