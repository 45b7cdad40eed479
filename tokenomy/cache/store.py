"""Key-value stores behind the response caches: get/set with TTL, delete, bounded by entry count with LRU eviction.

Contract shared by every store: values are JSON-able dicts; ``get`` returns None for a miss, an expired entry or
any failure of the backing store; ``set``/``delete`` never raise because the backing store failed. Failures
are counted in ``errors`` so they show on the metrics; the gateway keeps serving uncached. Values that are not
JSON-able dicts are a caller bug and raise TypeError.

- ``SQLiteStore``: in-process, persisted to one SQLite file (or ``:memory:``), survives a restart.
- ``RedisStore``: shared by several gateway replicas (redis-py); LRU order kept in a sorted set per namespace,
  updated atomically with each read and write by a Lua script, so replicas evict in one common order.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Clock = Callable[[], float]

log = logging.getLogger("tokenomy.cache")


@runtime_checkable
class Store(Protocol):
    errors: int
    max_entries: int

    def get(self, key: str) -> dict[str, Any] | None: ...
    def set(self, key: str, value: dict[str, Any], ttl_s: float | None = None) -> None: ...
    def delete(self, key: str) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...
    def __len__(self) -> int: ...


def _encode(value: dict[str, Any]) -> str:
    if not isinstance(value, dict):
        raise TypeError(f"store values must be dicts, got {type(value).__name__}")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"store value is not JSON-able: {exc}") from exc


def _check(key: str, max_entries: int | None = None, ttl_s: float | None = None) -> None:
    if not isinstance(key, str) or not key:
        raise TypeError("store keys must be non-empty strings")
    if max_entries is not None and (not isinstance(max_entries, int) or max_entries < 1):
        raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")


class SQLiteStore:
    """LRU store in one SQLite table, namespaced so several caches can share a file.

    Recency is a per-namespace sequence number bumped on every get and set (not the wall clock, which can tie
    or step back); eviction deletes the lowest numbers once the namespace holds more than ``max_entries``.
    """

    def __init__(self, path: str | Path = ":memory:", namespace: str = "default", max_entries: int = 10_000,
                 clock: Clock = time.time) -> None:
        _check("x", max_entries)
        self.path, self.namespace, self.max_entries, self.clock = str(path), namespace, max_entries, clock
        self.errors = 0
        self._lock = threading.Lock()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cache_store (ns TEXT NOT NULL, key TEXT NOT NULL, "
                         "value TEXT NOT NULL, expires_at REAL, used INTEGER NOT NULL, PRIMARY KEY (ns, key))")
        self._db.execute("CREATE INDEX IF NOT EXISTS cache_store_lru ON cache_store (ns, used)")
        row = self._db.execute("SELECT COUNT(*), COALESCE(MAX(used), 0) FROM cache_store WHERE ns=?",
                               (namespace,)).fetchone()
        self._count, self._seq = int(row[0]), int(row[1])

    def _failed(self) -> None:
        self.errors += 1

    def get(self, key: str) -> dict[str, Any] | None:
        _check(key)
        with self._lock:
            try:
                row = self._db.execute("SELECT value, expires_at FROM cache_store WHERE ns=? AND key=?",
                                       (self.namespace, key)).fetchone()
                if row is None:
                    return None
                if row[1] is not None and row[1] <= self.clock():
                    self._delete(key)
                    return None
                self._seq += 1
                self._db.execute("UPDATE cache_store SET used=? WHERE ns=? AND key=?",
                                 (self._seq, self.namespace, key))
            except sqlite3.Error:
                self._failed()
                return None
        try:
            value = json.loads(row[0])
            if isinstance(value, dict):
                return value
        except ValueError:
            pass
        self._failed()  # a corrupt row is dropped, not served
        self.delete(key)
        return None

    def set(self, key: str, value: dict[str, Any], ttl_s: float | None = None) -> None:
        _check(key, ttl_s=ttl_s)
        text = _encode(value)
        with self._lock:
            try:
                expires = self.clock() + ttl_s if ttl_s is not None else None
                exists = self._db.execute("SELECT 1 FROM cache_store WHERE ns=? AND key=?",
                                          (self.namespace, key)).fetchone()
                self._seq += 1
                self._db.execute("INSERT OR REPLACE INTO cache_store VALUES (?, ?, ?, ?, ?)",
                                 (self.namespace, key, text, expires, self._seq))
                self._count += 0 if exists else 1
                if self._count > self.max_entries:
                    self._evict()
            except sqlite3.Error:
                self._failed()

    def _evict(self) -> None:
        # Expired rows go first, then the least recently used ones until the bound holds.
        self._db.execute("DELETE FROM cache_store WHERE ns=? AND expires_at IS NOT NULL AND expires_at<=?",
                         (self.namespace, self.clock()))
        self._count = self._db.execute("SELECT COUNT(*) FROM cache_store WHERE ns=?",
                                       (self.namespace,)).fetchone()[0]
        excess = self._count - self.max_entries
        if excess > 0:
            self._db.execute("DELETE FROM cache_store WHERE ns=? AND key IN (SELECT key FROM cache_store "
                             "WHERE ns=? ORDER BY used LIMIT ?)", (self.namespace, self.namespace, excess))
            self._count -= excess

    def _delete(self, key: str) -> None:
        if self._db.execute("DELETE FROM cache_store WHERE ns=? AND key=?", (self.namespace, key)).rowcount:
            self._count -= 1

    def delete(self, key: str) -> None:
        _check(key)
        with self._lock:
            try:
                self._delete(key)
            except sqlite3.Error:
                self._failed()

    def clear(self) -> None:
        with self._lock:
            try:
                self._db.execute("DELETE FROM cache_store WHERE ns=?", (self.namespace,))
                self._count = 0
            except sqlite3.Error:
                self._failed()

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        with self._lock:
            self._db.close()


# KEYS: entry, lru zset, sequence counter. ARGV: value, ttl in ms (0 = none), max entries.
_SET_LUA = """
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, excess - 1)
  redis.call('ZREM', KEYS[2], unpack(old))
  redis.call('DEL', unpack(old))
