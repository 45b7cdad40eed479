"""tokenomy/metrics/live.py: the operations view's series are rates and quantiles of what a real Metrics registry
counted between two samples, as PromQL's rate() and histogram_quantile() give them."""

from __future__ import annotations

import pytest

from tokenomy.metrics.live import LiveSeries, quantile
from tokenomy.metrics.prometheus import Metrics

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


def test_series_are_the_intervals_rates_ratios_and_quantiles() -> None:
    m = Metrics()
    live = LiveSeries(m, min_interval_s=1.0)
    assert live.poll(now=100.0) == {"t": [], "interval_s": [], "series": {}}     # one sample: no interval yet
    m.tokens.labels("completion", "a").inc(50)
    m.tokens.labels("prompt", "a").inc(100)
    m.tokens.labels("cached", "a").inc(40)
    for status in ("ok", "ok", "ok", "ok", "error"):
        m.requests.labels(status, "a", "chat").inc()
    m.tenant_requests.labels("acme").inc(5)
    for v in [0.1] * 9 + [3.0]:
        m.ttft.labels("a").observe(v)
    m.cost.labels("a").inc(0.5)
    m.tenant_cost.labels("acme").inc(0.5)
    m.cache_requests.labels("a", "miss").inc(3)
    m.cache_requests.labels("a", "exact").inc(1)
    out = live.poll(now=110.0)
    s = out["series"]
    assert out["t"] == [110.0] and out["interval_s"] == [10.0]
    assert s["output_tokens_per_s"] == {"a": [5.0]}
    assert s["requests_per_s"] == {"a": [0.5]} and s["requests_per_s_by_tenant"] == {"acme": [0.5]}
    assert s["cost_per_min"] == {"a": [3.0]} and s["cost_per_min_by_tenant"] == {"acme": [3.0]}
    assert s["prefix_hit_rate"] == {"a": [0.4]}
    assert s["response_cache_hit_rate"] == {"a": [0.25]}
    # 9 of 10 in (0.05, 0.1], one in (2.5, 5]: linear within the bucket, as histogram_quantile()
    assert s["ttft_s"]["a p50"] == [pytest.approx(0.05 + 0.05 * 5 / 9)]
    assert s["ttft_s"]["a p99"] == [pytest.approx(2.5 + 2.5 * 0.9)]
    assert live.poll(now=110.5)["t"] == [110.0]           # sooner than min_interval_s: the last sample again
    m.tokens.labels("completion", "b").inc(20)            # a model first seen now: a gap before
    out = live.poll(now=120.0)["series"]
    assert out["output_tokens_per_s"] == {"a": [5.0, 0.0], "b": [None, 2.0]}
    assert out["ttft_s"]["a p50"][1] is None               # no observation in the interval: a gap, not 0
    assert out["prefix_hit_rate"] == {"a": [0.4, None]}


def test_gauges_are_their_value_at_the_sample() -> None:
    class Engine:
        running, queue_depth, kv_usage, state, restarts, max_model_len = 2, 3, 0.5, "ready", 0, 2048

    m = Metrics()
    m.watch_engines(lambda: [("a", Engine())])
    live = LiveSeries(m)
    live.poll(now=1.0)
    s = live.poll(now=3.0)["series"]
    assert s["queue"] == {"a waiting": [3.0], "a running": [2.0]} and s["kv_usage"] == {"a": [0.5]}


def test_quantile_edges() -> None:
    inf = float("inf")
    assert quantile(0.5, [(1.0, 0.0), (inf, 0.0)]) is None
    assert quantile(0.99, [(1.0, 0.0), (2.0, 1.0), (inf, 4.0)]) == 2.0     # past the last bound: that bound
    assert quantile(0.5, [(1.0, 2.0), (inf, 2.0)]) == 0.5


def test_a_point_spans_back_a_window_not_just_one_poll() -> None:
    m = Metrics()
    live = LiveSeries(m, min_interval_s=1.0, window_s=10.0)
    for t in range(0, 16, 2):
        m.tokens.labels("completion", "a").inc(10 if t % 4 else 0)    # bursty: 10 tokens every other poll
        out = live.poll(now=float(t))
    assert out["interval_s"] == [2.0, 4.0, 6.0, 8.0, 10.0, 10.0, 10.0]
    assert out["series"]["output_tokens_per_s"]["a"][-3:] == [3.0, 2.0, 3.0]    # steadier than 0, 5, 0, 5
