"""Counters that several gateway processes share through Redis: sliding-window rate limits, budget spend, and
the reservations (holds) of requests in flight against both.

Rate limits (one Lua script, atomic per key): a sorted set of request ids scored by arrival (rpm) and one of
`request_id:tokens` members scored by finish (tpm), both trimmed to the last 60 s; a request is refused while the
window is full, with the wait until its oldest entry leaves it. Budgets: one hash per key or tenant and period,
`usd` and `tokens` advanced with HINCRBYFLOAT and expiring a day after the period ends. At start each gateway
raises every counter to at least the ledger's total (the ledger is the source of truth; Redis may have been
restarted and lost them, or may hold spend the ledger has not committed yet, so never lower it).

Holds (pipeline/reserve.py reserves, the record settles): beside each budget hash and tpm window, a hash of
`request_id -> amount held` and a sorted set of the same ids scored by when their lease ends. Reserving is one
script over every limit that applies: it first drops holds whose lease ended (a gateway that died holding them),
then refuses unless spent + held + this request's maximum fits every limit, and only then holds it in all of them.
Settling is one script too: the hold goes, the actual spend is added. A live gateway renews its holds' leases.

A settle that no later request can be waiting on runs off the request path: the reserve scripts say whether the
budget or window had room for two more requests like this one after holding it ("ample"), and if so the settle is
queued for the settler thread, which sends what is queued in one pipelined round trip after the answer has gone.
Near a limit the settle runs before the answer, so a client that sends its next request as soon as it has the
last answer (to this gateway or another) finds the spend settled and its room exact. Deferring only delays the
release of a hold (never larger than the spend's bound), so it can refuse early, never overspend.

A Redis that does not answer raises StoreDown; the caller applies `limits.on_store_down` (budgets closed by
default, rate limits open). After a failure no call is tried for `retry_after_s`, so a dead Redis costs one
socket timeout a second, not one per request.
"""

from __future__ import annotations

import logging
import queue
import threading
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


_HOLD_SUMS = """
local function held_sums(holds, leases, now)
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  for _, r in ipairs(gone) do redis.call('HDEL', holds, r) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', leases, '-inf', now) end
  local u, t = 0, 0
  local all = redis.call('HGETALL', holds)
  for j = 2, #all, 2 do
    local a, b = string.match(all[j], '^(%S+) (%S+)$')
    u, t = u + tonumber(a), t + tonumber(b)
  end
  return u, t, #gone
end
local function hold(holds, leases, rid, need_u, need_t, lease_end, expire_at)
  local cur = redis.call('HGET', holds, rid)
  local u, t = 0, 0
  if cur then
    local a, b = string.match(cur, '^(%S+) (%S+)$')
    u, t = tonumber(a), tonumber(b)
  end
  redis.call('HSET', holds, rid, string.format('%.17g %.17g', u + need_u, t + need_t))
  redis.call('ZADD', leases, lease_end, rid)
  redis.call('EXPIREAT', holds, expire_at)
  redis.call('EXPIREAT', leases, expire_at)
end
"""