end
return excess
"""

# KEYS: entry, lru zset, sequence counter. A read refreshes recency only when the entry still exists.
_GET_LUA = """
local v = redis.call('GET', KEYS[1])
if v then redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
else redis.call('ZREM', KEYS[2], KEYS[1]) end
return v
"""


class RedisStore:
    """LRU store in Redis, shared by gateway replicas. TTL is Redis's own (PX), so it holds across replicas.

    An unreachable or failing Redis never raises to the caller: the call counts one error, returns a miss (or
    does nothing), and for ``retry_after_s`` later calls are not even tried (counted in ``skipped``), so a dead
    Redis costs one socket timeout per ``retry_after_s``, not one per request.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", namespace: str = "default",
                 max_entries: int = 10_000, timeout_s: float = 0.25, retry_after_s: float = 1.0,
                 clock: Clock = time.monotonic) -> None:
        import redis

        _check("x", max_entries)
        self.url, self.namespace, self.max_entries = url, namespace, max_entries
        self.retry_after_s, self.clock = retry_after_s, clock      # the breaker's pause, on `clock`
        self.errors = 0
        self.skipped = 0
        self._down_until = 0.0
        self._outage = False
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors_types: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        prefix = f"tokenomy:{namespace}:"
        self._entry_prefix, self._lru, self._seq = prefix + "e:", prefix + "lru", prefix + "seq"
        self._log = prefix + "log"
        self._set_script = self._redis.register_script(_SET_LUA)
        self._get_script = self._redis.register_script(_GET_LUA)

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self.clock() < self._down_until:
            self.skipped += 1
            return None
        try:
            result = fn()
        except self._errors_types as e:
            self.errors += 1
            self._down_until = self.clock() + self.retry_after_s
            if not self._outage:        # once per outage, not once per request
                self._outage = True
                log.warning("cache store %s (%s) failed: %s; serving uncached until it answers again",
                            self.namespace, self.url, e)
            return None
        if self._outage:
            self._outage = False
            log.warning("cache store %s (%s) answers again", self.namespace, self.url)
        return result

    @property
    def available(self) -> bool:
        """False while the breaker is open after a failure."""
        return self.clock() >= self._down_until

    @property
    def healthy(self) -> bool:
        """False from a failed call until a call succeeds again (what /health and /metrics show)."""
        return not self._outage

    def get(self, key: str) -> dict[str, Any] | None:
        _check(key)
        raw = self._call(lambda: self._get_script(keys=[self._entry_prefix + key, self._lru, self._seq]))
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            if isinstance(value, dict):
                return value
        except ValueError:
            pass
        self.errors += 1
        self.delete(key)
        return None

    def set(self, key: str, value: dict[str, Any], ttl_s: float | None = None) -> None:
        _check(key, ttl_s=ttl_s)
        text = _encode(value)
        ttl_ms = max(1, int(ttl_s * 1000)) if ttl_s is not None else 0
        self._call(lambda: self._set_script(keys=[self._entry_prefix + key, self._lru, self._seq],
                                            args=[text, ttl_ms, self.max_entries]))

    def delete(self, key: str) -> None:
        _check(key)
        full = self._entry_prefix + key
        self._call(lambda: self._redis.pipeline().delete(full).zrem(self._lru, full).execute())

    # ---- replication log: what one replica adds to its semantic index, the others replay ----------------

    def append_log(self, record: dict[str, Any]) -> None:
        """Append a record to this namespace's log, a Redis stream trimmed to about twice ``max_entries``."""
        fields = {"r": _encode(record)}
        self._call(lambda: self._redis.xadd(self._log, fields, maxlen=2 * self.max_entries, approximate=True))

    def read_log(self, after: str, count: int = 1000) -> list[tuple[str, dict[str, Any]]]:
        """Up to ``count`` (stream id, record) after stream id ``after`` ("0": from the start); [] on failure."""
        got = self._call(lambda: self._redis.xread({self._log: after}, count=count))
        out: list[tuple[str, dict[str, Any]]] = []
        for _stream, items in got or []:
            for sid, fields in items:
                try:
                    out.append((sid.decode() if isinstance(sid, bytes) else str(sid), json.loads(fields[b"r"])))
                except (KeyError, ValueError):
                    self.errors += 1
        return out

    def clear(self) -> None:
        def wipe() -> None:
            keys = list(self._redis.scan_iter(match=f"tokenomy:{self.namespace}:*", count=1000))
            for i in range(0, len(keys), 1000):
                self._redis.delete(*keys[i:i + 1000])
        self._call(wipe)

    def __len__(self) -> int:
        """Entries in the LRU set (may include entries whose TTL just lapsed until the next read or eviction)."""
        n = self._call(lambda: self._redis.zcard(self._lru))
        return int(n or 0)

    def close(self) -> None:
        self._redis.close()


def open_store(url: str, namespace: str = "default", max_entries: int = 10_000) -> Store:
    """A store from a URL: ``memory`` (in-process only), ``sqlite:///path/to.db`` or a plain file path,
    ``redis://host:port/db`` (or ``rediss://``)."""
    if not isinstance(url, str) or not url:
        raise ValueError("cache store URL must be a non-empty string")
    if url in ("memory", ":memory:", "local:memory"):
        return SQLiteStore(":memory:", namespace, max_entries)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url, namespace, max_entries)
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):], namespace, max_entries)
    if "://" in url:
        raise ValueError(f"unsupported cache store URL {url!r}: use memory, sqlite:///PATH or redis://HOST:PORT/DB")
    return SQLiteStore(url, namespace, max_entries)
