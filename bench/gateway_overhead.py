"""Latency tokenomy adds in front of an upstream: p50/p99 at 1, 10 and 100 concurrent streams, against a stub
upstream on loopback that answers instantly, vs calling the stub directly. All three run as separate processes.
`--dialects` measures instead what translation costs: the same streamed request as a chat completion, an
Anthropic Messages request and a Responses request to the same gateway and stub, one at a time, in alternating
rounds, and the added median latency of each dialect over the chat completion. `--tracing` measures what traces
cost (docs/telemetry.md): two gateways in front of the same stub, one with tracing off and one exporting every
span to an OTLP/HTTP sink on loopback (a fourth process that reads and drops them), the same streamed chat request
to each, one at a time in alternating rounds, and the added median latency of tracing on, with each gateway's
CPU time per request (its event loop's, its other threads', and its trace exporter process's) from the processes'
thread counters.
`--load hey` puts tokenomy beside the floor of its own stack (issue 37): a native load generator (`hey`, the Debian
package) against four endpoints in alternating rounds: the stub itself, a bare proxy (BARE_PROXY: a Starlette app
that forwards the body with stock httpx, under uvicorn with the same settings as `tokenomy serve`: the parser
and event loop of tokenomy.server.process.uvicorn_options, httptools and uvloop where installed), tokenomy (no keys;
default caches and ledger) and tokenomy with a key and a budget; non-streamed chat at each concurrency level:
req/s, p50, p99 and the ratio to the bare proxy. Then the same four streamed, with a small raw-socket client (hey
cannot see the first byte): time to first byte and content chunks a second.

    .venv/bin/python bench/gateway_overhead.py [--requests 300] [--json]
    .venv/bin/python bench/gateway_overhead.py --dialects [--requests 2000]
    .venv/bin/python bench/gateway_overhead.py --tracing [--requests 2000]
    .venv/bin/python bench/gateway_overhead.py --load hey [--levels 1,16,64] [--seconds 5] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

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


def tree_cpu_s(pid: int) -> tuple[float, float, float]:
    """`cpu_s`, and the CPU seconds of the process's children (the trace exporter process) so far."""
    children = 0.0
    for c in psutil.Process(pid).children(recursive=True):
        try:
            times = c.cpu_times()
        except psutil.NoSuchProcess:
            continue
        children += times.user + times.system
    return (*cpu_s(pid), children)


def settled_cpu_s(pid: int, quiet_s: float = 1.0, timeout_s: float = 30.0) -> tuple[float, float, float]:
    """`tree_cpu_s` once the process and its children have stopped working: no CPU used for `quiet_s` (after the
    requests, the batch processor's last export; its schedule delay is 5 s unless OTEL_BSP_SCHEDULE_DELAY says
    otherwise)."""
    time.sleep(float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1000 + 0.5)
    deadline, last = time.monotonic() + timeout_s, tree_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = tree_cpu_s(pid)
        if sum(now) - sum(last) < 0.005:
            return now
        last = now
    return last


def tracing(roots: dict[str, str], pids: dict[str, int], n: int, as_json: bool) -> None:
    before: dict[str, tuple[float, float, float]] = {}
    lat = asyncio.run(measure_alternating(roots, n, rounds=n,     # on and off take turns request by request
                                          warm=lambda: before.update({k: settled_cpu_s(p) for k, p in pids.items()})))
    after = {name: settled_cpu_s(pid) for name, pid in pids.items()}
    off = pct(lat["off"], .5)
    rows = []
    for name, xs in lat.items():
        main, other, children = (after[name][i] - before[name][i] for i in (0, 1, 2))
        rows.append({"tracing": name, "requests": len(xs), "p50_ms": pct(xs, .5) * 1e3, "p99_ms": pct(xs, .99) * 1e3,
                     "added_p50_ms": (pct(xs, .5) - off) * 1e3, "cpu_main_ms": main / len(xs) * 1e3,
                     "cpu_threads_ms": other / len(xs) * 1e3, "cpu_exporter_ms": children / len(xs) * 1e3})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="Tracing cost: one streamed chat request at a time through tokenomy to an instant stub (ms)")
    for col in ("tracing", "requests", "p50", "p99", "added p50 over off", "CPU/request: event loop",
                "other threads", "exporter process"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["tracing"], str(r["requests"]), f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
                  f"{r['added_p50_ms']:+.3f}", f"{r['cpu_main_ms']:.3f}", f"{r['cpu_threads_ms']:.3f}",
                  f"{r['cpu_exporter_ms']:.3f}")
    Console().print(t)


