"""A sweep: every load level against every target, in rounds that alternate which target goes first, and the
ratios between two targets on the same workload.

Rounds of one level are merged per target: records concatenated, durations added, so a figure over R rounds
is the figure of one run R times as long. In round r the targets go in the given order when r is even and in
reverse when odd; an open-loop round r draws its arrivals from seed + r, the same for every target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.tools.bench.loadgen import Load, Options, Target, run
from tokenomy.tools.bench.results import RequestResult, summarize
from tokenomy.tools.bench.workload import Request

# Ratios printed for a comparison: first target / second target. Throughputs: higher is better; latencies: lower.
RATIO_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
              "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms")


@dataclass
class Run:
    """One target at one load level, over all rounds."""
    name: str
    target: Target
    load: Load
    records: list[RequestResult] = field(default_factory=list)
    duration: float = 0.0
    rounds: int = 0

    def summary(self, slo: dict[str, float] | None) -> dict[str, Any]:
        """vLLM's fields for this run, plus the endpoint and the load (max_concurrency, request_rate as vLLM
        names them: request_rate is "inf" for closed loop and trace replay, max_concurrency None for open loop)."""
        out = summarize(self.records, self.duration, slo)
        out.update({"endpoint": self.name, "base_url": self.target.base_url, "model_id": self.target.model,
                    "load": self.load.kind, "rounds": self.rounds,
                    "max_concurrency": int(self.load.value) if self.load.kind == "closed" else None,
                    "request_rate": self.load.value if self.load.kind == "open" else "inf"})
        return out


async def sweep(targets: list[tuple[str, Target]], requests: list[Request], loads: list[Load], opts: Options,
                rounds: int = 1, n_requests: int | None = None, duration_s: float | None = None, seed: int = 0,
                on_start: Callable[[str, Load, int], None] | None = None,
                on_record: Callable[[RequestResult], None] | None = None, warmup: int = 0) -> list[Run]:
    """Runs in order of load level, then target; `on_start(name, load, round)` is called before each round.
    First, `warmup` requests go to each target one at a time and are not recorded (a cold server's first
    requests pay for loading and compiling, which is not what a sweep measures)."""
    if warmup:
        for _, target in targets:
            await run(target, requests, Load("closed", 1), opts, warmup)
    runs: list[Run] = []
    for load in loads:
        by_name = {name: Run(name, target, load) for name, target in targets}
        for r in range(rounds):
            order = targets if r % 2 == 0 else targets[::-1]
            for name, target in order:
                if on_start is not None:
                    on_start(name, load, r)
                records, duration = await run(target, requests, load, opts, n_requests, duration_s, seed + r,
                                              on_record)
                merged = by_name[name]
                merged.records += records
                merged.duration += duration
                merged.rounds += 1
        runs += by_name.values()
    return runs


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """a / b for each of RATIO_KEYS; None where either is missing or b is zero."""
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        x, y = a.get(key), b.get(key)
        out[key] = x / y if isinstance(x, int | float) and isinstance(y, int | float) and y else None
    return out
