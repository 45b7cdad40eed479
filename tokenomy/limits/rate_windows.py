"""Per-key and per-tenant requests- and tokens-per-minute limits: sliding 60-second windows, by key id (a
tenant's: "tenant:NAME").

The windows are kept in memory (one gateway process), or in Redis (`limits.store`, limits/shared_counters.py) so that
every gateway process counts one window; a 429 carries Retry-After = seconds until the window frees enough room. A
request counts against rpm when admitted (`admit`); against tpm, the reserve stage holds its prompt and output bound
(`reserve_tokens`, or with the budgets in one step: `window`, `held_with_budgets`) before it reaches a backend,
refused unless used + held + that fits, and the record replaces the hold by the tokens it used (`settle`); holds are
leases renewed while the request runs (`renew`), as budgets' are. A tenant's limits (all its keys together) count
at admission only: its rpm there, its tpm as the tokens its requests used in the last minute (`settle` adds them),
with no hold before a request runs. While Redis does not answer, rate limits are not applied
(`limits.rates_on_store_down: open`, the default) or every limited key is refused with a 503 (`closed`).

The state is keyed by key id, not kept on the keys: a keyring swapped whole on reload (limits/keys.py) leaves every
key's windows and holds here; a key's limits are read from the KeyInfo each call is given.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tokenomy.errors import APIError
from tokenomy.limits.keys import KeyInfo
from tokenomy.limits.shared_counters import SharedCounters, StoreDown

WINDOW_S = 60.0


@dataclass
class Window:
    """One key's last minute in this process: admitted requests, tokens used, and the tpm holds in flight."""

    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    held: dict[str, list[float]] = field(default_factory=dict)   # request id -> [tokens, lease end (monotonic)]

    def trim(self, now: float) -> None:
        while self.requests and now - self.requests[0] >= WINDOW_S:
            self.requests.popleft()
        while self.tokens and now - self.tokens[0][0] >= WINDOW_S:
            self.tokens.popleft()


def _unavailable() -> APIError:
    return APIError(503, "Rate limits cannot be checked: their shared store does not answer. Retry later.",
                    code="limits_unavailable", type_="server_error", headers={"retry-after": "1"})


def _retry(wait: float) -> dict[str, str]:
    return {"retry-after": str(max(1, int(wait + 0.999)))}


@dataclass(frozen=True)
class Limited:
    """What one window limits: a key, or a tenant (all its keys together)."""

    id: str            # the window's id: the key id, or "tenant:NAME"
    what: str          # as a message names it
    rpm: int | None
    tpm: int | None


def _of_key(info: KeyInfo) -> Limited | None:
    return Limited(info.key_id, f"key {info.name}", info.rpm, info.tpm) \
        if info.rpm is not None or info.tpm is not None else None


def _of_tenant(info: KeyInfo) -> Limited | None:
    return Limited(f"tenant:{info.tenant}", f"tenant {info.tenant}", info.tenant_rpm, info.tenant_tpm) \
        if info.tenant_rpm is not None or info.tenant_tpm is not None else None


