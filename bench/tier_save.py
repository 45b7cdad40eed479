"""When a finished prompt is saved to the KV tiers: between steps right after its answer is sent (the engine's rule,
`Scheduler.save_finished`), or only when its stream is given to an arrival (the rule before 2026-12-01), inside the
step that arrival's first token waits for.

Same engine, same grounded prompts (the `--prompts` shortest first turns of ../shared/data/grounded/dev.jsonl, chat
template), more prompts than KV streams so arrivals evict cached prompts. Each round and rule starts from an empty
cache (streams and tiers): every prompt is asked once (the warm pass, unmeasured), then again in a shuffled order by
`--concurrency` clients, each waiting `--delay-ms` between its answer and its next request (64 tokens, EOS ignored,
greedy). Rounds alternate the rules. Output tokens per second and TTFT p50 and p90 of the second pass (medians
over rounds, and the median of each round's ratio to the old rule), the sequence states saved during it and the
time those saves took.

    .venv/bin/python bench/tier_save.py [--prompts 24] [--streams 12] [--concurrency 4] [--rounds 3]
        [--delay-ms 8] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stream_placement import GROUNDED, closed_loop, grounded_prompts  # noqa: E402  (bench/stream_placement.py, beside this script)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

RULES = ("at eviction", "after finish")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("--prompts", 24), ("--streams", 12), ("--concurrency", 4), ("--rounds", 3),
                          ("--max-tokens", 64), ("--threads", 2)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--delay-ms", type=float, default=8.0)
    ap.add_argument("--grounded", default=GROUNDED)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = EngineConfig(max_running=args.streams, max_retired=0, n_ctx=args.streams * 4096, n_threads=args.threads,
                       kv_unified=False)
    engine = Engine(str(resolve_gguf("smollm2-135m-instruct")), cfg).start()
    s = engine.scheduler
    prompts = sorted(grounded_prompts(engine, args.grounded), key=len)[:args.prompts]
    saves, save_s = [0], [0.0]
    save = engine.runner.save

    def counted(slot: int):  # noqa: ANN202
        t0 = time.perf_counter()
        try:
            return save(slot)
        finally:
            saves[0] += 1
            save_s[0] += time.perf_counter() - t0

    engine.runner.save = counted  # type: ignore[method-assign]
    shipped = s.save_finished

    def at_eviction_only() -> None:
        s.layout.io._finished.clear()

    rng = random.Random(0)
    results: dict[str, list[tuple[float, float, float, int, float]]] = {r: [] for r in RULES}
    for r in range(args.rounds):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        for rule in RULES if r % 2 == 0 else RULES[::-1]:
            s.save_finished = at_eviction_only if rule == RULES[0] else shipped  # type: ignore[method-assign]
            engine.run_in_loop(s.clear_cache)
            closed_loop(engine, prompts, list(range(len(prompts))), args.concurrency, 0.0, args.max_tokens)
            engine.run_in_loop(lambda: None)          # the warm pass's last saves are done
            before, before_s = saves[0], save_s[0]
            tok_s, ttfts = closed_loop(engine, prompts, order, args.concurrency, args.delay_ms / 1e3,
                                       args.max_tokens)
            p50, p90 = pct(ttfts, 0.5), pct(ttfts, 0.9)
            results[rule].append((tok_s, p50, p90, saves[0] - before, save_s[0] - before_s))
            print(f"round {r + 1} saved {rule}: {tok_s:.1f} tok/s, TTFT p50 {p50 * 1e3:.0f} ms p90 {p90 * 1e3:.0f} ms, "
                  f"{saves[0] - before} states saved in {(save_s[0] - before_s) * 1e3:.0f} ms", file=sys.stderr)
    engine.stop()

    out = []
    base = results[RULES[0]]
    for rule in RULES:
        res = results[rule]

        def med(i: int, res: list = res) -> float:
            return statistics.median(x[i] for x in res)

        def ratio(i: int, res: list = res) -> float:     # median over rounds of the paired ratio
            return round(statistics.median(x[i] / b[i] for x, b in zip(res, base, strict=True)), 3)

        out.append({"rule": rule, "tok_s": round(med(0), 1), "tok_s_vs_base": ratio(0),
                    "ttft_p50_ms": round(med(1) * 1e3, 1), "ttft_p50_vs_base": ratio(1),
                    "ttft_p90_ms": round(med(2) * 1e3, 1), "ttft_p90_vs_base": ratio(2),
                    "saved_per_pass": med(3), "save_ms_per_pass": round(med(4) * 1e3, 1)})
    if args.json:
        print(json.dumps({"rows": out, "prompts": len(prompts), "streams": args.streams,
                          "concurrency": args.concurrency, "rounds": args.rounds}, indent=1))
        return
    print(f"{'saved':>12} {'tok/s':>7} {'ratio':>6} {'TTFT p50 ms':>12} {'ratio':>6} {'TTFT p90 ms':>12} {'ratio':>6} "
          f"{'saves':>6} {'save ms':>8}")
    for x in out:
        print(f"{x['rule']:>12} {x['tok_s']:>7} {x['tok_s_vs_base']:>6} {x['ttft_p50_ms']:>12} "
              f"{x['ttft_p50_vs_base']:>6} {x['ttft_p90_ms']:>12} {x['ttft_p90_vs_base']:>6} {x['saved_per_pass']:>6} "
              f"{x['save_ms_per_pass']:>8}")


if __name__ == "__main__":
    main()
