"""Engine throughput: tokenomy over HTTP vs llama.cpp's own C++ server (`llama-server`), side by side in one run.

Both are built from the same llama.cpp (the sources vendored in the pinned llama-cpp-python sdist) with the same
CPU flags: `bench/llama_server_build.py` builds and caches llama-server. For each concurrency, the same chat
requests with 128-token answers (EOS suppressed by logit_bias, so every answer is exactly 128 tokens) go to each
server through the same client, rounds alternating which server goes first. llama-server runs with one slot per
concurrent request (`-np`) and continuous batching, its defaults otherwise. Also: a ~1,000-token system prompt
shared by 8 concurrent requests (prompt tokens each server computed), and one request over HTTP vs in-process.

    .venv/bin/python bench/engine_throughput.py [--json] [--levels 1,8,16] [--tokens 128] [--rounds 2]
        [--layouts unified,streams] [--workload short|grounded] [--no-llama-server]

`--workload grounded` sends the first user turn of each grounded prompt (../shared/data/grounded/dev.jsonl, 230 to
1,551 tokens) instead of the short questions. The layouts `default` (the engine's defaults: KV streams that start
at kv_start_cells and grow) and `full` (the same with every stream at the whole window from the start, as before
issue 51) compare an engine's growing KV with the one allocated whole.
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
import threading
import time
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from servers import wait_up  # noqa: E402  (bench/servers.py, beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODEL = "smollm2-135m-instruct"
NO_CACHE = {"cache-control": "no-cache, no-store"}   # measure the engine, not the response cache
QUESTIONS = ["Describe the ocean.", "Explain how rain forms.", "Tell a story about a cat.", "Describe a city.",
             "Explain photosynthesis.", "Write about mountains.", "Describe a forest.", "Tell me about bread.",
             "Describe winter.", "Explain what a computer does.", "Write about the moon.", "Describe a river.",
             "Tell a story about a robot.", "Explain how bees make honey.", "Describe a market.",
             "Write about the wind."]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def eog_bias() -> dict[str, float]:
    from tokenomy.engine.vocab import Vocab
    from tokenomy.models.catalog import resolve_gguf

    r = Vocab(str(resolve_gguf(MODEL)), vocab_only=True)
    bias = {str(t): -100.0 for t in sorted(r.eog)}
    r.close()
    return bias


async def one_http(client: httpx.AsyncClient, url: str, messages: list[dict], tokens: int, bias: dict
                   ) -> tuple[float, float, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": bias}
    t0 = time.perf_counter()
    ttft, n = None, 0
    async with client.stream("POST", url + "/chat/completions", json=body, headers=NO_CACHE) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    return ttft or float("nan"), time.perf_counter() - t0, n


def grounded_messages() -> list[list[dict]]:
    from tokenomy.tools.bench.workload import DEFAULT_GROUNDED, grounded

    path = os.environ.get("TOKENOMY_SHARED_DATA")
    opts = {"path": os.path.join(path, "grounded", "dev.jsonl") if path else os.path.join(ROOT, DEFAULT_GROUNDED)}
    return [r.body["messages"] for r in grounded(opts, None)]   # type: ignore[arg-type]


PROMPTS: list[list[dict]] = [[{"role": "user", "content": q}] for q in QUESTIONS]


async def level_http(url: str, c: int, n_req: int, tokens: int, bias: dict) -> dict[str, float]:
    sem = asyncio.Semaphore(c)
    # a fresh connection per request, for both servers alike: llama-server (cpp-httplib) closes a kept-alive
    # connection after a few requests, and a request racing that close fails with "Server disconnected"
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64,
                                                                 max_keepalive_connections=0)) as client:
        async def run(i: int) -> tuple[float, float, int]:
            async with sem:
                return await one_http(client, url, PROMPTS[i % len(PROMPTS)], tokens, bias)
        t0 = time.perf_counter()
        res = await asyncio.gather(*[run(i) for i in range(n_req)])
        wall = time.perf_counter() - t0
    ttfts = [r[0] for r in res]
    return {"tok_s": sum(r[2] for r in res) / wall, "ttft_p50": pct(ttfts, 0.5), "ttft_p95": pct(ttfts, 0.95),
            "tokens": sum(r[2] for r in res), "wall_s": wall}


def start_llama_server(port: int, slots: int, threads: int) -> subprocess.Popen:
    from bench.llama_server_build import build
    from tokenomy.models.catalog import resolve_gguf

    binary = build()
    proc = subprocess.Popen([str(binary), "-m", str(resolve_gguf(MODEL)), "--port", str(port), "-np", str(slots),
                             "-c", str(2048 * slots), "-t", str(threads), "-tb", str(threads), "--cont-batching",
                             "--no-webui"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_up(f"http://127.0.0.1:{port}/health", [proc], 180)
    return proc


LAYOUTS = {   # tokenomy's KV layouts (docs/engine.md, "KV streams"); llama-server gets 2,048 cells per slot
    "unified": "engine: {kv_unified: true}\n",
    "streams": "engine: {kv_unified: false, max_running: 16, max_retired: 16, n_ctx: 65536}\n",
    "default": "engine: {}\n",
    "full": "engine: {kv_start_cells: null}\n",
    "prompts": "engine: {retire_outputs: false}\n",     # finished answers not kept (the default before 2026-12-06)
}


def start_server(port: int, layout: str, tmp: str) -> subprocess.Popen:
    """`tokenomy serve` with the layout's engine config; its log goes to $TMPDIR/engine_throughput_LAYOUT.log."""
    cfg = os.path.join(tmp, f"{layout}.yaml")
    with open(cfg, "w") as f:
        f.write(LAYOUTS[layout] + "ledger: null\n")
    log = open(os.path.join(tempfile.gettempdir(), f"engine_throughput_{layout}.log"), "w")   # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "--config", cfg],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "TOKENOMY_HOME": tmp})   # no state from, or for, another run
    wait_up(f"http://127.0.0.1:{port}/health", [proc], 180)
    return proc