# ---- --load hey: tokenomy beside the floor of its own stack ---------------------------------------------------
HEY_BODY = {"model": "up", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
BENCH_KEY = "sk-bench-overhead"
ENDPOINTS = ("stub", "bare proxy", "tokenomy", "tokenomy keys+budget")


def bare_proxy(port: int, upstream: str) -> None:
    """BARE_PROXY: the floor for any Python gateway on this stack. One pooled httpx client; the body goes to the
    upstream as it came, the answer comes back as it went (a stream chunk by chunk); served by uvicorn as
    `tokenomy serve` serves (the same uvicorn_options: httptools and uvloop where installed, else h11 and asyncio;
    log level warning), so that the comparison is of what each does with a request, not of their servers."""
    import uvicorn

    sys.path.insert(0, ROOT)             # this checkout's tokenomy, as the gateways the bench starts run it
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from tokenomy.server.process import uvicorn_options

    client = httpx.AsyncClient(base_url=upstream, timeout=60,
                               limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))

    async def forward(request: Request) -> Response:
        sent = client.build_request("POST", "/chat/completions", content=await request.body(),
                                    headers={"content-type": "application/json"})
        r = await client.send(sent, stream=True)
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(r.aiter_raw(), media_type="text/event-stream", background=BackgroundTask(r.aclose))
        body = await r.aread()
        return Response(body, status_code=r.status_code, media_type="application/json")

    async def health(_: Request) -> Response:
        return Response("ok")

    app = Starlette(routes=[Route("/v1/chat/completions", forward, methods=["POST"]), Route("/health", health)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_options())


def hey(url: str, concurrency: int, seconds: float, key: str | None = None) -> dict[str, float]:
    """One `hey` run of non-streamed chat requests for `seconds` at `concurrency`: req/s, p50 and p99 (ms), and
    the answers that were not 200."""
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
           "-d", json.dumps(HEY_BODY)]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout

    def num(pattern: str, fallback: str | None = None) -> float:
        m = re.search(pattern, out) or (re.search(fallback, out) if fallback else None)
        if m is None:
            raise RuntimeError(f"hey's summary has no {pattern!r}:\n{out}")
        return float(m.group(1))

    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", out)}
    return {"rps": num(r"Requests/sec:\s+([\d.]+)"), "p50_ms": num(r"50%+ in ([\d.]+) secs") * 1e3,
            "p99_ms": num(r"99%+ in ([\d.]+) secs", r"Slowest:\s+([\d.]+) secs") * 1e3,
            "requests": sum(codes.values()), "not_200": sum(n for c, n in codes.items() if c != 200)}


CONTENT = re.compile(rb'"content": ?"[^"]')       # an SSE event with text (a role chunk's "" is not one)


async def stream_load(port: int, concurrency: int, seconds: float, key: str | None = None) -> dict[str, float]:
    """Streamed chat for `seconds` at `concurrency`, each connection kept alive, read with raw sockets (a client
    whose own cost stays small beside a Python server's): streams/s, time to first body byte p50/p99 (ms), and
    content chunks (events with text) a second over the run."""
    body = json.dumps({**HEY_BODY, "stream": True}).encode()
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
               f"{auth}content-length: {len(body)}\r\n\r\n").encode() + body
    ttfb: list[float] = []
    counts = {"streams": 0, "chunks": 0, "not_200": 0}
    end = time.perf_counter() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                writer.write(request)
                status = int((await reader.readline()).split()[1])
                chunked, length = False, 0
                while (line := await reader.readline()) != b"\r\n":
                    name, _, value = line.decode("latin-1").partition(":")
                    name, value = name.strip().lower(), value.strip().lower()
                    chunked |= name == "transfer-encoding" and "chunked" in value
                    length = int(value) if name == "content-length" else length
                first = None
                if chunked:
                    while size := int((await reader.readline()).split(b";")[0], 16):
                        data = await reader.readexactly(size + 2)
                        first = first or time.perf_counter()
                        counts["chunks"] += len(CONTENT.findall(data))
                    await reader.readline()
                else:
                    await reader.readexactly(length)
                if status != 200:
                    counts["not_200"] += 1
                    continue
                ttfb.append((first or time.perf_counter()) - t0)
                counts["streams"] += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    return {"streams_per_s": counts["streams"] / wall, "ttfb_p50_ms": pct(ttfb, .5) * 1e3,
            "ttfb_p99_ms": pct(ttfb, .99) * 1e3, "chunks_per_s": counts["chunks"] / wall,
            "streams": counts["streams"], "stream_not_200": counts["not_200"]}


