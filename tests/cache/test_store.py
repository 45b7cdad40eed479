from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.cache.store import RedisStore, SQLiteStore, Store, open_store


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _payload(i: int) -> dict:
    return {"response": {"id": f"r{i}"}, "chunks": [{"delta": "x"}], "prompt_tokens": i, "cost_usd": 0.001 * i}


def test_sqlite_roundtrip_ttl_and_persistence(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "c.db"
    s = SQLiteStore(path, "exact", 10, clock=clock)
    s.set("k1", _payload(1), ttl_s=60)
    s.set("k2", _payload(2))
    assert s.get("k1") == _payload(1)
    s.close()
    s = SQLiteStore(path, "exact", 10, clock=clock)  # reopen: survives a restart
    assert s.get("k1") == _payload(1) and len(s) == 2
    clock.now += 61
    assert s.get("k1") is None and s.get("k2") == _payload(2)
    assert len(s) == 1
    assert SQLiteStore(path, "other", 10).get("k2") is None  # namespaces do not share keys


def test_sqlite_lru_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "c.db", "exact", max_entries=3)
    for i in range(3):
        s.set(f"k{i}", _payload(i))
    assert s.get("k0") is not None  # k0 becomes most recent, k1 is now the oldest
    s.set("k3", _payload(3))
    assert len(s) == 3
    assert s.get("k1") is None
    assert all(s.get(k) is not None for k in ("k0", "k2", "k3"))
    s.set("k3", _payload(33))  # overwrite does not count twice
    assert len(s) == 3 and s.get("k3") == _payload(33)


def test_sqlite_failure_is_a_counted_miss(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "c.db")
    s.set("k", _payload(1))
    s._db.execute("DROP TABLE cache_store")  # the backing store breaks under the cache
    assert s.get("k") is None
    s.set("k", _payload(1))
    s.delete("k")
    assert s.errors == 3


def test_bad_values_are_caller_errors() -> None:
    s = SQLiteStore()
    with pytest.raises(TypeError, match="dicts"):
        s.set("k", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JSON"):
        s.set("k", {"x": object()})
    with pytest.raises(ValueError, match="ttl_s"):
        s.set("k", {}, ttl_s=0)
    with pytest.raises(ValueError, match="max_entries"):
        SQLiteStore(max_entries=0)


def test_open_store_urls(tmp_path: Path, redis_url: str) -> None:
    assert isinstance(open_store("memory"), SQLiteStore)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/x.db"), SQLiteStore)
    assert isinstance(open_store(redis_url), RedisStore)
    assert isinstance(open_store("memory"), Store)
    with pytest.raises(ValueError, match="unsupported"):
        open_store("postgres://x")


def test_redis_roundtrip_ttl_and_lru(redis_url: str, namespace: str) -> None:
    s = RedisStore(redis_url, namespace, max_entries=3)
    try:
        s.set("ttl", _payload(0), ttl_s=60)
        for i in range(1, 3):
            s.set(f"k{i}", _payload(i))
        assert s.get("ttl") == _payload(0)
        # The TTL is Redis's own (its clock, not ours): it holds what was asked, and the other entries have none.
        entry = s._entry_prefix + "ttl"
        assert 0 < s._redis.pttl(entry) <= 60_000 and s._redis.pttl(s._entry_prefix + "k1") == -1
        s._redis.pexpireat(entry, 1)  # Redis expires it now: a deadline in the past
        assert s.get("ttl") is None  # the read also drops it from the LRU set
        assert len(s) == 2
        s.set("k3", _payload(3))
        assert s.get("k1") is not None  # k1 most recent, k2 oldest
        s.set("k4", _payload(4))
        assert len(s) == 3 and s.get("k2") is None
        assert RedisStore(redis_url, namespace).get("k4") == _payload(4)  # another replica sees it
        assert s.errors == 0
    finally:
        s.clear()
        assert len(s) == 0


def test_unreachable_redis_gives_misses_and_counted_errors() -> None:
    clock = FakeClock()
    s = RedisStore("redis://127.0.0.1:1/0", "dead", timeout_s=0.2, retry_after_s=60, clock=clock)
    assert s.get("k") is None
    s.set("k", _payload(1))
    s.delete("k")
    assert len(s) == 0
    assert s.errors == 1 and s.skipped == 3  # one real failure, then the breaker holds calls off
    assert not s.available
    clock.now += 61  # the breaker's pause is over: the next call tries Redis again
    assert s.available
    assert s.get("k") is None and s.errors == 2 and not s.available
