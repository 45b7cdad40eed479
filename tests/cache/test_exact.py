from __future__ import annotations

from pathlib import Path

from tokenomy.cache.entry import CacheEntry
from tokenomy.cache.exact import ExactCache
from tokenomy.cache.store import RedisStore, SQLiteStore

MSGS = [{"role": "user", "content": "Name a prime number."}]
DET = {"temperature": 0}


def _entry(text: str = "7") -> CacheEntry:
    return CacheEntry(response={"choices": [{"message": {"role": "assistant", "content": text}}]},
                      chunks=[{"choices": [{"delta": {"content": text}}]}], prompt_tokens=12,
                      completion_tokens=3, cost_usd=0.0042, model="small")


def test_hit_reports_savings_and_replays_chunks() -> None:
    cache = ExactCache(ttl_s=60)
    assert cache.lookup("t1", "small", MSGS, DET) is None
    assert cache.put("t1", "small", MSGS, DET, _entry()) is not None
    hit = cache.lookup("t1", "small", MSGS, {"temperature": 0.0, "stream": True})
    assert hit is not None and hit.kind == "exact"
    assert hit.saved_tokens == 15 and hit.saved_usd == 0.0042
    assert hit.entry.chunks == [{"choices": [{"delta": {"content": "7"}}]}]
    assert (cache.hits, cache.misses) == (1, 1)


def test_tenant_isolation() -> None:
    cache = ExactCache()
    cache.put("alice", "small", MSGS, DET, _entry("alice's answer"))
    assert cache.lookup("bob", "small", MSGS, DET) is None
    assert cache.lookup("alice", "small", MSGS, DET) is not None


def test_only_deterministic_requests_by_default() -> None:
    cache = ExactCache()
    assert cache.put("t", "small", MSGS, {"temperature": 0.8}, _entry()) is None
    assert cache.lookup("t", "small", MSGS, {"temperature": 0.8}) is None
    assert cache.put("t", "small", MSGS, {"temperature": 0.8, "seed": 1}, _entry()) is not None
    assert cache.lookup("t", "small", MSGS, {"temperature": 0.8, "seed": 1}) is not None
    anything = ExactCache(deterministic_only=False)
    anything.put("t", "small", MSGS, {"temperature": 0.8}, _entry())
    assert anything.lookup("t", "small", MSGS, {"temperature": 0.8}) is not None


def test_ttl_and_lru_bound(tmp_path: Path) -> None:
    now = [0.0]
    store = SQLiteStore(tmp_path / "x.db", "exact", clock=lambda: now[0])
    cache = ExactCache(store, ttl_s=10, max_entries=2)
    for i in range(3):
        cache.put("t", "small", [{"role": "user", "content": f"q{i}"}], DET, _entry(str(i)))
    assert len(store) == 2
    assert cache.lookup("t", "small", [{"role": "user", "content": "q0"}], DET) is None
    assert cache.lookup("t", "small", [{"role": "user", "content": "q2"}], DET) is not None
    now[0] = 11
    assert cache.lookup("t", "small", [{"role": "user", "content": "q2"}], DET) is None


def test_persists_across_reopen(tmp_path: Path) -> None:
    cache = ExactCache(SQLiteStore(tmp_path / "x.db", "exact"))
    cache.put("t", "small", MSGS, DET, _entry())
    cache.store.close()
    again = ExactCache(SQLiteStore(tmp_path / "x.db", "exact"))
    hit = again.lookup("t", "small", MSGS, DET)
    assert hit is not None and hit.entry == _entry().__class__.from_dict(hit.entry.to_dict())
    assert hit.entry.response["choices"][0]["message"]["content"] == "7"


def test_redis_backed_cache_is_shared_and_survives_redis_loss(redis_url: str, namespace: str) -> None:
    a = ExactCache(RedisStore(redis_url, namespace))
    b = ExactCache(RedisStore(redis_url, namespace))
    try:
        a.put("t", "small", MSGS, DET, _entry())
        hit = b.lookup("t", "small", MSGS, DET)
        assert hit is not None and hit.saved_usd == 0.0042
        assert b.lookup("other-tenant", "small", MSGS, DET) is None
    finally:
        a.store.clear()
    dead = ExactCache(RedisStore("redis://127.0.0.1:1/0", namespace, timeout_s=0.2))
    assert dead.put("t", "small", MSGS, DET, _entry()) is not None  # write attempted, silently dropped
    assert dead.lookup("t", "small", MSGS, DET) is None
    assert dead.errors >= 1
