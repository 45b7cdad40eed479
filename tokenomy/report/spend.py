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


def spend(rows: Iterable[LedgerRow], group_by: str) -> dict[str, Any]:
    """{"group_by", "data": [{group_by: value, requests, input_tokens, output_tokens, cached_tokens, cost_usd}],
    "total": {...}}, groups in order of their value (null last)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, got {group_by!r}")
    groups: dict[str | None, dict[str, Any]] = {}
    total = _zero()
    for r in rows:
        _add(groups.setdefault(group_of(r, group_by), _zero()), r)
        _add(total, r)
    order = sorted(groups, key=lambda g: (g is None, g or ""))
    return {"group_by": group_by, "data": [{group_by: g, **groups[g]} for g in order], "total": total}
