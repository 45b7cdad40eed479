"""Engine throughput: tokenomy over HTTP vs llama-cpp-python's high-level API serving one request at a time.

For each concurrency (1, 4, 8, 16), the same chat requests with 128-token outputs (EOS suppressed by logit_bias in
both systems, so every answer is exactly 128 tokens) go to (a) `tokenomy serve` on the embedded SmolLM2 through
its HTTP API and (b) `Llama.create_chat_completion`, sequentially, as a server without batching would serve them
(a request's TTFT there includes waiting for the ones before it). Also: warm vs cold TTFT for a ~1,000-token
system prompt that an earlier request already sent, and single-request latency through HTTP vs in-process.

    .venv/bin/python bench/engine_throughput.py [--json] [--levels 1,4,8,16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

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
    from tokenomy.engine.runner import ModelRunner, RunnerConfig
    from tokenomy.models import resolve_gguf

    r = ModelRunner(str(resolve_gguf(MODEL)), RunnerConfig(n_ctx=256, n_seq_max=1, n_batch=32))
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


async def level_http(url: str, c: int, n_req: int, tokens: int, bias: dict) -> dict[str, float]:
    sem = asyncio.Semaphore(c)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        async def run(i: int) -> tuple[float, float, int]:
            async with sem:
                msgs = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
                return await one_http(client, url, msgs, tokens, bias)
        t0 = time.perf_counter()
        res = await asyncio.gather(*[run(i) for i in range(n_req)])
        wall = time.perf_counter() - t0
    ttfts = [r[0] for r in res]
    return {"tok_s": sum(r[2] for r in res) / wall, "ttft_p50": pct(ttfts, 0.5), "ttft_p95": pct(ttfts, 0.95),
            "tokens": sum(r[2] for r in res), "wall_s": wall}


def baseline_runs(n_req: int, tokens: int, bias: dict, threads: int) -> list[tuple[float, float, int]]:
    """Sequential high-level llama-cpp-python: (ttft, duration, tokens) per request."""
    from llama_cpp import Llama

    from tokenomy.models import resolve_gguf

    llm = Llama(str(resolve_gguf(MODEL)), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    out = []
    for i in range(n_req):
        msgs = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        t0 = time.perf_counter()
        ttft, n = None, 0
        for chunk in llm.create_chat_completion(msgs, max_tokens=tokens, temperature=0, stream=True,
                                                logit_bias={int(k): v for k, v in bias.items()}):
            if chunk["choices"][0]["delta"].get("content"):
                n += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
        out.append((ttft or float("nan"), time.perf_counter() - t0, n))
    del llm
    return out


def baseline_level(runs: list[tuple[float, float, int]], c: int, n_req: int) -> dict[str, float]:
    """Requests arrive c at a time (a closed loop of c clients) at a server that serves one at a time."""
    clock, ttfts, total = 0.0, [], 0
    free_at = [0.0] * c                     # when each client sends its next request
    for i in range(n_req):
        ttft, dur, n = runs[i % len(runs)]
        k = min(range(c), key=free_at.__getitem__)
        arrival = free_at[k]
        start = max(clock, arrival)
        ttfts.append(start - arrival + ttft)
        clock = start + dur
        free_at[k] = clock
        total += n
    return {"tok_s": total / clock, "ttft_p50": pct(ttfts, 0.5), "ttft_p95": pct(ttfts, 0.95)}


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("tokenomy serve did not start")


async def prefix_ttft(url: str) -> dict[str, float]:
    system = ("You are the support assistant of a large online bookshop. Be precise and polite. " * 70).strip()
    async with httpx.AsyncClient(timeout=600) as client:
        async def ask(q: str) -> float:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
            return (await one_http(client, url, msgs, 8, {}))[0]
        cold = await ask("Do you ship abroad?")
        warm = await ask("Can I return a book?")
    return {"cold_ttft_s": cold, "warm_ttft_s": warm, "ratio": warm / cold}


def in_process_latency(tokens: int, bias: dict, repeats: int) -> float:
    from tokenomy.engine.engine import Engine
    from tokenomy.engine.sampling_params import SamplingParams
    from tokenomy.models import resolve_gguf

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
    ap.add_argument("--levels", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    console = Console(stderr=True)
    levels = [int(x) for x in args.levels.split(",")]
    bias = eog_bias()
    url = f"http://127.0.0.1:{args.port}/v1"
    results: dict[str, Any] = {"levels": [], "tokens": args.tokens}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("baseline: llama-cpp-python, one at a time", total=None)
        base_runs = baseline_runs(8, args.tokens, bias, args.threads)
        progress.update(task, description="tokenomy: starting server")
        proc = start_server(args.port)
        try:
            asyncio.run(level_http(url, 2, 2, 8, bias))                 # warm-up
            for c in levels:
                progress.update(task, description=f"tokenomy: concurrency {c}")
                n_req = 4 if c == 1 else 2 * c
                t = asyncio.run(level_http(url, c, n_req, args.tokens, bias))
                b = baseline_level(base_runs, c, n_req)
                results["levels"].append({"concurrency": c, "requests": n_req, "tokenomy": t, "baseline": b,
                                          "ratio": t["tok_s"] / b["tok_s"]})
            progress.update(task, description="prefix: warm vs cold TTFT")
            results["prefix"] = asyncio.run(prefix_ttft(url))
            progress.update(task, description="single request over HTTP")
            results["http_latency_s"] = http_latency(url, args.tokens, bias, 3)
        finally:
            proc.terminate()
            proc.wait(30)
        progress.update(task, description="single request in-process")
        results["inproc_latency_s"] = in_process_latency(args.tokens, bias, 3)
    results["http_overhead_ratio"] = results["http_latency_s"] / results["inproc_latency_s"]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    table = Table(title=f"Aggregate output tok/s, {args.tokens}-token answers, SmolLM2-135M, {args.threads} threads")
    for col in ("concurrency", "tokenomy tok/s", "baseline tok/s", "ratio", "tokenomy TTFT p50/p95 s",
                "baseline TTFT p50/p95 s"):
        table.add_column(col, justify="right")
    for lv in results["levels"]:
        t, b = lv["tokenomy"], lv["baseline"]
        table.add_row(str(lv["concurrency"]), f"{t['tok_s']:.1f}", f"{b['tok_s']:.1f}", f"{lv['ratio']:.2f}x",
                      f"{t['ttft_p50']:.2f} / {t['ttft_p95']:.2f}", f"{b['ttft_p50']:.2f} / {b['ttft_p95']:.2f}")
    out = Console()
    out.print(table)
    p = results["prefix"]
    out.print(f"~1,000-token shared system prompt: cold TTFT {p['cold_ttft_s']:.2f}s, warm {p['warm_ttft_s']:.2f}s,"
              f" ratio {p['ratio']:.3f}")
    out.print(f"single request ({args.tokens} tokens): HTTP {results['http_latency_s']:.2f}s, in-process "
              f"{results['inproc_latency_s']:.2f}s, ratio {results['http_overhead_ratio']:.3f}")


if __name__ == "__main__":
    main()
