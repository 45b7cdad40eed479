"""`tokenomy report --verify`: every aggregate of the report recomputed from the raw rows by a second code path.

The report (report.py) reads rows as LedgerRow objects and derives each figure through their properties
(billed_tokens, ok, cache_hit ...). This module reads the ledger's columns as plain tuples with its own query,
restates each definition from report.py's docstring inline, computes percentiles with the standard library's
`statistics.quantiles` (method "inclusive", the same type-7 definition) instead of the report's interpolation,
and compares every leaf of the report's figures (total, each group, the timeline) with its own. A figure the
report has and this module does not recompute is a mismatch too, so a new figure cannot go unchecked.

It also checks what each row must satisfy on its own, which a comparison of two sums over the same rows cannot
see: cost_usd = input + cached input + cache write + output parts; saved_tokens and saved_usd are the sums of
saved_by; a response-cache hit costs nothing; cached_tokens + cache_write_tokens <= prompt_tokens.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa

from tokenomy.ledger.tables import ledger

HITS = ("exact", "semantic")
MEASURED = ("nvml", "rapl")
REL = 1e-9
SKIP = {"generated_at"}                      # not an aggregate


def raw_rows(engine: sa.engine.Engine, since: float | None, until: float | None) -> list[dict[str, Any]]:
    q = sa.select(*ledger.c)
    if since is not None:
        q = q.where(ledger.c.ts >= since)
    if until is not None:
        q = q.where(ledger.c.ts < until)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def _pct(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0], "n": 1}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p95": q[94], "n": len(values)}


def _saved(raw: Any) -> dict[str, dict[str, float]]:
    return json.loads(raw) if isinstance(raw, str) and raw else {}


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    hit = [r["cache"] in HITS for r in rows]
    ok = [r["status"] < 400 and r["finish_reason"] not in ("error", "cancelled") for r in rows]
    billed_each = [0 if h else r["prompt_tokens"] + r["completion_tokens"] for r, h in zip(rows, hit, strict=True)]
    billed, n_ok = sum(billed_each), sum(ok)
    delivered = sum(r["completion_tokens"] for r, o in zip(rows, ok, strict=True) if o)
    cost = {k: sum((r[f"cost_{k}_usd"] or 0.0) if k != "total" else r["cost_usd"] for r in rows)
            for k in ("input", "cached_input", "cache_write", "output", "total")}
    span = max(r["ts"] + (r["e2e_s"] or 0.0) for r in rows) - min(r["ts"] for r in rows) if rows else 0.0
    gen_completion = gen_prompt = gen_cached = gen_prefixed = n_gen = 0
    for r, h in zip(rows, hit, strict=True):
        if not h:
            n_gen += 1
            gen_completion += r["completion_tokens"]
            gen_prompt += r["prompt_tokens"]
            gen_cached += r["cached_tokens"]
            gen_prefixed += r["cached_tokens"] > 0
    joules = 0.0
    e_tokens, sources, metered = 0, set(), 0
    for r, b in zip(rows, billed_each, strict=True):
        if r["energy_j"] is not None and r["energy_source"]:
            metered += 1
            joules += r["energy_j"]
            e_tokens += b
            sources.add(r["energy_source"])
    layers: dict[str, dict[str, float]] = {}
    for r in rows:
        for layer, s in _saved(r["saved_by"]).items():
            acc = layers.setdefault(layer, {"tokens": 0, "usd": 0.0})
            acc["tokens"] += int(s["tokens"])
            acc["usd"] += float(s["usd"])
    lookups = [r for r in rows if r["cache"] in ("miss", "explore", *HITS) and r["status"] < 400]
    cache = {}
    for layer in HITS:
        h = len([r for r in lookups if r["cache"] == layer])
        s = layers.get(layer, {"tokens": 0, "usd": 0.0})
        cache[layer] = {"hits": h, "lookups": len(lookups), "hit_rate": _div(h, len(lookups)),
                        "tokens_saved": s["tokens"], "usd_saved": s["usd"]}
    s = layers.get("prefix", {"tokens": 0, "usd": 0.0})
    cache["prefix"] = {"hits": gen_prefixed, "lookups": n_gen, "hit_rate": _div(gen_cached, gen_prompt),
                       "tokens_saved": s["tokens"], "usd_saved": s["usd"]}
    scores = [r["feedback_score"] for r in rows if r["feedback_score"] is not None]
    srcs = sorted(sources)
    worked = [r for r in rows if r["context_tokens_before"] is not None]
    before = sum(r["context_tokens_before"] for r in worked)
    after = sum(r["context_tokens_after"] or 0 for r in worked)
    return {
        "requests": n, "ok": n_ok, "errors": n - n_ok, "success_rate": _div(n_ok, n),
        "tokens": {"prompt": sum(r["prompt_tokens"] for r in rows), "cached": sum(r["cached_tokens"] for r in rows),
                   "cache_write": sum(r["cache_write_tokens"] or 0 for r in rows),
                   "completion": sum(r["completion_tokens"] for r in rows), "billed": billed,
                   "delivered": delivered},
        "span_s": span, "tokens_per_s": _div(billed, span), "completion_tokens_per_s": _div(gen_completion, span),
        "cost_usd": cost, "tokens_per_usd": _div(billed, cost["total"]),
        "cost_per_1k_tokens_usd": _div(1000 * cost["total"], billed), "cost_per_request_usd": _div(cost["total"], n),
        "energy": {"joules": joules if metered else None, "tokens": e_tokens, "sources": srcs,
                   "label": None if not metered else "measured" if set(srcs) <= set(MEASURED) else "estimate",
                   "tokens_per_joule": _div(e_tokens, joules)},
        "cache": cache,
        "saved": {"tokens": sum(v["tokens"] for v in layers.values()), "usd": sum(v["usd"] for v in layers.values()),
                  "by": layers},
        "token_efficiency": _div(delivered, billed),
        "latency": {k: _pct([r[k] for r in rows if r[k] is not None]) for k in ("ttft_s", "tpot_s", "e2e_s")},
        "over_budget": {"context": sum(bool(r["over_budget"]) for r in rows),
                        "spend": sum(r["status"] == 429 and r["error_code"] == "budget_exceeded" for r in rows)},
        "feedback": {"count": len(scores), "mean": _div(sum(scores), len(scores))},
        "notional_prices": sorted({r["model"] for r in rows if r["price_notional"] and r["model"]}),
        "context": {"requests": len(worked), "tokens_before": before, "tokens_after": after,
                    "kept": _div(after, before), "cost_usd": sum(r["context_cost_usd"] or 0.0 for r in worked)},
    }


def timeline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from tokenomy.report.figures import iso

    if not rows:
        return {"bucket_s": 60, "points": []}
    ts = [r["ts"] for r in rows]
    span = max(ts) - min(ts)
    width = 86400 if span > 2 * 86400 else 3600 if span > 2 * 3600 else 60
    points: dict[int, dict[str, Any]] = {}
    for r in rows:
        b = int(r["ts"] // width) * width
        p = points.setdefault(b, {"t": iso(b), "requests": 0, "billed": 0, "delivered": 0, "cost_usd": 0.0})
        p["requests"] += 1
        p["billed"] += 0 if r["cache"] in HITS else r["prompt_tokens"] + r["completion_tokens"]
        ok = r["status"] < 400 and r["finish_reason"] not in ("error", "cancelled")
        p["delivered"] += r["completion_tokens"] if ok else 0
        p["cost_usd"] += r["cost_usd"]
    return {"bucket_s": width, "points": [points[b] for b in sorted(points)]}


def recompute(rows: list[dict[str, Any]], by: str | None) -> dict[str, Any]:
    column = {"key": "key_id", "tenant": "tenant", "model": "model", "route": "route", None: None}[by]
    groups: dict[str, list[dict[str, Any]]] = {}
    if column is not None:
        for r in rows:
            groups.setdefault(r[column] or "(none)", []).append(r)
    return {"total": figures(rows), "groups": {k: figures(v) for k, v in groups.items()},
            "timeline": timeline(rows)}


def row_problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        rid = r["request_id"]
        parts = r["cost_input_usd"] + r["cost_cached_input_usd"] + (r["cost_cache_write_usd"] or 0.0) \
            + r["cost_output_usd"]
        if not _close(parts, r["cost_usd"]):
            out.append(f"row {rid}: cost_usd {r['cost_usd']!r} != input + cached input + cache write + output "
                       f"{parts!r}")
        saved = _saved(r["saved_by"])
        tokens, usd = sum(int(s["tokens"]) for s in saved.values()), sum(float(s["usd"]) for s in saved.values())
        if tokens != r["saved_tokens"] or not _close(usd, r["saved_usd"]):
            out.append(f"row {rid}: saved_tokens/saved_usd ({r['saved_tokens']}, {r['saved_usd']!r}) != the sums "
                       f"of saved_by ({tokens}, {usd!r})")
        if r["cache"] in HITS and r["cost_usd"] != 0:
            out.append(f"row {rid}: a {r['cache']} cache hit with cost_usd {r['cost_usd']!r} (hits cost nothing)")
        if r["cached_tokens"] + (r["cache_write_tokens"] or 0) > r["prompt_tokens"]:
            out.append(f"row {rid}: cached_tokens {r['cached_tokens']} + cache_write_tokens "
                       f"{r['cache_write_tokens'] or 0} > prompt_tokens {r['prompt_tokens']}")
    return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k not in SKIP:
                out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = {}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out
    return {path: value}


def compare(report: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[str]:
    """One line per figure that differs, or that only one side has."""
    mine = _leaves({k: recomputed[k] for k in ("total", "groups", "timeline")})
    theirs = _leaves({k: report[k] for k in ("total", "groups", "timeline")})
    out = []
    for path in sorted(set(mine) | set(theirs)):
        if path not in mine:
            out.append(f"{path}: in the report ({theirs[path]!r}) but not recomputed")
        elif path not in theirs:
            out.append(f"{path}: recomputed ({mine[path]!r}) but missing from the report")
        elif not _close(theirs[path], mine[path]):
            out.append(f"{path}: report {theirs[path]!r} != recomputed {mine[path]!r}")
    return out


def verify(report: Mapping[str, Any], engine: sa.engine.Engine, since: float | None, until: float | None,
           by: str | None) -> tuple[int, list[str]]:
    """(figures checked, mismatches) for a report built over since <= ts < until, grouped by `by`."""
    rows = raw_rows(engine, since, until)
    recomputed = recompute(rows, by)
    return len(_leaves(recomputed)), row_problems(rows) + compare(report, recomputed)
