"""Sweeps: rounds alternate which endpoint goes first and merge per endpoint; ratios divide base by compare."""

from __future__ import annotations

import asyncio

import pytest

from tests.tools.bench.stub import BenchStub, Served
from tokenomy.tools.bench.loadgen import Load, Options, Target
from tokenomy.tools.bench.sweep import RATIO_KEYS, ratios, sweep
from tokenomy.tools.bench.workload import Request

REQS = [Request({"messages": [{"role": "user", "content": "q"}]})]


def test_rounds_alternate_and_merge() -> None:
    log: list[str] = []
    starts: list[tuple[str, str, int]] = []
    with Served(BenchStub("a", log=log)) as a, Served(BenchStub("b", tokens=3, log=log)) as b:
        targets = [("base", Target(a.base_url, "m")), ("compare", Target(b.base_url, "m"))]
        runs = asyncio.run(sweep(targets, REQS, [Load("closed", 1), Load("closed", 2)], Options(), rounds=3,
                                 n_requests=2, on_start=lambda name, load, r: starts.append((name, load.label, r))))
    assert log == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"] * 2
    assert [s[0] for s in starts[:6]] == ["base", "compare", "compare", "base", "base", "compare"]
    assert [(r.name, r.load.value, r.rounds, len(r.records)) for r in runs] == [
        ("base", 1, 3, 6), ("compare", 1, 3, 6), ("base", 2, 3, 6), ("compare", 2, 3, 6)]
    assert sum(r.output_tokens for r in runs[1].records) == 18
    s = runs[0].summary(None)
    assert s["max_concurrency"] == 1 and s["request_rate"] == "inf" and s["endpoint"] == "base"
    assert s["duration"] == pytest.approx(runs[0].duration)


def test_ratios() -> None:
    a = {"output_throughput": 30.0, "median_ttft_ms": 100.0, "request_goodput": None}
    b = {"output_throughput": 20.0, "median_ttft_ms": 400.0, "request_goodput": 0.0}
    r = ratios(a, b)
    assert set(r) == set(RATIO_KEYS)
    assert r["output_throughput"] == pytest.approx(1.5) and r["median_ttft_ms"] == pytest.approx(0.25)
    assert r["request_goodput"] is None and r["request_throughput"] is None
