"""Budgets under concurrency (issue #34): does a burst of requests spend past a budget, in one gateway and in two
on one Redis; does a killed gateway's hold come free; what does reserving cost per request.

Four parts, each against real gateway processes (`tokenomy serve`):
- race: 32 and 256 requests at once (24-token answers, the embedded default, caches off) against a 300-token day
  budget and against a USD budget that fits 10 answers, run by this code and by the code before reservations
  (`--before`, a git ref: its `tokenomy/` is extracted and run the same way), side by side: served requests,
  tokens and USD, overshoot, and how many the budget fits.
- two: the same bursts split between two gateways on one Redis (this code only).
- kill: two gateways on one Redis, `lease_s` 10; 16 requests held in flight on gateway A (a slow upstream), the
  rest of the budget spent on B; A is killed (SIGKILL); how long until B admits again, and whether the ledgers'
  totals equal Redis's once everything settled.
- cost: median latency of one request at a time through a gateway with no budget, a budget kept in process and a
  budget kept in Redis (an instant upstream stub), in alternating rounds: what reserving and settling add; and the
  gateway process's CPU time per request (user + system, its threads included), which other load on the machine
  changes much less than latency. The added latency is given twice: the difference of the arms' medians over all
  rounds, and the median of each round's difference (the arms of a round run one right after the other).
  `--no-allowances` adds the Redis arm with `limits.allowances: false` (every
  request held in Redis on its own).
- calls: the CPU time (all the process's threads) and wall time of one reservation and its settle, called directly
  on Budgets (no HTTP, so a busy machine moves it little): in process, in Redis with allowances, in Redis holding
  every request on its own (`limits.allowances: false`).

    .venv/bin/python bench/budget_race.py [--parts race,two,kill,cost,calls] [--before 343a20c] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import services  # noqa: E402  (Redis for the shared-store parts, as the tests start it)
from tokenomy.ledger.ledger import Ledger  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "Count from 1 to 50, separated by commas."}]
NO_CACHE = {"exact": {"enabled": False}, "semantic": {"enabled": False}}
console = Console(stderr=True)


@contextmanager
def gateway(cfg: dict[str, Any], code: Path | None = None) -> Any:
    """A `tokenomy serve` process for `cfg` (its ledger in a fresh directory), run from `code` (a directory
    holding a `tokenomy/` package) or this checkout; yields (base URL, ledger URL, process)."""
    home = Path(tempfile.mkdtemp(prefix="tokenomy-race-"))
    ledger = f"sqlite:///{home}/ledger.db"
    path = home / "tokenomy.yaml"
    path.write_text(yaml.safe_dump({"ledger": ledger, **cfg}))
    port = free_port()
    env = {**os.environ, "TOKENOMY_HOME": str(home), "PYTHONPATH": str(code or ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--config", str(path), "--port",
                             str(port)], cwd=str(code or ROOT), env=env, stdout=subprocess.DEVNULL,
                            stderr=open(home / "serve.log", "wb"))
    try:
        wait_up(f"http://127.0.0.1:{port}/health", [proc])
        yield f"http://127.0.0.1:{port}/v1", ledger, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def stub(delay: float = 0.0) -> Any:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.upstream_stub", "--port", str(port),
                             "--delay", str(delay)],
                            cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_up(f"http://127.0.0.1:{port}/v1/models", [proc])
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.kill()
        proc.wait()


async def burst(urls: list[str], key: str, n: int, model: str = MODEL, max_tokens: int = 24) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n + 4)) as c:
        return await asyncio.gather(*[
            c.post(urls[i % len(urls)] + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": model, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0})
            for i in range(n)])


def spent(ledgers: list[str]) -> tuple[int, float, int]:
    """(billed tokens, USD, rows that were served) over the ledgers' files."""
    tokens, usd, served = 0, 0.0, 0
    for url in ledgers:
        led = Ledger(url)
        for r in led.query():
            tokens += r.billed_tokens
            usd += r.cost_usd
            served += r.status == 200
        led.close()
    return tokens, usd, served


