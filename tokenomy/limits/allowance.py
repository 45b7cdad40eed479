"""Leased local allowances: while a budget in Redis is far from its limit, a gateway holds a chunk of it and admits
requests against that chunk in process, so a request far from every limit makes no Redis round trip at all.

An allowance is one hold in Redis, in every budget slot a request of a key (and tenant) reserves in, beside the
holds of single requests and under the same lease. The reservation script grants it instead of holding the request
alone (limits/shared_counters.py) only when spent + held leaves room for at least `MIN_ROOM` more requests like this
one in every limit that applies; it then holds `min(room / SHARE, MAX)` such requests' worth (usd and tokens). Requests
then hold and settle against it here:

    room here = allowance - held by its requests in flight - spent by its settled requests
    held in Redis for it = allowance - spent already added to Redis's totals ("flushed")

so spent + held in Redis always covers everything its requests spend or may still spend, and no limit can be
overspent however many gateways hold allowances. A keeper thread adds the spend to Redis's totals every `TICK_S`
(one pipelined round trip for all allowances, lowering each allowance's hold by as much in the same script),
renews the leases every lease_s / 4, and gives an allowance back (its spend added, its hold dropped) once it is
closed and its last request has settled. An allowance closes when a request does not fit in what is left of it,
when it has been idle for `IDLE_S`, when the budgets are reloaded and when the gateway stops. Near a limit no
allowance is granted, and requests are held one by one in Redis as before, so the last requests a budget fits are
admitted exactly (the room still in other gateways' allowances comes back when they use it up, stop using it for
`IDLE_S`, or die: their lease ends after lease_s).

This process uses an allowance only while its lease is surely alive: until half a lease after the last call that
renewed it was sent. A flush that finds the hold gone (its lease lapsed, or Redis lost it) still adds the spend and
closes the allowance; a store that does not answer drops every allowance here (their spend is in the ledger and
comes back with the next seed from it, as for any settle that did not reach Redis), so that from then on requests
meet the store-down rules of single reservations.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.limits.shared_counters import SharedCounters, StoreDown

log = logging.getLogger("tokenomy.budget")

Slot = tuple[str, str, str, float]      # (scope, ident, period, period start as UNIX time), as in limits/budget.py

MIN_ROOM = 32        # requests like this one that must fit beside everything spent and held to grant an allowance
SHARE = 8            # an allowance is this fraction (1/SHARE) of that room ...
MAX = 256            # ... and at most this many requests like this one
TICK_S = 0.25        # how often the keeper adds settled spend to Redis (one round trip for all)
IDLE_S = 1.0         # an allowance no request used for this long goes back


@dataclass(eq=False)
class Allowance:
    slots: list[Slot]
    aid: str                    # its id among the holds in Redis
    usd: float                  # what it holds in all (its cap)
    tokens: float
    expire_at: float            # when Redis may forget the spend counters it adds to (UNIX s)
    valid_until: float          # on the keeper's lease clock: usable until then
    renewed_at: float
    last_used: float
    open: bool = True           # takes new requests
    held: dict[str, tuple[float, float]] = field(default_factory=dict)   # its requests in flight
    held_usd: float = 0.0
    held_tokens: float = 0.0
    spent_usd: float = 0.0      # what its settled requests spent
    spent_tokens: float = 0.0
    flushed_usd: float = 0.0    # of that, what is added to Redis's totals
    flushed_tokens: float = 0.0

    def fits(self, usd: float, tokens: float) -> bool:
        """Room for this much more, in the units it needs (as the reservation script checks only those)."""
        return ((usd <= 0 or self.spent_usd + self.held_usd + usd <= self.usd * (1 + 1e-9))
                and (tokens <= 0 or self.spent_tokens + self.held_tokens + tokens <= self.tokens))


class Allowances:
    """This process's allowances, by the slots a request reserves in. `take`, `settle` and `release` run on the
    request path (no I/O); the keeper thread talks to Redis."""

    def __init__(self, shared: SharedCounters, lease_s: float, lease_clock: Callable[[], float] = time.monotonic,
                 observe: Callable[[Slot, tuple[float, float]], None] | None = None) -> None:
        self.shared, self.lease_s, self.lease_clock, self.observe = shared, lease_s, lease_clock, observe
        self.open: dict[tuple[Slot, ...], Allowance] = {}      # the one taking requests, per slot set
        self.all: list[Allowance] = []                          # open and closed ones not given back yet
        self._cond = threading.Condition()
        self._flushing = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._stop = False

    def grant(self) -> tuple[str, int, int, int]:
        """What the reservation script needs to grant an allowance: (its id, MIN_ROOM, SHARE, MAX)."""
        return f"allow:{uuid.uuid4().hex[:16]}", MIN_ROOM, SHARE, MAX

    def take(self, slots: list[Slot], rid: str, usd: float, tokens: float) -> Allowance | None:
        """Hold (usd, tokens) for a request in the open allowance of these slots: the allowance, or None when
        there is none, its lease may have lapsed, or it has no room left (it then closes)."""
        key = tuple(slots)
        with self._cond:
            a = self.open.get(key)
            if a is None:
                return None
            t = self.lease_clock()
            if t >= a.valid_until or not self.shared.healthy or not a.fits(usd, tokens):
                a.open = False
                del self.open[key]
                return None
            self._hold(a, rid, usd, tokens, t)
            return a

    def add(self, slots: list[Slot], aid: str, usd: float, tokens: float, expire_at: float, sent_at: float,
            rid: str, need_usd: float, need_tokens: float) -> Allowance:
        """A granted allowance (the reservation call that granted it was sent at `sent_at` on the lease clock),
        with the request that asked for it held in it."""
        a = Allowance(list(slots), aid, usd, tokens, expire_at, sent_at + self.lease_s / 2, sent_at, sent_at)
        with self._cond:
            old = self.open.pop(tuple(slots), None)
            if old is not None:
                old.open = False
            self.open[tuple(slots)] = a
            self.all.append(a)
            self._hold(a, rid, need_usd, need_tokens, self.lease_clock())
            if self._keeper is None:
                self._stop = False
                self._keeper = threading.Thread(target=self._keep, name="budget-allowances", daemon=True)
                self._keeper.start()
            self._cond.notify_all()
        return a

    @staticmethod
    def _hold(a: Allowance, rid: str, usd: float, tokens: float, t: float) -> None:
        a.held[rid] = (usd, tokens)
        a.held_usd += usd
        a.held_tokens += tokens
        a.last_used = t

    def settle(self, a: Allowance, rid: str, usd: float, tokens: float, charge: bool) -> None:
        """A request held in `a` ended: drop its hold, and with `charge` count what it spent in `a` (the keeper
        adds it to Redis); without, the caller settles its spend in Redis itself."""
        with self._cond:
            h_usd, h_tokens = a.held.pop(rid, (0.0, 0.0))
            a.held_usd = max(0.0, a.held_usd - h_usd) if a.held else 0.0
            a.held_tokens = max(0.0, a.held_tokens - h_tokens) if a.held else 0.0
            if charge:
                a.spent_usd += usd
                a.spent_tokens += tokens
            a.last_used = self.lease_clock()

    def retire(self) -> Allowances:
        """Close every allowance (the budgets' limits may have changed): each goes back once its requests end."""
        with self._cond:
            for a in self.open.values():
                a.open = False
            self.open.clear()
        return self

    def close(self) -> None:
        """Give every allowance back now (spend added, holds dropped) and stop the keeper; for a gateway stopping,
        after its requests ended."""
        self.retire()
        with self._cond:
            for a in self.all:
                a.held.clear()
                a.held_usd = a.held_tokens = 0.0
        self.flush()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            keeper = self._keeper
        if keeper is not None:
            keeper.join(10.0)

    def _keep(self) -> None:
        while True:
            with self._cond:
                if self._stop and not self.all:
                    self._keeper = None
                    return
                if self.all:
                    self._cond.wait(TICK_S)
                else:
                    self._cond.wait()
            try:
                self.flush()
            except Exception:                       # never let the keeper die silently
                log.exception("budget allowances: flush failed")

    def flush(self) -> None:
        """One round trip: add what each allowance's requests spent since the last flush to Redis's totals (and
        lower its hold by as much), renew leases due, give back closed allowances whose requests all ended."""
        with self._flushing:
            t = self.lease_clock()
            batch: list[tuple[Allowance, float, float, bool]] = []
            with self._cond:
                for a in list(self.all):
                    if a.open and not a.held and t - a.last_used >= IDLE_S:
                        a.open = False
                        if self.open.get(tuple(a.slots)) is a:
                            del self.open[tuple(a.slots)]
                    give_back = not a.open and not a.held
                    du, dt = a.spent_usd - a.flushed_usd, a.spent_tokens - a.flushed_tokens
                    if give_back or du or dt or t - a.renewed_at >= self.lease_s / 4:
                        batch.append((a, du, dt, give_back))
                        a.flushed_usd, a.flushed_tokens = a.spent_usd, a.spent_tokens
                        if give_back:
                            self.all.remove(a)
            if not batch:
                return
            sent = self.lease_clock()
            try:
                out = self.shared.allowance_flush([(a.slots, a.aid, du, dt, back, a.expire_at)
                                                   for a, du, dt, back in batch], self.lease_s)
            except StoreDown as e:
                self._drop(f"the store did not answer ({e})", [(a.aid, du, dt) for a, du, dt, _ in batch])
                return
            with self._cond:
                for (a, _, _, back), (alive, _) in zip(batch, out, strict=True):
                    if not alive and not back and a.open:       # its hold is gone from Redis: use it no more
                        log.warning("budget allowance %s lapsed in the shared store: closed", a.aid)
                        a.open = False
                        if self.open.get(tuple(a.slots)) is a:
                            del self.open[tuple(a.slots)]
                    elif alive:
                        a.valid_until, a.renewed_at = sent + self.lease_s / 2, sent
            if self.observe is not None:
                for (a, *_), (_, totals) in zip(batch, out, strict=True):
                    for slot, total in zip(a.slots, totals, strict=True):
                        self.observe(slot, total)

    def _drop(self, why: str, lost: list[tuple[str, float, float]]) -> None:
        """Forget every allowance (the store failed): their requests in flight settle here and nowhere else."""
        with self._cond:
            lost += [(a.aid, a.spent_usd - a.flushed_usd, a.spent_tokens - a.flushed_tokens) for a in self.all]
            for a in self.all:
                a.open = False
            self.open.clear()
            self.all.clear()
        log.warning("budget allowances dropped: %s; spend not added to the shared store (the ledger has it): %s",
                     why, lost)

    def state(self) -> dict[str, Any]:
        """Counts for tests and the debugger: allowances open and not yet given back."""
        with self._cond:
            return {"open": len(self.open), "kept": len(self.all)}