class RateWindows:
    def __init__(self, shared: SharedCounters | None = None, fail_open: bool = True, lease_s: float = 300.0) -> None:
        self.shared, self.fail_open = shared, fail_open
        self.lease_s = lease_s
        self.windows: dict[str, Window] = {}   # key id -> its window in this process (store local)
        self.holding: dict[str, str] = {}      # request id -> key id: this process's tpm holds in flight
        self.ample: set[str] = set()           # of those in Redis, the ones whose settle may run after the answer

    def window_of(self, key_id: str) -> Window:
        w = self.windows.get(key_id)
        if w is None:
            w = self.windows[key_id] = Window()
        return w

    # ---- at admission: requests per minute ------------------------------------------------------------------
    def admit(self, info: KeyInfo, request_id: str) -> None:
        """Count a request against its key's and its tenant's rpm, or raise a 429 when a minute is full (rpm), or
        its tokens are (tpm: the tokens used in the last minute reached it). In this process a refused request
        counts against neither; in Redis, one the tenant refuses has counted against its key's rpm already."""
        limited = [x for x in (_of_key(info), _of_tenant(info)) if x is not None]
        if not limited:
            return
        if self.shared is not None:
            for x in limited:
                self._admit_shared(x, request_id)
            return
        now = time.monotonic()
        for x in limited:
            w = self.window_of(x.id)
            w.trim(now)
            if x.rpm is not None and len(w.requests) >= x.rpm:
                wait = WINDOW_S - (now - w.requests[0])
                raise APIError(429, f"Rate limit reached for {x.what}: {x.rpm} requests per minute. "
                               f"Retry in {wait:.1f}s.", code="rate_limit_exceeded", headers=_retry(wait))
            if x.tpm is not None:
                used = sum(n for _, n in w.tokens)
                if used >= x.tpm:
                    wait = WINDOW_S - (now - w.tokens[0][0])
                    raise APIError(429, f"Rate limit reached for {x.what}: {x.tpm} tokens per minute "
                                   f"({used} used). Retry in {wait:.1f}s.", code="rate_limit_exceeded",
                                   headers=_retry(wait))
        for x in limited:
            self.window_of(x.id).requests.append(now)

    def _admit_shared(self, x: Limited, request_id: str) -> None:
        assert self.shared is not None
        try:
            full, used, wait = self.shared.take_request(x.id, request_id, x.rpm, x.tpm, WINDOW_S)
        except StoreDown as e:
            if self.fail_open:
                return
            raise _unavailable() from e
        if full is None:
            return
        what = f"{x.rpm} requests per minute" if full == "rpm" else f"{x.tpm} tokens per minute ({int(used)} used)"
        raise APIError(429, f"Rate limit reached for {x.what}: {what}. Retry in {wait:.1f}s.",
                       code="rate_limit_exceeded", headers=_retry(wait))

    # ---- before a backend: tokens per minute ----------------------------------------------------------------
    def window(self, info: KeyInfo | None, tokens: int) -> tuple[str, int, int, float] | None:
        """What the budgets' reservation needs to hold the request's tokens-per-minute hold in the same step
        (Budgets.reserve(window=...)): (key id, tokens, tpm, window seconds), or None when it has nothing to hold
        or the windows are not in the shared store."""
        if self.shared is None or info is None or info.tpm is None or tokens <= 0:
            return None
        return info.key_id, tokens, info.tpm, WINDOW_S

    def held_with_budgets(self, info: KeyInfo | None, request_id: str, ample: bool) -> None:
        """The budgets' reservation held the request's tokens-per-minute hold (`window`): track it as ours."""
        if not ample or request_id in self.holding:
            self.ample.discard(request_id)
        else:
            self.ample.add(request_id)
        self.holding[request_id] = info.key_id if info is not None else ""

    def reserve_tokens(self, info: KeyInfo | None, request_id: str, tokens: int) -> None:
        """Hold `tokens` (the request's prompt and output bound) in its key's tokens-per-minute window, or raise a
        429 unless the tokens used in the last minute + held + these fit `tpm`. Calls for one request add up."""
        if info is None or info.tpm is None or tokens <= 0:
            return
        if self.shared is not None:
            try:
                full = self.shared.reserve_tokens(info.key_id, request_id, tokens, info.tpm, WINDOW_S, self.lease_s)
            except StoreDown as e:
                if self.fail_open:
                    return
                raise _unavailable() from e
            if not isinstance(full, bool):
                raise self.full(info, full[0], tokens, full[1])
            if not full or request_id in self.holding:    # two holds of one request: settle it at once
                self.ample.discard(request_id)
            else:
                self.ample.add(request_id)
        else:
            w = self.window_of(info.key_id)
            now = t = time.monotonic()
            w.trim(now)
            for gone in [r for r, h in w.held.items() if h[1] <= t]:
                del w.held[gone]
            used = sum(n for _, n in w.tokens) + sum(h[0] for h in w.held.values())
            if used + tokens > info.tpm:
                wait = WINDOW_S - (now - w.tokens[0][0]) if w.tokens else 1.0
                raise self.full(info, used, tokens, wait)
            h = w.held.setdefault(request_id, [0.0, 0.0])
            h[0], h[1] = h[0] + tokens, t + self.lease_s
        self.holding[request_id] = info.key_id

    @staticmethod
    def full(info: KeyInfo, used: float, tokens: int, wait: float) -> APIError:
        """The 429 for a request whose tokens-per-minute hold did not fit."""
        over = " more than the whole limit: lower max_tokens or the prompt" if tokens > (info.tpm or 0) else ""
        return APIError(429, f"Rate limit reached for key {info.name}: {info.tpm} tokens per minute ({int(used)} "
                        f"used or held by requests in flight); this request may use up to {tokens} tokens (its "
                        f"prompt and output bound){',' if over else ''}{over}. Retry in {wait:.1f}s.",
                        code="rate_limit_exceeded", headers=_retry(wait))

    def renew(self, held: list[tuple[str, str]] | None = None) -> None:
        """Extend the leases of this process's tpm holds in flight (`held`: a snapshot of `self.holding`'s items,
        taken on the thread that changes it; called every lease_s / 3)."""
        held = list(self.holding.items()) if held is None else held
        if not held:
            return
        if self.shared is not None:
            try:
                self.shared.renew([(self.shared.tpm_leases_key(k), rid) for rid, k in held], self.lease_s)
            except StoreDown:
                pass                 # logged by the store; a lapsed hold still settles
            return
        until = time.monotonic() + self.lease_s
        for rid, key_id in held:
            w = self.windows.get(key_id)
            h = w.held.get(rid) if w is not None else None
            if h is not None:
                h[1] = until

    # ---- after the answer -----------------------------------------------------------------------------------
    def settle(self, info: KeyInfo | None, request_id: str, tokens: int) -> None:
        """Replace the request's tpm hold by the tokens it used (prompt + completion); in Redis, a hold that left
        ample room settles after the answer, and stays in `holding` until then."""
        rid = request_id
        tenant = _of_tenant(info) if info is not None else None
        if tenant is not None and tenant.tpm is not None and tokens:
            self._spend(tenant.id, rid, tokens)
        held, ample = rid in self.holding, rid in self.ample
        self.ample.discard(rid)
        if info is None or self.shared is None or info.tpm is None or not (held or tokens):
            self.holding.pop(rid, None)
            if info is not None and self.shared is None and info.tpm is not None:
                w = self.window_of(info.key_id)
                w.held.pop(rid, None)
                if tokens:
                    w.tokens.append((time.monotonic(), tokens))
            return
        if ample:
            self.shared.settle_tokens(info.key_id, rid, tokens, WINDOW_S, then=lambda _: self.holding.pop(rid, None))
            return
        try:
            self.shared.settle_tokens(info.key_id, rid, tokens, WINDOW_S)
        except StoreDown:
            pass                 # logged by the store; the window forgets within a minute anyway
        self.holding.pop(rid, None)

    def _spend(self, window_id: str, request_id: str, tokens: int) -> None:
        """Count tokens a request used in a window that holds nothing before (a tenant's tpm)."""
        if self.shared is None:
            self.window_of(window_id).tokens.append((time.monotonic(), tokens))
            return
        try:
            self.shared.spend_tokens(window_id, request_id, tokens, WINDOW_S)
        except StoreDown:
            pass                 # logged by the store; the window forgets within a minute anyway
