"""The offline HTML report: written from run summaries, plotly inline (no CDN), the plots present."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tools.bench.test_results import TRACE
from tokenomy.tools.bench.html import latencies_ms, write_html
from tokenomy.tools.bench.results import parse_slo, summarize


def run_summary(endpoint: str, concurrency: int) -> dict:
    s = summarize(TRACE, 4.0, parse_slo("ttft=500ms"))
    s.update(endpoint=endpoint, load="closed", max_concurrency=concurrency, request_rate="inf")
    return s


def test_html_is_offline_and_has_the_plots(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    write_html([run_summary(e, c) for e in ("base", "compare") for c in (1, 8)], path)
    page = path.read_text()
    assert not re.search(r"<script[^>]+src=[\"']?https?:", page)
    assert page.count("Plotly.newPlot") == 3 and page.count("plotly-graph-div") >= 3
    assert len(page) > 1_000_000                      # plotly.js itself is inline
    for title in ("Latency distributions", "Throughput against concurrency", "Latency against concurrency",
                  "base c=8", "compare c=1"):
        assert title in page


def test_latencies_from_a_summary() -> None:
    lat = latencies_ms(run_summary("base", 1))
    assert lat["ttft"] == [200.0, 600.0, 100.0, 300.0]
    assert [round(x) for x in lat["tpot"]] == [200, 200, 500]
    assert len(lat["itl"]) == 10
