"""The batch lane: interactive Poisson traffic alone, then the same traffic with a batch running, side by side.

    .venv/bin/python bench/batch_lane.py [--seconds 60] [--rate 1] [--batch 500] [--tokens 16] [--threads 1]

One in-process tokenomy (embedded SmolLM2, response caches off) on a loopback port. Run 1: streamed chat requests
arriving as a Poisson process for --seconds. Run 2: the same arrivals (same seed) while a --batch-request batch
runs through the Batch API. Reported: interactive TTFT p50/p95 and TPOT p50 in both runs, the batch's completion
time and completion tokens per second, and the engine's busy share (time inside steps / wall time): alone over the
interactive window, with the batch over the part of it in which the batch lane had work (from its first item's
arrival to its last item's end, by the ledger), since a batch that ends early leaves the rest of the window to
interactive traffic alone. The batch's share of what the engine had left over = (busy with batch - busy alone) /
(1 - busy alone). Targets (issue #22): TTFT p95 within 1.2x, batch share at least 0.7.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from tokenomy.api.app import create_app  # noqa: E402
from tokenomy.config import Config  # noqa: E402
from tokenomy.gateway import Gateway  # noqa: E402

MODEL = "smollm2-135m-instruct"
TOPICS = ["the sea", "a forest", "coffee", "trains", "the moon", "bread", "rain", "a cat", "music", "snow"]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Busy:
    """Engine time inside steps, from the engine's per-step callback: when each step ended (wall clock, as the
    ledger's times) and how long it ran."""

    def __init__(self, gateway: Gateway) -> None:
        self.steps: list[tuple[float, float]] = []
        for _, engine in gateway.engines():
            engine.stats.on_step.append(self.on_step)

    def on_step(self, n_tokens: int, n_seqs: int, dt: float) -> None:
        self.steps.append((time.time(), dt))

    def share(self, start: float, end: float) -> float:
        """The share of [start, end] spent inside steps (a step that straddles an end counts for its part inside)."""
        inside = sum(max(0.0, min(t, end) - max(t - dt, start)) for t, dt in self.steps)
        return inside / (end - start)


async def interactive(base: str, seconds: float, rate: float, tokens: int, seed: int) -> list[dict[str, float]]:
    rng = random.Random(seed)
    results: list[dict[str, float]] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": MODEL, "stream": True, "max_tokens": tokens, "temperature": 0,
                "messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]} ({i})."}]}
        t0 = time.perf_counter()
        first, n = None, 0
        async with client.stream("POST", base + "/chat/completions", json=body) as r:
            async for raw in r.aiter_lines():
                if not raw.startswith("data: ") or raw == "data: [DONE]":
                    continue
                chunk = json.loads(raw[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = first or time.perf_counter()
                    n += 1
        end = time.perf_counter()
        if first is not None:
            results.append({"ttft": first - t0, "tpot": (end - first) / (n - 1) if n > 1 else float("nan")})

    async with httpx.AsyncClient(timeout=300) as client:
        tasks, t, start, i = [], 0.0, time.perf_counter(), 0
        while True:
            t += rng.expovariate(rate)
            if t > seconds:
                break
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client, i)))
            i += 1
        await asyncio.gather(*tasks)
    return results


