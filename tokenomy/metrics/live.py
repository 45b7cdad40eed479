"""The dashboard's operations view: recent time series computed from the app's own Prometheus registry, with no
store of its own. A sample is the registry's values of the families below at one moment; a point of a series is
the change between two consecutive samples over their interval, as PromQL's rate() and histogram_quantile() give
it over a range, or a gauge's value at the later sample.

Samples are taken when the dashboard asks (at most one per `min_interval_s`, shared by every viewer); a point spans
back to the newest sample at least `window_s` (10 s) older, so lines are rates over a few seconds, not the noise
between two polls. Each point is computed once, when its sample is taken, and the last `keep` samples and points stay
in memory: a page opened later starts with what earlier viewers saw; without viewers nothing runs.

Series (each by model, and by tenant where the metrics have it):
    output_tokens_per_s   d tokenomy_tokens_total{kind="completion"} / dt
    requests_per_s        d tokenomy_requests_total / dt; by tenant d tokenomy_tenant_requests_total / dt
    ttft_s, tpot_s        p50 and p99 of the interval's observations (tokenomy_ttft_seconds, tokenomy_tpot_seconds),
                          linear within a bucket as histogram_quantile()
    queue                 tokenomy_queue_depth (waiting) and tokenomy_engine_running_seqs (running)
    kv_usage              tokenomy_engine_kv_usage_ratio
    prefix_hit_rate       d cached / d prompt tokens (tokenomy_tokens_total): engine and upstream prompt caches
    response_cache_hit_rate  d (exact + semantic) / d all of tokenomy_cache_requests_total
    cost_per_min          60 x d tokenomy_cost_usd_total / dt; by tenant tokenomy_tenant_cost_usd_total
A ratio or quantile over an interval with nothing in it is null (a gap in the chart).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

QUANTILES = (("p50", 0.5), ("p99", 0.99))
HISTOGRAMS = (("ttft_s", "tokenomy_ttft_seconds"), ("tpot_s", "tokenomy_tpot_seconds"))
# (key, sample name, label to group by, label filter): the sums a sample keeps
SUMS = (("completion", "tokenomy_tokens_total", "model", {"kind": "completion"}),
        ("prompt", "tokenomy_tokens_total", "model", {"kind": "prompt"}),
        ("cached", "tokenomy_tokens_total", "model", {"kind": "cached"}),
        ("requests", "tokenomy_requests_total", "model", {}),
        ("tenant_requests", "tokenomy_tenant_requests_total", "tenant", {}),
        ("cost", "tokenomy_cost_usd_total", "model", {}),
        ("tenant_cost", "tokenomy_tenant_cost_usd_total", "tenant", {}),
        ("waiting", "tokenomy_queue_depth", "model", {}),
        ("running", "tokenomy_engine_running_seqs", "model", {}),
        ("kv", "tokenomy_engine_kv_usage_ratio", "model", {}),
        *((f"cache_{c}", "tokenomy_cache_requests_total", "model", {"cache": c})
          for c in ("miss", "explore", "exact", "semantic", "bypass")))
FAMILIES = frozenset({name.removesuffix("_total") for _, name, _, _ in SUMS} | {n for _, n in HISTOGRAMS})


@dataclass
class Sample:
    """The registry at time t: each of SUMS ({key: {label value: sum}}) and each histogram's cumulative buckets by
    model ({name: {model: [(le, count)]}}, le ascending, +Inf last)."""

    t: float
    sums: dict[str, dict[str, float]]
    buckets: dict[str, dict[str, list[tuple[float, float]]]]


def snapshot(families: Iterable[Any], now: float) -> Sample:
    """A Sample of prometheus_client metric families (registry.collect())."""
    sums: dict[str, dict[str, float]] = {key: {} for key, _, _, _ in SUMS}
    buckets: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for _, name in HISTOGRAMS}
    wanted: dict[str, list[tuple[str, str, dict[str, str]]]] = {}
    for key, name, by, match in SUMS:
        wanted.setdefault(name, []).append((key, by, match))
    for family in families:
        if family.name not in FAMILIES:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") and family.name in buckets:
                buckets[family.name].setdefault(s.labels.get("model", ""), []).append((float(s.labels["le"]),
                                                                                        s.value))
            for key, by, match in wanted.get(s.name, ()):
                if by in s.labels and all(s.labels.get(k) == v for k, v in match.items()):
                    group = sums[key]
                    group[s.labels[by]] = group.get(s.labels[by], 0.0) + s.value
    return Sample(now, sums, {n: {m: sorted(b) for m, b in by.items()} for n, by in buckets.items()})


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile(q) over cumulative buckets [(le, count)] with +Inf last; None without observations."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower                        # past the last finite bound: that bound, as Prometheus does
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower


def point(prev: Sample, cur: Sample) -> dict[str, dict[str, float | None]]:
    """The series' values over the interval from `prev` to `cur`: {series: {line: value}}."""
    dt = max(cur.t - prev.t, 1e-9)

    def delta(key: str) -> dict[str, float]:
        old = prev.sums[key]
        return {k: max(v - old.get(k, 0.0), 0.0) for k, v in cur.sums[key].items()}

    def rate(key: str, scale: float = 1.0) -> dict[str, float | None]:
        return {k: v * scale / dt for k, v in delta(key).items()}

    def ratio(num: dict[str, float], den: dict[str, float]) -> dict[str, float | None]:
        return {k: (num.get(k, 0.0) / d if d > 0 else None) for k, d in den.items()}

    out: dict[str, dict[str, float | None]] = {
        "output_tokens_per_s": rate("completion"),
        "requests_per_s": rate("requests"),
        "requests_per_s_by_tenant": rate("tenant_requests"),
        "cost_per_min": rate("cost", 60.0),
        "cost_per_min_by_tenant": rate("tenant_cost", 60.0),
        "queue": {**{f"{m} waiting": v for m, v in cur.sums["waiting"].items()},
                  **{f"{m} running": v for m, v in cur.sums["running"].items()}},
        "kv_usage": dict(cur.sums["kv"]),
        "prefix_hit_rate": ratio(delta("cached"), delta("prompt")),
    }
    for series, name in HISTOGRAMS:
        before, lines = prev.buckets[name], {}
        for model, now_b in cur.buckets[name].items():
            old = dict(before.get(model, []))
            diff = [(le, max(c - old.get(le, 0.0), 0.0)) for le, c in now_b]
            for label, q in QUANTILES:
                lines[f"{model} {label}"] = quantile(q, diff)
        out[series] = lines
    outcomes = {c: delta(f"cache_{c}") for c in ("miss", "explore", "exact", "semantic", "bypass")}
    every = {m: sum(o.get(m, 0.0) for o in outcomes.values()) for m in set().union(*outcomes.values())}
    hits = {m: outcomes["exact"].get(m, 0.0) + outcomes["semantic"].get(m, 0.0) for m in every}
    out["response_cache_hit_rate"] = ratio(hits, every)
    return out


