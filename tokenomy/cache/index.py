"""The semantic cache's ANN index: one usearch HNSW partition of entry vectors per context key.

Keys are entry ids (uint64), vectors are DIM-dimensional and compared by cosine distance. A search looks in one
context's partition only, so an entry of another context is never even a candidate. With a ``directory``, each
partition is one file, ``<directory>/<sha256(ctx)[:32]>.usearch``, written by ``flush`` for the partitions
changed since the last one; ``restore`` reopens a partition and reconciles it with the ids that should be in it.
Not thread-safe: the owner serialises calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DIM = 384
RESTORE_CHUNK = 5_000  # missing vectors fetched and inserted per call while restoring a partition


class PartitionedIndex:
    """Per-context ANN partitions, in memory or backed by one file each under ``directory``."""

    def __init__(self, directory: Path | None, *, dtype: str = "f16", expansion_search: int = 64) -> None:
        self.directory = directory
        self.dtype, self.expansion_search = dtype, expansion_search
        self._parts: dict[str, Any] = {}
        self._dirty: set[str] = set()

    def _file(self, ctx: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / (hashlib.sha256(ctx.encode()).hexdigest()[:32] + ".usearch")

    def _new(self) -> Any:
        from tokenomy.embedding.embedder import load_onnxruntime

        load_onnxruntime()  # before usearch: see there
        from usearch.index import Index

        return Index(ndim=DIM, metric="cos", dtype=self.dtype, connectivity=16, expansion_add=64,
                     expansion_search=self.expansion_search)

    def size(self, ctx: str) -> int:
        """Vectors in ``ctx``'s partition (0 when it has none)."""
        part = self._parts.get(ctx)
        return 0 if part is None else len(part)

    def add(self, ctx: str, ids: Sequence[int], vectors: np.ndarray) -> None:
        """Insert one vector per id into ``ctx``'s partition (created on first use)."""
        part = self._parts.get(ctx)
        if part is None:
            part = self._parts[ctx] = self._new()
        part.add(np.array(ids, dtype=np.uint64), vectors)
        self._dirty.add(ctx)

    def remove(self, ctx: str, id_: int) -> None:
        """Drop ``id_`` from ``ctx``'s partition, if that partition exists."""
        part = self._parts.get(ctx)
        if part is not None:
            part.remove(id_)
            self._dirty.add(ctx)

    def search(self, ctx: str, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` nearest ids of each query row in ``ctx``'s partition, which must not be empty: (keys,
        cosine distances, counts), the first two of shape (queries, k); row i's first counts[i] are valid."""
        found = self._parts[ctx].search(vectors, k)
        keys = np.atleast_2d(found.keys)
        dists = np.atleast_2d(found.distances)
        counts = np.atleast_1d(getattr(found, "counts", np.full(len(vectors), k)))
        return keys, dists, counts

    def restore(self, ctx: str, ids: set[int],
                vectors: Callable[[list[int]], Iterable[tuple[int, np.ndarray]]]) -> None:
        """Open ``ctx``'s partition from its file (an unreadable or absent file: a new one) and make it hold
        exactly ``ids``: stale ids leave it, missing ones are inserted with ``vectors(ids)`` -> (id, vector)."""
        part = self._new()
        file = self._file(ctx)
        if file is not None and file.exists():
            try:
                part.load(str(file))
            except (RuntimeError, ValueError, OSError):
                part = self._new()  # unreadable file: rebuilt from the vectors below
        # One bulk copy of the keys: iterating index.keys fetches each by offset, O(n) apiece (400 s at 100k).
        indexed = set(np.asarray(part.keys).tolist()) if len(part) else set()
        stale = indexed - ids
        if stale:
            part.remove(np.fromiter(stale, dtype=np.uint64))
        missing = sorted(ids - indexed)
        for i in range(0, len(missing), RESTORE_CHUNK):
            pairs = list(vectors(missing[i:i + RESTORE_CHUNK]))
            part.add(np.array([p[0] for p in pairs], dtype=np.uint64), np.stack([p[1] for p in pairs]))
        if stale or missing:
            self._dirty.add(ctx)
        self._parts[ctx] = part

    def flush(self) -> None:
        """Write the files of partitions changed since the last flush (atomically: a temporary, then a rename)."""
        for ctx in list(self._dirty):
            file = self._file(ctx)
            part = self._parts.get(ctx)
            if file is not None and part is not None:
                tmp = file.with_suffix(".tmp")
                part.save(str(tmp))
                tmp.replace(file)
            elif file is not None and file.exists():
                file.unlink()
        self._dirty.clear()