# KEYS: per budget slot (spent hash, holds hash, leases zset), then optionally a tokens-per-minute window's three
# keys (window zset, holds hash, leases zset); ARGV: now_ms, lease end ms, request id, expire-at (UNIX s), need usd,
# need tokens, number of slots n, then per slot its usd and tokens limits (-1: none), then with the window: its
# need, limit and length in ms. The window is checked first, then every slot; all or nothing is held. Returns
# {0, 0, '0', '0', expired, ample, window ample} when held (ample: 1 when every limit had room for this and two
# more like it), {-1, 0, used + held, ms until the window's oldest entry leaves, 0} when the window is full, else
# {slot index, 1 usd | 2 tokens, spent, held, expired}; amounts as strings (Lua numbers would be cut).
# Without a window, ARGV may end with an allowance's id, its minimum room, share and maximum (limits/allowance.py):
# when every limit has room for at least `minimum room` requests like this one, g = min(room / share, maximum)
# of them are held under the allowance's id instead of this one under the request's, and the 8th value is g.
_BUDGET_RESERVE_LUA = _HOLD_SUMS + """
local now, lease_end, rid, expire_at = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local need_u, need_t, n = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local expired, ample, tample = 0, 1, 1
local window = #KEYS > 3 * n
local allow = (not window) and #ARGV >= 11 + 2 * n
local room = math.huge
local tneed = 0
if window then
  local w = KEYS[3 * n + 1]
  local limit, win = tonumber(ARGV[9 + 2 * n]), tonumber(ARGV[10 + 2 * n])
  tneed = tonumber(ARGV[8 + 2 * n])
  redis.call('ZREMRANGEBYSCORE', w, '-inf', now - win)
  local used = 0
  local entries = redis.call('ZRANGE', w, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
  local _, held = held_sums(KEYS[3 * n + 2], KEYS[3 * n + 3], now)
  if used + held + tneed > limit then
    local wait = win
    if #entries > 0 then wait = tonumber(entries[2]) + win - now end
    return {-1, 0, tostring(used + held), tostring(wait), 0}
  end
  if used + held + 3 * tneed > limit then tample = 0 end
end
for i = 1, n do
  local hu, ht, gone = held_sums(KEYS[3 * i - 1], KEYS[3 * i], now)
  expired = expired + gone
  local s = redis.call('HMGET', KEYS[3 * i - 2], 'usd', 'tokens')
  local su, st = tonumber(s[1] or '0'), tonumber(s[2] or '0')
  local lu, lt = tonumber(ARGV[6 + 2 * i]), tonumber(ARGV[7 + 2 * i])
  if lu >= 0 and need_u > 0 and su + hu + need_u > lu * (1 + 1e-9) then
    return {i, 1, string.format('%.17g', su), string.format('%.17g', hu), expired}
  end
  if lt >= 0 and need_t > 0 and st + ht + need_t > lt then
    return {i, 2, string.format('%.17g', st), string.format('%.17g', ht), expired}
  end
  if (lu >= 0 and need_u > 0 and su + hu + 3 * need_u > lu * (1 + 1e-9))
      or (lt >= 0 and need_t > 0 and st + ht + 3 * need_t > lt) then
    ample = 0
  end
  if lu >= 0 and need_u > 0 then room = math.min(room, math.floor((lu * (1 + 1e-9) - su - hu) / need_u)) end
  if lt >= 0 and need_t > 0 then room = math.min(room, math.floor((lt - st - ht) / need_t)) end
end
if allow and room >= tonumber(ARGV[9 + 2 * n]) then
  local g = math.min(math.floor(room / tonumber(ARGV[10 + 2 * n])), tonumber(ARGV[11 + 2 * n]))
  for i = 1, n do hold(KEYS[3 * i - 1], KEYS[3 * i], ARGV[8 + 2 * n], g * need_u, g * need_t, lease_end, expire_at) end
  return {0, 0, '0', '0', expired, 1, 1, g}
end
for i = 1, n do hold(KEYS[3 * i - 1], KEYS[3 * i], rid, need_u, need_t, lease_end, expire_at) end
if window then
  hold(KEYS[3 * n + 2], KEYS[3 * n + 3], rid, 0, tneed, lease_end, math.floor(lease_end / 1000) + 60)
end
return {0, 0, '0', '0', expired, ample, tample}
"""

# KEYS: per held slot (holds hash, leases zset), then per slot charged now (spent hash); ARGV: request id, number
# of held slots, usd, tokens, then per charged slot its expire-at. Returns the charged slots' new totals.
_BUDGET_SETTLE_LUA = """
local rid, n, du, dt = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, n do
  redis.call('HDEL', KEYS[2 * i - 1], rid)
  redis.call('ZREM', KEYS[2 * i], rid)
end
local out = {}
for i = 2 * n + 1, #KEYS do
  local k = KEYS[i]
  if du ~= 0 then redis.call('HINCRBYFLOAT', k, 'usd', ARGV[3]) end
  if dt ~= 0 then redis.call('HINCRBYFLOAT', k, 'tokens', ARGV[4]) end
  if du ~= 0 or dt ~= 0 then redis.call('EXPIREAT', k, ARGV[4 + i - 2 * n]) end
  local cur = redis.call('HMGET', k, 'usd', 'tokens')
  table.insert(out, cur[1] or '0')
  table.insert(out, cur[2] or '0')
end
return out
"""

