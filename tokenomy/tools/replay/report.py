"""The replay report: per policy, against the recorded actual; as a table, JSON or an offline HTML page."""

from __future__ import annotations

import html
import io
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tokenomy.config import CacheSettings, Config
from tokenomy.report.figures import iso
from tokenomy.tools.replay.caches import cache_policies
from tokenomy.tools.replay.prices import price_policies
from tokenomy.tools.replay.routes import replay_routes
from tokenomy.tools.replay.traffic import Trace

WHAT = ("cache", "route", "price", "all")
FORMATS = ("table", "json", "html")
THRESHOLDS = (0.8, 0.85, 0.9, 0.95)


def recorded(trace: Trace) -> dict[str, Any]:
    rows = [q.row for q in trace.requests]
    out: dict[str, Any] = {"requests": len(rows), "with_bodies": trace.with_bodies,
                           "cost_usd": sum(r.cost_usd for r in rows)}
    for layer in ("exact", "semantic"):
        hits = [r for r in rows if r.cache == layer]
        out[layer] = {"requests": len(hits), "tokens": sum(r.prompt_tokens + r.completion_tokens for r in hits),
                      "usd": sum(float(r.saved_by.get(layer, {}).get("usd", 0.0)) for r in hits)}
    out["by_model"] = dict(sorted(Counter(q.row.model for q in trace.requests if q.generated and q.row.model)
                                  .items()))
    return out


def build(trace: Trace, config: Config | None, what: str = "all",
          thresholds: Iterable[float] = THRESHOLDS) -> dict[str, Any]:
    if what not in WHAT:
        raise ValueError(f"what must be one of {', '.join(WHAT)}, got {what!r}")
    data: dict[str, Any] = {"since": iso(trace.since), "until": iso(trace.until), "what": what,
                            "recorded": recorded(trace), "cannot_evaluate": []}
    cannot: list[str] = data["cannot_evaluate"]
    n, bodies = len(trace.requests), trace.with_bodies
    if what in ("cache", "all"):
        if bodies == 0:
            cannot.append("cache: no request bodies were stored (ledger.store_prompts is off for these tenants), "
                          "so exact and semantic hits cannot be replayed; the recorded hits are above")
        else:
            settings = config.cache if config is not None else CacheSettings()
            ts = set(thresholds) | ({settings.semantic.threshold} if settings.semantic.enabled else set())
            data["cache"] = [o.to_dict() for o in cache_policies(trace, settings, ts)]
            if bodies < n:
                cannot.append(f"cache: {n - bodies} of {n} requests have no stored body; they are carried at "
                              "their recorded cost and hits")
    if what in ("route", "all"):
        if config is None:
            cannot.append("route: no candidate config (--config) to route with")
        else:
            data["route"] = replay_routes(trace, config)
            for why, count in data["route"]["skipped"].items():
                cannot.append(f"route: {count} requests not evaluated: {why}")
            cannot.extend(f"route: {note}" for note in data["route"]["notes"])
    if what in ("price", "all"):
        prices = config.prices() if config is not None else None
        data["price"] = price_policies(trace, prices)
        if any(q.row.cache_hit and q.row.model and q.row.price_input == q.row.price_output == 0
               for q in trace.requests):
            cannot.append("price: some cache hits carry no recorded price; their generation cost counts as zero")
    return data


def render(data: dict[str, Any], format: str) -> str:
    if format == "json":
        return json.dumps(data, indent=2)
    if format == "table":
        return render_table(data)
    if format == "html":
        return render_html(data)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:.6g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def sections(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each table of the report: what the table and the HTML page both show."""
    rec = data["recorded"]
    base = rec["cost_usd"]
    out = [("recorded", ["requests", "with stored body", "cost", "exact hits (tokens)", "semantic hits (tokens)"],
            [[f"{rec['requests']:,}", f"{rec['with_bodies']:,}", _usd(base),
              f"{rec['exact']['requests']:,} ({rec['exact']['tokens']:,})",
              f"{rec['semantic']['requests']:,} ({rec['semantic']['tokens']:,})"]])]
    if "cache" in data:
        rows = [["recorded", "-", f"{rec['exact']['requests']:,}", f"{rec['exact']['tokens']:,}",
                 f"{rec['semantic']['requests']:,}", f"{rec['semantic']['tokens']:,}", "-", _usd(base), "-"]]
        for p in data["cache"]:
            e, s = p["exact"], p["semantic"]
            rows.append([p["name"], f"{p['evaluated']:,}", f"{e['requests']:,}", f"{e['tokens']:,}",
                         f"{s['requests']:,}", f"{s['tokens']:,}", f"{s['est_wrong']:.1f}", _usd(p["cost_usd"]),
                         _pct(p["cost_usd"] / base - 1 if base else None)])
        out.append(("response caches", ["policy", "evaluated", "exact hits", "exact tokens", "semantic hits",
                                        "semantic tokens", "est. wrong", "cost", "vs recorded"], rows))
    if "route" in data:
        r = data["route"]
        models = sorted(set(r["chosen"]) | set(r["recorded"]))
        ev = r["evaluated"] or 1
        rows = [["recorded"] + [f"{r['recorded'].get(m, 0) / ev:.1%}" for m in models] + [_usd(r["recorded_cost_usd"])],
                ["candidate"] + [f"{r['chosen'].get(m, 0) / ev:.1%}" for m in models] + [_usd(r["cost_usd"])]]
        agree = "-" if r["agreement"] is None else f"{r['agreement']:.1%}"
        out.append((f"routing ({r['evaluated']:,} generated requests; same model as recorded: {agree})",
                    ["router"] + models + ["cost"], rows))
    if "price" in data:
        rows = [[p["name"], _usd(p["cost_usd"]), _pct(p["vs_recorded"])] for p in data["price"]]
        out.append(("prices", ["policy", "cost", "vs recorded"], rows))
    return out


def render_table(data: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=140, color_system=None)
    console.print(f"tokenomy replay, {data['since'] or 'start'} .. {data['until'] or 'now'}")
    for title, header, rows in sections(data):
        table = Table(title=title)
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in data["cannot_evaluate"]:
        console.print(f"not evaluated: {line}")
    return buf.getvalue()


def render_html(data: dict[str, Any]) -> str:
    parts = ["<!doctype html><meta charset='utf-8'><title>tokenomy replay</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}</style>",
             f"<h1>tokenomy replay, {html.escape(data['since'] or 'start')} .. {html.escape(data['until'] or 'now')}"
             "</h1>"]
    for title, header, rows in sections(data):
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>"
                     + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    if data["cannot_evaluate"]:
        parts.append("<h2>not evaluated</h2><ul>"
                     + "".join(f"<li>{html.escape(x)}</li>" for x in data["cannot_evaluate"]) + "</ul>")
    return "\n".join(parts) + "\n"
