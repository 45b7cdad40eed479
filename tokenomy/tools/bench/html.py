"""The offline HTML report of a sweep: latency distributions per run and throughput against concurrency or rate.

It is drawn from the per-run summaries alone (the JSON a run writes), with plotly.js inlined once, so the page
loads nothing from the network.
"""

from __future__ import annotations

import html as stdhtml
from pathlib import Path
from typing import Any

_LATENCY_TITLES = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "itl": "ITL (ms)", "e2el": "E2E latency (ms)"}


def _level(s: dict[str, Any]) -> float:
    return float(s["max_concurrency"]) if s["load"] == "closed" else float(s["request_rate"]) \
        if s["load"] == "open" else 0.0


def _label(s: dict[str, Any]) -> str:
    if s["load"] == "closed":
        return f"{s['endpoint']} c={s['max_concurrency']}"
    return f"{s['endpoint']} {s['request_rate']}/s" if s["load"] == "open" else f"{s['endpoint']} trace"


def latencies_ms(s: dict[str, Any]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, E2EL and every ITL gap, in ms, of the completed requests of one run summary."""
    out: dict[str, list[float]] = {k: [] for k in _LATENCY_TITLES}
    for ttft, e2el, n, itl in zip(s["ttfts"], s["e2els"], s["output_lens"], s["itls"], strict=True):
        if ttft is None or e2el is None:
            continue
        out["ttft"].append(ttft * 1000)
        out["e2el"].append(e2el * 1000)
        if n > 1:
            out["tpot"].append((e2el - ttft) / (n - 1) * 1000)
        out["itl"] += [x * 1000 for x in itl]
    return out


def figures(summaries: list[dict[str, Any]]) -> list[Any]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    dist = make_subplots(rows=2, cols=2, subplot_titles=list(_LATENCY_TITLES.values()))
    for s in summaries:
        lat = latencies_ms(s)
        for i, key in enumerate(_LATENCY_TITLES):
            dist.add_trace(go.Box(y=lat[key], name=_label(s), legendgroup=_label(s), showlegend=i == 0,
                                  boxpoints="outliers"), row=i // 2 + 1, col=i % 2 + 1)
    dist.update_layout(title="Latency distributions", height=750)

    kinds = {s["load"] for s in summaries}
    axis = "concurrency" if kinds == {"closed"} else "request rate (req/s)" if kinds == {"open"} else "level"
    tput = make_subplots(rows=1, cols=2, subplot_titles=["Output tokens/s", "Requests/s (and goodput)"])
    lat = make_subplots(rows=1, cols=2, subplot_titles=["TTFT median and p99 (ms)", "TPOT median and p99 (ms)"])
    for endpoint in dict.fromkeys(s["endpoint"] for s in summaries):
        runs = sorted((s for s in summaries if s["endpoint"] == endpoint), key=_level)
        x = [_level(s) for s in runs]
        tput.add_trace(go.Scatter(x=x, y=[s["output_throughput"] for s in runs], name=f"{endpoint} output tok/s",
                                  mode="lines+markers"), row=1, col=1)
        tput.add_trace(go.Scatter(x=x, y=[s["request_throughput"] for s in runs], name=f"{endpoint} req/s",
                                  mode="lines+markers"), row=1, col=2)
        if any(s["request_goodput"] is not None for s in runs):
            tput.add_trace(go.Scatter(x=x, y=[s["request_goodput"] for s in runs], name=f"{endpoint} goodput",
                                      mode="lines+markers", line={"dash": "dot"}), row=1, col=2)
        for col, metric in ((1, "ttft"), (2, "tpot")):
            for stat, dash in (("median", None), ("p99", "dot")):
                lat.add_trace(go.Scatter(x=x, y=[s[f"{stat}_{metric}_ms"] for s in runs], mode="lines+markers",
                                         name=f"{endpoint} {stat} {metric.upper()}", line={"dash": dash}),
                              row=1, col=col)
    for fig, title in ((tput, f"Throughput against {axis}"), (lat, f"Latency against {axis}")):
        fig.update_xaxes(title_text=axis)
        fig.update_layout(title=title, height=450)
    return [dist, tput, lat]


def render(summaries: list[dict[str, Any]], title: str = "tokenomy bench") -> str:
    """A self-contained HTML page: plotly.js inline, one div per figure, and a table of the headline figures."""
    from plotly.offline import get_plotlyjs

    divs = [fig.to_html(include_plotlyjs=False, full_html=False) for fig in figures(summaries)]
    head = ["run", "completed", "failed", "output tok/s", "req/s", "goodput", "median TTFT ms", "median TPOT ms"]
    rows = "".join(
        "<tr>" + "".join(f"<td>{stdhtml.escape(str(v))}</td>" for v in (
            _label(s), s["completed"], s["failed"], f"{s['output_throughput']:.1f}", f"{s['request_throughput']:.2f}",
            "-" if s["request_goodput"] is None else f"{s['request_goodput']:.2f}",
            f"{s['median_ttft_ms']:.0f}", f"{s['median_tpot_ms']:.1f}")) + "</tr>" for s in summaries)
    table = ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{rows}</table>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{stdhtml.escape(title)}</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}</style>"
            f"</head><body><h1>{stdhtml.escape(title)}</h1>{table}{''.join(divs)}</body></html>")


def write_html(summaries: list[dict[str, Any]], path: Path, title: str = "tokenomy bench") -> None:
    path.write_text(render(summaries, title), encoding="utf-8")