def submit_batch(base: str, n: int, tokens: int) -> str:
    import openai

    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
    lines = [json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": MODEL, "max_tokens": tokens, "temperature": 0, "messages": [
                             {"role": "user", "content": f"Classify the sentiment of: I like {TOPICS[i % 10]} #{i}"}]}})
             for i in range(n)]
    f = client.files.create(file=("b.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {"n": len(rows), "ttft_p50": pct([r["ttft"] for r in rows], 0.5),
            "ttft_p95": pct([r["ttft"] for r in rows], 0.95),
            "tpot_p50": statistics.median([r["tpot"] for r in rows if r["tpot"] == r["tpot"]] or [float("nan")])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=1.0, help="interactive arrivals per second (Poisson)")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens of every request")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="engine threads (1 on a shared machine: docs/engine.md)")
    ap.add_argument("--step-tokens", type=int, default=None, help="engine.batch_step_tokens (default: the config's)")
    ap.add_argument("--step-ms", type=float, default=None, help="engine.batch_step_ms (0: steps bounded by "
                    "batch_step_tokens alone; default: the config's)")
    ap.add_argument("--concurrency", type=int, default=None, help="batch.concurrency (default: the config's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="tokenomy-batch-lane-")
    cfg = Config.model_validate({"cache": {"path": tmp + "/cache", "exact": {"enabled": False},
                                           "semantic": {"enabled": False}},
                                 "engine": {"n_threads": args.threads,
                                            **({"batch_step_tokens": args.step_tokens} if args.step_tokens else {}),
                                            **({"batch_step_ms": args.step_ms} if args.step_ms is not None else {})},
                                 "ledger": f"sqlite:///{tmp}/ledger.db",
                                 "batch": {"poll_s": 0.1, **({"concurrency": args.concurrency}
                                                             if args.concurrency else {})}})
    gateway = Gateway(cfg)
    busy = Busy(gateway)
    port = 18000 + os.getpid() % 1000
    server = uvicorn.Server(uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}/v1"
    asyncio.run(interactive(base, 3, 2, args.tokens, 1))       # warm-up

    w0 = time.time()
    alone = asyncio.run(interactive(base, args.seconds, args.rate, args.tokens, args.seed))
    busy_alone = busy.share(w0, time.time())

    t_batch = time.time()
    batch_id = submit_batch(base, args.batch, args.tokens)
    w0 = time.time()
    mixed = asyncio.run(interactive(base, args.seconds, args.rate, args.tokens, args.seed))
    w1 = time.time()
    store = gateway.batches
    while (done := store.get_batch(batch_id, None))["status"] not in ("completed", "failed", "cancelled"):
        time.sleep(0.2)
    end = done["completed_at"] or done["failed_at"] or done["cancelled_at"]
    batch_s = max(end - t_batch, 1.0)          # the batch's own end (whole seconds), not when this loop saw it
    gateway.ledger.flush()
    rows = [r for r in gateway.ledger.query() if r.batch == batch_id]
    batch_tokens = sum(r.completion_tokens for r in rows)
    server.should_exit = True
    if not rows:
        sys.exit(f"batch {batch_id} ran no request ({done['status']})")
    # the part of the interactive window in which the batch lane had work: its items ran from the first one's
    # arrival to the last one's end
    lane = (max(w0, min(r.ts for r in rows)), min(w1, max(r.ts + (r.e2e_s or 0.0) for r in rows)))
    busy_mixed = busy.share(*lane)

    a, m = summary(alone), summary(mixed)
    share = (busy_mixed - busy_alone) / (1 - busy_alone) if busy_alone < 1 else float("nan")
    result = {"alone": a, "with_batch": m, "busy_alone": busy_alone, "busy_with_batch": busy_mixed,
              "batch_lane_s": lane[1] - lane[0], "window_s": w1 - w0,
              "batch": {"requests": len(rows), "ok": sum(r.status == 200 for r in rows), "seconds": batch_s,
                        "completion_tokens": batch_tokens, "tok_s": batch_tokens / batch_s},
              "batch_share_of_leftover": share, "ttft_p95_ratio": m["ttft_p95"] / a["ttft_p95"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"interactive: Poisson {args.rate}/s for {args.seconds:g} s, max_tokens {args.tokens}; "
          f"batch: {args.batch} requests, max_tokens {args.tokens}")
    print(f"{'':22}{'alone':>10}{'with batch':>12}{'ratio':>8}")
    for k, label in (("n", "interactive requests"), ("ttft_p50", "TTFT p50 s"), ("ttft_p95", "TTFT p95 s"),
                     ("tpot_p50", "TPOT p50 s")):
        ratio = m[k] / a[k] if a[k] else float("nan")
        print(f"{label:22}{a[k]:>10.3f}{m[k]:>12.3f}{ratio:>7.2f}x")
    print(f"{'engine busy share':22}{busy_alone:>10.3f}{busy_mixed:>12.3f}   (with batch: over the "
          f"{result['batch_lane_s']:.1f} s of the {result['window_s']:.1f} s window the batch lane had work)")
    bt = result["batch"]
    print(f"batch: {bt['ok']}/{bt['requests']} ok in {bt['seconds']:.1f} s, {bt['completion_tokens']} completion "
          f"tokens, {bt['tok_s']:.1f} tok/s")
    print(f"batch share of leftover capacity: {share:.2f} (target >= 0.70); TTFT p95 ratio "
          f"{result['ttft_p95_ratio']:.2f}x (target <= 1.20x)")


if __name__ == "__main__":
    main()
