"""The load generator: sends a workload's requests to one OpenAI-compatible endpoint, streaming, and records what
happened to each (`results.RequestResult`).

Three shapes of load: closed loop (a fixed number of requests in flight; a new one is sent when one finishes),
open loop (Poisson arrivals at a rate, seeded, sent whether or not earlier ones have finished, so queueing shows)
and trace replay (the arrival times of a workload file). A run stops after a number of requests or, with a
duration, sends no new request after that many seconds and waits for those in flight. Every request ends as a
record: HTTP errors, resets, timeouts and streams that end early are failed records with their message.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tokenomy.tools.bench.results import RequestResult
from tokenomy.tools.bench.workload import Request

NO_CACHE = {"cache-control": "no-cache, no-store"}   # tokenomy's response caches stay out of an engine measurement


@dataclass(frozen=True)
class Target:
    """An endpoint: base URL up to and including /v1, the model to ask for, an optional bearer key."""
    base_url: str
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class Options:
    """What every request body gets unless the workload's body sets it (max_tokens, temperature)."""
    max_tokens: int | None = 128
    temperature: float | None = 0.0
    ignore_eos: bool = False          # `ignore_eos: true`, a body field tokenomy, llama-server and vLLM accept
    response_cache: bool = False      # False: send cache-control: no-cache, no-store
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Load:
    """closed: `value` requests in flight; open: Poisson arrivals at `value` per second; trace: the workload's
    own arrival times (`value` unused)."""
    kind: str
    value: float = 0.0

    @property
    def label(self) -> str:
        if self.kind == "closed":
            return f"concurrency {self.value:g}"
        return f"rate {self.value:g}/s" if self.kind == "open" else "trace"


def poisson_arrivals(rate: float, n: int, seed: int) -> list[float]:
    """n send times (seconds from the start) of a Poisson process at `rate` per second: the first at 0, then
    exponential gaps of mean 1/rate drawn from random.Random(seed)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def prepare(body: dict[str, Any], target: Target, opts: Options) -> dict[str, Any]:
    """The body as sent: the target's model, streaming with usage, and the run's defaults where the body is silent."""
    out = dict(body)
    out["model"] = target.model
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    if opts.max_tokens is not None:
        out.setdefault("max_tokens", opts.max_tokens)
    if opts.temperature is not None:
        out.setdefault("temperature", opts.temperature)
    if opts.ignore_eos:
        out["ignore_eos"] = True
    return out


def _headers(target: Target, opts: Options) -> dict[str, str]:
    headers = {} if opts.response_cache else dict(NO_CACHE)
    if target.api_key:
        headers["authorization"] = f"Bearer {target.api_key}"
    return headers


def _error_message(raw: bytes, status: int) -> str:
    try:
        msg = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = raw.decode("utf-8", "replace").strip()
    return f"HTTP {status}: {msg[:200]}" if msg else f"HTTP {status}"


async def send(client: httpx.AsyncClient, target: Target, request: Request, opts: Options,
               t_run: float) -> RequestResult:
    """Send one request, streaming, and record its timings and token counts; never raises for a failed request."""
    body = prepare(request.body, target, opts)
    url = target.base_url + ("/chat/completions" if request.chat else "/completions")
    t0 = time.perf_counter()
    rec = RequestResult(start=t0 - t_run)
    last: float | None = None
    chunks, finished = 0, False
    try:
        async with client.stream("POST", url, json=body, headers=_headers(target, opts)) as resp:
            if resp.status_code != 200:
                rec.error = _error_message(await resp.aread(), resp.status_code)
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    rec.error = f"error in stream: {msg}"[:200]
                    return rec
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content") or choice.get("text")
                    if text:
                        now = time.perf_counter()
                        if last is None:
                            rec.ttft = now - t0
                        else:
                            rec.itl.append(now - last)
                        last = now
                        chunks += 1
                    if choice.get("finish_reason"):
                        finished = True
                usage = chunk.get("usage")
                if usage:
                    rec.usage = True
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
    except httpx.TimeoutException as e:
        rec.error = f"timeout after {opts.timeout_s:g}s ({type(e).__name__})"
        return rec
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"[:200] if str(e) else type(e).__name__
        return rec
    except (ValueError, TypeError, AttributeError) as e:     # a chunk that is not the JSON of a stream chunk
        rec.error = f"bad stream chunk: {type(e).__name__}: {e}"[:200]
        return rec
    if not finished:
        rec.error = "stream ended before a finish_reason or [DONE]"
        return rec
    rec.e2el = time.perf_counter() - t0
    if rec.ttft is None:                 # an empty answer: first token and end coincide
        rec.ttft = rec.e2el
    if not rec.usage:
        rec.output_tokens = chunks
    rec.ok = True
    return rec


async def run(target: Target, requests: list[Request], load: Load, opts: Options, n_requests: int | None = None,
              duration_s: float | None = None, seed: int = 0,
              on_record: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float]:
    """Run one load against one target: (records in completion order, seconds from first send to last end).
    Request i is requests[i % len(requests)] (trace replay sends the file once, in arrival order). Stops after
    `n_requests`, or sends nothing new after `duration_s`; at least one of the two must be given, except for
    a trace."""
    if n_requests is None and duration_s is None and load.kind != "trace":
        raise ValueError("give n_requests or duration_s")
    records: list[RequestResult] = []

    def done(rec: RequestResult) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    # a fresh connection per request, for every server alike: llama-server closes a kept-alive connection after
    # a few requests, and a request racing that close would fail with "Server disconnected"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(opts.timeout_s), limits=limits) as client:
        t_run = time.perf_counter()

        def elapsed() -> float:
            return time.perf_counter() - t_run

        if load.kind == "closed":
            counter = iter(range(n_requests if n_requests is not None else 1 << 62))

            async def worker() -> None:
                for i in counter:
                    if duration_s is not None and elapsed() >= duration_s:
                        return
                    done(await send(client, target, requests[i % len(requests)], opts, t_run))

            await asyncio.gather(*(worker() for _ in range(max(1, int(load.value)))))
        else:
            if load.kind == "open":
                n = n_requests if n_requests is not None else int(load.value * duration_s * 3 + 100)
                times = poisson_arrivals(load.value, n, seed)
                schedule = [(t, requests[i % len(requests)]) for i, t in enumerate(times)]
            else:
                ordered = sorted(requests, key=lambda r: r.arrival_s or 0.0)
                schedule = [(r.arrival_s or 0.0, r) for r in ordered][:n_requests]
            if duration_s is not None:
                schedule = [(t, r) for t, r in schedule if t < duration_s]

            async def one(request: Request) -> None:
                done(await send(client, target, request, opts, t_run))

            tasks = []
            for t, request in schedule:
                wait = t - elapsed()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(request)))
            await asyncio.gather(*tasks)
        return records, elapsed()
