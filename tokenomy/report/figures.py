"""The efficiency report: every figure is a plain function of ledger rows (see row.py for the conventions).

Per group of rows (all rows, and each key / tenant / model / route with `by`):
    requests, ok, errors, success_rate = ok / requests
    span_s                 = max(ts + e2e_s) - min(ts)
    tokens_per_s           = billed / span_s ;  completion_tokens_per_s = completion of generated rows / span_s
    tokens_per_usd         = billed / cost_usd
    cost_per_1k_tokens_usd = 1000 * cost_usd / billed ;  cost_per_request_usd = cost_usd / requests
    tokens_per_joule       = billed tokens of rows with energy / their joules, labelled measured only when every
                             such row was measured (nvml, rapl), else estimate
    cache hit rate         = exact or semantic hits / lookups (rows: cache miss|explore|exact|semantic, status < 400);
                             prefix: cached / prompt tokens of generated rows
    saved                  = sums of saved_by per layer (tokens, USD)
    token_efficiency       = delivered / billed   (delivered: completion tokens of ok rows, cache hits included)
    ttft/tpot/e2e p50, p95 = linear-interpolated percentiles (numpy's default) over non-null values
    over_budget            = context: rows flagged over their route's context budget; spend: rows refused 429
                             with error code budget_exceeded
    context                = rows the context stage changed: prompt tokens before and after, its own cost (USD)
A ratio with a zero denominator is null.

The prompt-layout section (`lint`, per tenant, over rows the lint saw; units are the lint's layout units):
    cached share   = sum(lint_prefix) / sum(lint_units)      (what prefix reuse across requests could reach now)
    possible share = sum(lint_potential) / sum(lint_units)   (had the lint's advice been followed)
    breaks         = count per reason; spans = the most frequent (reason, where, offending span), up to 5
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tokenomy.hardware.energy import MEASURED_SOURCES
from tokenomy.ledger.row import SAVING_LAYERS, LedgerRow
from tokenomy.report.figure_rows import ROWS

BY = ("key", "tenant", "model", "route")
FORMATS = ("table", "json", "html")
NONE_GROUP = "(none)"
_REL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str | float | None, now: float | None = None) -> float | None:
    """'' or None -> None; '30m', '24h', '7d', '2w' -> that long before now; 'now'; an ISO 8601 date or datetime
    (naive means UTC); or UNIX seconds. Raises ValueError with the accepted forms, and for a time that is not
    finite or falls outside the years 1 to 9999 (which no date can show)."""
    t = _parse_time(text, now)
    if t is not None and not (math.isfinite(t) and _FIRST <= t <= _LAST):
        raise ValueError(f"{text!r} is not a time between the years 1 and 9999")
    return t


_FIRST, _LAST = -62135596800.0, 253402300799.0     # 0001-01-01 and 9999-12-31T23:59:59, UTC


def _parse_time(text: str | float | None, now: float | None) -> float | None:
    if text is None:
        return None
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    s = str(text).strip()
    if not s:
        return None
    now = time.time() if now is None else now
    if s.lower() == "now":
        return now
    m = _REL.match(s)
    if m:
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(s)
    except ValueError:
        pass
    try:
        d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use an ISO date or datetime (2025-01-31, 2025-01-31T12:00Z), "
                         f"a duration before now (30m, 24h, 7d, 2w), 'now', or UNIX seconds") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return d.timestamp()


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (Hyndman-Fan type 7, numpy's default); None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def figures(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    """All report figures for one group of rows."""
    n = len(rows)
    ok = sum(r.ok for r in rows)
    generated = [r for r in rows if not r.cache_hit]
    billed = sum(r.billed_tokens for r in rows)
    delivered = sum(r.delivered_tokens for r in rows)
    gen_completion = sum(r.completion_tokens for r in generated)
    span = (max(r.ts + (r.e2e_s or 0.0) for r in rows) - min(r.ts for r in rows)) if rows else 0.0
    cost = {"input": sum(r.cost_input_usd for r in rows), "cached_input": sum(r.cost_cached_input_usd for r in rows),
            "cache_write": sum(r.cost_cache_write_usd for r in rows), "output": sum(r.cost_output_usd for r in rows),
            "total": sum(r.cost_usd for r in rows)}
    metered = [r for r in rows if r.energy_j is not None and r.energy_source]
    joules = sum(r.energy_j or 0.0 for r in metered)
    sources = sorted({r.energy_source or "" for r in metered})
    energy_tokens = sum(r.billed_tokens for r in metered)
    lookups = [r for r in rows if r.cache in ("miss", "explore", "exact", "semantic") and r.status < 400]
    saved_by: dict[str, dict[str, float]] = {}
    for r in rows:
        for layer, s in r.saved_by.items():
            acc = saved_by.setdefault(layer, {"tokens": 0, "usd": 0.0})
            acc["tokens"] += int(s["tokens"])
            acc["usd"] += float(s["usd"])
    cache: dict[str, dict[str, Any]] = {}
    for layer in ("exact", "semantic"):
        hits = sum(r.cache == layer for r in lookups)
        s = saved_by.get(layer, {"tokens": 0, "usd": 0.0})
        cache[layer] = {"hits": hits, "lookups": len(lookups), "hit_rate": _ratio(hits, len(lookups)),
                        "tokens_saved": s["tokens"], "usd_saved": s["usd"]}
    gen_prompt = sum(r.prompt_tokens for r in generated)
    gen_cached = sum(r.cached_tokens for r in generated)
    s = saved_by.get("prefix", {"tokens": 0, "usd": 0.0})
    cache["prefix"] = {"hits": sum(r.cached_tokens > 0 for r in generated), "lookups": len(generated),
                       "hit_rate": _ratio(gen_cached, gen_prompt), "tokens_saved": s["tokens"], "usd_saved": s["usd"]}

    def pct(attr: str) -> dict[str, float | None]:
        vals = [v for v in (getattr(r, attr) for r in rows) if v is not None]
        return {"p50": percentile(vals, 0.5), "p95": percentile(vals, 0.95), "n": len(vals)}

    scores = [r.feedback_score for r in rows if r.feedback_score is not None]
    return {
        "requests": n, "ok": ok, "errors": n - ok, "success_rate": _ratio(ok, n),
        "tokens": {"prompt": sum(r.prompt_tokens for r in rows), "cached": sum(r.cached_tokens for r in rows),
                   "cache_write": sum(r.cache_write_tokens for r in rows),
                   "completion": sum(r.completion_tokens for r in rows), "billed": billed, "delivered": delivered},
        "span_s": span,
        "tokens_per_s": _ratio(billed, span),
        "completion_tokens_per_s": _ratio(gen_completion, span),
        "cost_usd": cost,
        "tokens_per_usd": _ratio(billed, cost["total"]),
        "cost_per_1k_tokens_usd": _ratio(1000 * cost["total"], billed),
        "cost_per_request_usd": _ratio(cost["total"], n),
        "energy": {"joules": joules if metered else None, "tokens": energy_tokens, "sources": sources,
                   "label": (None if not metered else
                             "measured" if all(x in MEASURED_SOURCES for x in sources) else "estimate"),
                   "tokens_per_joule": _ratio(energy_tokens, joules)},
        "cache": cache,
        "saved": {"tokens": sum(v["tokens"] for v in saved_by.values()),
                  "usd": sum(v["usd"] for v in saved_by.values()),
                  "by": {k: saved_by[k] for k in sorted(saved_by, key=_layer_order)}},
        "token_efficiency": _ratio(delivered, billed),
        "latency": {"ttft_s": pct("ttft_s"), "tpot_s": pct("tpot_s"), "e2e_s": pct("e2e_s")},
        "over_budget": {"context": sum(r.over_budget for r in rows),
                        "spend": sum(r.status == 429 and r.error_code == "budget_exceeded" for r in rows)},
        "feedback": {"count": len(scores), "mean": _ratio(sum(scores), len(scores))},
        "notional_prices": sorted({r.model for r in rows if r.price_notional and r.model}),
        "context": context_figures(rows),
    }


def context_figures(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    worked = [r for r in rows if r.context_tokens_before is not None]
    before = sum(r.context_tokens_before or 0 for r in worked)
    after = sum(r.context_tokens_after or 0 for r in worked)
    return {"requests": len(worked), "tokens_before": before, "tokens_after": after,
            "kept": _ratio(after, before), "cost_usd": sum(r.context_cost_usd or 0.0 for r in worked)}


def lint_figures(rows: Sequence[LedgerRow]) -> dict[str, dict[str, Any]]:
    """The prompt-layout section: per tenant, see the module docstring."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.lint_units is None:
            continue
        t = out.setdefault(r.tenant, {"requests": 0, "units": 0, "prefix": 0, "potential": 0, "breaks": {},
                                      "_spans": {}})
        t["requests"] += 1
        t["units"] += r.lint_units
        t["prefix"] += r.lint_prefix or 0
        t["potential"] += r.lint_potential or 0
        for b in r.lint_breaks or []:
            t["breaks"][b["reason"]] = t["breaks"].get(b["reason"], 0) + 1
            k = (b["reason"], f"{r.route or r.model}: {b['segment']}", b["span"])
            t["_spans"][k] = t["_spans"].get(k, 0) + 1
    for t in out.values():
        t["cached_share"], t["possible_share"] = _ratio(t["prefix"], t["units"]), _ratio(t["potential"], t["units"])
        spans = sorted(t.pop("_spans").items(), key=lambda kv: -kv[1])[:5]
        t["spans"] = [{"reason": k[0], "where": k[1], "span": k[2], "count": n} for k, n in spans]
    return dict(sorted(out.items()))