# ---- race and two -----------------------------------------------------------------------------------------------

def answer_cost(code: Path | None) -> tuple[int, float]:
    """(billed tokens, USD) of one answer to PROMPT (24 tokens) on the embedded default."""
    with gateway({"cache": NO_CACHE, "keys": [{"key": "sk-probe", "name": "probe"}]}, code) as (url, ledger, _):
        [r] = asyncio.run(burst([url], "sk-probe", 1))
        assert r.status_code == 200, r.text
    tokens, usd, _ = spent([ledger])                    # the gateway has stopped: its row is committed
    return tokens, usd


def race(n: int, budget: dict[str, Any], code: Path | None, gateways: int = 1, redis: str | None = None
         ) -> dict[str, Any]:
    key = f"sk-race-{uuid.uuid4().hex}"             # a key of its own: its spend starts at 0 in a shared Redis
    cfg: dict[str, Any] = {"cache": NO_CACHE, "keys": [{"key": key, "name": "race", "budget": budget}]}
    if redis is not None:
        cfg["limits"] = {"store": redis}
    with ExitStack() as stack:
        gws = [stack.enter_context(gateway(cfg, code)) for _ in range(gateways)]
        answers = asyncio.run(burst([g[0] for g in gws], key, n))
        ledgers = [g[1] for g in gws]
    tokens, usd, served = spent(ledgers)         # the gateways have stopped: every row is committed
    assert served == sum(a.status_code == 200 for a in answers)
    return {"requests": n, "served": served, "refused": sum(a.status_code == 429 for a in answers),
            "tokens": tokens, "usd": usd}


