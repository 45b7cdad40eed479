"""One stream at a time, read by the plainest client: TTFT and TPOT of two OpenAI-compatible servers side by side.

`tokenomy bench` drives many streams from one asyncio process; on a 2-core machine that process competes with
the servers for the cores. This reads one stream at a time with a blocking httpx client (a new connection per
request), so what differs between the two servers is the servers themselves. Grounded prompts (the first
`--prompts` of ../shared/data/grounded/dev.jsonl), each sent once unrecorded so both servers hold it cached, then
`--rounds` rounds alternating which server goes first; medians over all recorded requests.

    .venv/bin/python bench/stream_latency.py --base-url http://127.0.0.1:8000/v1 \\
        --compare http://127.0.0.1:8001/v1 [--model smollm2-135m-instruct] [--prompts 4] [--rounds 3]
        [--max-tokens 64] [--grounded PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenomy.tools.bench.workload import load_workload  # noqa: E402

NO_CACHE = {"cache-control": "no-cache, no-store"}
GROUNDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                        "grounded", "dev.jsonl")


def one(base: str, body: dict) -> tuple[float, float]:
    """(TTFT, mean time per output token after the first) of one streamed request, in seconds."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=600) as c, \
            c.stream("POST", "/chat/completions", json=body, headers=NO_CACHE) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                stamps.append(time.perf_counter())
    return stamps[0] - t0, (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--grounded", default=GROUNDED)
    args = ap.parse_args()
    bodies = [dict(r.body, model=args.model, max_tokens=args.max_tokens, temperature=0, stream=True,
                   ignore_eos=True) for r in load_workload(f"grounded:path={args.grounded}")[:args.prompts]]
    servers = {"base": args.base_url, "compare": args.compare}
    for base in servers.values():             # prefill every prompt once on each server, unrecorded
        for b in bodies:
            one(base, b)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    for r in range(args.rounds):
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            got[name] += [one(servers[name], b) for b in bodies]
    med = {name: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for name, v in got.items()}
    print(f"{'endpoint':8} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12}")
    for name, (ttft, tpot) in med.items():
        print(f"{name:8} {ttft * 1e3:12.1f} {tpot * 1e3:12.2f}")
    (bt, bp), (ct, cp) = med["base"], med["compare"]
    print(f"base / compare: TTFT {bt / ct:.2f}x, TPOT {bp / cp:.2f}x")


if __name__ == "__main__":
    main()
