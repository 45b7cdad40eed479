"""Admit stage: API keys (stored hashed), tenants, and per-key requests- and tokens-per-minute limits.

With no keys configured, every request is admitted as tenant "default". Limits are sliding 60-second windows
kept in memory (one gateway process), or in Redis (`limits.store`, limits/shared_counters.py) so that every gateway
process counts one window; the 429 carries Retry-After = seconds until the window frees enough room. A request counts
against rpm when admitted; against tpm, the reserve stage holds its prompt and output bound
(`reserve_tokens`) before it reaches a backend, refused unless used + held + that fits, and the record replaces
the hold by the tokens it used (`on_record`); holds are leases renewed while the request runs, as budgets' are.
While Redis does not answer, rate limits are not applied (`limits.rates_on_store_down: open`, the default) or
every limited key is refused with a 503 (`closed`).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field

from tokenomy.config import KeySpec, TenantSpec
from tokenomy.errors import APIError
from tokenomy.limits.shared_counters import SharedCounters, StoreDown
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext

WINDOW_S = 60.0


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class KeyInfo:
    key_id: str                 # first 12 hex chars of the hash: safe to log and store
    name: str
    tenant: str
    admin: bool
    rpm: int | None
    tpm: int | None
    allowed: frozenset[str] | None = None    # model and route names it may ask for (key's and tenant's); None: all
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    held: dict[str, list[float]] = field(default_factory=dict)   # request id -> [tokens, lease end (monotonic)]


class Keyring:
    def __init__(self, keys: list[KeySpec], tenants: dict[str, TenantSpec] | None = None) -> None:
        self.by_hash: dict[str, KeyInfo] = {}
        for k in keys:
            h = k.key_sha256.lower() if k.key_sha256 else hash_key(k.key or "")
            lists = [set(x) for x in (k.models, (tenants or {}).get(k.tenant, TenantSpec()).models) if x is not None]
            allowed = frozenset(set.intersection(*lists)) if lists else None
            self.by_hash[h] = KeyInfo(h[:12], k.name, k.tenant, k.admin, k.rpm, k.tpm, allowed)
        self._by_id = {i.key_id: i for i in self.by_hash.values()}

    @property
    def enabled(self) -> bool:
        return bool(self.by_hash)

    def by_key_id(self, key_id: str | None) -> KeyInfo | None:
        return self._by_id.get(key_id) if key_id else None

    def lookup(self, authorization: str | None) -> KeyInfo:
        """The key a request's Authorization header presents, or a 401. Only the key's SHA-256 is kept and looked
        up (in a table: the time a lookup takes tells nothing of a stored digest's preimage)."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                           code="missing_api_key")
        info = self.by_hash.get(hash_key(authorization[7:].strip()))
        if info is not None:
            return info
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def by_id(self, key_id: str | None) -> KeyInfo:
        """The key behind a batch (authenticated when the batch was created): 401 once it is no longer configured."""
        info = self.by_key_id(key_id)
        if info is None:
            raise APIError(401, "The API key that created this batch is no longer configured.",
                           code="invalid_api_key")
        return info

    def admin(self, authorization: str | None) -> KeyInfo | None:
        """Admin endpoints: refuse unless an admin key is presented (or no keys are configured at all)."""
        if not self.enabled:
            return None
        info = self.lookup(authorization)
        if not info.admin:
            raise APIError(403, "This endpoint needs an admin key.", code="not_admin")
        return info


class Admit:
    name = "admit"

    def __init__(self, keyring: Keyring, shared: SharedCounters | None = None, fail_open: bool = True,
                 lease_s: float = 300.0) -> None:
        self.keyring = keyring
        self.shared, self.fail_open = shared, fail_open
        self.lease_s = lease_s
        self.holding: dict[str, str] = {}      # request id -> key id: this process's tpm holds in flight
        self.ample: set[str] = set()           # of those in Redis, the ones whose settle may run after the answer

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        if self.keyring.enabled:
            # a batch request (ctx.batch_id, set only by tokenomy/batch/) carries the key id it was created with
            info = (self.keyring.by_id(ctx.key_id) if ctx.batch_id is not None
                    else ctx.key or self.keyring.lookup(ctx.headers.get("authorization")))
            ctx.key_id, ctx.tenant = info.key_id, info.tenant
            if info.allowed is not None:
                ctx.allowed_models = frozenset(info.allowed) if info.allowed is not None else None
                if ctx.gen.model not in info.allowed:
                    raise APIError(403, f"This key may not use the model '{ctx.gen.model}'. It may use: "
                                   f"{', '.join(sorted(info.allowed))}.", param="model", code="model_not_allowed")
            self._check_limits(info, ctx)
        await call_next(ctx)         # budgets: the reserve stage holds the request's worst case or refuses it

    def limits_tokens(self, key_id: str | None) -> bool:
        """Whether this key has a tokens-per-minute limit (else there is nothing to reserve for it)."""
        info = self.keyring.by_key_id(key_id)
        return info is not None and info.tpm is not None

    def window(self, ctx: RequestContext, tokens: int) -> tuple[str, int, int, float] | None:
        """What the budgets' reservation needs to hold the request's tokens-per-minute hold in the same step
        (Budgets.reserve(window=...)): (key id, tokens, tpm, window seconds), or None when it has nothing to hold
        or its windows are not in the shared store."""
        info = self.keyring.by_key_id(ctx.key_id)
        if self.shared is None or info is None or info.tpm is None or tokens <= 0:
            return None
        return info.key_id, tokens, info.tpm, WINDOW_S

    def held_with_budgets(self, ctx: RequestContext, ample: bool) -> None:
        """The budgets' reservation held the request's tokens-per-minute hold (`window`): track it as ours."""
        if not ample or ctx.request_id in self.holding:
            self.ample.discard(ctx.request_id)
        else:
            self.ample.add(ctx.request_id)
        self.holding[ctx.request_id] = ctx.key_id or ""

    def window_full(self, ctx: RequestContext, used: float, tokens: int, wait: float) -> APIError:
        """The 429 for a request whose tokens-per-minute hold did not fit (held with the budgets)."""
        info = self.keyring.by_key_id(ctx.key_id)
        assert info is not None
        return self._tokens_full(info, used, tokens, wait)

    def reserve_tokens(self, ctx: RequestContext, tokens: int) -> None:
        """Hold `tokens` (the request's prompt and output bound) in its key's tokens-per-minute window, or raise a
        429 unless the tokens used in the last minute + held + these fit `tpm`. Calls for one request add up."""
        info = self.keyring.by_key_id(ctx.key_id)
        if info is None or info.tpm is None or tokens <= 0:
            return
        if self.shared is not None:
            try:
                full = self.shared.reserve_tokens(info.key_id, ctx.request_id, tokens, info.tpm, WINDOW_S,
                                                  self.lease_s)
            except StoreDown as e:
                if self.fail_open:
                    return
                raise APIError(503, "Rate limits cannot be checked: their shared store does not answer. Retry "
                               "later.", code="limits_unavailable", type_="server_error",
                               headers={"retry-after": "1"}) from e
            if not isinstance(full, bool):
                raise self._tokens_full(info, full[0], tokens, full[1])
            if not full or ctx.request_id in self.holding:    # two holds of one request: settle it at once
                self.ample.discard(ctx.request_id)
            else:
                self.ample.add(ctx.request_id)
        else:
            now = t = time.monotonic()
            self._trim(info, now)
            for gone in [r for r, h in info.held.items() if h[1] <= t]:
                del info.held[gone]
            used = sum(n for _, n in info.tokens) + sum(h[0] for h in info.held.values())
            if used + tokens > info.tpm:
                wait = WINDOW_S - (now - info.tokens[0][0]) if info.tokens else 1.0
                raise self._tokens_full(info, used, tokens, wait)
            h = info.held.setdefault(ctx.request_id, [0.0, 0.0])
            h[0], h[1] = h[0] + tokens, t + self.lease_s
        self.holding[ctx.request_id] = info.key_id

    @staticmethod
    def _tokens_full(info: KeyInfo, used: float, tokens: int, wait: float) -> APIError:
        over = " more than the whole limit: lower max_tokens or the prompt" if tokens > (info.tpm or 0) else ""
        return APIError(429, f"Rate limit reached for key {info.name}: {info.tpm} tokens per minute ({int(used)} "
                        f"used or held by requests in flight); this request may use up to {tokens} tokens (its "
                        f"prompt and output bound){',' if over else ''}{over}. Retry in {wait:.1f}s.",
                        code="rate_limit_exceeded", headers={"retry-after": str(max(1, int(wait + 0.999)))})

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
            info = self.keyring.by_key_id(key_id)
            h = info.held.get(rid) if info is not None else None
            if h is not None:
                h[1] = until

    def on_record(self, ctx: RequestContext) -> None:
        """Record sink: replace the request's tpm hold by the tokens it used (prompt + completion); in Redis, a
        hold that left ample room settles after the answer, and stays in `holding` until then."""
        rid = ctx.request_id
        held, ample = rid in self.holding, rid in self.ample
        self.ample.discard(rid)
        info = self.keyring.by_key_id(ctx.key_id)
        tokens = ctx.usage.prompt_tokens + ctx.usage.completion_tokens if ctx.usage is not None else 0
        if info is None or self.shared is None or info.tpm is None or not (held or tokens):
            self.holding.pop(rid, None)
            if info is not None and self.shared is None:
                info.held.pop(rid, None)
                if tokens:
                    self.spend(info, tokens)
            return
        if ample:
            self.shared.settle_tokens(info.key_id, rid, tokens, WINDOW_S, then=lambda _: self.holding.pop(rid, None))
            return
        try:
            self.shared.settle_tokens(info.key_id, rid, tokens, WINDOW_S)
        except StoreDown:
            pass                 # logged by the store; the window forgets within a minute anyway
        self.holding.pop(rid, None)

    @staticmethod
    def _trim(info: KeyInfo, now: float) -> None:
        while info.requests and now - info.requests[0] >= WINDOW_S:
            info.requests.popleft()
        while info.tokens and now - info.tokens[0][0] >= WINDOW_S:
            info.tokens.popleft()

    def _check_limits(self, info: KeyInfo, ctx: RequestContext) -> None:
        if self.shared is not None:
            self._check_shared(info, ctx)
            return
        now = time.monotonic()
        self._trim(info, now)
        if info.rpm is not None and len(info.requests) >= info.rpm:
            wait = WINDOW_S - (now - info.requests[0])
            raise APIError(429, f"Rate limit reached for key {info.name}: {info.rpm} requests per minute. "
                           f"Retry in {wait:.1f}s.", code="rate_limit_exceeded",
                           headers={"retry-after": str(max(1, int(wait + 0.999)))})
        if info.tpm is not None:
            used = sum(n for _, n in info.tokens)
            if used >= info.tpm:
                wait = WINDOW_S - (now - info.tokens[0][0])
                raise APIError(429, f"Rate limit reached for key {info.name}: {info.tpm} tokens per minute "
                               f"({used} used). Retry in {wait:.1f}s.", code="rate_limit_exceeded",
                               headers={"retry-after": str(max(1, int(wait + 0.999)))})
        info.requests.append(now)

    def _check_shared(self, info: KeyInfo, ctx: RequestContext) -> None:
        assert self.shared is not None
        if info.rpm is None and info.tpm is None:
            return
        try:
            full, used, wait = self.shared.take_request(info.key_id, ctx.request_id, info.rpm, info.tpm, WINDOW_S)
        except StoreDown as e:
            if self.fail_open:
                return
            raise APIError(503, "Rate limits cannot be checked: their shared store does not answer. Retry later.",
                           code="limits_unavailable", type_="server_error", headers={"retry-after": "1"}) from e
        if full is None:
            return
        what = f"{info.rpm} requests per minute" if full == "rpm" else \
            f"{info.tpm} tokens per minute ({int(used)} used)"
        raise APIError(429, f"Rate limit reached for key {info.name}: {what}. Retry in {wait:.1f}s.",
                       code="rate_limit_exceeded", headers={"retry-after": str(max(1, int(wait + 0.999)))})

    @staticmethod
    def spend(info: KeyInfo, tokens: int) -> None:
        info.tokens.append((time.monotonic(), tokens))