# An allowance's flush (limits/allowance.py). KEYS: per slot (spent hash, holds hash, leases zset); ARGV: allowance
# id, usd and tokens its requests spent since the last flush, 1 to give it back (else 0), lease end ms, expire-at
# (UNIX s). The spend is added to every slot and the allowance's hold lowered by as much (given back: dropped), its
# lease renewed. Returns per slot its new usd and tokens totals, then 1 when the hold was still there (else 0: it
# lapsed, or Redis lost it).
_ALLOWANCE_FLUSH_LUA = """
local aid, du, dt, back = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local alive = 1
local out = {}
for i = 1, #KEYS / 3 do
  local spent, holds, leases = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if du ~= 0 then redis.call('HINCRBYFLOAT', spent, 'usd', ARGV[2]) end
  if dt ~= 0 then redis.call('HINCRBYFLOAT', spent, 'tokens', ARGV[3]) end
  if du ~= 0 or dt ~= 0 then redis.call('EXPIREAT', spent, ARGV[6]) end
  local cur = redis.call('HGET', holds, aid)
  if not cur then
    alive = 0
  elseif back then
    redis.call('HDEL', holds, aid)
    redis.call('ZREM', leases, aid)
  else
    local a, b = string.match(cur, '^(%S+) (%S+)$')
    redis.call('HSET', holds, aid, string.format('%.17g %.17g', math.max(0, tonumber(a) - du),
                                                 math.max(0, tonumber(b) - dt)))
    redis.call('ZADD', leases, 'XX', ARGV[5], aid)
  end
  local c = redis.call('HMGET', spent, 'usd', 'tokens')
  table.insert(out, c[1] or '0')
  table.insert(out, c[2] or '0')
end
table.insert(out, alive)
return out
"""

# A tokens-per-minute window with holds: KEYS window zset (`request_id:tokens` scored by finish ms), holds hash,
# leases zset; ARGV now_ms, window ms, lease end ms, request id, need, limit. {0, 0, 0, ample} when held (ample:
# 1 when the window had room for this and two more like it), else {1, spent + held, ms until the window's oldest
# entry leaves}.
_TPM_RESERVE_LUA = _HOLD_SUMS + """
local now, win, lease_end, rid = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local need, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - win)
local used = 0
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
local _, held = held_sums(KEYS[2], KEYS[3], now)
if used + held + need > limit then
  local wait = win
  if #entries > 0 then wait = tonumber(entries[2]) + win - now end
  return {1, used + held, wait}
end
hold(KEYS[2], KEYS[3], rid, 0, need, lease_end, math.floor(lease_end / 1000) + 60)
if used + held + 3 * need > limit then return {0, 0, 0, 0} end
return {0, 0, 0, 1}
"""

