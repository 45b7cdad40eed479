"""The fleet's eviction by reload cost against llama.cpp router's rule (least recently used, by count), on one trace.

    python bench/fleet.py [--models 6] [--fits 3] [--requests 90] [--zipf 1.1] [--concurrency 2] [--rounds 2]
        [--seed 0] [--tokenomy .venv/bin/tokenomy] [--json]

`--models` models, copies of the packaged SmolLM2-135M and Gemma-3-270M under their own names (alternating: the
Gemma copies load slower), are asked for in a Zipf-skewed trace (popularity 1/rank^zipf, the ranks shuffled by the
seed), `--requests` chat completions of at most 8 tokens, streamed, from `--concurrency` clients in a closed loop.
Each policy gets a fresh `tokenomy serve` with the same models, the same trace and keep_alive 1h (longer than a run:
only eviction unloads; -1 would forbid eviction):

- cost: `fleet.eviction: cost` within a memory limit that holds the `--fits` largest models (fleet.memory_limit_gb);
- lru: `fleet.eviction: lru` and `fleet.max_loaded: --fits` within the same limit (llama.cpp router's
  --models-max).

Rounds alternate which policy runs first. Printed per policy, over all rounds: requests, loads (a request that
found its model loaded needs none: hit rate = 1 - loads / requests), load seconds (the servers' own, summed over
models: /admin/models load_s_total), evictions, and TTFT p50 / p95 from the client (a load, when the request waits
for one, is in it); then lru / cost for load seconds and p95 TTFT (above 1: cost does better).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import free_port, wait_up  # noqa: E402

from tokenomy.backends.embedded_launch import engine_settings  # noqa: E402
from tokenomy.config import Config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GGUFS = ("smollm2-135m-instruct", "gemma3-270m")
ENGINE = {"n_ctx": 2048, "max_model_len": 512, "max_running": 2, "max_retired": 2, "max_batch_tokens": 256,
          "kv_tier_ram_mb": 0, "n_threads": 1}
PROMPTS = ("Say hi.", "Name a colour.", "Count to three.", "Name a fruit.", "Say yes.")


def models(n: int) -> list[dict[str, Any]]:
    return [{"name": f"m{i}", "gguf": GGUFS[i % 2], "engine": ENGINE, "preload": False, "keep_alive": "1h"}
            for i in range(n)]


def limit_gib(specs: list[dict[str, Any]], fits: int) -> float:
    """GiB that hold the `fits` largest of `specs` as placement counts them (Fit.need + the engine overhead)."""
    config = Config.model_validate({"models": specs})
    overhead = config.fleet.engine_overhead_mb << 20
    sizes = []
    for spec in config.models:
        got: dict[str, Any] = {}
        engine_settings(spec, config, fits=got)  # type: ignore[arg-type]
        sizes.append(got[spec.name].need + overhead)
    return (sum(sorted(sizes)[-fits:]) + (16 << 20)) / (1 << 30)


def trace(n_models: int, n: int, s: float, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    ranks = list(range(n_models))
    rng.shuffle(ranks)
    weights = [1 / (ranks[i] + 1) ** s for i in range(n_models)]
    picks = rng.choices(range(n_models), weights=weights, k=n)
    return [(f"m{i}", rng.choice(PROMPTS)) for i in picks]


def ask(base: str, model: str, prompt: str) -> float:
    """Seconds to the first streamed content (the load, when the request waits for one, included)."""
    t0 = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0,
            "stream": True}
    first = None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: {r.status_code} {r.read()!r}")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                first = time.perf_counter() - t0
    return first if first is not None else time.perf_counter() - t0


def run(policy: str, specs: list[dict[str, Any]], gib: float, fits: int, work: list[tuple[str, str]],
        concurrency: int, tokenomy: str) -> dict[str, Any]:
    fleet: dict[str, Any] = {"memory_limit_gb": gib, "eviction": policy}
    if policy == "lru":
        fleet["max_loaded"] = fits
    home = Path(tempfile.mkdtemp(prefix=f"fleet-bench-{policy}-"))
    cfg = home / "tokenomy.yaml"
    cfg.write_text(yaml.safe_dump({"models": specs, "fleet": fleet, "cache": {"exact": {"enabled": False},
                                                                                 "semantic": {"enabled": False}}}))
    port = free_port()
    env = {**os.environ, "TOKENOMY_HOME": str(home)}
    server = subprocess.Popen([tokenomy, "serve", "--config", str(cfg), "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/health", [server])
        with ThreadPoolExecutor(concurrency) as pool:
            ttfts = list(pool.map(lambda w: ask(base, *w), work))
        lines = httpx.get(base + "/admin/models", timeout=30).json()["models"]
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(home, ignore_errors=True)
    return {"ttfts": ttfts, "loads": sum(m["loads"] for m in lines), "evictions": sum(m["evictions"] for m in lines),
            "load_s": sum(m["load_s_total"] for m in lines)}


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--requests", type=int, default=90)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenomy", default=str(ROOT / ".venv" / "bin" / "tokenomy"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    specs = models(a.models)
    gib = limit_gib(specs, a.fits)
    totals: dict[str, dict[str, Any]] = {p: {"requests": 0, "loads": 0, "evictions": 0, "load_s": 0.0, "ttfts": []}
                                         for p in ("cost", "lru")}
    for r in range(a.rounds):
        work = trace(a.models, a.requests, a.zipf, a.seed + r)
        for policy in (("cost", "lru") if r % 2 == 0 else ("lru", "cost")):
            got = run(policy, specs, gib, a.fits, work, a.concurrency, a.tokenomy)
            t = totals[policy]
            t["requests"] += len(work)
            t["loads"] += got["loads"]
            t["evictions"] += got["evictions"]
            t["load_s"] += got["load_s"]
            t["ttfts"] += got["ttfts"]
            print(f"round {r + 1} {policy}: {got['loads']} loads, {got['load_s']:.1f} load s, "
                  f"p95 TTFT {pct(got['ttfts'], 95):.2f} s", file=sys.stderr, flush=True)
    rows = {p: {"requests": t["requests"], "loads": t["loads"], "hit_rate": 1 - t["loads"] / t["requests"],
                "load_s": t["load_s"], "evictions": t["evictions"], "ttft_p50_s": pct(t["ttfts"], 50),
                "ttft_p95_s": pct(t["ttfts"], 95)} for p, t in totals.items()}
    ratios = {"load_s_lru_over_cost": rows["lru"]["load_s"] / max(rows["cost"]["load_s"], 1e-9),
              "ttft_p95_lru_over_cost": rows["lru"]["ttft_p95_s"] / max(rows["cost"]["ttft_p95_s"], 1e-9)}
    if a.json:
        print(json.dumps({"models": a.models, "fits": a.fits, "memory_limit_gb": gib, "zipf": a.zipf,
                          "rounds": a.rounds, "rows": rows, **ratios}, indent=2))
        return
    print(f"{a.models} models (SmolLM2-135M and Gemma-3-270M copies), limit {gib:.2f} GiB (the {a.fits} largest), "
          f"Zipf {a.zipf}, {a.requests} requests x {a.rounds} rounds, concurrency {a.concurrency}")
    print(f"{'policy':8}{'requests':>9}{'loads':>7}{'hit rate':>10}{'load s':>9}{'evictions':>11}"
          f"{'TTFT p50':>10}{'TTFT p95':>10}")
    for p, row in rows.items():
        print(f"{p:8}{row['requests']:>9}{row['loads']:>7}{row['hit_rate']:>10.2f}{row['load_s']:>9.1f}"
              f"{row['evictions']:>11}{row['ttft_p50_s']:>10.2f}{row['ttft_p95_s']:>10.2f}")
    print(f"lru / cost: load seconds {ratios['load_s_lru_over_cost']:.2f}x, TTFT p95 "
          f"{ratios['ttft_p95_lru_over_cost']:.2f}x")


if __name__ == "__main__":
    main()