async def shared_prefix(url: str, n: int = 8) -> dict[str, float]:
    """n concurrent requests behind one ~1,000-token system prompt: prompt tokens the server computed."""
    system = ("You are the support assistant of a large online bookshop. Be precise and polite. " * 70).strip()
    async with httpx.AsyncClient(timeout=600) as client:
        async def ask(q: str) -> tuple[int, int]:
            body = {"model": MODEL, "messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": q}],
                    "max_tokens": 8, "temperature": 0}
            r = await client.post(url + "/chat/completions", json=body, headers=NO_CACHE)
            r.raise_for_status()
            data = r.json()
            usage = data["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            computed = (data.get("timings") or {}).get("prompt_n", usage["prompt_tokens"] - cached)
            return usage["prompt_tokens"], computed
        t0 = time.perf_counter()
        res = await asyncio.gather(*[ask(f"Question {i}: do you ship to country {i}?") for i in range(n)])
        wall = time.perf_counter() - t0
    return {"requests": n, "prompt_tokens": sum(r[0] for r in res), "computed": sum(r[1] for r in res),
            "wall_s": wall}


def in_process_latency(tokens: int, bias: dict, repeats: int) -> float:
    from tokenomy.engine.engine import Engine
    from tokenomy.engine.sampling_params import SamplingParams
    from tokenomy.models.catalog import resolve_gguf

    engine = Engine(str(resolve_gguf(MODEL))).start()
    times = []
    for _ in range(repeats):
        done = threading.Event()
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[0]}])
        t0 = time.perf_counter()
        engine.submit(ids, SamplingParams(max_tokens=tokens, temperature=0,
                                          logit_bias={int(k): v for k, v in bias.items()}),
                      lambda ev, done=done: ev.finish_reason and done.set())
        done.wait()
        times.append(time.perf_counter() - t0)
    engine.stop()
    return statistics.median(times)


