"""Exact response cache: a hit requires the same canonical request (see ``key.exact_key``).

By default only deterministic requests (temperature 0 or a seed given) are cached, since serving a stored
sample for a request that asked for randomness changes what the client gets; a route can turn that off with
``deterministic_only=False``. Entries live in a ``Store`` under the ``ttl_s`` given here and the store's LRU bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenomy.cache.entry import CacheEntry, CacheHit, read_entry
from tokenomy.cache.key import exact_key, is_deterministic
from tokenomy.cache.store import SQLiteStore, Store


class ExactCache:
    def __init__(self, store: Store | None = None, ttl_s: float | None = 86_400.0,
                 max_entries: int | None = None, deterministic_only: bool = True) -> None:
        """``store`` defaults to an in-process one; ``max_entries`` (if given) sets the store's LRU bound."""
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")
        if max_entries is not None and (not isinstance(max_entries, int) or max_entries < 1):
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.store: Store = store if store is not None else SQLiteStore(":memory:", "exact", max_entries or 10_000)
        if max_entries is not None:
            self.store.max_entries = max_entries
        self.ttl_s = ttl_s
        self.deterministic_only = deterministic_only
        self.hits = 0
        self.misses = 0

    @property
    def errors(self) -> int:
        return self.store.errors

    def cacheable(self, params: Mapping[str, Any] | None) -> bool:
        return not self.deterministic_only or is_deterministic(params)

    def lookup(self, tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
               params: Mapping[str, Any] | None = None) -> CacheHit | None:
        """The cached response for this exact request, or None (miss, not cacheable, or store failure)."""
        if not self.cacheable(params):
            return None
        return self.lookup_key(exact_key(tenant, model, messages, params))

    def lookup_key(self, key: str) -> CacheHit | None:
        entry = read_entry(self.store, key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return CacheHit(kind="exact", entry=entry, key=key)

    def put(self, tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
            params: Mapping[str, Any] | None, entry: CacheEntry) -> str | None:
        """Store ``entry`` for this request; returns its key, or None when the request is not cacheable."""
        if not self.cacheable(params):
            return None
        key = exact_key(tenant, model, messages, params)
        self.put_key(key, entry)
        return key

    def put_key(self, key: str, entry: CacheEntry) -> None:
        if not isinstance(entry, CacheEntry):
            raise TypeError("ExactCache.put needs a CacheEntry")
        self.store.set(key, entry.to_dict(), self.ttl_s)
