"""A bounded mapping that forgets its least recently used entries first.

``get`` and ``get_or_compute`` count as a use; ``peek``, ``items``, ``in`` and ``len`` do not. ``put`` stores (or
replaces) a value as the most recent and then drops the oldest entries beyond ``max_size``. ``None`` is a value like
any other: a miss is told apart from a stored ``None`` by ``in``, or by ``get_or_compute``.

With ``thread_safe=True`` every operation holds an internal lock; ``get_or_compute`` does not hold it while
``compute`` runs, so two threads missing the same key at once may both compute it (the later ``put`` wins).
Without it, the caller serialises access (its own lock, or a single thread).

Bounded by entry count only. Two caches are bounded by weight instead and keep their own order: the vocabulary's
piece cache (engine/vocab.py, by characters) and the KV tiers (engine/kv/tier.py, by bytes, with a save on
eviction).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class LRU(Generic[K, V]):
    """At most ``max_size`` entries, least recently used out first."""

    def __init__(self, max_size: int, *, thread_safe: bool = False) -> None:
        if not isinstance(max_size, int) or max_size < 0:
            raise ValueError(f"max_size must be a non-negative integer, got {max_size!r}")
        self.max_size = max_size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock: AbstractContextManager[object] = threading.Lock() if thread_safe else nullcontext()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value stored for ``key`` (now the most recent), or ``default``."""
        with self._lock:
            value = self._data.get(key, _MISSING)  # type: ignore[arg-type]
            if value is _MISSING:
                return default
            self._data.move_to_end(key)
            return value  # type: ignore[return-value]

    def peek(self, key: K, default: V | None = None) -> V | None:
        """The value stored for ``key``, or ``default``, leaving the order as it is."""
        with self._lock:
            return self._data.get(key, default)

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._data.items())

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key``; its value, or ``default``."""
        with self._lock:
            return self._data.pop(key, default)

    def put(self, key: K, value: V) -> None:
        """Store ``value`` as the most recent entry, then evict beyond ``max_size``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_size:
                self._data.popitem(last=False)

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The value stored for ``key``; on a miss, ``compute()`` stored and returned."""
        with self._lock:
            value = self._data.get(key, _MISSING)  # type: ignore[arg-type]
            if value is not _MISSING:
                self._data.move_to_end(key)
                return value  # type: ignore[return-value]
        value = compute()
        self.put(key, value)
        return value  # type: ignore[return-value]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
