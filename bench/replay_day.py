"""A day of synthetic multi-tenant traffic, recorded into a ledger with stored prompts, then replayed.

Recording: no model runs. Each request is a real RequestContext (tenant, route, messages, usage, answer text)
that goes through the meter's own code (`row_from_context`, `prompt_from_context`, `Ledger.write`), so the rows
and stored bodies are exactly what the record stage would write; the token counts are drawn, not generated.
The recorded config is the "before": every request on the route `default`, which serves on `large`, with no
response cache. Traffic: tenants of Zipf-distributed size ask (a) support questions from a shared set of
intents, each in several phrasings (so exact repeats and paraphrases), (b) hard questions ("prove", "derive"),
and (c) a long tail of one-off arithmetic questions that differ only in their numbers (what a semantic cache at
a low threshold gets wrong); a fifth of requests ask for temperature 0.7 (not cacheable).

Replay (`tokenomy.tools.replay`, the code behind `tokenomy replay`) then runs the day through the recorded
config (the check: it must reproduce the recorded cost) and through a candidate config: exact and semantic
caches at several thresholds, a rules router (hard questions to `large`, the rest to `small`), other prices.

    .venv/bin/python bench/replay_day.py [--requests 3000] [--tenants 12] [--seed 7] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml  # noqa: E402

from tokenomy.config import Price, load_config  # noqa: E402
from tokenomy.generation import GenRequest, Usage  # noqa: E402
from tokenomy.ledger.ledger import Ledger  # noqa: E402
from tokenomy.ledger.prompts import prompt_from_context  # noqa: E402
from tokenomy.ledger.row import row_from_context  # noqa: E402
from tokenomy.pipeline.request import RequestContext  # noqa: E402
from tokenomy.tools.replay.report import build, render  # noqa: E402
from tokenomy.tools.replay.traffic import load_trace  # noqa: E402

PRICES = {"small": {"input": 0.10, "cached_input": 0.025, "output": 0.40},
          "mid": {"input": 0.40, "cached_input": 0.10, "output": 1.60},
          "large": {"input": 2.50, "cached_input": 0.625, "output": 10.00}}
SYSTEM = "You are the support assistant of {tenant}. Answer briefly and accurately. " * 3
INTENTS = [("reset", "my password"), ("cancel", "my subscription"), ("update", "my billing address"),
           ("export", "all my data"), ("change", "the email on my account"), ("delete", "my account"),
           ("upgrade", "my plan"), ("download", "last month's invoice"), ("add", "a team member"),
           ("enable", "two-factor authentication"), ("rotate", "my API key"), ("pause", "my subscription")]
PHRASINGS = ["How do I {v} {o}?", "How can I {v} {o}?", "What are the steps to {v} {o}?",
             "Can you tell me how to {v} {o}?", "how do i {v} {o}"]
HARD = ["Prove that the square root of {n} is irrational.", "Derive the closed form of the sum of the first {n} "
        "squares.", "Prove that there are infinitely many primes congruent to {n} mod 4."]


def live_config(url: str) -> dict[str, Any]:
    models = [{"name": n, "backend": "openai", "base_url": "http://127.0.0.1:9/v1", "price": p}
              for n, p in PRICES.items()]
    return {"models": models, "ledger": {"url": url, "store_prompts": True},
            "routes": {"default": {"strategy": "fixed", "models": ["large"]}},
            "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}}}


def candidate_config(url: str) -> dict[str, Any]:
    cfg = live_config(url)
    cfg["routes"] = {"default": {"strategy": "rules", "models": ["small", "large"],
                                 "rules": [{"when": {"keywords": ["prove", "derive"]}, "model": "large"}]}}
    cfg["cache"] = {"exact": {"enabled": True},      # thresholds alone, so the sweep shows what each one serves
                    "semantic": {"enabled": True, "threshold": 0.9, "error_budget": None, "min_margin": 0.02}}
    return cfg


def zipf(rng: random.Random, n: int, s: float = 1.1) -> int:
    weights = [1 / (i + 1) ** s for i in range(n)]
    return rng.choices(range(n), weights)[0]


def day(n: int, tenants: int, seed: int, start: float) -> list[dict[str, Any]]:
    """The requests of one day: arrival, tenant, question, kind, temperature, usage."""
    rng = random.Random(seed)
    out = []
    last_seen: dict[str, float] = {}
    for t in sorted(start + rng.uniform(0, 86400) for _ in range(n)):
        tenant = f"tenant-{zipf(rng, tenants):02d}"
        kind = rng.choices(["support", "hard", "tail"], [0.55, 0.1, 0.35])[0]
        if kind == "support":
            v, o = INTENTS[zipf(rng, len(INTENTS), 0.8)]
            q = rng.choice(PHRASINGS).format(v=v, o=o)
            completion = rng.randint(80, 200)
        elif kind == "hard":
            q = rng.choice(HARD).format(n=rng.choice([3, 5, 7, 10]))
            completion = rng.randint(300, 600)
        else:
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            q = rng.choice(["What is {a} times {b}?", "What is {a} plus {b}?"]).format(a=a, b=b)
            completion = rng.randint(10, 30)
        system = SYSTEM.format(tenant=tenant)
        prompt = int(1.3 * (len(system.split()) + len(q.split()))) + 12
        warm = t - last_seen.get(tenant, -1e9) < 300          # the tenant's system prompt is still prefix-cached
        last_seen[tenant] = t
        out.append({"ts": t, "tenant": tenant, "kind": kind, "system": system, "question": q,
                    "temperature": 0.7 if rng.random() < 0.2 else 0.0, "prompt": prompt,
                    "cached": int(1.3 * len(system.split())) if warm else 0, "completion": completion,
                    "e2e": 0.2 + completion * 0.02})
    return out


def record(url: str, requests: list[dict[str, Any]]) -> None:
    price = Price(**PRICES["large"])
    with Ledger(url, batch_size=1000) as led:
        for i, r in enumerate(requests):
            gen = GenRequest(model="default", messages=[{"role": "system", "content": r["system"]},
                                                        {"role": "user", "content": r["question"]}],
                             params={"temperature": r["temperature"], "max_tokens": 600})
            ctx = RequestContext(gen=gen, request_id=f"req_{i:06d}", tenant=r["tenant"], key_id=r["tenant"][:12])
            ctx.route, ctx.model, ctx.finish_reason, ctx.text = "default", "large", "stop", f"(answer {i})"
            ctx.usage = Usage(prompt_tokens=r["prompt"], cached_tokens=r["cached"], completion_tokens=r["completion"],
                              ttft_s=0.2, e2e_s=r["e2e"])
            ctx.started = time.perf_counter() - r["e2e"]
            row = row_from_context(ctx, price, backend="openai", now=r["ts"] + r["e2e"])
            led.write(row, prompt_from_context(ctx, row.ts))
        led.flush()
        assert led.failed == 0 and led.dropped == 0


def savings(data: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(strategy, cost, note) per strategy, recorded first."""
    base = data["recorded"]["cost_usd"]
    out = [("recorded (all on large, no response cache)", base, "")]
    for p in data.get("cache", []):
        if p["name"].startswith("candidate"):
            continue
        s = p["semantic"]
        note = f"exact {p['exact']['requests']} hits"
        if p["name"] != "exact only":
            note += f", semantic {s['requests']} hits (est. {s['est_wrong']:.1f} wrong)"
        out.append((p["name"], p["cost_usd"], note))
    if "route" in data:
        r = data["route"]
        shares = ", ".join(f"{m} {c / max(r['evaluated'], 1):.0%}" for m, c in r["chosen"].items())
        out.append(("rules router (prove/derive -> large, rest small)", r["cost_usd"], shares))
    for p in data.get("price", []):
        if p["name"].startswith("all on") or p["name"].startswith("no prompt caching"):
            out.append((p["name"], p["cost_usd"], "same tokens, other prices"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--tenants", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="write the ledger and configs here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tokenomy-replay-day-"))
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'ledger.db'}"
    if (folder / "ledger.db").exists():
        sys.exit(f"{folder / 'ledger.db'} exists: pass an empty --keep folder")
    for name, cfg in (("live.yaml", live_config(url)), ("candidate.yaml", candidate_config(url))):
        (folder / name).write_text(yaml.safe_dump(cfg, sort_keys=False))
    start = time.time() - 2 * 86400
    t0 = time.perf_counter()
    requests = day(args.requests, args.tenants, args.seed, start)
    record(url, requests)
    t_record = time.perf_counter() - t0
    with Ledger(url) as led:
        trace = load_trace(led)
    t0 = time.perf_counter()
    check = build(trace, load_config(folder / "live.yaml"), "all", [])
    t_check = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = build(trace, load_config(folder / "candidate.yaml"), "all")
    t_replay = time.perf_counter() - t0
    live = next(p for p in check["cache"] if p["name"].startswith("candidate"))
    rec = data["recorded"]["cost_usd"]
    if args.json:
        print(json.dumps({"check": check, "candidate": data, "savings": savings(data)}, indent=2))
        return
    print(f"recorded {len(requests):,} requests of {args.tenants} tenants into {url} in {t_record:.1f} s")
    print(f"check, replay with the recorded config: cost ${live['cost_usd']:.4f} vs recorded ${rec:.4f} "
          f"({100 * (live['cost_usd'] / rec - 1):+.3f}%), {t_check:.1f} s")
    print(f"replay with the candidate config: {t_replay:.1f} s\n")
    print(render(data, "table"))
    print(f"{'strategy':58} {'cost':>10} {'saved':>8}  note")
    for name, cost, note in savings(data):
        print(f"{name:58} ${cost:>9.4f} {100 * (1 - cost / rec):>7.1f}%  {note}")
    print(f"\nsame with the CLI: tokenomy replay --ledger {url} --config {folder / 'candidate.yaml'}")


if __name__ == "__main__":
    main()
