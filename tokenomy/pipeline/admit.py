"""Admit stage: API keys (stored hashed), tenants, and per-key requests- and tokens-per-minute limits.

With no keys configured, every request is admitted as tenant "default". Limits are sliding 60-second windows
kept in memory (one gateway process), or in Redis (`limits.store`, meter/shared.py) so that every gateway process
counts one window; the 429 carries Retry-After = seconds until the window frees enough room. While Redis does not
answer, rate limits are not applied (`limits.rates_on_store_down: open`, the default) or every limited key is
refused with a 503 (`closed`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tokenomy.config import KeySpec, TenantSpec
from tokenomy.errors import APIError
from tokenomy.meter.shared import SharedCounters, StoreDown
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


class Keyring:
    def __init__(self, keys: list[KeySpec], tenants: dict[str, TenantSpec] | None = None) -> None:
        self.by_hash: dict[str, KeyInfo] = {}
        for k in keys:
            h = k.key_sha256.lower() if k.key_sha256 else hash_key(k.key or "")
            lists = [set(x) for x in (k.models, (tenants or {}).get(k.tenant, TenantSpec()).models) if x is not None]
            allowed = frozenset(set.intersection(*lists)) if lists else None
            self.by_hash[h] = KeyInfo(h[:12], k.name, k.tenant, k.admin, k.rpm, k.tpm, allowed)

    @property
    def enabled(self) -> bool:
        return bool(self.by_hash)

    def lookup(self, authorization: str | None) -> KeyInfo:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                           code="missing_api_key")
        digest = hash_key(authorization[7:].strip())
        for h, info in self.by_hash.items():
            if hmac.compare_digest(h, digest):
                return info
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")

    def by_id(self, key_id: str | None) -> KeyInfo:
        """The key behind a batch (authenticated when the batch was created): 401 once it is no longer configured."""
        for info in self.by_hash.values():
            if info.key_id == key_id:
                return info
        raise APIError(401, "The API key that created this batch is no longer configured.", code="invalid_api_key")

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

    def __init__(self, keyring: Keyring, budgets: Any = None, shared: SharedCounters | None = None,
                 fail_open: bool = True) -> None:
        self.keyring = keyring
        self.budgets = budgets
        self.shared, self.fail_open = shared, fail_open

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        if self.keyring.enabled:
            # a batch request (ctx.batch_id, set only by tokenomy/batch/) carries the key id it was created with
            info = (self.keyring.by_id(ctx.key_id) if ctx.batch_id is not None
                    else self.keyring.lookup(ctx.headers.get("authorization")))
            ctx.key_id, ctx.tenant = info.key_id, info.tenant
            if info.allowed is not None:
                ctx.allowed_models = frozenset(info.allowed) if info.allowed is not None else None
                if ctx.gen.model not in info.allowed:
                    raise APIError(403, f"This key may not use the model '{ctx.gen.model}'. It may use: "
                                   f"{', '.join(sorted(info.allowed))}.", param="model", code="model_not_allowed")
            self._check_limits(info, ctx)
        if self.budgets is not None:
            self.budgets.check(ctx.key_id, ctx.tenant)   # raises BudgetExceeded: a 429 naming the budget
        await call_next(ctx)

    def on_record(self, ctx: RequestContext) -> None:
        """Record sink: count the tokens a finished request used against its key's tokens-per-minute."""
        if ctx.key_id is None or ctx.usage is None:
            return
        for info in self.keyring.by_hash.values():
            if info.key_id == ctx.key_id:
                tokens = ctx.usage.prompt_tokens + ctx.usage.completion_tokens
                if self.shared is None:
                    self.spend(info, tokens)
                elif info.tpm is not None:
                    try:
                        self.shared.spend_tokens(info.key_id, ctx.request_id, tokens, WINDOW_S)
                    except StoreDown:
                        pass                 # logged by the store; the window forgets within a minute anyway

    def _check_limits(self, info: KeyInfo, ctx: RequestContext) -> None:
        if self.shared is not None:
            self._check_shared(info, ctx)
            return
        now = time.monotonic()
        while info.requests and now - info.requests[0] >= WINDOW_S:
            info.requests.popleft()
        while info.tokens and now - info.tokens[0][0] >= WINDOW_S:
            info.tokens.popleft()
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
