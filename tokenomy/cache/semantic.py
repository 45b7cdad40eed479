"""Semantic response cache: serve a stored answer to a differently worded question, within an error budget.

Only the last user turn is embedded (MiniLM, ``tokenomy.embedding.embedder``). Everything else in the request is reduced
to ``context_key`` and must match exactly: each context has its own ANN partition (a usearch HNSW index), so an
entry of another tenant or another conversation is never even a candidate; every candidate's context is checked
again before it is served. A lookup serves the nearest entry only when

    cos(query, entry) >= threshold                     (the route's similarity gate)
    cos(query, entry) - cos(query, next entry) >= min_margin   (not ambiguous between two stored questions)
    p(right) >= verifier.operating_point(budget, gate)  (calibrated verifier, see verify.py)
    p(right) >= entry.bar                               (per-entry bar raised by wrong-hit feedback)

With ``explore`` > 0 online error control (error_control.py) decides instead of the operating point, which
becomes its prior: a candidate is served only when the live stream's checked outcomes allow it at its score;
otherwise ``Lookup.explore`` holds it, for the caller to ask the model, answer with the fresh answer, and report
the comparison through ``observe``. The reason is ``explore`` for a would-be hit held back (what the guarantee
costs) and ``rejected`` for a candidate under the operating point (a miss anyway, checked at no extra cost).

Replicas sharing a Redis store find each other's entries and deletions through its log (replication.py).

Persistence: entry metadata and vectors in ``<path>/semantic.sqlite`` (the source of truth), the ANN partitions
under ``<path>/index/`` (index.py; saved on ``flush``/``close`` and every ``flush_every`` writes); on open,
index files are reconciled with the metadata, so a crash loses no entry. Payloads live in a ``Store``
(SQLite by default, Redis to share them), with the same TTL. The entry count is bounded with LRU eviction.
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tokenomy.cache.entry import CacheEntry, CacheHit, read_entry
from tokenomy.cache.error_control import ErrorControl
from tokenomy.cache.hit_verifier import Verifier, load_default, pair_features
from tokenomy.cache.index import DIM, PartitionedIndex
from tokenomy.cache.key import context_key, question_key
from tokenomy.cache.replication import Added, Deleted, Replication
from tokenomy.cache.store import SQLiteStore, Store
from tokenomy.generation import last_user_text

Reason = Literal["hit", "exact-text", "empty", "below-threshold", "ambiguous", "rejected", "entry-bar",
                 "payload-missing", "explore"]


@dataclass
class _Meta:
    ctx: str
    text: str
    expires_at: float | None
    used: int
    bar: float = 0.0
    right: int = 0
    wrong: int = 0


@dataclass
class Lookup:
    """One lookup's outcome and why: ``hit`` is set only when an answer is served; ``explore`` only when a
    would-be hit is to be checked against the model instead (reason ``explore``)."""

    reason: Reason
    hit: CacheHit | None = None
    candidate_id: int | None = None
    candidate_text: str | None = None
    similarity: float = 0.0
    second_similarity: float | None = None
    score: float | None = None
    explore: CacheHit | None = None


class SemanticCache:
    """The semantic response cache (see the module docstring); thread-safe."""

    def __init__(self, path: str | Path | None = None, *, store: Store | None = None,
                 embedder: Any | None = None, threshold: float = 0.9, error_budget: float | None = 0.02,
                 verifier: Verifier | None | Literal["default"] = "default", ttl_s: float | None = 86_400.0,
                 max_entries: int = 100_000, candidates: int = 8, dtype: str = "f16",
                 expansion_search: int = 64, flush_every: int = 1_000, clock: Callable[[], float] = time.time,
                 embed_threads: int = 1, min_margin: float = 0.0, explore: float = 0.0,
                 explore_window: int = 100, rng: random.Random | None = None) -> None:
        """``path`` None keeps everything in memory. ``error_budget`` None serves on the threshold alone (a
        baseline, not for production); otherwise a verifier is required. ``explore`` > 0 (it needs an error
        budget) turns on online error control with that explore floor and ``explore_window`` as its memory
        (error_control.py); 0 serves on the calibration alone. ``rng`` draws the explore decisions (seed it in
        tests)."""
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        if error_budget is not None and not 0 < error_budget < 1:
            raise ValueError(f"error_budget must be in (0, 1) or None, got {error_budget!r}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive or None, got {ttl_s!r}")
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.threshold, self.error_budget, self.ttl_s = threshold, error_budget, ttl_s
        self.max_entries, self.candidates, self.clock = max_entries, max(2, candidates), clock
        self.flush_every = flush_every
        self.verifier = load_default() if verifier == "default" else verifier
        if error_budget is not None and self.verifier is None:
            raise ValueError("an error budget needs a verifier; build tokenomy/cache/verifier.json with "
                             "`python -m tokenomy.tools.cache_calibration.calibrate` or pass error_budget=None")
        self._embedder = embedder
        self._default_embedder = embedder is None
        self.embed_threads = embed_threads
        if not 0 <= min_margin < 1:
            raise ValueError(f"min_margin must be in [0, 1), got {min_margin!r}")
        self.min_margin = min_margin
        if not 0 <= explore <= 1:
            raise ValueError(f"explore must be in [0, 1], got {explore!r}")
        if explore > 0 and (error_budget is None or self.verifier is None):
            raise ValueError("explore needs an error budget (and its verifier): it keeps that budget online")
        self.control: ErrorControl | None = None
        if explore > 0:
            assert error_budget is not None and self.verifier is not None
            self.control = ErrorControl(error_budget, explore, window=explore_window, rng=rng,
                                        prior=self.verifier.served_points(error_budget, threshold))
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "index").mkdir(exist_ok=True)
        db_path = str(self.path / "semantic.sqlite") if self.path is not None else ":memory:"
        self.store: Store = store if store is not None else SQLiteStore(db_path, "semantic", max_entries)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS semantic_entries (id INTEGER PRIMARY KEY, ctx TEXT NOT NULL, "
                         "text TEXT NOT NULL, vector BLOB NOT NULL, expires_at REAL, used INTEGER NOT NULL, "
                         "bar REAL NOT NULL DEFAULT 0, n_right INTEGER NOT NULL DEFAULT 0, "
                         "n_wrong INTEGER NOT NULL DEFAULT 0)")
        self._migrate()
        self._db.execute("CREATE INDEX IF NOT EXISTS semantic_entries_used ON semantic_entries (used)")
        self._meta: dict[int, _Meta] = {}
        self._by_text: dict[tuple[str, str], int] = {}
        self._index = PartitionedIndex(self.path / "index" if self.path is not None else None, dtype=dtype,
                                       expansion_search=expansion_search)
        self._writes = 0
        self._seq = 0
        self.hits = self.misses = 0
        self._replication = Replication(self.store, self._lock)
        self._load()
        self._sync()

    def _migrate(self) -> None:
        """Files written by an earlier version: bring their columns to the current names, never drop data."""
        cols = {row[1] for row in self._db.execute("PRAGMA table_info(semantic_entries)")}
        for old, new in (("right", "n_right"), ("wrong", "n_wrong")):
            if old in cols and new not in cols:
                self._db.execute(f'ALTER TABLE semantic_entries RENAME COLUMN "{old}" TO {new}')
            elif new not in cols:
                self._db.execute(f"ALTER TABLE semantic_entries ADD COLUMN {new} INTEGER NOT NULL DEFAULT 0")

    # ---- persistence -------------------------------------------------------------------------------------

    def _load(self) -> None:
        rows = self._db.execute("SELECT id, ctx, text, expires_at, used, bar, n_right, n_wrong FROM semantic_entries")
        by_ctx: dict[str, set[int]] = {}
        for id_, ctx, text, expires_at, used, bar, right, wrong in rows:
            self._meta[id_] = _Meta(ctx, text, expires_at, used, bar, right, wrong)
            self._by_text[(ctx, question_key(text))] = id_
            by_ctx.setdefault(ctx, set()).add(id_)
            self._seq = max(self._seq, used)
        for ctx, ids in by_ctx.items():
            self._index.restore(ctx, ids, self._vectors)

    def _vectors(self, ids: list[int]) -> list[tuple[int, np.ndarray]]:
        marks = ",".join("?" * len(ids))
        got = self._db.execute(f"SELECT id, vector FROM semantic_entries WHERE id IN ({marks})", ids)
        return [(id_, np.frombuffer(blob, dtype=np.float32)) for id_, blob in got]

    def flush(self) -> None:
        """Write changed partitions' index files (metadata is already durable)."""
        with self._lock:
            self._index.flush()
            self._writes = 0

    def close(self) -> None:
        with self._lock:
            self.flush()
            self._db.close()
            self.store.close()

    def __len__(self) -> int:
        return len(self._meta)

    @property
    def errors(self) -> int:
        return self.store.errors

    # ---- embedding ---------------------------------------------------------------------------------------

    def warm(self) -> None:
        """Load the embedder now (the first start also exports MiniLM to ONNX, ~10 s), not on the first lookup."""
        self._embed(["warm up"])

    @property
    def default_embedding(self) -> bool:
        """True when this cache embeds with the shared default MiniLM (tokenomy.embedding.embedder), whose vectors other
        stages (the router's "minilm" embedding) may share through a request's memo."""
        return self._default_embedder

    def vector(self, text: str, memo: dict[str, Any] | None = None) -> np.ndarray:
        """(1, dim) embedding of ``text``. ``memo`` is one request's {text: vector} of default-MiniLM vectors:
        read from it and fill it, so the lookup, the router and the add after generation embed a text once.
        A cache with its own embedder neither reads nor fills it."""
        shared = memo if memo is not None and self.default_embedding else None
        if shared is not None and text in shared:
            return self._check_vectors(np.asarray(shared[text]).reshape(1, -1), 1)
        vec = self._embed([text])
        if shared is not None:
            shared[text] = vec[0]
        return vec

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self._embedder is None:
            from tokenomy.embedding.embedder import default_embedder

            self._embedder = default_embedder(self.embed_threads)
        return self._embedder.embed(texts)

    @staticmethod
    def _check_vectors(vectors: np.ndarray, n: int) -> np.ndarray:
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim == 1:
            v = v[None, :]
        if v.shape != (n, DIM) or not np.isfinite(v).all():
            raise ValueError(f"expected {n} finite vectors of dimension {DIM}, got shape {v.shape}")
        return v

    # ---- writes ------------------------------------------------------------------------------------------

    def add(self, tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
            params: Mapping[str, Any] | None, entry: CacheEntry, memo: dict[str, Any] | None = None) -> int | None:
        """Store ``entry`` as the answer to this request's last user turn; None if it has none. ``memo``: see
        ``vector``."""
        text = last_user_text(messages)
        if text is None:
            return None
        return self.add_text(context_key(tenant, model, messages, params), text, entry, self.vector(text, memo)[0])

    def add_text(self, ctx: str, text: str, entry: CacheEntry, vector: np.ndarray | None = None) -> int:
        return self.add_many(ctx, [text], [entry], None if vector is None else np.asarray(vector)[None, :])[0]

    def add_many(self, ctx: str, texts: Sequence[str], entries: Sequence[CacheEntry],
                 vectors: np.ndarray | None = None) -> list[int]:
        """Store many entries in one context (one transaction, one batched index insert). A text already
        stored in this context (same words, case and spacing aside) is replaced, as a re-generation would."""
        if not isinstance(ctx, str) or not ctx:
            raise ValueError("context key must be a non-empty string")
        if len(texts) != len(entries) or any(not isinstance(t, str) or not t.strip() for t in texts):
            raise ValueError("add_many needs one non-empty text per entry")
        for e in entries:
            if not isinstance(e, CacheEntry):
                raise TypeError("SemanticCache entries must be CacheEntry objects")
        if not texts:
            return []
        vecs = self._check_vectors(self._embed(list(texts)) if vectors is None else vectors, len(texts))
        now = self.clock()
        expires = now + self.ttl_s if self.ttl_s is not None else None
        with self._lock:
            last = {question_key(t): i for i, t in enumerate(texts)}  # a duplicate within the batch: last wins
            keep = sorted(last.values())
            ids: list[int] = []
            taken: set[int] = set()
            for _ in texts:
                id_ = secrets.randbits(63)
                while id_ in self._meta or id_ in taken:
                    id_ = secrets.randbits(63)
                taken.add(id_)
                ids.append(id_)
            for i in keep:
                old = self._by_text.get((ctx, question_key(texts[i])))
                if old is not None:
                    self._remove(old)
            self._insert(ctx, [ids[i] for i in keep], [texts[i] for i in keep], vecs[keep], expires)
            for i in keep:
                if ids[i] not in self._meta:
                    continue  # evicted at once (a batch larger than max_entries)
                self.store.set(str(ids[i]), entries[i].to_dict(), self.ttl_s)
                self._replication.publish_add(ids[i], ctx, texts[i], vecs[i], expires)
            self._writes += len(keep)
            if self._writes >= self.flush_every:
                self.flush()
            return ids

    def _insert(self, ctx: str, ids: list[int], texts: list[str], vecs: np.ndarray, expires: float | None) -> None:
        """Index new entries of one context: metadata in memory and in SQLite (one transaction), vectors in the
        context's ANN partition; then the LRU bound. Callers have removed older entries of the same questions."""
        rows = []
        for id_, text, vec in zip(ids, texts, vecs, strict=True):
            self._seq += 1
            self._meta[id_] = _Meta(ctx, text, expires, self._seq)
            self._by_text[(ctx, question_key(text))] = id_
            rows.append((id_, ctx, text, vec.tobytes(), expires, self._seq))
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR REPLACE INTO semantic_entries (id, ctx, text, vector, expires_at, used) "
                             "VALUES (?, ?, ?, ?, ?, ?)", rows)
        self._db.execute("COMMIT")
        self._index.add(ctx, ids, vecs)
        if len(self._meta) > self.max_entries:
            self._evict(len(self._meta) - self.max_entries)

    def _remove(self, id_: int) -> None:
        meta = self._meta.pop(id_, None)
        if meta is None:
            return
        self._by_text.pop((meta.ctx, question_key(meta.text)), None)
        self._index.remove(meta.ctx, id_)
        self._db.execute("DELETE FROM semantic_entries WHERE id=?", (id_,))
        self.store.delete(str(id_))

    def _evict(self, n: int) -> None:
        # Least recently used first; `used` is written through to SQLite on every hit, so its index orders them.
        for (id_,) in self._db.execute("SELECT id FROM semantic_entries ORDER BY used LIMIT ?", (n,)).fetchall():
            self._remove(id_)

    def delete(self, entry_id: int) -> None:
        with self._lock:
            self._remove(entry_id)
            self._replication.publish_delete(entry_id)

    def _sync(self) -> None:
        """Apply what other replicas logged since the last call (replication.py)."""
        self._replication.pull(self._meta.__contains__, self.clock, self._apply)

    def _apply(self, change: Added | Deleted) -> None:
        if isinstance(change, Deleted):
            self._remove(change.id)
            return
        old = self._by_text.get((change.ctx, question_key(change.text)))
        if old is not None:
            self._remove(old)  # the same question re-stored elsewhere: the newer entry wins
        self._insert(change.ctx, [change.id], [change.text], change.vector[None, :], change.expires_at)

    def observe(self, entry_id: int, score: float, correct: bool) -> None:
        """An explore outcome: the entry's cached answer was (not) the model's fresh answer to a question it
        would have been served for at verifier score ``score``. Feeds online error control and the entry's
        own bar (``feedback``)."""
        if self.control is not None:
            self.control.observe(score, not correct)
        self.feedback(entry_id, score, correct)

    def feedback(self, entry_id: int, score: float, correct: bool) -> None:
        """Learn a per-entry bar from a served hit's outcome (vCache-style, conservative).

        A wrong hit at verifier score s raises the entry's bar to s (the entry is never again served at a score
        <= s); an entry whose wrong hits exceed the budget share of its judged hits, with at least 3 wrong, is
        retired from the semantic cache. Right hits are counted and never lower the bar.
        """
        with self._lock:
            meta = self._meta.get(entry_id)
            if meta is None:
                return
            if correct:
                meta.right += 1
            else:
                meta.wrong += 1
                meta.bar = max(meta.bar, float(np.nextafter(score, 2.0)))
                budget = self.error_budget if self.error_budget is not None else 0.02
                if meta.wrong >= 3 and meta.wrong > budget * (meta.right + meta.wrong):
                    self._remove(entry_id)
                    self._replication.publish_delete(entry_id)
                    return
            self._db.execute("UPDATE semantic_entries SET bar=?, n_right=?, n_wrong=? WHERE id=?",
                             (meta.bar, meta.right, meta.wrong, entry_id))

    # ---- reads -------------------------------------------------------------------------------------------

    def lookup(self, tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
               params: Mapping[str, Any] | None = None, memo: dict[str, Any] | None = None) -> CacheHit | None:
        """The answer stored for a question like this request's last user turn in the same context, or None.
        ``memo``: see ``vector``."""
        found = self.check(tenant, model, messages, params, memo)
        return None if found is None else found.hit

    def check(self, tenant: str, model: str, messages: Sequence[Mapping[str, Any]],
              params: Mapping[str, Any] | None = None, memo: dict[str, Any] | None = None) -> Lookup | None:
        """``lookup`` with its reasons (and a would-be hit to explore); None when there is no user turn."""
        text = last_user_text(messages)
        if text is None:
            return None
        return self.decide(context_key(tenant, model, messages, params), text, memo=memo)

    def decide(self, ctx: str, text: str, vector: np.ndarray | None = None,
               memo: dict[str, Any] | None = None) -> Lookup:
        """Full lookup with its reasons; embeds ``text`` (or takes it from ``memo``) unless ``vector`` is given."""
        self._sync()
        if self._index.size(ctx) == 0:  # no entry in this context: no embedding spent
            self.misses += 1
            return Lookup("empty")
        vec = self._check_vectors(self.vector(text, memo) if vector is None else vector, 1)
        return self.decide_many(ctx, [text], vec)[0]

    def decide_many(self, ctx: str, texts: Sequence[str], vectors: np.ndarray) -> list[Lookup]:
        """Batched ``decide`` (one ANN call for all queries); used by the benchmark and bulk replays."""
        vecs = self._check_vectors(vectors, len(texts))
        with self._lock:
            size = self._index.size(ctx)
            if size == 0:
                self.misses += len(texts)
                return [Lookup("empty") for _ in texts]
            keys, dists, counts = self._index.search(ctx, vecs, min(self.candidates, size))
            out = [self._decide_one(ctx, text, keys[i, :counts[i]], dists[i, :counts[i]])
                   for i, text in enumerate(texts)]
        return out

    def _decide_one(self, ctx: str, text: str, keys: np.ndarray, dists: np.ndarray) -> Lookup:
        now = self.clock()
        best: tuple[int, _Meta, float] | None = None
        second: float | None = None
        for key, dist in zip(keys.tolist(), dists.tolist(), strict=True):
            meta = self._meta.get(key)
            if meta is None:
                continue
            if meta.ctx != ctx:  # cannot happen with partitions; checked because serving it would be a leak
                raise AssertionError("semantic cache partition holds an entry of another context")
            if meta.expires_at is not None and meta.expires_at <= now:
                self._remove(key)
                continue
            if best is None:
                best = (key, meta, 1.0 - dist)
            else:
                second = 1.0 - dist
                break
        if best is None:
            self.misses += 1
            return Lookup("empty")
        id_, meta, cos = best
        decision = Lookup("below-threshold", candidate_id=id_, candidate_text=meta.text, similarity=cos,
                            second_similarity=second)
        same_text = question_key(text) == question_key(meta.text)
        if cos < self.threshold and not same_text:
            self.misses += 1
            return decision
        # Ambiguity gate: two different stored questions almost equally close to the query. Whichever one wins,
        # the answer is a coin toss between them; on GPTCache's paraphrase set most wrong hits are of this kind
        # (near-duplicate stored entries), and on QQP the gate also lowers the wrong share at every threshold.
        if not same_text and second is not None and cos - second < self.min_margin:
            decision.reason = "ambiguous"
            self.misses += 1
            return decision
        score, rejected = 1.0, False
        if not same_text and self.error_budget is not None:
            if self.verifier is None:  # a budget nobody can check is never met by guessing
                decision.reason = "rejected"
                self.misses += 1
                return decision
            score = float(self.verifier.probability(pair_features(text, meta.text, cos, second)))
            decision.score = score
            # Under online control the calibration's operating point is the prior, not a gate: a candidate
            # below it is a miss, and checking it against the model's answer costs nothing over that miss.
            rejected = score < self.verifier.operating_point(self.error_budget, self.threshold)
            if rejected and self.control is None:
                decision.reason = "rejected"
                self.misses += 1
                return decision
            if score < meta.bar:
                decision.reason = "entry-bar"
                self.misses += 1
                return decision
        decision.score = score
        entry = read_entry(self.store, str(id_))
        if entry is None:
            decision.reason = "payload-missing"
            self.misses += 1
            return decision
        if self.control is not None and not same_text and not self.control.serve(score):
            # A would-be hit (of the calibration or of online control) held back is an explore, the cost of the
            # guarantee; anything else stays the miss it is ("rejected"), checked at no extra cost.
            held_back = not rejected or self.control.allows(score)
            decision.reason = "explore" if held_back else "rejected"
            decision.explore = CacheHit(kind="semantic", entry=entry, key=ctx, similarity=cos, score=score,
                                        entry_id=id_, held_back=held_back)
            self.misses += 1
            return decision
        self._seq += 1
        meta.used = self._seq
        self._db.execute("UPDATE semantic_entries SET used=? WHERE id=?", (self._seq, id_))
        decision.reason = "exact-text" if same_text else "hit"
        decision.hit = CacheHit(kind="semantic", entry=entry, key=ctx, similarity=cos, score=score, entry_id=id_)
        self.hits += 1
        return decision
