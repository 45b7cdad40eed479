"""Balancing policies side by side: a shared-prefix multi-tenant workload (tokenomy bench's `shared-prefix`,
shuffled so tenants arrive in random order, Poisson arrivals) against 2 embedded-engine replicas behind one
gateway, once per policy: prefix-cache-aware, round-robin, least-outstanding. Each policy gets fresh replicas
(cold prefix caches) and the same requests at the same times.

Figures per policy: prefix-hit share of prompt tokens (sum of cached_tokens / sum of prompt_tokens over the
gateway's ledger rows, as the replicas reported them), TTFT p50/p95 and throughput (completed requests and output
tokens per second, from tokenomy bench's load generator). Replicas, gateway and load generator share the
machine's cores, so compare the policies' ratios, not the absolute figures.

    .venv/bin/python bench/replicas.py [--tenants 8] [--system 300] [--questions 4] [--rate 1] [--threads 1]
        [--cached 4] [--max-tokens 8] [--json]

`--cached` is each replica's prefix-cache capacity in prompts: with one KV stream per sequence (the engine's
default) a finished prompt keeps its stream, and each replica has `--cached` streams beyond its 4 running ones
(one kept spare), with the KV tiers off so that evicted prompts are really gone. The workload's prefixes should fit
in the two replicas together but not in one, as in a deployment that needs more than one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

from tokenomy.ledger.ledger import Ledger
from tokenomy.tools.bench.loadgen import Load, Options, Target, run
from tokenomy.tools.bench.results import summarize
from tokenomy.tools.bench.workload import load_workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = (("prefix-aware", "prefix"), ("round-robin", "round_robin"), ("least-load", "least_outstanding"))


def serve(config: dict[str, Any], port: int, workdir: Path, name: str) -> subprocess.Popen[bytes]:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(workdir / f"{name}.log", "wb")     # noqa: SIM115 - the process owns it
    return subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "--config",
                             str(path)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def one_policy(policy: str, args: argparse.Namespace, requests: list[Any], workdir: Path) -> dict[str, Any]:
    engine = {"n_threads": args.threads, "n_ctx": (4 + args.cached) * 1024, "max_model_len": 1024, "max_running": 4,
              "max_retired": args.cached, "kv_tier_ram_mb": 0}
    ports = [free_port() for _ in range(2)]
    replica_cfg = {"engine": engine, "ledger": None,
                   "cache": {"path": str(workdir / "cache"), "exact": {"enabled": False},
                             "semantic": {"enabled": False}}}
    procs = [serve(replica_cfg, p, workdir, f"replica-{policy}-{i}") for i, p in enumerate(ports)]
    ledger_path = workdir / f"ledger-{policy}.db"
    gw_port = free_port()
    gw_cfg = {"ledger": f"sqlite:///{ledger_path}", "cache": replica_cfg["cache"],
              "models": [{"name": "pooled", "backend": "openai", "model": "smollm2-135m-instruct",
                          "tokenizer": "smollm2-135m-instruct", "timeout_s": 600,
                          "replicas": [f"http://127.0.0.1:{p}/v1" for p in ports],
                          "balance": {"policy": policy, "margin": args.margin}}]}
    try:
        for p in ports:
            wait_up(f"http://127.0.0.1:{p}/health", procs)
        procs.append(serve(gw_cfg, gw_port, workdir, f"gateway-{policy}"))
        wait_up(f"http://127.0.0.1:{gw_port}/health", procs)
        target = Target(f"http://127.0.0.1:{gw_port}/v1", "pooled")
        records, duration = asyncio.run(run(target, requests, Load("open", args.rate),
                                            Options(max_tokens=args.max_tokens), n_requests=len(requests),
                                            seed=args.seed))
    finally:
        stop(procs)
    s = summarize(records, duration)
    with Ledger(f"sqlite:///{ledger_path}") as led:
        rows = [r for r in led.query() if r.status == 200]
    prompt, cached = sum(r.prompt_tokens for r in rows), sum(r.cached_tokens for r in rows)
    return {"completed": s["completed"], "failed": s["failed"], "prompt_tokens": prompt, "cached_tokens": cached,
            "prefix_hit_share": cached / prompt if prompt else 0.0,
            "ttft_p50_ms": s["median_ttft_ms"], "ttft_p95_ms": s["p95_ttft_ms"],
            "request_throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
            "duration_s": duration, "replicas_used": sorted({r.replica or "?" for r in rows})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--system", type=int, default=300, help="words in each tenant's system prompt")
    ap.add_argument("--questions", type=int, default=4, help="questions per tenant")
    ap.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals per second")
    ap.add_argument("--threads", type=int, default=1, help="engine threads per replica")
    ap.add_argument("--cached", type=int, default=4, help="streams per replica beyond its 4 running ones, each "
                    "holding a finished prompt")
    ap.add_argument("--margin", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    requests = load_workload(f"shared-prefix:tenants={args.tenants},system={args.system},"
                             f"questions={args.questions}", seed=args.seed)
    random.Random(args.seed).shuffle(requests)     # tenants in random order, as real traffic arrives
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tokenomy-bench-replicas-") as tmp:
        for label, policy in POLICIES:
            print(f"running {label} ...", file=sys.stderr, flush=True)
            results[label] = one_policy(policy, args, requests, Path(tmp))
    if args.json:
        print(json.dumps({"args": vars(args), "results": results}, indent=2))
        return
    print(f"workload: shared-prefix, {args.tenants} tenants x {args.questions} questions, system prompt "
          f"{args.system} words, Poisson {args.rate:g}/s, max_tokens {args.max_tokens}; 2 replicas, "
          f"{args.threads} engine thread(s) each, {args.cached} cached-prompt streams each, KV tiers off")
    head = f"{'policy':<14}{'done':>6}{'hit share':>11}{'TTFT p50':>11}{'TTFT p95':>11}{'req/s':>8}{'out tok/s':>11}"
    print(head)
    for label, r in results.items():
        print(f"{label:<14}{r['completed']:>4}/{r['completed'] + r['failed']:<1}{r['prefix_hit_share']:>11.1%}"
              f"{r['ttft_p50_ms'] / 1000:>10.2f}s{r['ttft_p95_ms'] / 1000:>10.2f}s{r['request_throughput']:>8.3f}"
              f"{r['output_throughput']:>11.2f}")
    pa = results["prefix-aware"]
    for label in ("round-robin", "least-load"):
        o = results[label]
        print(f"prefix-aware vs {label}: hit share x{pa['prefix_hit_share'] / max(o['prefix_hit_share'], 1e-9):.2f}, "
              f"TTFT p50 /{o['ttft_p50_ms'] / max(pa['ttft_p50_ms'], 1e-9):.2f}, "
              f"throughput x{pa['request_throughput'] / max(o['request_throughput'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