def http_latency(url: str, tokens: int, bias: dict, repeats: int) -> float:
    times = []
    with httpx.Client(timeout=600) as c:
        for _ in range(repeats):
            body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": tokens,
                    "temperature": 0, "logit_bias": bias}
            t0 = time.perf_counter()
            c.post(url + "/chat/completions", json=body, headers=NO_CACHE).raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--layouts", default="unified,streams", help="tokenomy KV layouts to run, each its own server")
    ap.add_argument("--workload", choices=["short", "grounded"], default="short")
    ap.add_argument("--no-llama-server", action="store_true", help="tokenomy's layouts only (ratios between them)")
    ap.add_argument("--levels-only", action="store_true", help="skip the shared prefix and the latency measures")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.workload == "grounded":
        PROMPTS[:] = grounded_messages()
    console = Console(stderr=True)
    levels = [int(x) for x in args.levels.split(",")]
    layouts = args.layouts.split(",")
    bias = eog_bias()
    urls = {f"tokenomy {lay}": f"http://127.0.0.1:{args.port + 2 + i}/v1" for i, lay in enumerate(layouts)}
    if not args.no_llama_server:
        urls["llama-server"] = f"http://127.0.0.1:{args.port + 1}/v1"
    baseline = "llama-server" if not args.no_llama_server else next(iter(urls))
    results: dict[str, Any] = {"levels": [], "tokens": args.tokens, "rounds": args.rounds, "layouts": LAYOUTS,
                               "workload": args.workload, "baseline": baseline}
    with Progress(console=console, transient=True) as progress, tempfile.TemporaryDirectory() as tmp:
        task = progress.add_task("starting llama-server (building it first if needed)", total=None)
        procs = [] if args.no_llama_server else [start_llama_server(args.port + 1, max(levels), args.threads)]
        try:
            for i, lay in enumerate(layouts):
                progress.update(task, description=f"starting tokenomy serve ({lay} KV)")
                procs.append(start_server(args.port + 2 + i, lay, tmp))
            for url in urls.values():
                asyncio.run(level_http(url, 2, 2, 8, bias))                 # warm-up
            names = list(urls)
            for c in levels:
                n_req = 4 if c == 1 else 2 * c
                runs: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
                for r in range(args.rounds):
                    order = names[r % len(names):] + names[:r % len(names)]     # each goes first in turn
                    for name in order:
                        progress.update(task, description=f"{name}: concurrency {c}, round {r + 1}")
                        runs[name].append(asyncio.run(level_http(urls[name], c, n_req, args.tokens, bias)))
                row: dict[str, Any] = {"concurrency": c, "requests": n_req}
                for name, rs in runs.items():
                    row[name] = {k: statistics.median(x[k] for x in rs) for k in ("tok_s", "ttft_p50", "ttft_p95")}
                    row[name]["rounds_tok_s"] = [x["tok_s"] for x in rs]
                for name in names:
                    row[name]["ratio"] = row[name]["tok_s"] / row[baseline]["tok_s"]
                results["levels"].append(row)
            if args.levels_only:
                if args.json:
                    print(json.dumps(results, indent=2))
                else:
                    print_levels(results, urls, args)
                return
            progress.update(task, description="shared 1,000-token prefix, 8 concurrent requests")
            results["shared_prefix"] = {name: asyncio.run(shared_prefix(url)) for name, url in urls.items()}
            progress.update(task, description="single request over HTTP")
            first = names[0]
            results["http_latency_s"] = http_latency(urls[first], args.tokens, bias, 3)
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
        progress.update(task, description="single request in-process")
        results["inproc_latency_s"] = in_process_latency(args.tokens, bias, 3)
    results["http_overhead_ratio"] = results["http_latency_s"] / results["inproc_latency_s"]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    out = print_levels(results, urls, args)
    for name, p in results["shared_prefix"].items():
        out.print(f"{name}: 8 requests behind one ~1,000-token system prompt: {p['prompt_tokens']} prompt tokens, "
                  f"{p['computed']} computed, {p['wall_s']:.2f}s")
    out.print(f"single request ({args.tokens} tokens, {names[0]}): HTTP {results['http_latency_s']:.2f}s, in-process "
              f"{results['inproc_latency_s']:.2f}s, ratio {results['http_overhead_ratio']:.3f}")


def print_levels(results: dict[str, Any], urls: dict[str, str], args: argparse.Namespace) -> Console:
    table = Table(title=f"Aggregate output tok/s, {args.tokens}-token answers, SmolLM2-135M, {args.threads} threads, "
                        f"median of {args.rounds} alternating rounds, {args.workload} prompts; ratio to "
                        f"{results['baseline']}")
    table.add_column("concurrency", justify="right")
    for name in urls:
        table.add_column(f"{name} tok/s (ratio)", justify="right")
        table.add_column(f"{name} TTFT p50/p95 s", justify="right")
    for lv in results["levels"]:
        cells = [str(lv["concurrency"])]
        for name in urls:
            t = lv[name]
            cells += [f"{t['tok_s']:.1f} ({t['ratio']:.2f}x)", f"{t['ttft_p50']:.2f} / {t['ttft_p95']:.2f}"]
        table.add_row(*cells)
    out = Console()
    out.print(table)
    return out


if __name__ == "__main__":
    main()
