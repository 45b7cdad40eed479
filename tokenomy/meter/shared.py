"""Counters that several gateway processes share through Redis: sliding-window rate limits and budget spend.

Rate limits (one Lua script, atomic per key): a sorted set of request ids scored by arrival (rpm) and one of
`request_id:tokens` members scored by finish (tpm), both trimmed to the last 60 s; a request is refused while the
window is full, with the wait until its oldest entry leaves it. Budgets: one hash per key or tenant and period,
`usd` and `tokens` advanced with HINCRBYFLOAT and expiring a day after the period ends. At start each gateway
raises every counter to at least the ledger's total (the ledger is the source of truth; Redis may have been
restarted and lost them, or may hold spend the ledger has not committed yet, so never lower it).

A Redis that does not answer raises StoreDown; the caller applies `limits.on_store_down` (budgets closed by
default, rate limits open). After a failure no call is tried for `retry_after_s`, so a dead Redis costs one
socket timeout a second, not one per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tokenomy.limits")

_RATE_LUA = """
local now, win = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - win)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - win)
if rpm >= 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {1, n, tonumber(oldest[2]) + win - now}
  end
end
if tpm >= 0 then
  local used = 0
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
  if used >= tpm then return {2, used, tonumber(entries[2]) + win - now} end
end
redis.call('ZADD', KEYS[1], now, ARGV[5])
redis.call('PEXPIRE', KEYS[1], win)
return {0, 0, 0}
"""

_RAISE_LUA = """
for i = 1, #ARGV - 1, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if cur < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
"""


class StoreDown(RuntimeError):
    """The shared counter store did not answer."""


class SharedCounters:
    def __init__(self, url: str, timeout_s: float = 0.25, retry_after_s: float = 1.0,
                 prefix: str = "tokenomy:limits:") -> None:
        import redis

        self.url, self.prefix, self.retry_after_s = url, prefix, retry_after_s
        self.errors = 0
        self._down_until = 0.0
        self._outage = False
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._error_types: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._rate = self._redis.register_script(_RATE_LUA)
        self._raise = self._redis.register_script(_RAISE_LUA)
        self.on_recover: list[Callable[[], None]] = []

    @property
    def healthy(self) -> bool:
        return not self._outage

    def _call(self, fn: Callable[[], Any]) -> Any:
        if time.monotonic() < self._down_until:
            raise StoreDown(f"limits store {self.url} is down")
        try:
            result = fn()
        except self._error_types as e:
            self.errors += 1
            self._down_until = time.monotonic() + self.retry_after_s
            if not self._outage:
                self._outage = True
                log.warning("limits store %s failed: %s", self.url, e)
            raise StoreDown(f"limits store {self.url} failed: {type(e).__name__}") from e
        if self._outage:
            self._outage = False
            log.warning("limits store %s answers again", self.url)
            for cb in self.on_recover:
                cb()
        return result

    # --- rate limits --------------------------------------------------------------------------------------------

    def take_request(self, key_id: str, request_id: str, rpm: int | None, tpm: int | None,
                     window_s: float) -> tuple[str | None, float, float]:
        """Count one request against the key's windows unless one is full: (None, 0, 0) when admitted, else
        ("rpm" | "tpm", used, seconds until room)."""
        keys = [f"{self.prefix}rpm:{key_id}", f"{self.prefix}tpm:{key_id}"]
        now_ms = int(time.time() * 1000)
        which, used, wait_ms = self._call(lambda: self._rate(
            keys=keys, args=[now_ms, int(window_s * 1000), -1 if rpm is None else rpm, -1 if tpm is None else tpm,
                             request_id]))
        return (None if which == 0 else ("rpm", "tpm")[int(which) - 1]), float(used), max(0, wait_ms) / 1000

    def spend_tokens(self, key_id: str, request_id: str, tokens: int, window_s: float) -> None:
        key = f"{self.prefix}tpm:{key_id}"

        def go() -> None:
            pipe = self._redis.pipeline()
            pipe.zadd(key, {f"{request_id}:{int(tokens)}": time.time() * 1000})
            pipe.pexpire(key, int(window_s * 1000))
            pipe.execute()

        self._call(go)

    # --- budgets ------------------------------------------------------------------------------------------------

    def _budget_key(self, slot: tuple[str, str, str, float]) -> str:
        scope, ident, period, start = slot
        return f"{self.prefix}budget:{scope}:{ident}:{period}:{int(start)}"

    def budget_get(self, slots: list[tuple[str, str, str, float]]) -> list[tuple[float, float]]:
        def go() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for s in slots:
                pipe.hmget(self._budget_key(s), "usd", "tokens")
            return pipe.execute()

        return [(float(u or 0), float(t or 0)) for u, t in self._call(go)]

    def budget_add(self, slots: list[tuple[tuple[str, str, str, float], float]], usd: float,
                   tokens: float) -> list[tuple[float, float]]:
        """Add spend to each (slot, expiry UNIX time); the new totals, in order."""
        def go() -> list[Any]:
            pipe = self._redis.pipeline()
            for s, expire_at in slots:
                k = self._budget_key(s)
                pipe.hincrbyfloat(k, "usd", usd)
                pipe.hincrbyfloat(k, "tokens", tokens)
                pipe.expireat(k, int(expire_at))
            return pipe.execute()

        out = self._call(go)
        return [(float(out[3 * i]), float(out[3 * i + 1])) for i in range(len(slots))]

    def budget_raise(self, slot: tuple[str, str, str, float], usd: float, tokens: float, expire_at: float) -> None:
        """Raise the slot's totals to at least these (from the ledger)."""
        k = self._budget_key(slot)

        def go() -> None:
            self._raise(keys=[k], args=["usd", repr(float(usd)), "tokens", repr(float(tokens))])
            self._redis.expireat(k, int(expire_at))

        self._call(go)
