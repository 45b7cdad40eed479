"""Spend budgets per API key and per tenant: USD and tokens, per day and per month (UTC periods).

Spend is a running total in memory, seeded from the ledger at start (`seed`) and advanced by every recorded
row (`record`), so checking costs no database query. What counts, as in the ledger's conventions:
    usd    = sum(cost_usd)                          (response-cache hits cost nothing)
    tokens = sum(prompt + completion) of rows a model generated (billed tokens)
`check(key_id, tenant)` refuses a request once any budget that applies is spent (used >= limit), with a 429
that names the budget and when it resets. A request admitted under its budget may finish above it: its cost
is only known at the end. Crossing `warn_at` x limit logs a warning and counts tokenomy_budget_warnings_total,
once per budget and period. With several gateway processes each keeps its own total since its start.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenomy.config import BudgetLimits
from tokenomy.errors import APIError
from tokenomy.meter.row import LedgerRow

log = logging.getLogger("tokenomy.budget")

PERIODS = ("day", "month")
UNITS = ("usd", "tokens")


def period_bounds(period: str, t: float) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the UTC day or month holding UNIX time t."""
    now = dt.datetime.fromtimestamp(t, dt.UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + dt.timedelta(days=1)
    if period == "month":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return start, end
    raise ValueError(f"period must be day or month, got {period!r}")


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


class BudgetExceeded(APIError):
    """429 with an OpenAI-style body: which budget is spent and when it resets (ISO 8601, UTC)."""

    def __init__(self, scope: str, ident: str, name: str, unit: str, period: str, limit: float, used: float,
                 resets_at: dt.datetime, now: float) -> None:
        self.scope, self.ident, self.unit, self.period = scope, ident, unit, period
        self.limit, self.used, self.resets_at = limit, used, resets_at
        amount = (f"${limit:,.2f} (${used:,.4f} used)" if unit == "usd"
                  else f"{int(limit):,} tokens ({int(used):,} used)")
        every = "daily" if period == "day" else "monthly"
        retry = max(1, math.ceil(resets_at.timestamp() - now))
        super().__init__(429, f"Budget exceeded: the {every} {unit.upper() if unit == 'usd' else unit} budget of "
                         f"{scope} '{name}' is {amount}. It resets at {iso(resets_at)}.",
                         code="budget_exceeded", type_="insufficient_quota",
                         headers={"retry-after": str(retry)})


@dataclass
class _Subject:
    scope: str          # key | tenant
    ident: str          # key_id or tenant name
    name: str           # what messages call it (the key's name)
    limits: BudgetLimits


class Budgets:
    def __init__(self, keys: dict[str, BudgetLimits] | None = None, tenants: dict[str, BudgetLimits] | None = None,
                 key_names: dict[str, str] | None = None, metrics: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`keys`: key_id -> limits; `tenants`: tenant -> limits; `key_names`: key_id -> name for messages;
        `metrics`: a Metrics (budget_used_ratio, budget_warnings)."""
        names = key_names or {}
        self.subjects: dict[tuple[str, str], _Subject] = {}
        for kid, lim in (keys or {}).items():
            self.subjects[("key", kid)] = _Subject("key", kid, names.get(kid, kid), lim)
        for tenant, lim in (tenants or {}).items():
            self.subjects[("tenant", tenant)] = _Subject("tenant", tenant, tenant, lim)
        self.metrics = metrics
        self.clock = clock
        # (scope, ident, period, period start) -> [usd, tokens]
        self._used: dict[tuple[str, str, str, float], list[float]] = {}
        self._warned: set[tuple[str, str, str, str, float]] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.subjects)

    def _applicable(self, key_id: str | None, tenant: str | None) -> Iterator[_Subject]:
        for k in (("key", key_id), ("tenant", tenant)):
            if k[1] is not None and k in self.subjects:
                yield self.subjects[k]

    def seed(self, ledger: Any) -> None:
        """Load this month's (and so today's) spend from the ledger; call once at start."""
        if not self.enabled:
            return
        now = self.clock()
        for period in PERIODS:
            start, _ = period_bounds(period, now)
            for scope, by in (("key", "key_id"), ("tenant", "tenant")):
                for ident, (usd, tokens) in ledger.totals(start, by=by).items():
                    if ident is not None and (scope, ident) in self.subjects:
                        self._used[(scope, ident, period, start.timestamp())] = [usd, float(tokens)]

    def used(self, scope: str, ident: str, period: str) -> tuple[float, int]:
        """(USD, tokens) spent by a key or tenant in the current day or month."""
        start, _ = period_bounds(period, self.clock())
        usd, tokens = self._used.get((scope, ident, period, start.timestamp()), (0.0, 0.0))
        return usd, int(tokens)

    def record(self, row: LedgerRow) -> None:
        """Add a finished request's spend (a record sink calls this with its ledger row)."""
        if not self.enabled:
            return
        usd, tokens = row.cost_usd, row.billed_tokens
        if usd == 0 and tokens == 0:
            return
        now = self.clock()
        with self._lock:
            for s in self._applicable(row.key_id, row.tenant):
                for period in PERIODS:
                    start, end = period_bounds(period, now)
                    slot = self._used.setdefault((s.scope, s.ident, period, start.timestamp()), [0.0, 0.0])
                    slot[0] += usd
                    slot[1] += tokens
                    self._observe(s, period, start, slot)
            self._prune(now)

    def _observe(self, s: _Subject, period: str, start: dt.datetime, slot: list[float]) -> None:
        for i, unit in enumerate(UNITS):
            limit = s.limits.limit(unit, period)
            if limit is None:
                continue
            ratio = slot[i] / limit
            if self.metrics is not None:
                self.metrics.budget_used.labels(s.scope, s.ident, period, unit).set(ratio)
            mark = (s.scope, s.ident, period, unit, start.timestamp())
            if ratio >= s.limits.warn_at and mark not in self._warned:
                self._warned.add(mark)
                log.warning("budget warning: %s '%s' has used %.0f%% of its %s %s budget (%s of %s)",
                            s.scope, s.name, 100 * ratio, "daily" if period == "day" else "monthly", unit,
                            f"{slot[i]:.4f}" if unit == "usd" else int(slot[i]), limit)
                if self.metrics is not None:
                    self.metrics.budget_warnings.labels(s.scope, period, unit).inc()

    def _prune(self, now: float) -> None:
        live = {period_bounds(p, now)[0].timestamp() for p in PERIODS}
        for k in [k for k in self._used if k[3] not in live]:
            del self._used[k]
        self._warned = {w for w in self._warned if w[4] in live}

    def check(self, key_id: str | None, tenant: str | None) -> None:
        """Raise BudgetExceeded (a 429 APIError) if any budget of this key or tenant is spent."""
        if not self.enabled:
            return
        now = self.clock()
        for s in self._applicable(key_id, tenant):
            for period in PERIODS:
                start, end = period_bounds(period, now)
                usd, tokens = self._used.get((s.scope, s.ident, period, start.timestamp()), (0.0, 0.0))
                for unit, used in (("usd", usd), ("tokens", tokens)):
                    limit = s.limits.limit(unit, period)
                    if limit is not None and used >= limit:
                        raise BudgetExceeded(s.scope, s.ident, s.name, unit, period, limit, used, end, now)
