"""API workers (`server.workers`): 1 vs 2 (or more) in one run, against the upstream stub and on the embedded engine.

1. Gateway throughput: `hey` (Debian's package; a Python client when it is missing, which then competes with the
   gateway for the cores and says so) sends the same small chat body to tokenomy in front of the instant stub
   (tests/helpers/upstream_stub.py), one upstream model, no keys, default caches and ledger, at each concurrency, for
   each worker count: req/s, p50 and p99.
2. Engine throughput: the embedded SmolLM2 behind 1 and 2 workers, the same 64-token answers (EOS suppressed) at
   each concurrency (bench/engine_throughput.py's client): output tok/s. One engine process serves every worker,
   so this should not move with the worker count: a worker adds HTTP capacity, not decode capacity.

Timings on a shared or 2-core machine say little (the load generator and the workers share the cores; say so with
the figures); the lead reruns it on a quiet machine:

    .venv/bin/python bench/workers.py [--workers 1,2] [--levels 1,16,64] [--requests 3000]
        [--engine-levels 1,8] [--tokens 64] [--engine-requests 4] [--rounds 1] [--baseline DIR]
        [--skip-engine] [--skip-stub] [--json]

`--baseline DIR` runs the engine half on another source tree too (an earlier commit), the two taking turns each
round, and prints this tree's tok/s over the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BODY = {"model": "up", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def serve(port: int, config: str, workers: int, home: str, tree: str = ROOT) -> subprocess.Popen:
    """`tokenomy serve` of the source tree `tree` (its `tokenomy` package: the server's and its children's cwd)."""
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "--config", config,
                             "--workers", str(workers)], cwd=tree, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TOKENOMY_HOME": home})
    wait_up(f"http://127.0.0.1:{port}/health", [proc], 600)
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def hey(url: str, concurrency: int, n: int) -> dict[str, float]:
    """req/s, p50 and p99 (ms) from one `hey` run."""
    out = subprocess.run(["hey", "-n", str(n), "-c", str(concurrency), "-m", "POST", "-T", "application/json",
                          "-d", json.dumps(BODY), url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))   # type: ignore[union-attr]

    def q(p: int) -> float:
        m = re.search(rf"\s{p}% in ([\d.]+) secs", out)
        return float(m.group(1)) * 1e3 if m else float("nan")

    statuses = dict(re.findall(r"\[(\d{3})\]\s+(\d+) responses", out))
    return {"rps": rps, "p50_ms": q(50), "p99_ms": q(99), "non_200": sum(int(v) for k, v in statuses.items()
                                                                          if k != "200")}


def python_load(url: str, concurrency: int, n: int) -> dict[str, float]:
    """hey's figures from an httpx client in this process (when hey is not installed)."""
    import httpx

    async def run() -> tuple[list[float], float, int]:
        lat: list[float] = []
        bad = 0
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as c:
            async def one() -> None:
                nonlocal bad
                async with sem:
                    t = time.perf_counter()
                    r = await c.post(url, json=BODY)
                    lat.append(time.perf_counter() - t)
                    bad += r.status_code != 200
            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            return lat, time.perf_counter() - t0, bad

    lat, wall, bad = asyncio.run(run())
    lat.sort()
    return {"rps": n / wall, "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
            "non_200": bad}


def stub_rows(workers: list[int], levels: list[int], n: int, console: Console) -> list[dict[str, Any]]:
    load = hey if shutil.which("hey") else python_load
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, "-m", "tests.helpers.upstream_stub", "--port", str(stub_port)], cwd=ROOT)
    rows = []
    try:
        wait_up(f"http://127.0.0.1:{stub_port}/v1/models", [stub])
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "stub.yaml")
            with open(config, "w") as f:
                f.write(f"models:\n  - {{name: up, backend: openai, base_url: 'http://127.0.0.1:{stub_port}/v1', "
                        f"model: stub, tokenizer: cl100k_base}}\n")
            for w in workers:
                console.print(f"stub: {w} worker(s)")
                port = free_port()
                proc = serve(port, config, w, tempfile.mkdtemp(dir=tmp))
                try:
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
                    load(url, 4, 200)                                  # warm-up
                    for c in levels:
                        rows.append({"workers": w, "concurrency": c, "load": load.__name__,
                                     **load(url, c, n)})
                finally:
                    stop(proc)
    finally:
        stub.terminate()
        stub.wait(10)
    return rows