def run_race(before: tuple[str, Path] | None, two: bool, parts: set[str], sizes: list[int]) -> list[dict[str, Any]]:
    per_tokens, per_usd = answer_cost(None)
    usd_budget = round(per_usd * 10.5, 10)                 # fits 10 answers, not 11
    budgets = [("tokens_per_day 300", {"tokens_per_day": 300}, "tokens", 300, per_tokens),
               (f"usd_per_day {usd_budget:.3g} (10 answers)", {"usd_per_day": usd_budget}, "usd", usd_budget,
                per_usd)]
    out = []
    redis = services.start_redis() if two else None
    try:
        for n in sizes:
            for label, budget, unit, limit, per in budgets:
                arms = []
                if "race" in parts:
                    arms += [("this code", None, 1)] + ([(f"before ({before[0]})", before[1], 1)] if before else [])
                if two:
                    arms.append(("this code, 2 gateways on Redis", None, 2))
                for arm, code, gws in arms:
                    console.log(f"{arm}: {n} requests against {label}")
                    r = race(n, budget, code, gws, redis.url if gws == 2 and redis else None)
                    used = r[unit]
                    r.update(arm=arm, budget=label, fits=int(limit // per), limit=limit,
                             overshoot=max(0.0, used - limit), overshoot_x=used / limit)
                    out.append(r)
    finally:
        if redis is not None:
            redis.stop()
    return out


# ---- kill -------------------------------------------------------------------------------------------------------

def run_kill(lease_s: float = 10.0) -> dict[str, Any]:
    import redis as redis_lib

    server = services.start_redis()
    try:
        with stub(delay=3600) as slow_url, stub() as fast_url:
            models = [{"name": name, "backend": "openai", "base_url": url, "model": "stub", "tokenizer": MODEL,
                       "max_retries": 0, "timeout_s": 3600, "price": {"input": 1, "output": 1}}
                      for name, url in (("slow", slow_url), ("fast", fast_url))]
            cfg = {"cache": NO_CACHE, "models": models, "limits": {"store": server.url, "lease_s": lease_s},
                   "keys": [{"key": "sk-probe", "name": "probe", "budget": {"tokens_per_day": 10**9}}]}
            with gateway(cfg) as (url, _, _):
                [r] = asyncio.run(burst([url], "sk-probe", 1, model="fast", max_tokens=5))
                per = int(r.headers["x-tokenomy-reserved"].split(";")[0].split("=")[1])
            cfg["keys"] = [{"key": "sk-k", "name": "k", "tenant": "kill", "budget": {"tokens_per_day": 20 * per}}]
            r = redis_lib.Redis.from_url(server.url)
            with gateway(cfg) as (url_a, ledger_a, proc_a), gateway(cfg) as (url_b, ledger_b, _):
                held: dict[str, Any] = {}

                def hold_on_a() -> None:
                    try:
                        asyncio.run(burst([url_a], "sk-k", 16, model="slow", max_tokens=5))
                    except Exception as e:          # the gateway is killed under them
                        held["error"] = type(e).__name__

                import threading
                t = threading.Thread(target=hold_on_a, daemon=True)
                t.start()
                def holds() -> tuple[bytes | None, int]:
                    keys = [k for k in r.scan_iter("tokenomy:limits:budget:key:*:day:*") if k.endswith(b":holds")]
                    return (keys[0], r.hlen(keys[0])) if keys else (None, 0)

                deadline = time.time() + 120
                while holds()[1] < 16 and time.time() < deadline:
                    time.sleep(0.05)
                key, in_flight = holds()
                assert key is not None, "gateway A never held its requests"
                on_b = asyncio.run(burst([url_b], "sk-k", 8, model="fast", max_tokens=5))
                while asyncio.run(burst([url_b], "sk-k", 1, model="fast", max_tokens=5))[0].status_code == 200:
                    pass                # answers spend less than they hold: B spends what that frees, until refused
                proc_a.kill()
                killed = time.monotonic()
                proc_a.wait()
                while True:
                    [x] = asyncio.run(burst([url_b], "sk-k", 1, model="fast", max_tokens=5))
                    if x.status_code == 200:
                        break
                    time.sleep(0.1)
                readmitted_s = time.monotonic() - killed
                day = key[: -len(":holds")]          # B settled each answer before sending it
                redis_tokens = float(r.hget(day, "tokens") or 0)
            ledger_tokens, _, served = spent([ledger_a, ledger_b])
    finally:
        server.stop()
    return {"lease_s": lease_s, "held_on_a": in_flight, "budget_tokens": 20 * per, "per_request": per,
            "b_served_before_kill": sum(a.status_code == 200 for a in on_b), "readmitted_after_s": readmitted_s,
            "ledger_tokens": ledger_tokens, "redis_tokens": redis_tokens, "rows_served": served}


# ---- cost -------------------------------------------------------------------------------------------------------

async def latencies(url: str, key: str, n: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            r = await c.post(url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                             json={"model": "up", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
    return out


def cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run_cost(rounds: int, n: int, no_allowances: bool = False, restart: bool = False) -> dict[str, Any]:
    """With `restart`, each arm's gateway is started anew for each round and is the only one running while it is
    measured (on a loaded machine one of several identical gateway processes can answer 2 to 3 times faster than
    the others for its whole life, which alternating rounds of long-lived processes cannot average out)."""
    server = services.start_redis()
    try:
        with stub() as up:
            model = [{"name": "up", "backend": "openai", "base_url": up, "model": "stub", "tokenizer": "cl100k_base",
                      "price": {"input": 1, "output": 1}}]
            base = {"cache": NO_CACHE, "models": model}
            big = {"usd_per_day": 1e6, "tokens_per_day": 10**12}
            arms = {"no budget": {**base, "keys": [{"key": "sk-c", "name": "c"}]},
                    "budget, in process": {**base, "keys": [{"key": "sk-c", "name": "c", "budget": big}]},
                    "budget, Redis": {**base, "keys": [{"key": "sk-c", "name": "c", "budget": big}],
                                      "limits": {"store": server.url}}}
            if no_allowances:
                arms["budget, Redis, no allowances"] = {**base, "keys": [{"key": "sk-c", "name": "c2", "budget": big}],
                                                        "limits": {"store": server.url, "allowances": False}}
            got: dict[str, list[float]] = {name: [] for name in arms}
            rounds_ms: dict[str, list[float]] = {name: [] for name in arms}      # each round's median, per arm
            cpu: dict[str, float] = {name: 0.0 for name in arms}
            with ExitStack() as stack:
                started = {} if restart else {name: stack.enter_context(gateway(cfg)) for name, cfg in arms.items()}
                for url, _, _ in started.values():
                    asyncio.run(latencies(url, "sk-c", 50))                 # warm-up
                for i in range(rounds):
                    order = list(arms) if i % 2 == 0 else list(reversed(arms))
                    for name in order:
                        console.log(f"cost round {i + 1}/{rounds}: {name}")
                        with ExitStack() as one:
                            if restart:
                                url, _, proc = one.enter_context(gateway(arms[name]))
                                asyncio.run(latencies(url, "sk-c", 50))     # warm-up
                            else:
                                url, _, proc = started[name]
                            c0 = cpu_s(proc.pid)
                            one_round = asyncio.run(latencies(url, "sk-c", n))
                            cpu[name] += cpu_s(proc.pid) - c0
                            got[name] += one_round
                            rounds_ms[name].append(statistics.median(one_round) * 1e3)
        import redis as redis_lib

        client = redis_lib.Redis.from_url(server.url)      # what one round trip to this Redis costs, for scale
        pings = []
        for _ in range(2000):
            t0 = time.perf_counter()
            client.ping()
            pings.append(time.perf_counter() - t0)
    finally:
        server.stop()
    med = {name: statistics.median(v) * 1e3 for name, v in got.items()}
    per = {name: cpu[name] / (rounds * n) * 1e3 for name in arms}
    # paired by round: each round's median minus the no-budget arm's in the same round (the arms of a round run one
    # right after the other, so a machine that slows for a while moves both)
    paired = {name: sorted(a - b for a, b in zip(rounds_ms[name], rounds_ms["no budget"], strict=True))
              for name in arms if name != "no budget"}
    return {"median_ms": med, "added_ms": {name: med[name] - med["no budget"] for name in arms if name != "no budget"},
            "added_by_round_ms": paired,
            "added_paired_ms": {name: statistics.median(v) for name, v in paired.items()},
            "cpu_ms": per, "added_cpu_ms": {name: per[name] - per["no budget"] for name in arms if name != "no budget"},
            "requests_per_arm": rounds * n, "redis_ping_ms": statistics.median(pings) * 1e3}


def run_calls(n: int = 3000) -> dict[str, Any]:
    """CPU and wall microseconds per reserve + settle on Budgets, far from the limit (a key with a USD and a token
    budget: two slots a request, as in the cost part)."""
    import dataclasses

    from tests.helpers.synthetic import Spec, rows_for
    from tokenomy.config import BudgetLimits
    from tokenomy.limits.budget import Budgets
    from tokenomy.limits.shared_counters import SharedCounters

    [row] = rows_for([Spec("large", 12, 0, 3, key_id="k1", tenant="acme")], now=time.time(), prefix="x")
    server = services.start_redis()
    out: dict[str, Any] = {}
    try:
        for name, store, allow in (("in process", False, False), ("Redis, allowances", True, True),
                                   ("Redis, every request held on its own", True, False)):
            shared = SharedCounters(server.url, prefix=f"bench:{uuid.uuid4().hex[:8]}:") if store else None
            b = Budgets(keys={"k1": BudgetLimits(usd_per_day=1e6, tokens_per_day=10**12)}, shared=shared,
                        allowances=allow)
            rows = [dataclasses.replace(row, request_id=f"r{i}") for i in range(n + 200)]
            for i, r in enumerate(rows):
                if i == 200:                        # after a warm-up
                    c0, t0 = time.process_time(), time.perf_counter()
                b.reserve("k1", "acme", r.request_id, 1e-5, 40)
                b.record(r)
            c1, t1 = time.process_time(), time.perf_counter()
            b.close()
            if shared is not None:
                shared.drain()
                shared.close()
            out[name] = {"cpu_us": (c1 - c0) / n * 1e6, "wall_us": (t1 - t0) / n * 1e6}
    finally:
        server.stop()
    return out


def extract(ref: str) -> Path:
    """The `tokenomy/` package at git `ref`, extracted into a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix="tokenomy-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tokenomy"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="race,two,kill,cost")
    ap.add_argument("--before", default="343a20c", help="git ref of the code before reservations ('' to skip)")
    ap.add_argument("--sizes", default="32,256", help="burst sizes of the race and two parts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200, help="requests per arm and round in the cost part")
    ap.add_argument("--no-allowances", action="store_true",
                    help="cost part: add the Redis arm with limits.allowances false (every request held in Redis)")
    ap.add_argument("--restart", action="store_true",
                    help="cost part: start each arm's gateway anew for each round, alone while it is measured")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {}
    if parts & {"race", "two"}:
        before = (args.before, extract(args.before)) if args.before and "race" in parts else None
        result["race"] = run_race(before, "two" in parts, parts, [int(x) for x in args.sizes.split(",")])
    if "kill" in parts:
        result["kill"] = run_kill()
    if "cost" in parts:
        result["cost"] = run_cost(args.rounds, args.requests, args.no_allowances, args.restart)
    if "calls" in parts:
        result["calls"] = run_calls()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    out = Console(width=170)
    if "race" in result:
        t = Table(title="Concurrent requests against one budget (24-token answers, embedded default, caches off)")
        for c in ("budget", "requests", "arm", "served", "fits", "refused", "tokens", "USD", "overshoot"):
            t.add_column(c, justify="left" if c in ("budget", "arm") else "right")
        for r in result["race"]:
            over = f"{r['overshoot']:.3g}" if isinstance(r["limit"], float) else f"{int(r['overshoot'])}"
            t.add_row(r["budget"], str(r["requests"]), r["arm"], str(r["served"]), str(r["fits"]),
                      str(r["refused"]), str(r["tokens"]), f"{r['usd']:.3g}", f"{over} ({r['overshoot_x']:.2f}x)")
        out.print(t)
    if "kill" in result:
        k = result["kill"]
        out.print(f"kill: {k['held_on_a']} holds in flight on gateway A, B served {k['b_served_before_kill']} of 8 "
                  f"with the rest of the budget; A killed; B admitted again after {k['readmitted_after_s']:.1f} s "
                  f"(lease_s {k['lease_s']:g}); ledgers {k['ledger_tokens']} tokens, Redis {k['redis_tokens']:g}")
    if "cost" in result:
        c = result["cost"]
        t = Table(title=f"What reserving costs: median latency, one request at a time ({c['requests_per_arm']} "
                        "requests per arm, alternating rounds)")
        t.add_column("configuration")
        t.add_column("median ms", justify="right")
        t.add_column("added ms", justify="right")
        t.add_column("added, paired by round: median [min, max]", justify="right")
        t.add_column("gateway CPU ms / request", justify="right")
        t.add_column("added CPU ms", justify="right")
        for name, ms in c["median_ms"].items():
            by = c["added_by_round_ms"].get(name)
            paired = f"{c['added_paired_ms'][name]:+.3f} [{by[0]:+.3f}, {by[-1]:+.3f}]" if by else ""
            t.add_row(name, f"{ms:.3f}", f"{c['added_ms'].get(name, 0.0):+.3f}", paired, f"{c['cpu_ms'][name]:.3f}",
                      f"{c['added_cpu_ms'].get(name, 0.0):+.3f}")
        out.print(t)
        out.print(f"one PING to the same Redis: {c['redis_ping_ms']:.3f} ms at the median")
    if "calls" in result:
        t = Table(title="One reservation and its settle, called on Budgets (far from the limit)")
        for col in ("store", "CPU us", "wall us"):
            t.add_column(col, justify="left" if col == "store" else "right")
        for name, v in result["calls"].items():
            t.add_row(name, f"{v['cpu_us']:.1f}", f"{v['wall_us']:.1f}")
        out.print(t)


if __name__ == "__main__":
    main()
