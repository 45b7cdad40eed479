"""The load generator against stub servers on loopback: timings from planted delays, failures counted with their
messages, the no-usage fallback, and the three shapes of load."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from tests.tools.bench.stub import BenchStub, Served
from tokenomy.tools.bench.loadgen import Load, Options, Target, poisson_arrivals, prepare, run
from tokenomy.tools.bench.workload import Request

REQS = [Request({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(3)]


def go(url: str, load: Load, n: int | None = None, duration: float | None = None, reqs: list[Request] = REQS,
       opts: Options | None = None):
    return asyncio.run(run(Target(url, "m"), reqs, load, opts or Options(), n, duration))


def test_poisson_arrivals_seeded_with_the_right_mean() -> None:
    times = poisson_arrivals(4.0, 20000, seed=7)
    assert times == poisson_arrivals(4.0, 20000, seed=7) and times != poisson_arrivals(4.0, 20000, seed=8)
    assert times[0] == 0.0 and times == sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)    # exponential: sd = mean


def test_prepare_sets_model_streaming_and_defaults() -> None:
    body = prepare({"messages": [], "max_tokens": 3, "model": "other", "stream": False}, Target("u", "m"),
                   Options(max_tokens=9, temperature=0.5, ignore_eos=True))
    assert body["model"] == "m" and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 3 and body["temperature"] == 0.5 and body["ignore_eos"] is True
    assert "ignore_eos" not in prepare({"messages": []}, Target("u", "m"), Options())


def test_timings_follow_planted_delays() -> None:
    stub = BenchStub(tokens=4, first_delay=0.15, token_delay=0.05)
    with Served(stub) as s:
        records, duration = go(s.base_url, Load("closed", 1), n=2)
    assert len(records) == 2 and all(r.ok and r.usage for r in records)
    for r in records:
        # lower bounds only: a busy machine may stretch any interval, never shorten a planted delay
        assert 0.15 <= r.ttft <= r.e2el
        assert len(r.itl) == 3 and all(x >= 0.045 for x in r.itl)
        assert sum(r.itl) <= r.e2el - r.ttft + 1e-6                  # the gaps lie between first token and end
        assert r.output_tokens == 4 and r.prompt_tokens == 10
        assert r.tpot == pytest.approx((r.e2el - r.ttft) / 3)
    assert duration >= sum(r.e2el for r in records) * 0.99           # concurrency 1: one after another
    assert stub.bodies[0]["model"] == "m" and stub.bodies[0]["stream_options"] == {"include_usage": True}


def test_failures_counted_with_messages() -> None:
    with Served(BenchStub(fail_every=3, reset_every=4)) as s:
        records, _ = go(s.base_url, Load("closed", 2), n=12)
    assert len(records) == 12
    errors = sorted(r.error or "" for r in records if not r.ok)
    assert len(errors) == 6                          # requests 3, 6, 9, 12 answer 500; 4 and 8 close mid-stream
    assert sum(e.startswith("HTTP 500: planted failure") for e in errors) == 4
    assert sum(e.startswith("RemoteProtocolError") for e in errors) == 2


def test_malformed_stream_is_a_failed_record() -> None:
    with Served(BenchStub(garbage_every=2)) as s:
        records, _ = go(s.base_url, Load("closed", 1), n=2)
    assert sorted(r.ok for r in records) == [False, True]
    assert next(r.error for r in records if not r.ok).startswith("bad stream chunk: JSONDecodeError")


def test_unreachable_and_timeout_are_failed_records() -> None:
    from tests.conftest import free_port

    records, _ = go(f"http://127.0.0.1:{free_port()}/v1", Load("closed", 1), n=2)
    assert [r.ok for r in records] == [False, False] and all("ConnectError" in (r.error or "") for r in records)
    with Served(BenchStub(first_delay=1.0)) as s:
        records, _ = go(s.base_url, Load("closed", 1), n=1, opts=Options(timeout_s=0.2))
    assert not records[0].ok and records[0].error.startswith("timeout after 0.2s")


def test_no_usage_falls_back_to_counting_chunks() -> None:
    with Served(BenchStub(tokens=6, usage=False)) as s:
        records, _ = go(s.base_url, Load("closed", 1), n=2)
    assert all(r.ok and not r.usage and r.output_tokens == 6 and r.prompt_tokens == 0 for r in records)


def test_open_loop_sends_at_poisson_times_without_waiting() -> None:
    stub = BenchStub(first_delay=0.3)
    with Served(stub) as s:
        records, duration = go(s.base_url, Load("open", 20.0), n=6)
    assert len(records) == 6 and all(r.ok for r in records)
    expected = poisson_arrivals(20.0, 6, seed=0)
    starts = sorted(r.start for r in records)
    assert all(abs(a - b) < 0.1 for a, b in zip(starts, expected, strict=True))
    assert duration < expected[-1] + 0.3 * 6                  # overlapping, not one after another


def test_trace_replays_arrival_times_and_duration_stops_sending() -> None:
    reqs = [Request({"messages": [{"role": "user", "content": "x"}]}, t) for t in (0.4, 0.0, 0.2)]
    with Served(BenchStub()) as s:
        records, _ = go(s.base_url, Load("trace"), reqs=reqs)
        assert [round(r.start, 1) for r in sorted(records, key=lambda r: r.start)] == [0.0, 0.2, 0.4]
        records, _ = go(s.base_url, Load("trace"), duration=0.3, reqs=reqs)
        assert len(records) == 2
        records, duration = go(s.base_url, Load("closed", 2), duration=0.3)
        assert records and all(r.start < 0.3 for r in records) and duration >= 0.3