def load_hey(ports: dict[str, int], pids: dict[str, int], levels: list[int], seconds: float,
             rounds: int) -> list[dict[str, Any]]:
    """Every endpoint at every level, non-streamed by hey then streamed by stream_load, in `rounds` rounds whose
    endpoint order rotates (drift on the machine falls on all alike); each figure is the median of its rounds,
    but `cpu_ms` (the endpoint's own process: CPU ms a request, non-streamed; `stream_cpu_ms` a stream), which
    is over all rounds."""
    keys = {name: BENCH_KEY if "keys" in name else None for name in ports}
    names = list(ports)
    rows = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("warming up", total=None)
        for name in names:       # warm-up: connections, first-request imports, the tokenizer
            hey(f"http://127.0.0.1:{ports[name]}/v1/chat/completions", 4, 1, keys[name])
            asyncio.run(stream_load(ports[name], 4, 1, keys[name]))
        for c in levels:
            runs: dict[tuple[str, str], list[dict[str, float]]] = {}
            for mode in ("hey", "stream"):
                for i in range(rounds):
                    k = i % len(names)
                    for name in names[k:] + names[:k]:
                        progress.update(task, description=f"concurrency {c}, {mode}, round {i + 1}: {name}")
                        cpu0 = sum(cpu_s(pids[name]))
                        run = (hey(f"http://127.0.0.1:{ports[name]}/v1/chat/completions", c, seconds, keys[name])
                               if mode == "hey" else asyncio.run(stream_load(ports[name], c, seconds, keys[name])))
                        run["cpu_s"] = sum(cpu_s(pids[name])) - cpu0
                        runs.setdefault((name, mode), []).append(run)
            for name in names:
                row: dict[str, Any] = {"concurrency": c, "endpoint": name}
                for mode in ("hey", "stream"):
                    for field in runs[name, mode][0]:
                        xs = [r[field] for r in runs[name, mode]]
                        summed = field.endswith("not_200") or field in ("requests", "streams", "cpu_s")
                        row[field] = sum(xs) if summed else statistics.median(xs)
                    done = sum(r["requests" if mode == "hey" else "streams"] for r in runs[name, mode])
                    row["cpu_ms" if mode == "hey" else "stream_cpu_ms"] = \
                        sum(r["cpu_s"] for r in runs[name, mode]) * 1e3 / max(done, 1)
                    del row["cpu_s"]
                rows.append(row)
            bare = next(r for r in rows[-len(names):] if r["endpoint"] == "bare proxy")
            stub = next(r for r in rows[-len(names):] if r["endpoint"] == "stub")
            for r in rows[-len(names):]:
                r["rps_vs_bare"] = r["rps"] / bare["rps"]
                added, bare_added = r["p50_ms"] - stub["p50_ms"], bare["p50_ms"] - stub["p50_ms"]
                r["added_p50_ms"] = added
                r["added_p50_vs_bare"] = added / bare_added if bare_added > 0 else float("nan")
    return rows