@dataclass
class Point:
    t: float
    interval_s: float
    values: dict[str, dict[str, float | None]]


class LiveSeries:
    """Samples of a Metrics registry and the points between them, kept in rings; `poll()` samples (when due) and
    returns the series. A point spans from its sample back to the newest sample at least `window_s` older (the
    oldest kept, at first): rates over a few seconds, as rate(x[10s]) would, rather than between two polls."""

    def __init__(self, metrics: Any, min_interval_s: float = 1.0, window_s: float = 10.0, keep: int = 360) -> None:
        self.metrics = metrics
        self.min_interval_s, self.window_s = min_interval_s, window_s
        self.samples: deque[Sample] = deque(maxlen=keep)
        self.points: deque[Point] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def poll(self, now: float | None = None) -> dict[str, Any]:
        """{"t": [point time, UNIX s], "interval_s": [the span each point covers], "series": {series: {line:
        [value | None]}}} over the points kept, after taking a sample when the last is `min_interval_s` old."""
        now = time.time() if now is None else now
        with self._lock:
            if not self.samples or now - self.samples[-1].t >= self.min_interval_s:
                cur = snapshot(self.metrics.registry.collect(), now)
                if self.samples:
                    prev = next((s for s in reversed(self.samples) if now - s.t >= self.window_s), self.samples[0])
                    self.points.append(Point(now, round(now - prev.t, 3), point(prev, cur)))
                self.samples.append(cur)
            points = list(self.points)
        series: dict[str, dict[str, list[float | None]]] = {}
        for i, p in enumerate(points):
            for name, lines in p.values.items():
                chart = series.setdefault(name, {})
                for line, v in lines.items():
                    chart.setdefault(line, [None] * i).append(v)
            for chart in series.values():              # a line that was absent this interval: a gap
                for values in chart.values():
                    values.extend([None] * (i + 1 - len(values)))
        return {"t": [p.t for p in points], "interval_s": [p.interval_s for p in points], "series": series}
