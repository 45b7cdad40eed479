"""Replicas of one semantic cache that share a Redis store also share their index entries, through its log.

Every entry a replica adds is appended to the store's log (a Redis stream) as an ``add`` record carrying its
context, question text, vector and expiry; an explicit deletion as a ``del`` record. Before a lookup, each
replica pulls what was logged since its last pull and applies it to its own index, so one replica's entries are
found by all. A store without a log (SQLite) makes all of this a no-op; so does a dead Redis (the store's
breaker), never an error. A malformed record is counted in ``store.errors`` and skipped.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenomy.cache.index import DIM
from tokenomy.cache.store import Store

LOG_BATCH = 1000  # records read per call; a full batch means more may be waiting


@dataclass(frozen=True)
class Added:
    """Another replica stored this entry."""

    id: int
    ctx: str
    text: str
    vector: np.ndarray
    expires_at: float | None


@dataclass(frozen=True)
class Deleted:
    """Another replica deleted this entry."""

    id: int


def decode(record: Mapping[str, Any], known: Callable[[int], bool], clock: Callable[[], float]
           ) -> Added | Deleted | None:
    """What a log record asks of this replica; None when nothing: an unknown op, an entry ``known`` already (our
    own coming back, or one replayed before), or one expired by ``clock()``. Raises KeyError, TypeError or
    ValueError for a malformed record."""
    id_ = int(record["id"])
    if record["op"] == "del":
        return Deleted(id_)
    if record["op"] != "add" or known(id_):
        return None
    ctx, text, expires = str(record["ctx"]), str(record["text"]), record.get("exp")
    if expires is not None and float(expires) <= clock():
        return None
    vec = np.frombuffer(base64.b64decode(record["vec"]), dtype=np.float32)
    if vec.shape != (DIM,):
        raise ValueError("replicated vector has the wrong size")
    return Added(id_, ctx, text, vec, expires)


class Replication:
    """One replica's side of the log: publish its own changes, pull the others'.

    ``lock`` is the cache's lock, held while pulled records are applied.
    """

    def __init__(self, store: Store, lock: threading.RLock) -> None:
        self.store = store
        self.enabled = callable(getattr(store, "read_log", None))
        self.position = "0"  # stream id of the last record pulled ("0": none yet)
        self._lock = lock

    def publish_add(self, id_: int, ctx: str, text: str, vector: np.ndarray, expires_at: float | None) -> None:
        if self.enabled:
            self.store.append_log({"op": "add", "id": id_, "ctx": ctx, "text": text,  # type: ignore[attr-defined]
                                   "vec": base64.b64encode(vector.tobytes()).decode(), "exp": expires_at})

    def publish_delete(self, id_: int) -> None:
        if self.enabled:
            self.store.append_log({"op": "del", "id": id_})  # type: ignore[attr-defined]

    def pull(self, known: Callable[[int], bool], clock: Callable[[], float],
             apply: Callable[[Added | Deleted], None]) -> None:
        """Apply, in log order, every record logged since the last pull (see ``decode``); one non-blocking read
        per LOG_BATCH records."""
        if not self.enabled:
            return
        while True:
            records = self.store.read_log(self.position, count=LOG_BATCH)  # type: ignore[attr-defined]
            if not records:
                return
            with self._lock:
                for pos, record in records:
                    self.position = pos
                    try:
                        change = decode(record, known, clock)
                        if change is not None:
                            apply(change)
                    except (KeyError, TypeError, ValueError):
                        self.store.errors += 1  # a malformed record is skipped, never fatal
            if len(records) < LOG_BATCH:
                return