def print_load(rows: list[dict[str, Any]], seconds: float, rounds: int) -> None:
    t = Table(title=f"Non-streamed chat by hey, {seconds:g} s a run, median of {rounds} alternating rounds")
    for col in ("c", "endpoint", "req/s", "x bare", "p50 ms", "p99 ms", "added p50 ms", "x bare's added",
                "CPU ms/req", "not 200"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["concurrency"]), r["endpoint"], f"{r['rps']:,.0f}", f"{r['rps_vs_bare']:.2f}",
                  f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.1f}", f"{r['added_p50_ms']:.2f}",
                  f"{r['added_p50_vs_bare']:.2f}", f"{r['cpu_ms']:.3f}", str(r["not_200"]))
    console = Console(width=160)
    console.print(t)
    t = Table(title="Streamed chat (raw-socket client): time to first byte and content chunks a second")
    for col in ("c", "endpoint", "streams/s", "TTFB p50 ms", "TTFB p99 ms", "chunks/s", "CPU ms/stream", "not 200"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["concurrency"]), r["endpoint"], f"{r['streams_per_s']:,.0f}", f"{r['ttfb_p50_ms']:.2f}",
                  f"{r['ttfb_p99_ms']:.1f}", f"{r['chunks_per_s']:,.0f}", f"{r['stream_cpu_ms']:.3f}",
                  str(r["stream_not_200"]))
    console.print(t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--levels", default="1,10,100", help="concurrency levels (--load: default 1,16,64)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dialects", action="store_true", help="the added latency of Messages and Responses over chat")
    ap.add_argument("--tracing", action="store_true", help="the added latency of tracing on (an OTLP sink) over off")
    ap.add_argument("--load", choices=["hey"], help="stub, bare proxy, tokenomy and tokenomy with keys and a "
                    "budget side by side under a native load generator (hey)")
    ap.add_argument("--seconds", type=float, default=5, help="--load: seconds a run")
    ap.add_argument("--rounds", type=int, default=3, help="--load: alternating rounds")
    ap.add_argument("--otlp-sink", type=int, help=argparse.SUPPRESS)     # run as the --tracing sink process
    ap.add_argument("--bare-proxy", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.otlp_sink:
        return otlp_sink(args.otlp_sink)
    if args.bare_proxy:
        return bare_proxy(int(args.bare_proxy[0]), args.bare_proxy[1])
    if args.load and args.levels == "1,10,100":
        args.levels = "1,16,64"
    if args.load and shutil.which("hey") is None:
        sys.exit("--load hey needs hey on PATH (Debian/Ubuntu: apt-get install hey; `bash install.sh test` does it)")
    stub_port, gw_port, traced_port, sink_port = free_port(), free_port(), free_port(), free_port()
    bare_port, keyed_port = free_port(), free_port()
    models = (f"models:\n  - {{name: up, backend: openai, base_url: 'http://127.0.0.1:{stub_port}/v1', "
              f"model: stub, tokenizer: cl100k_base}}\n")
    configs = {"off": models, "on": models + f"telemetry: {{traces: true, endpoint: "
                                              f"'http://127.0.0.1:{sink_port}/v1/traces'}}\n",
               # a budget that never runs out, so every request is held, settled and charged
               "keyed": models + f"keys: [{{key: {BENCH_KEY}, name: bench, budget: {{tokens_per_day: 1000000000000, "
                                 f"usd_per_day: 1000000}}}}]\n"}
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
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.upstream_stub", "--port", str(stub_port)],
                              cwd=ROOT),
             off_gateway]
    if args.tracing:
        on_gateway = gateway(traced_port, files["on"])
        procs += [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--otlp-sink", str(sink_port)]),
                  on_gateway]
    if args.load:
        procs += [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--bare-proxy", str(bare_port),
                                    f"http://127.0.0.1:{stub_port}/v1"]),
                  gateway(keyed_port, files["keyed"])]
    rows = []
    try:
        wait_up(f"http://127.0.0.1:{stub_port}/v1/models")
        wait_up(f"http://127.0.0.1:{gw_port}/health")
        if args.load:
            wait_up(f"http://127.0.0.1:{bare_port}/health")
            wait_up(f"http://127.0.0.1:{keyed_port}/health")
            ports = dict(zip(ENDPOINTS, (stub_port, bare_port, gw_port, keyed_port), strict=True))
            pids = dict(zip(ENDPOINTS, (procs[0].pid, procs[-2].pid, procs[1].pid, procs[-1].pid), strict=True))
            rows = load_hey(ports, pids, [int(x) for x in args.levels.split(",")], args.seconds, args.rounds)
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print_load(rows, args.seconds, args.rounds)
            return
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
