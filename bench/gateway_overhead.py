"""Latency tokenomy adds in front of an upstream: p50/p99 at 1, 10 and 100 concurrent streams, against a stub
upstream on loopback that answers instantly, vs calling the stub directly. All three run as separate processes.
`--dialects` measures instead what translation costs: the same streamed request as a chat completion, an
Anthropic Messages request and a Responses request to the same gateway and stub, one at a time, in alternating
rounds, and the added median latency of each dialect over the chat completion.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--json]
    .venv/bin/python bench/gateway_overhead.py --dialects [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def measure(url: str, concurrency: int, n: int) -> list[float]:
    body = {"model": "up", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency + 8)) as c:
        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                async with c.stream("POST", url + "/chat/completions", json=body) as r:
                    async for _ in r.aiter_bytes():
                        pass
                lat.append(time.perf_counter() - t0)
        for _ in range(min(20, n)):           # warm-up connections
            await one()
        lat.clear()
        await asyncio.gather(*[one() for _ in range(n)])
    return lat


DIALECTS = {
    "chat": ("/v1/chat/completions", {"model": "up", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    "messages": ("/v1/messages", {"model": "up", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
                                  "stream": True}),
    "responses": ("/v1/responses", {"model": "up", "input": "hi", "stream": True, "store": False}),
}


async def measure_dialects(root: str, n: int, rounds: int = 20) -> dict[str, list[float]]:
    """Seconds per streamed request of each dialect, one request at a time; the dialects take turns in rounds
    (the order rotating), so drift on the machine falls on all of them alike."""
    lat: dict[str, list[float]] = {d: [] for d in DIALECTS}
    names = list(DIALECTS)
    async with httpx.AsyncClient(timeout=60) as c:
        async def one(name: str) -> float:
            path, body = DIALECTS[name]
            t0 = time.perf_counter()
            async with c.stream("POST", root + path, json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: {r.status_code} {(await r.aread())[:300]!r}")
                async for _ in r.aiter_bytes():
                    pass
            return time.perf_counter() - t0
        for name in names * 10:              # warm-up
            await one(name)
        per = max(1, n // rounds)
        for i in range(rounds):
            for name in names[i % 3:] + names[:i % 3]:
                lat[name] += [await one(name) for _ in range(per)]
    return lat


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--levels", default="1,10,100")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dialects", action="store_true", help="the added latency of Messages and Responses over chat")
    args = ap.parse_args()
    stub_port, gw_port = free_port(), free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"models:\n  - {{name: up, backend: openai, base_url: 'http://127.0.0.1:{stub_port}/v1', "
              f"model: stub, tokenizer: cl100k_base}}\n")
    cfg.close()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.upstream_stub", "--port", str(stub_port)], cwd=ROOT),
             subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(gw_port), "--config",
                               cfg.name], cwd=ROOT, stderr=subprocess.DEVNULL,
                              env={**os.environ, "TOKENOMY_HOME": tempfile.mkdtemp(prefix="tokenomy-bench-")})]
    rows = []
    try:
        wait_up(f"http://127.0.0.1:{stub_port}/v1/models")
        wait_up(f"http://127.0.0.1:{gw_port}/health")
        if args.dialects:
            return dialects(asyncio.run(measure_dialects(f"http://127.0.0.1:{gw_port}", args.requests)), args.json)
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("measuring", total=None)
            for c in [int(x) for x in args.levels.split(",")]:
                progress.update(task, description=f"concurrency {c}: direct")
                direct = asyncio.run(measure(f"http://127.0.0.1:{stub_port}/v1", c, args.requests))
                progress.update(task, description=f"concurrency {c}: through tokenomy")
                via = asyncio.run(measure(f"http://127.0.0.1:{gw_port}/v1", c, args.requests))
                rows.append({"concurrency": c,
                             "direct_p50_ms": pct(direct, .5) * 1e3, "direct_p99_ms": pct(direct, .99) * 1e3,
                             "tokenomy_p50_ms": pct(via, .5) * 1e3, "tokenomy_p99_ms": pct(via, .99) * 1e3})
                rows[-1]["added_p50_ms"] = rows[-1]["tokenomy_p50_ms"] - rows[-1]["direct_p50_ms"]
                rows[-1]["added_p99_ms"] = rows[-1]["tokenomy_p99_ms"] - rows[-1]["direct_p99_ms"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        os.unlink(cfg.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title=f"Gateway overhead, streamed chat, {args.requests} requests per level (ms)")
    for col in ("concurrency", "direct p50", "direct p99", "tokenomy p50", "tokenomy p99", "added p50",
                "added p99"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["concurrency"]), *(f"{r[k]:.2f}" for k in ("direct_p50_ms", "direct_p99_ms",
                  "tokenomy_p50_ms", "tokenomy_p99_ms", "added_p50_ms", "added_p99_ms")))
    Console().print(t)


def dialects(lat: dict[str, list[float]], as_json: bool) -> None:
    chat = pct(lat["chat"], .5)
    rows = [{"dialect": d, "requests": len(xs), "p50_ms": pct(xs, .5) * 1e3, "p99_ms": pct(xs, .99) * 1e3,
             "added_p50_ms": (pct(xs, .5) - chat) * 1e3, "ratio_p50": pct(xs, .5) / chat} for d, xs in lat.items()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="Translation cost: one streamed request at a time through tokenomy to an instant stub (ms)")
    for col in ("dialect", "requests", "p50", "p99", "added p50 over chat", "p50 / chat"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["dialect"], str(r["requests"]), f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
                  f"{r['added_p50_ms']:+.3f}", f"{r['ratio_p50']:.3f}x")
    Console().print(t)


if __name__ == "__main__":
    main()
