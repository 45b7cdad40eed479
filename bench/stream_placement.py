"""Where an arrival whose prompt is cached on a stream apart from the running ones starts: there (in place), or on
a stream next to them with the prompt copied in.

With KV streams (llama-server's layout, `engine.kv_unified: false`) llama.cpp computes one ubatch per run of
consecutive stream ids, so a sequence apart from the running block costs one more ubatch every step until the
scheduler moves it next to the others (`_compact`, with more stream copies). Copying the prompt next to the block
costs once: 2-14 ms for a 4,096-cell stream since copies move only the cells in use (runner.copy_stream).
`engine.in_place_tokens` is the rule: a cached prefix at least that long runs where it lies; None (the default
since 2026-12-01): never apart.

Same engine, same grounded prompts (first turns of ../shared/data/grounded/dev.jsonl, chat template), each prompt
asked once beforehand so it is cached: `--concurrency` clients each ask, wait for the whole answer (64 tokens, EOS
ignored, greedy), wait `--delay-ms` (a client's round trip over HTTP) and ask the next; rounds alternate the rule
between the values given (the first is the baseline; `none`: never apart), in a new shuffled order each round.
Output tokens per second, TTFT p50 (submit to first token) and stream copies per round, with ratios to the baseline.

    .venv/bin/python bench/stream_placement.py [--in-place 128,none] [--concurrency 8] [--prompts 32]
        [--rounds 6] [--delay-ms 8] [--threads 2] [--streams 32] [--n-ctx 131072] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402
from tokenomy.tools.bench.workload import grounded  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")


def grounded_prompts(engine: Engine, path: str) -> list[list[int]]:
    """The prompts of `tokenomy bench --workload grounded` (the first user turns of `path`), chat-templated."""
    return [engine.tokenizer.encode_chat(r.body["messages"]) for r in grounded({"path": path}, random.Random(0))]


def closed_loop(engine: Engine, prompts: list[list[int]], order: list[int], clients: int, delay_s: float,
                max_tokens: int) -> tuple[float, list[float]]:
    """`clients` threads ask the prompts in `order`, one request at a time each; (output tok/s, each TTFT in s)."""
    lock = threading.Lock()
    todo = iter(order)
    ttft: list[float] = []
    tokens = [0]

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            done, t = threading.Event(), {}

            def on_event(ev: Any, done: threading.Event = done, t: dict[str, Any] = t) -> None:
                if "first" not in t and ev.token_ids:
                    t["first"] = time.perf_counter()
                if ev.finish_reason is not None:
                    t["n"] = ev.completion_tokens
                    done.set()

            t0 = time.perf_counter()
            engine.submit(prompts[i], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                          on_event)
            if not done.wait(600):
                raise RuntimeError("the engine did not answer")
            with lock:
                ttft.append(t["first"] - t0)
                tokens[0] += t["n"]
            time.sleep(delay_s)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return tokens[0] / (time.perf_counter() - t0), ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in-place", default="128,none", help="in_place_tokens values (none: never apart); the first "
                    "is the baseline")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--delay-ms", type=float, default=8.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=131072)
    ap.add_argument("--grounded", default=GROUNDED)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    values: list[int | None] = [None if v == "none" else int(v) for v in args.in_place.split(",")]
    # by default the bench server pair's layout (docs/bench.md): 32 streams of 4,096 cells, no extra ids
    cfg = EngineConfig(max_running=args.streams, max_retired=0, n_ctx=args.n_ctx, n_threads=args.threads,
                       kv_unified=False)
    engine = Engine(str(resolve_gguf("smollm2-135m-instruct")), cfg).start()
    copies = [0]
    copy_stream = engine.runner.copy_stream

    def counted(src: int, dst: int) -> None:
        copies[0] += 1
        copy_stream(src, dst)

    engine.runner.copy_stream = counted  # type: ignore[method-assign]
    prompts = grounded_prompts(engine, args.grounded)[:args.prompts]
    rng = random.Random(0)
    closed_loop(engine, prompts, list(range(len(prompts))), args.concurrency, 0.0, args.max_tokens)   # cache them
    results: dict[int | None, list[tuple[float, float, int]]] = {}
    for r in range(args.rounds):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        for v in values if r % 2 == 0 else values[::-1]:
            engine.cfg.in_place_tokens = v      # the layout reads it at each admission
            before = copies[0]
            tok_s, ttfts = closed_loop(engine, prompts, order, args.concurrency, args.delay_ms / 1e3,
                                       args.max_tokens)
            ttft = statistics.median(ttfts)
            results.setdefault(v, []).append((tok_s, ttft, copies[0] - before))
            print(f"round {r + 1} in_place={v}: {tok_s:.1f} tok/s, TTFT p50 {ttft * 1e3:.0f} ms, "
                  f"{copies[0] - before} stream copies", file=sys.stderr)
    engine.stop()
    base_tok = statistics.median(x[0] for x in results[values[0]])
    base_ttft = statistics.median(x[1] for x in results[values[0]])
    out = []
    for v in values:
        tok_s = statistics.median(x[0] for x in results[v])
        ttft = statistics.median(x[1] for x in results[v])
        out.append({"in_place_tokens": v, "tok_s": round(tok_s, 1), "tok_s_vs_base": round(tok_s / base_tok, 3),
                    "ttft_p50_ms": round(ttft * 1e3, 1), "ttft_vs_base": round(ttft / base_ttft, 3),
                    "copies_per_round": statistics.median(x[2] for x in results[v])})
    if args.json:
        print(json.dumps({"rows": out, "concurrency": args.concurrency, "prompts": len(prompts),
                          "delay_ms": args.delay_ms, "rounds": args.rounds, "threads": args.threads}, indent=1))
        return
    print(f"{'in place':>8} {'tok/s':>7} {'ratio':>6} {'TTFT p50 ms':>12} {'ratio':>6} {'copies':>7}")
    for x in out:
        print(f"{str(x['in_place_tokens']):>8} {x['tok_s']:>7} {x['tok_s_vs_base']:>6} {x['ttft_p50_ms']:>12} "
              f"{x['ttft_vs_base']:>6} {x['copies_per_round']:>7}")


if __name__ == "__main__":
    main()