def _layer_order(layer: str) -> tuple[int, str]:
    return (SAVING_LAYERS.index(layer) if layer in SAVING_LAYERS else len(SAVING_LAYERS), layer)


def group_key(row: LedgerRow, by: str) -> str:
    value = {"key": row.key_id, "tenant": row.tenant, "model": row.model, "route": row.route}[by]
    return value if value else NONE_GROUP


def timeline(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    """Per time bucket (a minute, an hour or a day, by span): requests, billed and delivered tokens, cost."""
    if not rows:
        return {"bucket_s": 60, "points": []}
    span = max(r.ts for r in rows) - min(r.ts for r in rows)
    width = 60 if span <= 2 * 3600 else 3600 if span <= 2 * 86400 else 86400
    points: dict[float, dict[str, Any]] = {}
    for r in rows:
        t = math.floor(r.ts / width) * width
        p = points.setdefault(t, {"t": iso(t), "requests": 0, "billed": 0, "delivered": 0, "cost_usd": 0.0})
        p["requests"] += 1
        p["billed"] += r.billed_tokens
        p["delivered"] += r.delivered_tokens
        p["cost_usd"] += r.cost_usd
    return {"bucket_s": width, "points": [points[t] for t in sorted(points)]}


def build(rows: Iterable[LedgerRow], since: float | None = None, until: float | None = None,
          by: str | None = None) -> dict[str, Any]:
    """The report as one JSON-ready object: {since, until, by, total, groups, timeline}."""
    if by is not None and by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, got {by!r}")
    rows = list(rows)
    groups: dict[str, list[LedgerRow]] = {}
    if by is not None:
        for r in rows:
            groups.setdefault(group_key(r, by), []).append(r)
    return {"since": iso(since), "until": iso(until), "by": by, "generated_at": iso(time.time()),
            "total": figures(rows), "groups": {k: figures(v) for k, v in sorted(groups.items())},
            "timeline": timeline(rows), "lint": lint_figures(rows)}


def report(ledger: Any, since: float | None = None, until: float | None = None, by: str | None = None,
           format: str = "table") -> str:
    """Read the ledger (a Ledger) over since <= ts < until and render the report as table, json or html."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    data = build(ledger.query(since=since, until=until), since, until, by)
    return render(data, format)


def render(data: dict[str, Any], format: str) -> str:
    if format == "json":
        return json.dumps(data, indent=2)
    if format == "html":
        from tokenomy.report.page import render_page

        return render_page(data)
    if format == "table":
        return render_table(data)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")


def lookup(figs: dict[str, Any], path: str) -> Any:
    v: Any = figs
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v


def fmt(value: Any, kind: str) -> str:
    """How a figure reads in the table (the page's JS formats the same way)."""
    if value is None:
        return "-"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "usd":
        return f"${value:.6g}"
    if kind == "sec":
        return f"{value:.4f}"
    return f"{value:,.4g}" if abs(value) < 1e15 else f"{value:.4e}"


def _cell(figs: dict[str, Any], path: str, kind: str) -> str:
    text = fmt(lookup(figs, path), kind)
    if path.startswith("energy.") and figs["energy"]["label"]:
        text += f" ({figs['energy']['label']})"
    if path == "feedback.mean" and figs["feedback"]["count"]:
        text += f" ({figs['feedback']['count']})"
    return text


def render_table(data: dict[str, Any]) -> str:
    from rich.console import Console
    from rich.table import Table

    window = f"{data['since'] or 'start'} .. {data['until'] or 'now'}"
    table = Table(title=f"tokenomy report, {window}" + (f", by {data['by']}" if data["by"] else ""))
    table.add_column("figure")
    cols = [("all", data["total"])] + list(data["groups"].items())
    for name, _ in cols:
        table.add_column(name, justify="right")
    for label_, path, kind in ROWS:
        table.add_row(label_, *(_cell(f, path, kind) for _, f in cols))
    out = io.StringIO()
    console = Console(file=out, width=max(100, 40 + 18 * len(cols)), color_system=None)
    console.print(table)
    notional = data["total"]["notional_prices"]
    if notional:
        console.print(f"Prices for {', '.join(notional)} are notional (packaged models have no market price).")
    if data["total"]["energy"]["label"] == "estimate":
        console.print("Energy is an estimate (CPU time x watts per core), not a measurement.")
    ctxf = data["total"].get("context") or {}
    if ctxf.get("requests"):
        console.print(f"Context stage: {ctxf['requests']} requests changed, prompt tokens {ctxf['tokens_before']:,}"
                      f" -> {ctxf['tokens_after']:,}, its own cost {fmt(ctxf['cost_usd'], 'usd')}.")
    for tenant, t in (data.get("lint") or {}).items():
        console.print(f"Prompt layout, tenant {tenant}: {t['requests']} requests; prefix reusable across requests "
                      f"{fmt(t['cached_share'], 'pct')}, possible {fmt(t['possible_share'], 'pct')}; breaks: "
                      + (", ".join(f"{k} {v}" for k, v in sorted(t["breaks"].items())) or "none"))
        for sp in t["spans"]:
            console.print(f"  {sp['reason']} x{sp['count']} at {sp['where']}: {sp['span']!r}")
    return out.getvalue()