# KEYS window, holds, leases; ARGV request id, actual tokens, now_ms, window ms.
_TPM_SETTLE_LUA = """
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1] .. ':' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
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
        self._budget_reserve = self._redis.register_script(_BUDGET_RESERVE_LUA)
        self._budget_settle = self._redis.register_script(_BUDGET_SETTLE_LUA)
        self._tpm_reserve = self._redis.register_script(_TPM_RESERVE_LUA)
        self._tpm_settle = self._redis.register_script(_TPM_SETTLE_LUA)
        self._allowance_flush = self._redis.register_script(_ALLOWANCE_FLUSH_LUA)
        self.on_recover: list[Callable[[], None]] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()     # deferred script calls, for the settler
        self._pending = 0
        self._idle = threading.Condition()
        self._settler: threading.Thread | None = None

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

    def reserve_tokens(self, key_id: str, request_id: str, need: int, tpm: int, window_s: float,
                       lease_s: float) -> tuple[float, float] | bool:
        """Hold `need` tokens in the key's tokens-per-minute window unless spent + held + need exceeds `tpm`:
        when held, whether the window had room for two more like it (its settle may then be deferred); else
        (tokens spent and held, seconds until the window's oldest entry leaves)."""
        base = f"{self.prefix}tpm:{key_id}"
        now_ms = int(time.time() * 1000)
        full, used, wait_ms, *ample = self._call(lambda: self._tpm_reserve(
            keys=[base, base + ":holds", base + ":leases"],
            args=[now_ms, int(window_s * 1000), now_ms + int(lease_s * 1000), request_id, int(need), int(tpm)]))
        return bool(ample and int(ample[0])) if full == 0 else (float(used), max(0, float(wait_ms)) / 1000)

    def settle_tokens(self, key_id: str, request_id: str, tokens: int, window_s: float,
                      then: Callable[[bool], None] | None = None) -> None:
        """Replace the request's tokens-per-minute hold by the tokens it used (counted from now). With `then`,
        the settle is deferred to the settler thread, which calls then(settled) once it ran."""
        base = f"{self.prefix}tpm:{key_id}"
        keys = [base, base + ":holds", base + ":leases"]
        args = [request_id, int(tokens), int(time.time() * 1000), int(window_s * 1000)]
        if then is not None:
            self._defer(self._tpm_settle, keys, args, lambda out: then(out is not None))
            return
        self._call(lambda: self._tpm_settle(keys=keys, args=args))

    def renew(self, holds: list[tuple[str, str]], lease_s: float) -> None:
        """Extend the leases of (leases key, request id) holds this gateway still serves; one that already
        lapsed stays gone (its spend is still added when it settles)."""
        if not holds:
            return
        until = int(time.time() * 1000) + int(lease_s * 1000)

        def go() -> None:
            pipe = self._redis.pipeline(transaction=False)
            for key, rid in holds:
                pipe.zadd(key, {rid: until}, xx=True)
            pipe.execute()

        self._call(go)

    def budget_leases_key(self, slot: tuple[str, str, str, float]) -> str:
        return self._budget_key(slot) + ":leases"

    def tpm_leases_key(self, key_id: str) -> str:
        return f"{self.prefix}tpm:{key_id}:leases"

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

    def budget_reserve(self, slots: list[tuple[tuple[str, str, str, float], float | None, float | None]],
                       request_id: str, usd: float, tokens: float, lease_s: float, expire_at: float,
                       window: tuple[str, int, int, float] | None = None,
                       allowance: tuple[str, int, int, int] | None = None,
                       ) -> tuple[Any, int, bool, bool | None, int]:
        """Hold (usd, tokens) in every (slot, usd limit, tokens limit), and with `window` (key id, need, tpm,
        window seconds) `need` tokens in that key's tokens-per-minute window, in one atomic step, unless one of
        them has no room: (None, holds found expired, ample, window ample or None without a window, 0) when held,
        with ample True when every limit had room for two more like it (the settle may then be deferred); else
        ((index of the slot, "usd" | "tokens", spent, held), expired, False, None, 0), or, when the window is full,
        ((-1, "tpm", tokens used and held, seconds until its oldest entry leaves), 0, False, None, 0).

        With `allowance` (its id, minimum room, share, maximum; not with a window; limits/allowance.py), when every
        limit has room for `minimum room` requests like this one, g of them are held under the allowance's id
        instead, and the last value is g (the request is not held under its own id: the caller holds it in the
        allowance)."""
        keys: list[str] = []
        limits: list[float] = []
        for slot, usd_limit, tokens_limit in slots:
            k = self._budget_key(slot)
            keys += [k, k + ":holds", k + ":leases"]
            limits += [-1 if usd_limit is None else usd_limit, -1 if tokens_limit is None else tokens_limit]
        extra: list[Any] = []
        if window is not None:
            key_id, need, tpm, window_s = window
            base = f"{self.prefix}tpm:{key_id}"
            keys += [base, base + ":holds", base + ":leases"]
            extra = [int(need), int(tpm), int(window_s * 1000)]
        elif allowance is not None:
            extra = list(allowance)
        now_ms = int(time.time() * 1000)
        out = self._call(lambda: self._budget_reserve(
            keys=keys, args=[now_ms, now_ms + int(lease_s * 1000), request_id, int(expire_at), repr(float(usd)),
                             repr(float(tokens)), len(slots), *[repr(float(x)) for x in limits], *extra]))
        which, unit, spent, held, expired, *ample = out
        if int(which) == -1:
            return (-1, "tpm", float(spent), max(0.0, float(held)) / 1000), 0, False, None, 0
        if int(which) == 0:
            return None, int(expired), bool(int(ample[0])), \
                (bool(int(ample[1])) if window is not None else None), int(ample[2]) if len(ample) > 2 else 0
        return (int(which) - 1, ("usd", "tokens")[int(unit) - 1], float(spent), float(held)), int(expired), False, \
            None, 0

    def budget_settle(self, held: list[tuple[str, str, str, float]],
                      charged: list[tuple[tuple[str, str, str, float], float]], request_id: str, usd: float,
                      tokens: float, then: Callable[[list[tuple[float, float]] | None], None] | None = None,
                      ) -> list[tuple[float, float]]:
        """Drop the request's holds in `held` and add its spend to each (slot, expire-at) in `charged`, in one
        step; the charged slots' new totals, in order. With `then`, the settle is deferred to the settler thread,
        which calls then(totals), or then(None) when the store did not answer; this returns [] at once."""
        keys: list[str] = []
        for slot in held:
            k = self._budget_key(slot)
            keys += [k + ":holds", k + ":leases"]
        keys += [self._budget_key(s) for s, _ in charged]
        args = [request_id, len(held), repr(float(usd)), repr(float(tokens)), *[int(e) for _, e in charged]]

        def totals(out: list[Any]) -> list[tuple[float, float]]:
            return [(float(out[2 * i]), float(out[2 * i + 1])) for i in range(len(charged))]

        if then is not None:
            self._defer(self._budget_settle, keys, args, lambda out: then(None if out is None else totals(out)))
            return []
        return totals(self._call(lambda: self._budget_settle(keys=keys, args=args)))

    def allowance_flush(self, flushes: list[tuple[list[tuple[str, str, str, float]], str, float, float, bool, float]],
                        lease_s: float) -> list[tuple[bool, list[tuple[float, float]]]]:
        """For each (slots, allowance id, usd, tokens, give back, expire-at): add the spend to every slot and lower
        the allowance's hold by as much (or drop it: give back), renewing its lease; all in one pipelined round
        trip. Per flush: whether its hold was still there, and the slots' new (usd, tokens) totals."""
        from redis.exceptions import NoScriptError

        until = int(time.time() * 1000) + int(lease_s * 1000)
        calls = []
        for slots, aid, usd, tokens, back, expire_at in flushes:
            keys: list[str] = []
            for slot in slots:
                k = self._budget_key(slot)
                keys += [k, k + ":holds", k + ":leases"]
            calls.append((keys, [aid, repr(float(usd)), repr(float(tokens)), 1 if back else 0, until,
                                 int(expire_at)]))

        def go() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(self._allowance_flush.sha, len(keys), *keys, *args)
            out = pipe.execute(raise_on_error=False)
            for i, r in enumerate(out):         # Redis restarted and lost the script: the Script object loads it
                if isinstance(r, NoScriptError):
                    out[i] = self._allowance_flush(keys=calls[i][0], args=calls[i][1])
                elif isinstance(r, Exception):
                    raise r
            return out

        result = []
        for out in self._call(go):
            *totals, alive = out
            result.append((bool(int(alive)), [(float(totals[2 * i]), float(totals[2 * i + 1]))
                                              for i in range(len(totals) // 2)]))
        return result

    def budget_held(self, slot: tuple[str, str, str, float]) -> tuple[float, float]:
        """(usd, tokens) held by requests in flight in a slot, leases lapsed or not (for reports and tests)."""
        def go() -> dict[Any, Any]:
            return self._redis.hgetall(self._budget_key(slot) + ":holds")

        u = t = 0.0
        for v in self._call(go).values():
            a, b = v.split()
            u, t = u + float(a), t + float(b)
        return u, t

    # --- settling off the request path --------------------------------------------------------------------------

    def _defer(self, script: Any, keys: list[str], args: list[Any], done: Callable[[Any], None]) -> None:
        """Queue a script call for the settler thread; done(result), or done(None) when the store failed."""
        with self._idle:
            self._pending += 1
            if self._settler is None:
                self._settler = threading.Thread(target=self._settle_loop, name="limits-settler", daemon=True)
                self._settler.start()
        self._queue.put((script, keys, args, done))

    def _settle_loop(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < 256:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            calls = [c for c in batch if c is not None]
            for (*_, done), out in zip(calls, self._run(calls), strict=True):
                try:
                    done(out)
                except Exception:              # a callback's failure must not stop the settler
                    log.exception("after a deferred settle")
            with self._idle:
                self._pending -= len(calls)
                self._idle.notify_all()

    def _run(self, calls: list[Any]) -> list[Any]:
        """Run queued script calls in one pipelined round trip; None for each when the store failed."""
        if not calls:
            return []
        from redis.exceptions import NoScriptError

        def go() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for script, keys, args, _ in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            return pipe.execute(raise_on_error=False)

        try:
            out = self._call(go)
        except StoreDown:
            return [None] * len(calls)
        for i, (r, (script, keys, args, _)) in enumerate(zip(out, calls, strict=True)):
            if isinstance(r, NoScriptError):      # Redis restarted and lost the script: the Script object loads it
                try:
                    out[i] = self._call(lambda s=script, k=keys, a=args: s(keys=k, args=a))
                except StoreDown:
                    out[i] = None
            elif isinstance(r, Exception):
                log.warning("a deferred settle failed: %s", r)
                out[i] = None
        return out

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until every deferred settle has run (or `timeout_s` passed): whether none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self) -> None:
        """Run what is deferred, then stop the settler thread."""
        if self._settler is not None:
            self._queue.put(None)
            self._settler.join(10.0)
            self._settler = None
