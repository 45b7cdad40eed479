"""Latency tokenomy adds in front of an upstream: p50/p99 at 1, 10 and 100 concurrent streams, against a stub
upstream on loopback that answers instantly, vs calling the stub directly. All three run as separate processes.
`--dialects` measures instead what translation costs: the same streamed request as a chat completion, an
Anthropic Messages request and a Responses request to the same gateway and stub, one at a time, in alternating
rounds, and the added median latency of each dialect over the chat completion. `--tracing` measures what traces
cost (docs/telemetry.md): two gateways in front of the same stub, one with tracing off and one exporting every
span to an OTLP/HTTP sink on loopback (a fourth process that reads and drops them), the same streamed chat request
to each, one at a time in alternating rounds, and the added median latency of tracing on, with each gateway's
CPU time per request (its event loop's, its other threads': the export) from the process's thread counters.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--json]
    .venv/bin/python bench/gateway_overhead.py --dialects [--requests 2000]
    .venv/bin/python bench/gateway_overhead.py --tracing [--requests 2000]
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
from collections.abc import Callable

import httpx
import psutil
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


async def measure_alternating(roots: dict[str, str], n: int, rounds: int = 20,
                              warm: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Seconds per streamed chat request to each gateway (by name), one request at a time, the gateways taking
    turns in rounds (the order rotating), so drift on the machine falls on all of them alike. `warm` is called
    after the warm-up requests."""
    lat: dict[str, list[float]] = {name: [] for name in roots}
    names = list(roots)
    path, body = DIALECTS["chat"]
    async with httpx.AsyncClient(timeout=60) as c:
        async def one(name: str) -> float:
            t0 = time.perf_counter()
            async with c.stream("POST", roots[name] + path, json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: {r.status_code} {(await r.aread())[:300]!r}")
                async for _ in r.aiter_bytes():
                    pass
            return time.perf_counter() - t0
        for name in names * 20:              # warm-up
            await one(name)
        if warm is not None:
            warm()
        per = max(1, n // rounds)
        for i in range(rounds):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                lat[name] += [await one(name) for _ in range(per)]
    return lat


def otlp_sink(port: int) -> None:
    """An OTLP/HTTP receiver that reads every export and answers 200 with an empty response (the spans dropped):
    what a collector costs the exporting gateway, without a collector's own work on this machine's cores."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:   # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:    # noqa: N802 (wait_up's probe)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) a process has used so far: (its main thread's, its other threads')."""
    main = other = 0.0
    for t in psutil.Process(pid).threads():
        if t.id == pid:
            main += t.user_time + t.system_time
        else:
            other += t.user_time + t.system_time
    return main, other


def settled_cpu_s(pid: int, quiet_s: float = 1.0, timeout_s: float = 30.0) -> tuple[float, float]:
    """`cpu_s` once the process has stopped working: no CPU used for `quiet_s` (after the requests, the batch
    processor's last export; its schedule delay is 5 s unless OTEL_BSP_SCHEDULE_DELAY says otherwise)."""
    time.sleep(float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1000 + 0.5)
    deadline, last = time.monotonic() + timeout_s, cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_s(pid)
        if sum(now) - sum(last) < 0.005:
            return now
        last = now
    return last


def tracing(roots: dict[str, str], pids: dict[str, int], n: int, as_json: bool) -> None:
    before: dict[str, tuple[float, float]] = {}
    lat = asyncio.run(measure_alternating(roots, n, rounds=n,     # on and off take turns request by request
                                          warm=lambda: before.update({k: settled_cpu_s(p) for k, p in pids.items()})))
    after = {name: settled_cpu_s(pid) for name, pid in pids.items()}
    off = pct(lat["off"], .5)
    rows = []
    for name, xs in lat.items():
        main, other = (after[name][i] - before[name][i] for i in (0, 1))
        rows.append({"tracing": name, "requests": len(xs), "p50_ms": pct(xs, .5) * 1e3, "p99_ms": pct(xs, .99) * 1e3,
                     "added_p50_ms": (pct(xs, .5) - off) * 1e3, "cpu_main_ms": main / len(xs) * 1e3,
                     "cpu_threads_ms": other / len(xs) * 1e3})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="Tracing cost: one streamed chat request at a time through tokenomy to an instant stub (ms)")
    for col in ("tracing", "requests", "p50", "p99", "added p50 over off", "CPU/request: event loop",
                "other threads"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["tracing"], str(r["requests"]), f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
                  f"{r['added_p50_ms']:+.3f}", f"{r['cpu_main_ms']:.3f}", f"{r['cpu_threads_ms']:.3f}")
    Console().print(t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--levels", default="1,10,100")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dialects", action="store_true", help="the added latency of Messages and Responses over chat")
    ap.add_argument("--tracing", action="store_true", help="the added latency of tracing on (an OTLP sink) over off")
    ap.add_argument("--otlp-sink", type=int, help=argparse.SUPPRESS)     # run as the --tracing sink process
    args = ap.parse_args()
    if args.otlp_sink:
        return otlp_sink(args.otlp_sink)
    stub_port, gw_port, traced_port, sink_port = free_port(), free_port(), free_port(), free_port()
    models = (f"models:\n  - {{name: up, backend: openai, base_url: 'http://127.0.0.1:{stub_port}/v1', "
              f"model: stub, tokenizer: cl100k_base}}\n")
    configs = {"off": models, "on": models + f"telemetry: {{traces: true, endpoint: "
                                              f"'http://127.0.0.1:{sink_port}/v1/traces'}}\n"}
    files = {}
    for name, text in configs.items():
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
        files[name] = f.name
    # tracing only where configured (the batch processor's OTEL_BSP_* settings pass)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") or k.startswith("OTEL_BSP_")}

    def gateway(port: int, config: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "--config",
                                 config], cwd=ROOT, stderr=subprocess.DEVNULL,
                                env={**env, "TOKENOMY_HOME": tempfile.mkdtemp(prefix="tokenomy-bench-")})

    off_gateway = gateway(gw_port, files["off"])
    procs = [subprocess.Popen([sys.executable, "-m", "tests.upstream_stub", "--port", str(stub_port)], cwd=ROOT),
             off_gateway]
    if args.tracing:
        on_gateway = gateway(traced_port, files["on"])
        procs += [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--otlp-sink", str(sink_port)]),
                  on_gateway]
    rows = []
    try:
        wait_up(f"http://127.0.0.1:{stub_port}/v1/models")
        wait_up(f"http://127.0.0.1:{gw_port}/health")
        if args.dialects:
            return dialects(asyncio.run(measure_dialects(f"http://127.0.0.1:{gw_port}", args.requests)), args.json)
        if args.tracing:
            wait_up(f"http://127.0.0.1:{sink_port}/")
            wait_up(f"http://127.0.0.1:{traced_port}/health")
            return tracing({"off": f"http://127.0.0.1:{gw_port}", "on": f"http://127.0.0.1:{traced_port}"},
                           {"off": off_gateway.pid, "on": on_gateway.pid}, args.requests, args.json)
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
        for path in files.values():
            os.unlink(path)
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
