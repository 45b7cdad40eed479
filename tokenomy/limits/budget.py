"""Spend budgets per API key and per tenant: USD and tokens, per day and per month (UTC periods).

Spend is a running total in memory, seeded from the ledger at start (`seed`) and advanced by every recorded
row (`record`), so checking costs no database query. What counts, as in the ledger's conventions:
    usd    = sum(cost_usd)                          (response-cache hits cost nothing)
    tokens = sum(prompt + completion) of rows a model generated (billed tokens)

Reserve, then settle. Before a request reaches a backend, `reserve` holds the most it can cost (its prompt plus
its output bound, priced at the model that serves it: pipeline/reserve.py works that out) against every budget
that applies, and refuses it with a 429 (`BudgetExceeded`: which budget, what is used, held and left, when it
resets) unless spent + held + its maximum fits each. When its row is recorded, `record` replaces the hold by the
row's actual spend. So concurrent requests can never together spend past a budget: each was admitted only if
its worst case fitted beside everything already spent or held. (`check` only says whether a budget is spent
outright; the request path needs no call of its own for that, since a reservation refuses it too.)

Holds are leases of `lease_s`: this process renews its own (`renew`) while their requests run; a hold whose lease
ends (its gateway was killed) is dropped by the next reservation, which also raises the shared totals to the
ledger's again (`reseed`), so a crash neither leaves a tenant blocked for good nor loses spend its rows recorded.

With several gateway processes, `shared` (limits/shared_counters.py) keeps totals and holds in Redis instead of in
memory, each reserve and settle one atomic script, so all of them count one spend; each raises Redis's totals to at
least the ledger's at start and after an outage. When Redis does not answer, `check` and `reserve` refuse with a 503
(`fail_open` False, the default) or admit unchecked; spend recorded meanwhile is in the ledger and comes back with
the next seed. While a budget in Redis is far from its limit, this process holds a chunk of it (a leased local
allowance, limits/allowance.py) and reserves and settles requests against that in process, with no round trip;
near the limit every request is held in Redis on its own. Crossing `warn_at` x limit logs a warning and counts
tokenomy_budget_warnings_total, once per budget and period.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tokenomy.config import BudgetLimits
from tokenomy.errors import APIError
from tokenomy.ledger.row import LedgerRow
from tokenomy.limits.allowance import Allowance, Allowances
from tokenomy.limits.shared_counters import SharedCounters, StoreDown

log = logging.getLogger("tokenomy.budget")

PERIODS = ("day", "month")
UNITS = ("usd", "tokens")


def period_bounds(period: str, t: float) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the UTC day or month holding UNIX time t."""
    return _bounds(period, int(t // 86400))          # UNIX time has 86,400 s in every UTC day


@functools.lru_cache(maxsize=64)
def _bounds(period: str, day: int) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.fromtimestamp(day * 86400, dt.UTC)
    if period == "day":
        return start, start + dt.timedelta(days=1)
    if period == "month":
        start = start.replace(day=1)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return start, end
    raise ValueError(f"period must be day or month, got {period!r}")


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


class BudgetExceeded(APIError):
    """429 with an OpenAI-style body: which budget, what is used, held by requests in flight and left, what this
    request may cost at most (when it was refused for that), and when the budget resets (ISO 8601, UTC).
    Retry-After is the reset, or 1 s when the request would fit once the requests in flight settle (`fits_later`)."""

    def __init__(self, scope: str, ident: str, name: str, unit: str, period: str, limit: float, used: float,
                 resets_at: dt.datetime, now: float, held: float = 0.0, need: float | None = None) -> None:
        self.scope, self.ident, self.unit, self.period = scope, ident, unit, period
        self.limit, self.used, self.held, self.need, self.resets_at = limit, used, held, need, resets_at
        left = self.left

        def amount(x: float) -> str:
            return f"${x:,.4f}" if unit == "usd" else f"{math.ceil(x):,} tokens"

        head = (f"${limit:,.2f}" if unit == "usd" else f"{int(limit):,} tokens")
        parts = [f"{amount(used)} used"] + ([f"{amount(held)} held by requests in flight"] if held > 0 else []) \
            + [f"{amount(left)} left"]
        every = "daily" if period == "day" else "monthly"
        msg = (f"Budget exceeded: the {every} {unit.upper() if unit == 'usd' else unit} budget of {scope} '{name}' "
               f"is {head} ({', '.join(parts)}).")
        if need is not None:
            msg += (f" This request may cost up to {amount(need)} (its prompt and output bound)"
                    + (", more than the whole budget." if need > limit else "."))
        self.fits_later = need is not None and held > 0 and used + need <= limit
        retry = 1 if self.fits_later else max(1, math.ceil(resets_at.timestamp() - now))
        super().__init__(429, msg + f" It resets at {iso(resets_at)}.", code="budget_exceeded",
                         type_="insufficient_quota", headers={"retry-after": str(retry)})

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used - self.held)


Slot = tuple[str, str, str, float]      # (scope, ident, period, period start as UNIX time)


class WindowFull(Exception):
    """A tokens-per-minute window reserved with the budgets (`reserve(window=...)`) had no room: tokens used and
    held in it, and seconds until its oldest entry leaves. The caller words the 429 (limits/rate_windows.py)."""

    def __init__(self, used: float, wait_s: float) -> None:
        super().__init__(f"tokens-per-minute window full: {used:.0f} used or held")
        self.used, self.wait_s = used, wait_s


@dataclass
class Hold:
    """What one request holds: the slots it reserved in and how much, in total over its reservations."""

    slots: list[Slot]
    usd: float = 0.0
    tokens: float = 0.0
    ample: bool = True      # every reservation left room for two more like it: the settle may run after the answer
    allowance: Allowance | None = None   # held in this process's allowance (its first reservation), not in `slots`


class _Held:
    """One budget slot's holds in this process (store local): request id -> [usd, tokens, lease end], with their
    sums kept, so a reservation costs the same however many requests are in flight."""

    __slots__ = ("by_rid", "usd", "tokens", "next_end")

    def __init__(self) -> None:
        self.by_rid: dict[str, list[float]] = {}
        self.usd = self.tokens = 0.0
        self.next_end = math.inf        # at most the earliest lease end among the holds

    def __len__(self) -> int:
        return len(self.by_rid)

    def add(self, rid: str, usd: float, tokens: float, end: float) -> None:
        h = self.by_rid.setdefault(rid, [0.0, 0.0, 0.0])
        h[0], h[1], h[2] = h[0] + usd, h[1] + tokens, end
        self.usd += usd
        self.tokens += tokens
        self.next_end = min(self.next_end, end)

    def pop(self, rid: str) -> None:
        h = self.by_rid.pop(rid, None)
        if h is None:
            return
        if self.by_rid:
            self.usd -= h[0]
            self.tokens -= h[1]
        else:                           # none left: no rounding carried over
            self.usd = self.tokens = 0.0
            self.next_end = math.inf

    def renew(self, rid: str, end: float) -> None:
        h = self.by_rid.get(rid)
        if h is not None:
            h[2] = end

    def expire(self, t: float) -> None:
        """Drop the holds whose lease ended by `t` (nobody renewed them: their request ended without settling)."""
        if t < self.next_end:
            return
        for rid in [r for r, h in self.by_rid.items() if h[2] <= t]:
            self.pop(rid)
        self.next_end = min((h[2] for h in self.by_rid.values()), default=math.inf)


def _subjects(keys: dict[str, BudgetLimits] | None, tenants: dict[str, BudgetLimits] | None,
              key_names: dict[str, str] | None) -> dict[tuple[str, str], _Subject]:
    """(scope, ident) -> its limits: keys by key id (named by `key_names` in messages), tenants by name."""
    names = key_names or {}
    out = {("key", kid): _Subject("key", kid, names.get(kid, kid), lim) for kid, lim in (keys or {}).items()}
    out.update({("tenant", t): _Subject("tenant", t, t, lim) for t, lim in (tenants or {}).items()})
    return out


@dataclass
class _Subject:
    scope: str          # key | tenant
    ident: str          # key_id or tenant name
    name: str           # what messages call it (the key's name)
    limits: BudgetLimits

    def __post_init__(self) -> None:
        # (unit, period) -> its limit, None: unlimited (read on every reservation and settle)
        self.limit = {(unit, period): self.limits.limit(unit, period) for unit in UNITS for period in PERIODS}


class Budgets:
    def __init__(self, keys: dict[str, BudgetLimits] | None = None, tenants: dict[str, BudgetLimits] | None = None,
                 key_names: dict[str, str] | None = None, metrics: Any = None,
                 clock: Callable[[], float] = time.time, shared: SharedCounters | None = None,
                 fail_open: bool = False, lease_s: float = 300.0,
                 lease_clock: Callable[[], float] = time.monotonic, allowances: bool = True) -> None:
        """`keys`: key_id -> limits; `tenants`: tenant -> limits; `key_names`: key_id -> name for messages;
        `metrics`: a Metrics (budget_used_ratio, budget_warnings); `shared`: totals in Redis, shared by gateways;
        `fail_open`: admit (True) or refuse (False) while `shared` does not answer; `lease_s`: how long a hold
        outlives its last renewal (`lease_clock` measures it in this process); `allowances`: with `shared`, hold
        leased local allowances while far from a limit (limits/allowance.py)."""
        self.subjects = _subjects(keys, tenants, key_names)
        self.metrics = metrics
        self.clock = clock
        # (scope, ident, period, period start) -> [usd, tokens]
        self._used: dict[tuple[str, str, str, float], list[float]] = {}
        self._warned: set[tuple[str, str, str, str, float]] = set()
        # in this process (store local): slot -> request id -> [usd, tokens, lease end on lease_clock]
        self._held: dict[Slot, _Held] = {}
        self.holding: dict[str, Hold] = {}       # request id -> what it holds: this process's requests in flight
        self.settling: set[str] = set()          # of those, the ones whose settle is queued (limits/shared_counters.py)
        self.lease_s, self.lease_clock = lease_s, lease_clock
        self._lock = threading.Lock()
        self.shared, self.fail_open = shared, fail_open
        self.allow = allowances          # grant allowances (this process settles what it holds in them either way)
        self.allowances = Allowances(shared, lease_s, lease_clock, self._observe_slot) if shared is not None else None
        self._ledger: Any = None
        self._plans: dict[tuple[str | None, str | None, int], tuple[list[Any], list[Slot]]] = {}
        self._gauges: dict[tuple[str, str, str, str], Any] = {}     # budget_used's children, by their labels
        self._live_day = -1             # the UTC day whose periods' totals _prune last kept

    @property
    def enabled(self) -> bool:
        return bool(self.subjects)

    def set_limits(self, keys: dict[str, BudgetLimits], tenants: dict[str, BudgetLimits],
                   key_names: dict[str, str], *, fail_open: bool, allowances: bool) -> None:
        """Swap the limits whole (a config reload): one assignment replaces the table of keys' and tenants' limits;
        the spend counted, the holds of requests in flight and their leases are kept. A key or tenant new to the
        table is seeded from the ledger; the allowances taken under the old limits close (each goes back once its
        requests end)."""
        subjects = _subjects(keys, tenants, key_names)
        new = [k for k in subjects if k not in self.subjects]
        self.subjects, self._plans = subjects, {}
        self.fail_open, self.allow = fail_open, allowances
        if self.allowances is not None:
            self.allowances.retire()
        if self._ledger is not None and new:
            self.seed(self._ledger, only=set(new))

    def _applicable(self, key_id: str | None, tenant: str | None) -> Iterator[_Subject]:
        for k in (("key", key_id), ("tenant", tenant)):
            if k[1] is not None and k in self.subjects:
                yield self.subjects[k]

    def _plan(self, key_id: str | None, tenant: str | None, now: float) -> tuple[list[Any], list[Slot], list[Any]]:
        """The budgets of a key and tenant at UNIX time `now`: (subject, period, period start, period end) for
        each, their slots, and (check, slot, USD limit, token limit) for those with a limit (the only ones a
        reservation in process holds in), made once a UTC day per key and tenant (the lists are shared: read only)."""
        day = int(now // 86400)
        plan = self._plans.get((key_id, tenant, day))
        if plan is None:
            checks = [(s, period, *_bounds(period, day)) for s in self._applicable(key_id, tenant)
                      for period in PERIODS]
            slots: list[Slot] = [(s.scope, s.ident, period, start.timestamp()) for s, period, start, _ in checks]
            limited = [(c, slot, c[0].limit["usd", c[1]], c[0].limit["tokens", c[1]])
                       for c, slot in zip(checks, slots, strict=True)
                       if c[0].limit["usd", c[1]] is not None or c[0].limit["tokens", c[1]] is not None]
            if len(self._plans) >= 4096:
                self._plans.clear()
            plan = self._plans[(key_id, tenant, day)] = (checks, slots, limited)
        return plan

    def seed(self, ledger: Any, only: set[tuple[str, str]] | None = None) -> None:
        """Load this month's (and so today's) spend from the ledger; call once at start (`only`: of these keys and
        tenants, (scope, ident), new to the limits)."""
        self._ledger = ledger
        if not self.enabled:
            return
        now = self.clock()
        for period in PERIODS:
            start, end = period_bounds(period, now)
            for scope, by in (("key", "key_id"), ("tenant", "tenant")):
                for ident, (usd, tokens) in ledger.totals(start, by=by).items():
                    if ident is None or (scope, ident) not in self.subjects or \
                            (only is not None and (scope, ident) not in only):
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
        """Settle a finished request (a record sink calls this with its ledger row): its hold, if it has one,
        is replaced by the row's spend. In the shared store, a hold that left ample room settles after the answer
        (limits/shared_counters.py); it stays in `holding` (and in `settling`) until then."""
        usd, tokens = row.cost_usd, row.billed_tokens
        hold = self.holding.get(row.request_id)
        if not self.enabled or (hold is None and usd == 0 and tokens == 0):
            self.holding.pop(row.request_id, None)
            return
        now = self.clock()
        spent, slots, _ = self._plan(row.key_id, row.tenant, now) if usd or tokens else ([], [], [])
        if self.shared is not None:
            self._record_shared(row, hold, spent, usd, tokens)
            return
        self.holding.pop(row.request_id, None)
        with self._lock:
            for slot in hold.slots if hold is not None else []:
                held = self._held.get(slot)
                if held is not None:
                    held.pop(row.request_id)
            for (s, period, _, _), slot in zip(spent, slots, strict=True):
                total = self._used.get(slot)
                if total is None:
                    total = self._used[slot] = [0.0, 0.0]
                total[0] += usd
                total[1] += tokens
                self._observe(s, period, slot[3], total)
            self._prune(now)

    def _record_shared(self, row: LedgerRow, hold: Hold | None, spent: list[Any], usd: float, tokens: float) -> None:
        assert self.shared is not None
        rid = row.request_id

        def settled(totals: list[tuple[float, float]] | None) -> None:
            self.holding.pop(rid, None)
            self.settling.discard(rid)
            if totals is None:      # the ledger has the row (the next seed counts it); the hold's lease lapses
                log.warning("spend of %s not counted in the shared store (it did not answer)", rid)
                return
            with self._lock:
                for (s, period, start, _), total in zip(spent, totals, strict=True):
                    self._observe(s, period, start.timestamp(), list(total))

        charged = [((s.scope, s.ident, period, start.timestamp()), end.timestamp() + 86400)
                   for s, period, start, end in spent]
        if hold is not None and hold.allowance is not None and self.allowances is not None:
            # spent in its allowance's slots by a request held only there: the keeper adds it to Redis; else the
            # allowance only drops its hold, and the spend is settled in Redis below
            mine = not hold.slots and [c[0] for c in charged] == hold.allowance.slots
            self.allowances.settle(hold.allowance, rid, usd, tokens, charge=mine)
            hold.allowance = None
            if mine or not (hold.slots or charged):
                self.holding.pop(rid, None)
                return
        args = (hold.slots if hold is not None else [], charged, rid, usd, tokens)
        if hold is not None and hold.ample:
            self.settling.add(rid)
            self.shared.budget_settle(*args, then=settled)
            return
        try:
            totals: list[tuple[float, float]] | None = self.shared.budget_settle(*args)
        except StoreDown:
            totals = None
        settled(totals)

    # --- reservations -------------------------------------------------------------------------------------------

    def applies(self, key_id: str | None, tenant: str | None) -> bool:
        """Whether any budget applies to this key or tenant (else there is nothing to reserve)."""
        subjects = self.subjects
        return bool(subjects) and (("key", key_id) in subjects or ("tenant", tenant) in subjects)

    def reserve(self, key_id: str | None, tenant: str | None, request_id: str, usd: float, tokens: float,
                window: tuple[str, int, int, float] | None = None) -> bool | None:
        """Hold `usd` and `tokens` more for a request against every budget of its key and tenant, or raise
        BudgetExceeded (a 429: nothing is held) unless spent + held + this fits each; a 503 APIError while the
        shared store does not answer and budgets fail closed. Calls for one request add up (a fallback to a
        dearer model, a cascade's next answer); `record` settles them all.

        `window` (key id, tokens, tpm, window seconds): in the shared store, the request's tokens-per-minute hold
        is taken in the same atomic step (one round trip, not two), or WindowFull raised (nothing held). Returns
        whether the window had ample room when it was held here, None when it was not (no budget applies, no
        shared store, or the store did not answer): the caller then holds it on its own."""
        if not self.enabled or (usd <= 0 and tokens <= 0):
            return None
        now = self.clock()
        checks, slots, limited = self._plan(key_id, tenant, now)
        if not checks:
            return None
        window_ample = None
        allowance = None
        if self.shared is None:
            slots = self._reserve_local(limited, request_id, usd, tokens, now)
            ample = False
        else:
            # a request's first reservation, without a tpm window to hold with it, may be held in an allowance
            fresh = self.allow and self.allowances is not None and window is None and request_id not in self.holding
            if fresh:
                assert self.allowances is not None
                allowance = self.allowances.take(slots, request_id, usd, tokens)
            if allowance is None:
                ample, window_ample, allowance = self._reserve_shared(checks, slots, request_id, usd, tokens, now,
                                                                      window, fresh)
        hold = self.holding.get(request_id)
        if hold is None:
            hold = self.holding[request_id] = Hold(slots=[])
        if allowance is not None:
            hold.allowance, hold.usd, hold.tokens = allowance, usd, tokens
            return window_ample
        if hold.slots:
            hold.slots += [s for s in slots if s not in hold.slots]
        else:
            hold.slots = list(slots)
        hold.usd += usd
        hold.tokens += tokens
        hold.ample = hold.ample and ample
        return window_ample

    def _reserve_local(self, limited: list[Any], rid: str, usd: float, tokens: float, now: float) -> list[Slot]:
        """Hold in process in each slot with a limit (`_plan`'s third list), or raise; the slots held in."""
        t = self.lease_clock()
        with self._lock:
            for (s, period, _, end), slot, usd_limit, tokens_limit in limited:
                held = self._held.get(slot)
                if held is None:
                    held = self._held[slot] = _Held()
                held.expire(t)
                spent = self._used.get(slot, (0.0, 0.0))
                if usd_limit is not None and usd > 0 and spent[0] + held.usd + usd > usd_limit * (1 + 1e-9):
                    raise BudgetExceeded(s.scope, s.ident, s.name, "usd", period, usd_limit, spent[0], end, now,
                                         held=held.usd, need=usd)
                if tokens_limit is not None and tokens > 0 and \
                        spent[1] + held.tokens + tokens > tokens_limit * (1 + 1e-9):
                    raise BudgetExceeded(s.scope, s.ident, s.name, "tokens", period, tokens_limit, spent[1], end,
                                         now, held=held.tokens, need=tokens)
            end_at = t + self.lease_s
            for _, slot, _, _ in limited:
                self._held[slot].add(rid, usd, tokens, end_at)
        return [slot for _, slot, _, _ in limited]

    def _reserve_shared(self, checks: list[Any], slots: list[Slot], rid: str, usd: float, tokens: float,
                        now: float, window: tuple[str, int, int, float] | None, allow: bool = False,
                        ) -> tuple[bool, bool | None, Allowance | None]:
        """Hold in Redis, or raise: whether every budget had room for two more like this (an ample hold), the
        same for the tokens-per-minute window held with it (None: not held here), and with `allow`, the allowance
        granted instead when the budgets are far from their limits (the request is held in it), else None."""
        assert self.shared is not None
        limits = [(slot, s.limit["usd", period], s.limit["tokens", period])
                  for (s, period, _, _), slot in zip(checks, slots, strict=True)]
        expire_at = max(end.timestamp() for _, _, _, end in checks) + 86400
        grant = self.allowances.grant() if allow and self.allowances is not None else None
        sent = self.lease_clock()
        try:
            refused, expired, ample, window_ample, granted = self.shared.budget_reserve(
                limits, rid, usd, tokens, self.lease_s, expire_at, window, grant)
        except StoreDown as e:
            if self.fail_open:
                return False, None, None
            raise APIError(503, "Budgets cannot be checked: their shared store does not answer. Retry later.",
                           code="limits_unavailable", type_="server_error", headers={"retry-after": "1"}) from e
        if expired:     # a gateway died holding these: what its rows recorded comes back from the ledger
            log.warning("%d budget holds outlived their lease (a gateway stopped without settling them)", expired)
            threading.Thread(target=self.reseed, name="budget-reseed", daemon=True).start()
        if refused is not None:
            i, unit, spent, held = refused
            if unit == "tpm":
                raise WindowFull(spent, held)
            s, period, _, end = checks[i]
            raise BudgetExceeded(s.scope, s.ident, s.name, unit, period, s.limit[unit, period] or 0.0,
                                 spent, end, now, held=held, need=usd if unit == "usd" else tokens)
        if granted and grant is not None and self.allowances is not None:
            return ample, window_ample, self.allowances.add(slots, grant[0], granted * usd, granted * tokens,
                                                            expire_at, sent, rid, usd, tokens)
        return ample, window_ample, None

    def renew(self, holding: list[tuple[str, Hold]] | None = None) -> None:
        """Extend the leases of the holds this process's requests in flight have (`holding`: a snapshot of
        `self.holding`'s items, taken on the thread that changes it; called every lease_s / 3)."""
        holding = list(self.holding.items()) if holding is None else holding
        if not holding:
            return
        if self.shared is None:
            until = self.lease_clock() + self.lease_s
            with self._lock:
                for rid, hold in holding:
                    for slot in hold.slots:
                        if slot in self._held:
                            self._held[slot].renew(rid, until)
            return
        try:
            self.shared.renew([(self.shared.budget_leases_key(slot), rid) for rid, hold in holding
                               for slot in hold.slots], self.lease_s)
        except StoreDown as e:
            log.warning("budget holds not renewed: %s", e)

    def release(self, request_id: str) -> None:
        """Drop a request's holds without counting any spend: for a request whose row could not be made."""
        hold = self.holding.pop(request_id, None)
        if hold is None:
            return
        if hold.allowance is not None and self.allowances is not None:
            self.allowances.settle(hold.allowance, request_id, 0.0, 0.0, charge=False)
            if not hold.slots:
                return
        if self.shared is None:
            with self._lock:
                for slot in hold.slots:
                    if slot in self._held:
                        self._held[slot].pop(request_id)
            return
        try:
            self.shared.budget_settle(hold.slots, [], request_id, 0.0, 0.0)
        except StoreDown as e:
            log.warning("holds of %s not released (their lease will end): %s", request_id, e)

    def held(self, scope: str, ident: str, period: str) -> tuple[float, int]:
        """(USD, tokens) held by requests in flight for a key or tenant in the current day or month."""
        start, _ = period_bounds(period, self.clock())
        slot = (scope, ident, period, start.timestamp())
        if self.shared is not None:
            usd, tokens = self.shared.budget_held(slot)
            return usd, int(tokens)
        with self._lock:
            held = self._held.get(slot)
            return (held.usd, round(held.tokens)) if held is not None else (0.0, 0)

    def close(self) -> None:
        """Give this process's allowances back to the shared store (a gateway stopping; its requests ended)."""
        if self.allowances is not None:
            self.allowances.close()

    def _observe_slot(self, slot: Slot, total: tuple[float, float]) -> None:
        s = self.subjects.get(slot[:2])
        if s is not None:
            with self._lock:
                self._observe(s, slot[2], slot[3], list(total))

    def _observe(self, s: _Subject, period: str, start: float, slot: list[float]) -> None:
        """Set a budget's used-share gauges from its period's totals `slot` (period start: UNIX time `start`), and
        warn once a period when a share crosses warn_at."""
        for i, unit in enumerate(UNITS):
            limit = s.limit[unit, period]
            if limit is None:
                continue
            ratio = slot[i] / limit
            if self.metrics is not None:
                labels = (s.scope, s.ident, period, unit)
                gauge = self._gauges.get(labels)
                if gauge is None:
                    gauge = self._gauges[labels] = self.metrics.budget_used.labels(*labels)
                gauge.set(ratio)
            if ratio < s.limits.warn_at:
                continue
            mark = (s.scope, s.ident, period, unit, start)
            if mark not in self._warned:
                self._warned.add(mark)
                log.warning("budget warning: %s '%s' has used %.0f%% of its %s %s budget (%s of %s)",
                            s.scope, s.name, 100 * ratio, "daily" if period == "day" else "monthly", unit,
                            f"{slot[i]:.4f}" if unit == "usd" else int(slot[i]), limit)
                if self.metrics is not None:
                    self.metrics.budget_warnings.labels(s.scope, period, unit).inc()

    def _prune(self, now: float) -> None:
        """Forget the totals and holds of periods that ended (once a UTC day: nothing ends in between)."""
        day = int(now // 86400)
        if day == self._live_day:
            return
        self._live_day = day
        live = {_bounds(p, day)[0].timestamp() for p in PERIODS}
        for k in [k for k in self._used if k[3] not in live]:
            del self._used[k]
        for k in [k for k in self._held if k[3] not in live and not self._held[k]]:
            del self._held[k]
        self._warned = {w for w in self._warned if w[4] in live}

    def check(self, key_id: str | None, tenant: str | None) -> None:
        """Raise BudgetExceeded (a 429 APIError) if any budget of this key or tenant is spent."""
        if not self.enabled:
            return
        now = self.clock()
        checks, slots, _ = self._plan(key_id, tenant, now)
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
                limit = s.limit[unit, period]
                if limit is not None and used >= limit:
                    raise BudgetExceeded(s.scope, s.ident, s.name, unit, period, limit, used, end, now)
