"""Spend by one dimension (the admin API's GET /admin/spend): per group of ledger rows, the requests, input, output
and cached tokens and USD, with the same conventions as the report (report/figures.py): every row counts, errors
and response-cache hits included; input = prompt_tokens, output = completion_tokens, cost = cost_usd. A row with
no value for the dimension (no key, no user) is its own group, null."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from tokenomy.ledger.row import LedgerRow

GROUP_BY = ("tenant", "key", "model", "user", "day")


def group_of(row: LedgerRow, by: str) -> str | None:
    if by == "day":
        return dt.datetime.fromtimestamp(row.ts, dt.UTC).date().isoformat()
    return {"tenant": row.tenant, "key": row.key_id, "model": row.model, "user": row.user}[by] or None


def _zero() -> dict[str, Any]:
    return {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "cost_usd": 0.0}


def _add(acc: dict[str, Any], r: LedgerRow) -> None:
    acc["requests"] += 1
    acc["input_tokens"] += r.prompt_tokens
    acc["output_tokens"] += r.completion_tokens
    acc["cached_tokens"] += r.cached_tokens
    acc["cost_usd"] += r.cost_usd


def dimensions(group_by: str) -> tuple[str, ...]:
    """'tenant' or 'day,model' (at most two, each of GROUP_BY) -> the dimensions; ValueError otherwise."""
    dims = tuple(d.strip() for d in group_by.split(","))
    if not 1 <= len(dims) <= 2 or len(set(dims)) != len(dims) or any(d not in GROUP_BY for d in dims):
        raise ValueError(f"group_by must be one or two (comma-separated) of {', '.join(GROUP_BY)}, got {group_by!r}")
    return dims


def spend(rows: Iterable[LedgerRow], group_by: str) -> dict[str, Any]:
    """{"group_by", "data": [{dimension: value, ..., requests, input_tokens, output_tokens, cached_tokens,
    cost_usd}], "total": {...}}, grouped by one dimension or two ('day,tenant': over time), groups in order of their
    values (null last)."""
    dims = dimensions(group_by)
    groups: dict[tuple[str | None, ...], dict[str, Any]] = {}
    total = _zero()
    for r in rows:
        _add(groups.setdefault(tuple(group_of(r, d) for d in dims), _zero()), r)
        _add(total, r)
    order = sorted(groups, key=lambda g: tuple((v is None, v or "") for v in g))
    return {"group_by": ",".join(dims), "data": [{**dict(zip(dims, g, strict=True)), **groups[g]} for g in order],
            "total": total}
