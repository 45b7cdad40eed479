"""Spend budgets per API key and per tenant: USD and tokens, per day and per month (UTC periods).

Spend is a running total in memory, seeded from the ledger at start (`seed`) and advanced by every recorded
row (`record`), so checking costs no database query. What counts, as in the ledger's conventions:
    usd    = sum(cost_usd)                          (response-cache hits cost nothing)
    tokens = sum(prompt + completion) of rows a model generated (billed tokens)
`check(key_id, tenant)` refuses a request once any budget that applies is spent (used >= limit), with a 429
that names the budget and when it resets. A request admitted under its budget may finish above it: its cost
is only known at the end. Crossing `warn_at` x limit logs a warning and counts tokenomy_budget_warnings_total,
once per budget and period.

With several gateway processes, `shared` (meter/shared.py) keeps the totals in Redis instead of in memory, so all
of them count one spend; each raises Redis's totals to at least the ledger's at start and after an outage. When
Redis does not answer, `check` refuses with a 503 (`fail_open` False, the default) or admits unchecked; spend
recorded meanwhile is in the ledger and comes back with the next seed. A budget holds to within the cost of the
requests admitted while it still had room: one at a time, at most one request's cost over.
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
from tokenomy.meter.shared import SharedCounters, StoreDown

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
                 clock: Callable[[], float] = time.time, shared: SharedCounters | None = None,
                 fail_open: bool = False) -> None:
        """`keys`: key_id -> limits; `tenants`: tenant -> limits; `key_names`: key_id -> name for messages;
        `metrics`: a Metrics (budget_used_ratio, budget_warnings); `shared`: totals in Redis, shared by gateways;
        `fail_open`: admit (True) or refuse (False) while `shared` does not answer."""
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
        self.shared, self.fail_open = shared, fail_open
        self._ledger: Any = None

    @property
    def enabled(self) -> bool:
        return bool(self.subjects)

    def _applicable(self, key_id: str | None, tenant: str | None) -> Iterator[_Subject]:
        for k in (("key", key_id), ("tenant", tenant)):
            if k[1] is not None and k in self.subjects:
                yield self.subjects[k]

    def seed(self, ledger: Any) -> None:
        """Load this month's (and so today's) spend from the ledger; call once at start."""
        self._ledger = ledger
        if not self.enabled:
            return
        now = self.clock()
        for period in PERIODS:
            start, end = period_bounds(period, now)
            for scope, by in (("key", "key_id"), ("tenant", "tenant")):
                for ident, (usd, tokens) in ledger.totals(start, by=by).items():
                    if ident is None or (scope, ident) not in self.subjects:
                        continue
                    slot = (scope, ident, period, start.timestamp())
                    if self.shared is None:
                        self._used[slot] = [usd, float(tokens)]
                        continue
                    try:
                        self.shared.budget_raise(slot, usd, float(tokens), end.timestamp() + 86400)
                    except StoreDown as e:
                        log.warning("budgets not seeded into the shared store (%s); they will be when it answers", e)
                        return

    def reseed(self) -> None:
        """Seed again from the ledger that `seed` was given (the shared store answers again after an outage)."""
        if self._ledger is not None:
            self.seed(self._ledger)

    def used(self, scope: str, ident: str, period: str) -> tuple[float, int]:
        """(USD, tokens) spent by a key or tenant in the current day or month."""
        start, _ = period_bounds(period, self.clock())
        slot = (scope, ident, period, start.timestamp())
        usd, tokens = self.shared.budget_get([slot])[0] if self.shared is not None else self._used.get(slot, (0.0, 0.0))
        return usd, int(tokens)

    def record(self, row: LedgerRow) -> None:
        """Add a finished request's spend (a record sink calls this with its ledger row)."""
        if not self.enabled:
            return
        usd, tokens = row.cost_usd, row.billed_tokens
        if usd == 0 and tokens == 0:
            return
        now = self.clock()
        if self.shared is not None:
            self._record_shared(row, usd, tokens, now)
            return
        with self._lock:
            for s in self._applicable(row.key_id, row.tenant):
                for period in PERIODS:
                    start, end = period_bounds(period, now)
                    slot = self._used.setdefault((s.scope, s.ident, period, start.timestamp()), [0.0, 0.0])
                    slot[0] += usd
                    slot[1] += tokens
                    self._observe(s, period, start, slot)
            self._prune(now)

    def _record_shared(self, row: LedgerRow, usd: float, tokens: float, now: float) -> None:
        assert self.shared is not None
        slots = [(s, period, *period_bounds(period, now)) for s in self._applicable(row.key_id, row.tenant)
                 for period in PERIODS]
        try:
            totals = self.shared.budget_add([((s.scope, s.ident, period, start.timestamp()), end.timestamp() + 86400)
                                             for s, period, start, end in slots], usd, tokens)
        except StoreDown as e:      # the ledger has the row; the next seed (on recovery) counts it
            log.warning("spend of %s not counted in the shared store: %s", row.request_id, e)
            return
        with self._lock:
            for (s, period, start, _), total in zip(slots, totals, strict=True):
                self._observe(s, period, start, list(total))

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
        checks = [(s, period, *period_bounds(period, now)) for s in self._applicable(key_id, tenant)
                  for period in PERIODS]
        slots = [(s.scope, s.ident, period, start.timestamp()) for s, period, start, _ in checks]
        if not slots:
            return
        if self.shared is None:
            totals = [tuple(self._used.get(slot, (0.0, 0.0))) for slot in slots]
        else:
            try:
                totals = self.shared.budget_get(slots)
            except StoreDown as e:
                if self.fail_open:
                    return
                raise APIError(503, "Budgets cannot be checked: their shared store does not answer. Retry later.",
                               code="limits_unavailable", type_="server_error",
                               headers={"retry-after": "1"}) from e
        for (s, period, _, end), (usd, tokens) in zip(checks, totals, strict=True):
            for unit, used in (("usd", usd), ("tokens", tokens)):
                limit = s.limits.limit(unit, period)
                if limit is not None and used >= limit:
                    raise BudgetExceeded(s.scope, s.ident, s.name, unit, period, limit, used, end, now)
