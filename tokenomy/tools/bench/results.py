"""Per-request records and the figures a run reports, under the field names of `vllm bench serve`.

Definitions (vLLM's): TTFT is the time from sending a request to its first content chunk; ITL the gaps between
later content chunks; TPOT = (E2EL - TTFT) / (output tokens - 1) for requests with more than one output token
(0 for goodput otherwise); E2EL the time from sending to the end of the stream. A request is good when it
completed and every SLO given holds (metric <= limit); request_goodput = good requests / duration. Throughputs
divide by the run's duration (first send to last completion). Percentiles interpolate linearly between closest
ranks (numpy's default).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

SLO_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 95, 99)
_UNITS = {"ms": 1e-3, "s": 1.0, "": 1e-3}   # a bare number is milliseconds, as in vLLM's --goodput


@dataclass
class RequestResult:
    """What happened to one request. Times in seconds; `start` relative to the run's start."""
    start: float = 0.0
    ok: bool = False
    error: str | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2el: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    usage: bool = False          # token counts came from the server's usage (else output = content chunks)

    @property
    def tpot(self) -> float:
        if self.e2el is None or self.ttft is None or self.output_tokens <= 1:
            return 0.0
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


class SLOError(ValueError):
    """An SLO string that does not parse; the message is one line fit for the user."""


def parse_slo(text: str) -> dict[str, float]:
    """'ttft=500ms,tpot=0.05s' -> {'ttft': 0.5, 'tpot': 0.05} (seconds); keys ttft, tpot, itl, e2el."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise SLOError(f"{part!r} is not metric=limit (e.g. ttft=500ms)")
        if key not in SLO_METRICS:
            raise SLOError(f"unknown SLO metric {key!r}; use {', '.join(SLO_METRICS)}")
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*", value)
        if not m:
            raise SLOError(f"{key}={value.strip()!r} is not a duration (e.g. 500ms or 2s)")
        limit = float(m.group(1)) * _UNITS[m.group(2) or ""]
        if limit <= 0:
            raise SLOError(f"{key} limit must be positive")
        out[key] = limit
    if not out:
        raise SLOError("empty SLO; give metric=limit pairs, e.g. ttft=500ms,tpot=50ms")
    return out


def percentile(xs: list[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation between closest ranks; 0.0 for no data (as vLLM)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    rank = (len(s) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def is_good(r: RequestResult, slo: dict[str, float]) -> bool:
    """Completed, and each SLO holds; the ITL SLO holds when every gap of the request does."""
    if not r.ok:
        return False
    values = {"ttft": r.ttft or 0.0, "tpot": r.tpot, "e2el": r.e2el or 0.0, "itl": max(r.itl, default=0.0)}
    return all(values[k] <= limit for k, limit in slo.items())


def summarize(records: list[RequestResult], duration: float, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The figures of one run, keyed as `vllm bench serve` keys them (latencies in ms)."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    dur = duration if duration > 0 else float("nan")
    total_in = sum(r.prompt_tokens for r in done)
    total_out = sum(r.output_tokens for r in done)
    series = {"ttft": [r.ttft or 0.0 for r in done], "tpot": [r.tpot for r in done if r.output_tokens > 1],
              "itl": [x for r in done for x in r.itl], "e2el": [r.e2el or 0.0 for r in done]}
    out: dict[str, Any] = {
        "duration": duration, "completed": len(done), "failed": len(failed),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / dur, "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "request_goodput": sum(is_good(r, slo) for r in done) / dur if slo else None,
    }
    for name in LATENCIES:
        ms = [x * 1000 for x in series[name]]
        out[f"mean_{name}_ms"] = _mean(ms)
        out[f"median_{name}_ms"] = percentile(ms, 50)
        out[f"std_{name}_ms"] = _std(ms)
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = percentile(ms, p)
    with_usage = sum(r.usage for r in done)
    out["token_counts"] = "usage" if with_usage == len(done) else "chunks" if with_usage == 0 else "mixed"
    out["input_lens"] = [r.prompt_tokens for r in records]
    out["output_lens"] = [r.output_tokens for r in records]
    out["ttfts"] = [r.ttft if r.ok else None for r in records]
    out["itls"] = [r.itl for r in records]
    out["e2els"] = [r.e2el if r.ok else None for r in records]
    out["errors"] = ["" if r.ok else r.error or "unknown error" for r in records]
    out["error_samples"] = error_samples(failed)
    return out


def error_samples(failed: list[RequestResult], keep: int = 5) -> list[dict[str, Any]]:
    """Distinct error messages with their counts, most frequent first, at most `keep`."""
    counts: dict[str, int] = {}
    for r in failed:
        msg = r.error or "unknown error"
        counts[msg] = counts.get(msg, 0) + 1
    return [{"message": m, "count": n} for m, n in sorted(counts.items(), key=lambda kv: -kv[1])[:keep]]
