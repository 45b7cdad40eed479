"""Soak: mixed traffic against a real `tokenomy serve` for a fixed time, watching memory, descriptors and the engine.

Two tenants' keys send, at a bounded concurrency: plain answers, streams read to the end, streams dropped after a
few chunks, repeated questions (exact-cache hits), and bad inputs (broken JSON, a lone surrogate, logit_bias off
the vocabulary, an unknown model, no key). Every `--every` seconds it samples the gateway's and the engine's RSS
and open descriptors and the engine's running sequences. It fails (exit 1) on any 5xx, or when the gateway's or
the engine's RSS at the end is more than 10% above its value after warm-up.

    .venv/bin/python bench/soak.py --minutes 30 [--concurrency 4] [--json]
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
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
KEYS = {"a": "sk-soak-a", "b": "sk-soak-b"}
QUESTIONS = ["What is rain?", "Name a color.", "Say hello.", "What is 2+2?", "Name a fruit.", "What is snow?"]
GROWTH_LIMIT = 1.10


def config(dir_: Path) -> Path:
    path = dir_ / "soak.yaml"
    path.write_text(json.dumps({
        "engine": {"n_ctx": 4096, "max_running": 8, "max_retired": 8},
        "cache": {"path": str(dir_ / "cache"), "semantic": {"enabled": False}},
        "ledger": f"sqlite:///{dir_ / 'ledger.db'}",
        "keys": [{"key": KEYS["a"], "tenant": "a"}, {"key": KEYS["b"], "tenant": "b"}],
    }))
    return path


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def one(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random) -> int:
    key = KEYS[rng.choice("ab")]
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                            "max_tokens": 12, "temperature": 0}
    if kind == "bad-json":
        return (await client.post(url, content=b'{"model": ', headers=headers)).status_code
    if kind == "surrogate":
        raw = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}' % MODEL.encode()
        return (await client.post(url, content=raw, headers=headers)).status_code
    if kind == "bias":
        body["logit_bias"] = {"60000": 1}
    elif kind == "unknown-model":
        body["model"] = f"nope-{rng.randrange(10**6)}"
    elif kind == "no-key":
        headers.pop("authorization")
    elif kind == "fresh":
        body["messages"][0]["content"] += f" ({rng.randrange(10**9)})"    # never cached
        body["temperature"] = 0.8
    if kind in ("stream", "drop"):
        body["stream"] = True
        async with client.stream("POST", url, json=body, headers=headers) as r:
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data:")
                if kind == "drop" and n >= 3:
                    break                        # leave mid-stream: the connection closes
            return r.status_code
    return (await client.post(url, json=body, headers=headers)).status_code


KINDS = ["plain"] * 4 + ["fresh"] * 3 + ["stream"] * 3 + ["drop"] * 2 + ["bias", "bad-json", "surrogate",
                                                                        "unknown-model", "no-key"]


async def traffic(base: str, seconds: float, concurrency: int, codes: Counter, stop: asyncio.Event) -> None:
    rng = random.Random(7)
    url = base + "/v1/chat/completions"
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        async def worker(i: int) -> None:
            wrng = random.Random(rng.random() + i)
            while time.monotonic() < deadline:
                kind = wrng.choice(KINDS)
                try:
                    codes[f"{kind}:{await one(client, url, kind, wrng)}"] += 1
                except httpx.HTTPError as e:
                    codes[f"{kind}:{type(e).__name__}"] += 1
        await asyncio.gather(*[worker(i) for i in range(concurrency)])
    stop.set()


async def sample(base: str, gateway: int, every: float, samples: list[dict], stop: asyncio.Event) -> None:
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            health = (await client.get(base + "/health")).json()
            engine = health["engines"][MODEL]
            s = {"t_s": round(time.monotonic() - t0, 1), "gateway_rss_mb": rss_kb(gateway) / 1024,
                 "gateway_fds": fds(gateway)}
            if engine.get("pid"):
                s["engine_rss_mb"], s["engine_fds"] = rss_kb(engine["pid"]) / 1024, fds(engine["pid"])
            metrics = (await client.get(base + "/metrics")).text
            s["engine_running"] = next((float(x.split()[-1]) for x in metrics.splitlines()
                                        if x.startswith("tokenomy_engine_running_seqs")), 0.0)
            s["engine_restarts"] = engine["restarts"]
            samples.append(s)
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--every", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=0.2, help="share of the run before the RSS baseline")
    ap.add_argument("--port", type=int, default=8779)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenomy-soak-"))
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(args.port), "--config",
                             str(config(work))], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit("tokenomy serve did not start")
            time.sleep(0.3)
        codes: Counter = Counter()
        samples: list[dict] = []

        async def run() -> None:
            stop = asyncio.Event()
            await asyncio.gather(traffic(base, args.minutes * 60, args.concurrency, codes, stop),
                                 sample(base, proc.pid, args.every, samples, stop))

        Console(stderr=True).print(f"soak: {args.minutes:g} min, concurrency {args.concurrency}, pid {proc.pid}")
        asyncio.run(run())
    finally:
        proc.terminate()
        proc.wait(30)
    warm = next(s for s in samples if s["t_s"] >= args.warmup * args.minutes * 60) if samples else {}
    last = samples[-1] if samples else {}
    growth = {k: last[k] / warm[k] for k in ("gateway_rss_mb", "engine_rss_mb") if warm.get(k) and k in last}
    errors = {k: v for k, v in codes.items() if k.split(":")[1].startswith("5") or not k.split(":")[1].isdigit()}
    ok = not errors and all(g <= GROWTH_LIMIT for g in growth.values())
    result = {"minutes": args.minutes, "requests": sum(codes.values()), "codes": dict(sorted(codes.items())),
              "rss_growth_after_warmup": growth, "server_errors": errors, "samples": samples, "ok": ok}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        t = Table(title=f"soak: {result['requests']} requests in {args.minutes:g} min")
        for col in ("t s", "gateway RSS MB", "gateway fds", "engine RSS MB", "engine fds", "running", "restarts"):
            t.add_column(col, justify="right")
        for s in samples:
            t.add_row(str(s["t_s"]), f"{s['gateway_rss_mb']:.0f}", str(s["gateway_fds"]),
                      f"{s.get('engine_rss_mb', 0):.0f}", str(s.get("engine_fds", "")),
                      f"{s['engine_running']:.0f}", str(s["engine_restarts"]))
        out = Console()
        out.print(t)
        out.print(f"RSS end / after warm-up: {growth} (limit {GROWTH_LIMIT}); 5xx or transport errors: {errors}")
        out.print(f"outcomes: {dict(sorted(codes.items()))}")
        out.print("[green]ok[/]" if ok else "[red]FAILED[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
