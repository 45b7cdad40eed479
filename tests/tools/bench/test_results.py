"""SLO parsing, percentiles and the run figures on a planted trace whose expected values are worked out by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenomy.tools.bench.results import RequestResult, SLOError, is_good, parse_slo, percentile, summarize


def rec(ttft: float, e2el: float, out: int, itl: list[float] | None = None) -> RequestResult:
    return RequestResult(ok=True, ttft=ttft, e2el=e2el, output_tokens=out, prompt_tokens=10, usage=True, itl=itl or [])


# r1 tpot (1.0-0.2)/4 = 0.2; r2 tpot 0.4/2 = 0.2; r3 tpot 2.0/4 = 0.5; r4 one token, tpot 0; r5 failed
TRACE = [rec(0.2, 1.0, 5, [0.2] * 4), rec(0.6, 1.0, 3, [0.1, 0.3]), rec(0.1, 2.1, 5, [0.5] * 4), rec(0.3, 0.3, 1),
         RequestResult(ok=False, error="HTTP 500: boom")]


def test_parse_slo_units() -> None:
    assert parse_slo("ttft=500ms,tpot=0.05s") == {"ttft": 0.5, "tpot": 0.05}
    assert parse_slo("e2el=2s, itl=40") == {"e2el": 2.0, "itl": 0.04}    # bare numbers are ms, as vLLM's
    assert parse_slo("TTFT=1.5e3ms") == {"ttft": 1.5}


@pytest.mark.parametrize("text, words", [("ttft=abc", "not a duration"), ("foo=1s", "unknown SLO metric 'foo'"),
                                         ("ttft", "not metric=limit"), ("", "empty SLO"), ("ttft=0ms", "positive"),
                                         ("ttft=5min", "not a duration")])
def test_parse_slo_rejects(text: str, words: str) -> None:
    with pytest.raises(SLOError, match=words):
        parse_slo(text)


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(3)
    for n in (1, 2, 5, 100):
        xs = [rng.uniform(0, 10) for _ in range(n)]
        for p in (0, 50, 90, 99, 100):
            assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))
    assert percentile([], 50) == 0.0
    assert percentile([100, 200, 300, 600], 99) == pytest.approx(591.0)   # rank 2.97: 300 + 0.97 * 300


def test_goodput_on_planted_trace() -> None:
    slo = parse_slo("ttft=500ms,tpot=250ms")   # r1 and r4 good; r2 misses TTFT, r3 TPOT, r5 failed
    assert [is_good(r, slo) for r in TRACE] == [True, False, False, True, False]
    s = summarize(TRACE, duration=4.0, slo=slo)
    assert s["completed"] == 4 and s["failed"] == 1
    assert s["request_goodput"] == pytest.approx(2 / 4)
    assert summarize(TRACE, 4.0, parse_slo("e2el=1s"))["request_goodput"] == pytest.approx(3 / 4)
    assert summarize(TRACE, 4.0, parse_slo("itl=250ms"))["request_goodput"] == pytest.approx(2 / 4)   # r1, r4
    assert summarize(TRACE, 4.0)["request_goodput"] is None


def test_figures_on_planted_trace() -> None:
    s = summarize(TRACE, duration=4.0)
    assert s["total_input_tokens"] == 40 and s["total_output_tokens"] == 14
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(14 / 4)
    assert s["total_token_throughput"] == pytest.approx(54 / 4)
    assert s["mean_ttft_ms"] == pytest.approx(300) and s["median_ttft_ms"] == pytest.approx(250)
    assert s["p99_ttft_ms"] == pytest.approx(591)
    # TPOT over requests with more than one token: 200, 200, 500 ms
    assert s["mean_tpot_ms"] == pytest.approx(300) and s["median_tpot_ms"] == pytest.approx(200)
    assert s["p99_tpot_ms"] == pytest.approx(494)
    assert s["median_e2el_ms"] == pytest.approx(1000)
    assert s["median_itl_ms"] == pytest.approx(250)   # gaps 0.1 0.2x4 0.3 0.5x4: between the 5th and 6th
    assert s["errors"] == ["", "", "", "", "HTTP 500: boom"]
    assert s["error_samples"] == [{"message": "HTTP 500: boom", "count": 1}]
    assert s["token_counts"] == "usage"


def test_token_source_flagged() -> None:
    no_usage = [RequestResult(ok=True, ttft=0.1, e2el=0.2, output_tokens=3)]
    assert summarize(no_usage, 1.0)["token_counts"] == "chunks"
    assert summarize(no_usage + TRACE[:1], 1.0)["token_counts"] == "mixed"