def engine_rows(workers: list[int], levels: list[int], tokens: int, console: Console, baseline: str | None = None,
                rounds: int = 1, requests: int = 4) -> list[dict[str, Any]]:
    """Each worker count's tok/s and TTFT at each level (`requests` a level at concurrency 1, twice the level
    above), `rounds` times; with `baseline` (a source tree), its server too, the two taking turns to go first."""
    import engine_throughput as et

    bias = et.eog_bias()
    rows = []
    trees = [("this", ROOT)] + ([("baseline", os.path.abspath(baseline))] if baseline else [])
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "engine.yaml")
        with open(config, "w") as f:
            f.write("ledger: null\ncache: {exact: {enabled: false}, semantic: {enabled: false}}\n")
        for i in range(rounds):
            for tree, path in trees[i % 2:] + trees[:i % 2]:
                for w in workers:
                    console.print(f"round {i + 1}: {tree}, engine: {w} worker(s)")
                    port = free_port()
                    proc = serve(port, config, w, tempfile.mkdtemp(dir=tmp), path)
                    try:
                        url = f"http://127.0.0.1:{port}/v1"
                        asyncio.run(et.level_http(url, 2, 2, 8, bias))           # warm-up
                        for c in levels:
                            n_req = requests if c == 1 else 2 * c
                            r = asyncio.run(et.level_http(url, c, n_req, tokens, bias))
                            rows.append({"tree": tree, "round": i + 1, "workers": w, "concurrency": c,
                                         "requests": n_req, **r})
                    finally:
                        stop(proc)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--levels", default="1,16,64", help="concurrency levels against the stub")
    ap.add_argument("--requests", type=int, default=3000, help="requests per level against the stub")
    ap.add_argument("--engine-levels", default="1,8", help="concurrency levels on the embedded engine")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer on the embedded engine")
    ap.add_argument("--engine-requests", type=int, default=4, help="requests at concurrency 1 on the engine")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the engine half")
    ap.add_argument("--baseline", default=None, help="a tokenomy source tree (e.g. an older commit: `git archive "
                    "COMMIT | tar -x -C /tmp/base`) whose server the engine half runs too, rounds alternating")
    ap.add_argument("--skip-stub", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # a killed run still stops its servers (finally)
    console = Console(stderr=True)
    workers = [int(x) for x in args.workers.split(",")]
    out: dict[str, Any] = {"cores": os.cpu_count()}
    if not args.skip_stub:
        out["stub"] = stub_rows(workers, [int(x) for x in args.levels.split(",")], args.requests, console)
        if not args.json:
            stub_table(out["stub"], args.requests, out["cores"])
    if not args.skip_engine:
        out["engine"] = engine_rows(workers, [int(x) for x in args.engine_levels.split(",")], args.tokens, console,
                                    args.baseline, args.rounds, args.engine_requests)
        if not args.json:
            engine_table(out["engine"], args.tokens)
    if args.json:
        print(json.dumps(out, indent=2))


def stub_table(rows: list[dict[str, Any]], requests: int, cores: int | None) -> None:
    load = rows[0]["load"] if rows else ""
    t = Table(title=f"tokenomy in front of the instant stub ({load}, {requests} requests a level, {cores} cores "
                    "shared with the load generator)")
    for col in ("workers", "concurrency", "req/s", "p50 ms", "p99 ms", "non-200"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["workers"]), str(r["concurrency"]), f"{r['rps']:.0f}", f"{r['p50_ms']:.2f}",
                  f"{r['p99_ms']:.2f}", str(r["non_200"]))
    Console().print(t)


def engine_table(rows: list[dict[str, Any]], tokens: int) -> None:
    """The median over rounds of each (tree, workers, concurrency), and this tree's ratio to the baseline's."""
    t = Table(title=f"embedded SmolLM2, {tokens}-token answers: one engine process behind the workers (median of "
                    f"{max(r['round'] for r in rows)} rounds)")
    for col in ("tree", "workers", "concurrency", "tok/s", "TTFT p50 s", "tok/s vs baseline"):
        t.add_column(col, justify="right")
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["tree"], r["workers"], r["concurrency"]), []).append(r)

    def median(key: tuple[str, int, int], field: str) -> float:
        values = sorted(r[field] for r in groups[key])
        return values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1:][:2]) / 2

    for (tree, w, c) in groups:
        base = ("baseline", w, c)
        ratio = f"{median((tree, w, c), 'tok_s') / median(base, 'tok_s'):.2f}x" \
            if tree == "this" and base in groups else ""
        t.add_row(tree, str(w), str(c), f"{median((tree, w, c), 'tok_s'):.1f}",
                  f"{median((tree, w, c), 'ttft_p50'):.2f}", ratio)
    Console().print(t)


if __name__ == "__main__":
    main()
