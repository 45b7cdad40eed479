"""KV tiers: the time to first token of a long prompt whose prefix was evicted, restored from RAM or from disk,
against recomputing it (the tiers off), same prompts, one run, rounds alternating the order.

Each mode has its own in-process engine with two KV streams: the long prompt (real articles from
../shared/data/grounded/dev.jsonl, joined to about --tokens tokens, a fresh one each round) is asked once, a short
filler prompt then takes its stream (the scheduler evicts it: saved to the tier when one is on), and the long
prompt is asked again for one token. That second TTFT is the figure: the restore (or the recompute) plus one step.

- recompute: kv_tier_ram_mb 0 (the baseline: the evicted prefix is prefilled again);
- ram:       the RAM tier;
- disk:      a RAM tier smaller than one prefix, so it goes on to the disk tier (a temporary directory).

    .venv/bin/python bench/kv_tiers.py [--tokens 2000] [--rounds 2] [--threads 2] [--json]

With `--cycle N`, instead: N distinct grounded prompts (up to 600 tokens) asked twice in turn, one at a time, on N
streams (one kept spare, so N - 1 fit), with the tiers off and on; the second round's TTFTs and hits.

    .venv/bin/python bench/kv_tiers.py --cycle 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
MODES = ("recompute", "ram", "disk")
FILLER = "Name three colors and say why the sky is blue, in one short sentence for each of them please."


def ttft(engine: Engine, ids: list[int]) -> tuple[float, int]:
    """Seconds from submit to the first token of a 1-token greedy answer, and its cached tokens."""
    done = threading.Event()
    out: dict[str, Any] = {}

    def on(ev: Any) -> None:
        out.setdefault("t", time.perf_counter())
        if ev.finish_reason:
            out["cached"] = ev.cached_tokens
            done.set()

    t0 = time.perf_counter()
    engine.submit(ids, SamplingParams(max_tokens=1, temperature=0), on)
    assert done.wait(600), "no answer"
    return out["t"] - t0, out["cached"]


def long_prompts(engine: Engine, n: int, tokens: int) -> list[list[int]]:
    """`n` chat prompts of about `tokens` tokens each, from different articles."""
    rows = [json.loads(line) for line in open(GROUNDED, encoding="utf-8") if line.strip()]
    texts = [r["turns"][0] for r in rows if r["task"] in ("summarize", "context_qa")]
    out, i = [], 0
    for _ in range(n):
        parts: list[str] = []
        while len(engine.tokenizer.encode(" ".join(parts))) < tokens - 40:
            parts.append(texts[i % len(texts)])
            i += 1
        ids = engine.tokenizer.encode(" ".join(parts))[: tokens - 40]
        text = engine.tokenizer.decode(ids) + "\n\nSummarize the text above."
        out.append(engine.tokenizer.encode_chat([{"role": "user", "content": text}]))
    return out


def engine_for(mode: str, path: str, threads: int, disk_dir: str) -> Engine:
    cfg = EngineConfig(n_ctx=2 * 4096, max_running=1, max_retired=1, n_threads=threads, speculative=False,
                       kv_tier_ram_mb={"recompute": 0, "ram": 1024, "disk": 1}[mode],
                       kv_tier_disk_dir=disk_dir if mode == "disk" else None, kv_tier_disk_mb=4096)
    return Engine(path, cfg, name=f"bench-{mode}").start()


def cycle(path: str, n: int, threads: int) -> dict[str, Any]:
    """Second-round TTFTs of n prompts asked twice in turn on n streams, tiers off and on."""
    rows = [json.loads(line) for line in open(GROUNDED, encoding="utf-8") if line.strip()]
    texts = [r["turns"][0][:2500] for r in rows if r["task"] in ("summarize", "context_qa")][:n]
    out: dict[str, Any] = {}
    for label, ram in (("tiers off", 0), ("RAM tier", 1024)):
        e = Engine(path, EngineConfig(max_running=n, max_retired=0, n_ctx=n * 4096, n_threads=threads,
                                      speculative=False, kv_tier_ram_mb=ram)).start()
        try:
            prompts = [e.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
            for p in prompts:
                ttft(e, p)
            second = [ttft(e, p) for p in prompts]
        finally:
            e.stop()
        out[label] = {"ttft_median_s": statistics.median(t for t, _ in second),
                      "hits": sum(c >= len(p) - 1 for (_, c), p in zip(second, prompts, strict=True))}
        print(f"{label:9s} second round: median TTFT {out[label]['ttft_median_s']:.3f} s, "
              f"{out[label]['hits']}/{n} prompts found cached")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=2000, help="length of the long prompt")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cycle", type=int, default=0, help="the LRU-cycle measurement on this many prompts instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = str(resolve_gguf("smollm2-135m-instruct"))
    if args.cycle:
        res = cycle(path, args.cycle, args.threads)
        if args.json:
            print(json.dumps(res, indent=2))
        return
    disk_dir = tempfile.mkdtemp(prefix="kv-tier-bench-")
    engines = {m: engine_for(m, path, args.threads, disk_dir) for m in MODES}
    first = engines["recompute"]
    prompts = long_prompts(first, args.rounds, args.tokens)
    filler = first.tokenizer.encode_chat([{"role": "user", "content": FILLER}])
    ttfts: dict[str, list[float]] = {m: [] for m in MODES}
    cold: dict[str, list[float]] = {m: [] for m in MODES}
    restored: dict[str, int] = {}
    try:
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                e = engines[mode]
                c, _ = ttft(e, prompts[r])              # cold: prefilled, then cached in its stream
                ttft(e, filler)                          # takes the stream: the long prompt is evicted
                t, cached = ttft(e, prompts[r])
                cold[mode].append(c)
                ttfts[mode].append(t)
                restored[mode] = cached
                print(f"round {r} {mode:9s} cold {c:6.3f} s  after eviction {t:6.3f} s  cached {cached}",
                      file=sys.stderr)
        held = {m: max(engines[m].tiers.stats.bytes.values()) for m in MODES}
        restore_s = {m: sum(engines[m].tiers.stats.restore_s.values()) / args.rounds for m in MODES}
    finally:
        for e in engines.values():
            e.stop()
    base = statistics.median(ttfts["recompute"])
    result = {
        "prompt_tokens": len(prompts[0]),
        "rounds": args.rounds,
        "modes": {m: {"ttft_s": statistics.median(ttfts[m]), "cold_ttft_s": statistics.median(cold[m]),
                      "ratio_to_recompute": statistics.median(ttfts[m]) / base, "cached_tokens": restored[m],
                      "restore_s": restore_s[m], "tier_bytes": held[m]} for m in MODES},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"prompt {result['prompt_tokens']} tokens, {args.rounds} rounds, medians")
    print(f"{'mode':10s} {'TTFT after eviction':>20s} {'x recompute':>12s} {'restore':>9s} {'cached':>7s} "
          f"{'cold TTFT':>10s}")
    for m, v in result["modes"].items():
        print(f"{m:10s} {v['ttft_s']:19.3f}s {v['ratio_to_recompute']:12.3f} {v['restore_s']:8.3f}s "
              f"{v['cached_tokens']:7d} {v['cold_ttft_s']:9.3f}s")


if __name__ == "__main__":
    main()
