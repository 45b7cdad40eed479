"""The ledger: one row per request in SQLite (WAL) or PostgreSQL, written off the request path.

Contract:
- `write(row)` never blocks: it puts the row on a bounded queue (default 10,000 rows) and returns. A full queue
  drops the row and counts it in `dropped` (exported as tokenomy_ledger_dropped_rows_total); blocking the
  request path to save a row would turn a slow database into a slow gateway.
- One background thread takes whatever is queued (up to `batch_size` rows) and commits it in one transaction,
  at most one commit every `commit_every_s` (default 50 ms) while rows keep coming: under load the rows of that
  interval share one transaction (a commit costs the gateway's interpreter far more than a row does), and a row
  written to an idle ledger is committed at once. A failed commit is retried with backoff; rows that still fail
  are counted in `failed` and logged.
- `flush()` returns once every row written before it is committed (without waiting out the interval); `close()`
  drains the queue and stops.
- Durability: a committed row survives `kill -9` (SQLite: WAL with synchronous=NORMAL is durable against a
  process crash, not against power loss; PostgreSQL: a committed transaction). Rows still queued are lost.
- The schema is migrated on open (see schema.py); migrations only add, never drop.
- Stored prompts (`write(row, prompt)`, ledger.store_prompts) go into `ledger_prompts` in the same transaction
  as their row. A prompt the database refuses never costs its row: the row is written alone and the prompt
  counted in `prompts_failed`. With `prompt_retention_s`, prompts older than that are deleted on open and then
  at most every `prune_every_s` by the writer; rows are never pruned.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as dt
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from tokenomy.config import home
from tokenomy.ledger.prompts import StoredPrompt
from tokenomy.ledger.row import LedgerRow
from tokenomy.ledger.tables import LedgerSchemaError, ledger, migrate, prompts

log = logging.getLogger("tokenomy.ledger")

FEEDBACK_RANGE = (-1.0, 1.0)
MAX_COMMENT = 4000
_STOP = object()
_HITS = ("exact", "semantic")


class LedgerError(RuntimeError):
    pass


def normalize_url(url: str | None) -> str:
    """None -> ledger.db in the data directory (tokenomy/config/home.py); postgres[ql]:// -> postgresql+psycopg://; a
    bare path -> a SQLite file."""
    if url is None or not str(url).strip():
        return home.ledger_url()
    url = str(url).strip()
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if "://" not in url:
        return "sqlite:///" + url
    if not (url.startswith("sqlite") or url.startswith("postgresql")):
        raise LedgerError(f"ledger URL {url!r}: use sqlite:///FILE or postgresql://USER@HOST/DB")
    return url


def safe_url(url: str) -> str:
    """A database URL fit for logs: its password masked."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)


def _timestamp(value: float | dt.datetime | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a datetime or UNIX seconds, got {value!r}")
    return float(value)


def _engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True)
    memory = url in ("sqlite://", "sqlite:///:memory:")
    if not memory:
        path = Path(sa.engine.make_url(url).database or "")
        if path.parent == home.data_dir():        # the default place is made on first use; any other must exist
            path.parent.mkdir(parents=True, exist_ok=True)
        if not path.parent.exists():
            raise LedgerError(f"ledger {url}: directory {path.parent} does not exist")
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                              poolclass=StaticPool if memory else None)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _: Any) -> None:
        # pysqlite's implicit transactions leave DDL outside them; we emit BEGIN ourselves (SQLAlchemy's recipe)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("immediate") else "BEGIN")

    return engine


def _compiled_insert(engine: Engine) -> tuple[str, list[str] | None, list[tuple[str, Callable[[Any], Any]]]]:
    """The ledger's INSERT of every LedgerRow field as this database's driver takes it: the SQL, the order of
    the values (None: the driver takes them by name) and the columns whose values SQLAlchemy processes first."""
    fields = {f.name for f in dataclasses.fields(LedgerRow)}
    columns = [c for c in ledger.columns if c.name in fields]
    dialect = engine.dialect
    compiled = ledger.insert().compile(dialect=dialect, column_keys=[c.name for c in columns])
    process = [(c.name, proc) for c in columns
               if (proc := c.type.dialect_impl(dialect).bind_processor(dialect)) is not None]
    return str(compiled), list(compiled.positiontup or ()) if compiled.positional else None, process


class Ledger:
    def __init__(self, url: str | None = None, max_queue: int = 10_000, batch_size: int = 500,
                 retries: int = 3, prompt_retention_s: float | None = None, prune_every_s: float = 600.0,
                 commit_every_s: float = 0.05) -> None:
        if max_queue < 1 or batch_size < 1:
            raise ValueError("max_queue and batch_size must be positive")
        if prompt_retention_s is not None and not prompt_retention_s > 0:
            raise ValueError("prompt_retention_s must be positive or None")
        self.url = normalize_url(url)
        self.batch_size, self.retries = batch_size, retries
        self.prompt_retention_s, self.prune_every_s = prompt_retention_s, prune_every_s
        try:
            self.engine = _engine(self.url)
            with self._begin(immediate=True) as conn:
                before, after = migrate(conn)
        except LedgerSchemaError as e:
            raise LedgerError(str(e)) from e
        except sa.exc.SQLAlchemyError as e:
            raise LedgerError(f"cannot open the ledger at {self.safe_url}: {e.__class__.__name__}: "
                              f"{getattr(e, 'orig', e)}") from e
        if after > before:
            log.info("ledger %s: schema migrated from version %d to %d", self.safe_url, before, after)
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.prompts_written = 0
        self.prompts_failed = 0
        self.prompts_pruned = 0
        self._last_prune = 0.0
        self._prune()
        # The queue: rows (or (row, prompt)), flush markers (Events) and _STOP, in order. A deque and two events
        # instead of queue.Queue: a write is an append, and wakes the writer only when it may be asleep.
        self.max_queue, self.commit_every_s = max_queue, commit_every_s
        self._queue: deque[Any] = deque()
        self._wake = threading.Event()       # something is queued while the writer sleeps for want of rows
        self._idle = False                   # ... which it does after an interval without one
        self._hurry = threading.Event()      # a flush or close waits: commit without waiting out the interval
        self._last_commit = 0.0
        self._insert = _compiled_insert(self.engine)
        self._explicit_begin = self.url.startswith("sqlite")
        dbapi = self.engine.dialect.loaded_dbapi
        self._retry_errors = (dbapi.OperationalError, dbapi.InterfaceError)
        self._raw: Any = None       # the writer thread's driver connection, opened at its first commit
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._last_drop_log = 0.0
        atexit.register(self.close)

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    @property
    def pending(self) -> int:
        return len(self._queue)

    @contextmanager
    def _begin(self, immediate: bool = False) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if immediate:
                conn = conn.execution_options(immediate=True)
            with conn.begin():
                yield conn

    # ---- writing -----------------------------------------------------------------------------------------
    def write(self, row: LedgerRow, prompt: StoredPrompt | None = None) -> None:
        """Queue a row (and its stored prompt, if any) for the writer thread; never blocks (a full queue drops
        and counts the row)."""
        if self._closed:
            self._drop("the ledger is closed")
            return
        if self._thread is None:
            self._start()
        if len(self._queue) >= self.max_queue:
            self._drop(f"the write queue is full ({self.max_queue} rows)")
            return
        self._queue.append(row if prompt is None else (row, prompt))
        if self._idle:          # else the writer looks at the queue when its interval ends: no signal to send
            self._idle = False
            self._wake.set()

    def _put(self, item: Any) -> None:
        """Queue a marker (a flush's Event, _STOP) whatever the queue holds, and wake the writer now."""
        self._queue.append(item)
        self._hurry.set()
        self._wake.set()        # an idle writer waits on this, one in its interval on _hurry

    def _drop(self, why: str) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_log > 10:      # one line per 10 s, not one per row
            self._last_drop_log = now
            log.warning("ledger row dropped: %s (%d dropped so far)", why, self.dropped)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
                self._thread.start()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every row written before this call is committed; False on timeout."""
        if self._thread is None or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Drain the queue, commit, stop the writer. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._put(_STOP)
            thread.join(timeout)
            if thread.is_alive():
                log.error("ledger close: the writer is stuck; %d rows not written", len(self._queue))
            else:
                self._close_writer_connection()
        self.engine.dispose()
        atexit.unregister(self.close)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _run(self) -> None:
        stop = False
        while not stop:
            # group commit: the rows of an interval wait for one transaction (a flush or close cuts it short)
            self._hurry.wait(self._last_commit + self.commit_every_s - time.monotonic())
            if not self._queue:              # an interval without a row: sleep until one comes, then commit at once
                self._idle = True
                if not self._queue:          # (a row queued before the flag was up is seen here)
                    self._wake.wait()
                self._idle = False
                self._wake.clear()
            self._hurry.clear()              # before the queue is read: a flush queued after it hurries the next
            rows: list[LedgerRow] = []
            stored: dict[str, StoredPrompt] = {}
            markers: list[threading.Event] = []
            while self._queue and len(rows) < self.batch_size:
                item = self._queue.popleft()
                if item is _STOP:
                    stop = True
                elif isinstance(item, threading.Event):
                    markers.append(item)
                else:
                    self._take(item, rows, stored)
            if stop:        # rows that raced close() in behind the stop marker still get written
                while self._queue:
                    item = self._queue.popleft()
                    if isinstance(item, LedgerRow | tuple):
                        self._take(item, rows, stored)
                    elif isinstance(item, threading.Event):
                        markers.append(item)
            elif self._queue:                # a backlog past batch_size: no reason to wait
                self._hurry.set()
            if rows:
                self._last_commit = time.monotonic()
                try:
                    self._commit(rows, stored)
                except Exception:       # a bug must not kill the writer: later rows still get written
                    self.failed += len(rows)
                    log.exception("ledger: %d rows not written", len(rows))
            if self.prompt_retention_s is not None and time.monotonic() - self._last_prune >= self.prune_every_s:
                try:
                    self._prune()
                except Exception:
                    log.exception("ledger: pruning stored prompts failed")
            for m in markers:
                m.set()

    @staticmethod
    def _take(item: Any, rows: list[LedgerRow], stored: dict[str, StoredPrompt]) -> None:
        if isinstance(item, tuple):
            row, prompt = item
            stored[row.request_id] = prompt
            rows.append(row)
        else:
            rows.append(item)

    def _commit(self, rows: list[LedgerRow], stored: dict[str, StoredPrompt] | None = None) -> None:
        stored = stored or {}
        for attempt in range(self.retries + 1):
            try:
                if stored:
                    with self._begin() as conn:
                        conn.execute(ledger.insert(), [r.to_db() for r in rows])
                        conn.execute(prompts.insert(), [p.to_db() for p in stored.values()])
                else:
                    self._insert_rows(rows)
                self.written += len(rows)
                self.prompts_written += len(stored)
                return
            except (sa.exc.OperationalError, sa.exc.InterfaceError, *self._retry_errors) as e:   # the database
                self._close_writer_connection(invalidate=True)
                if attempt == self.retries:
                    self.failed += len(rows)
                    log.error("ledger: %d rows not written after %d tries: %s", len(rows), attempt + 1, e)
                    return
                time.sleep(0.5 * 2 ** attempt)
            except Exception:   # a row the database refuses or cannot encode: write one by one, lose only it
                self._commit_one_by_one(rows, stored)
                return

    def _insert_rows(self, rows: list[LedgerRow]) -> None:
        """Insert `rows` in one transaction on the writer's own driver connection, by SQLAlchemy's statement for
        this database compiled once (with its bind processors): what Connection.execute does, without its cost
        a commit (a pool checkout, events, an execution context: 3-4x the driver's time for a few rows)."""
        raw = self._raw
        if raw is None:
            raw = self._raw = self.engine.raw_connection()
        sql, order, process = self._insert
        params: list[Any] = []
        for r in rows:
            d = r.to_db()
            for name, proc in process:
                d[name] = proc(d[name])
            params.append(tuple(d[k] for k in order) if order is not None else d)
        cur = raw.cursor()
        try:
            if self._explicit_begin:       # pysqlite left in autocommit (_engine): the transaction is ours
                cur.execute("BEGIN")
            cur.executemany(sql, params)
            raw.commit()
        except BaseException:
            try:
                raw.rollback()
            except Exception:
                self._close_writer_connection(invalidate=True)
            raise
        finally:
            cur.close()

    def _close_writer_connection(self, invalidate: bool = False) -> None:
        raw, self._raw = self._raw, None
        if raw is None:
            return
        try:
            raw.invalidate() if invalidate else raw.close()
        except Exception:
            pass

    def _commit_one_by_one(self, rows: list[LedgerRow], stored: dict[str, StoredPrompt]) -> None:
        for r in rows:
            prompt = stored.get(r.request_id)
            if prompt is not None:
                try:
                    with self._begin() as conn:
                        conn.execute(ledger.insert(), [r.to_db()])
                        conn.execute(prompts.insert(), [prompt.to_db()])
                    self.written += 1
                    self.prompts_written += 1
                    continue
                except Exception as e:      # perhaps the prompt: the row still goes in alone
                    self.prompts_failed += 1
                    log.error("ledger: prompt of %r not written: %s", r.request_id, getattr(e, "orig", e))
            try:
                with self._begin() as conn:
                    conn.execute(ledger.insert(), [r.to_db()])
                self.written += 1
            except Exception as e:
                self.failed += 1
                log.error("ledger: row %r not written: %s", r.request_id, getattr(e, "orig", e))

    def _prune(self, now: float | None = None) -> int:
        self._last_prune = time.monotonic()
        if self.prompt_retention_s is None:
            return 0
        return self.prune_prompts(now)

    def prune_prompts(self, now: float | None = None) -> int:
        """Delete stored prompts older than the retention; returns how many."""
        if self.prompt_retention_s is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.prompt_retention_s
        with self._begin() as conn:
            n = conn.execute(prompts.delete().where(prompts.c.ts < cutoff)).rowcount or 0
        self.prompts_pruned += n
        return n

    # ---- reading -----------------------------------------------------------------------------------------
    def query(self, since: float | dt.datetime | None = None, until: float | dt.datetime | None = None,
              tenant: str | None = None, key_id: str | None = None, model: str | None = None,
              route: str | None = None, limit: int | None = None) -> list[LedgerRow]:
        """Committed rows with since <= ts < until (UNIX seconds or datetimes; naive ones are UTC), oldest first."""
        lo, hi = _timestamp(since, "since"), _timestamp(until, "until")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"since ({since}) is after until ({until})")
        q = sa.select(ledger)
        for col, value in ((ledger.c.tenant, tenant), (ledger.c.key_id, key_id), (ledger.c.model, model),
                           (ledger.c.route, route)):
            if value is not None:
                q = q.where(col == value)
        if lo is not None:
            q = q.where(ledger.c.ts >= lo)
        if hi is not None:
            q = q.where(ledger.c.ts < hi)
        q = q.order_by(ledger.c.ts, ledger.c.request_id)
        if limit is not None:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [LedgerRow.from_db(r._mapping) for r in conn.execute(q)]

    def prompts(self, since: float | dt.datetime | None = None, until: float | dt.datetime | None = None
                ) -> dict[str, StoredPrompt]:
        """Stored prompts with since <= ts < until, by request id."""
        lo, hi = _timestamp(since, "since"), _timestamp(until, "until")
        q = sa.select(prompts)
        if lo is not None:
            q = q.where(prompts.c.ts >= lo)
        if hi is not None:
            q = q.where(prompts.c.ts < hi)
        with self.engine.connect() as conn:
            return {r.request_id: StoredPrompt.from_db(r._mapping) for r in conn.execute(q)}

    def get(self, request_id: str) -> LedgerRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(sa.select(ledger).where(ledger.c.request_id == request_id)).first()
        return LedgerRow.from_db(r._mapping) if r is not None else None

    def totals(self, since: float | dt.datetime, by: str, until: float | dt.datetime | None = None
               ) -> dict[str | None, tuple[float, int]]:
        """{key_id or tenant: (USD spent, billed tokens)} over since <= ts < until; what budgets are seeded from.
        Billed tokens: prompt + completion of rows that were not response-cache hits (see row.py)."""
        if by not in ("key_id", "tenant"):
            raise ValueError(f"by must be key_id or tenant, got {by!r}")
        col = ledger.c[by]
        billed = sa.case((ledger.c.cache.in_(_HITS), 0),
                         else_=ledger.c.prompt_tokens + ledger.c.completion_tokens)
        q = (sa.select(col, sa.func.coalesce(sa.func.sum(ledger.c.cost_usd), 0.0),
                       sa.func.coalesce(sa.func.sum(billed), 0))
             .where(ledger.c.ts >= _timestamp(since, "since")).group_by(col))
        hi = _timestamp(until, "until")
        if hi is not None:
            q = q.where(ledger.c.ts < hi)
        with self.engine.connect() as conn:
            return {k: (float(usd), int(tokens)) for k, usd, tokens in conn.execute(q)}

    # ---- the business layer ------------------------------------------------------------------------------
    def feedback(self, request_id: str, score: float, comment: str | None = None) -> bool:
        """Attach a score in [-1, 1] (and an optional comment) to a request's row; False if no such request.
        A second call replaces the first. Rows still queued are flushed first, so feedback can follow at once."""
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score) \
                or not FEEDBACK_RANGE[0] <= score <= FEEDBACK_RANGE[1]:
            raise ValueError(f"score must be a number from {FEEDBACK_RANGE[0]:g} to {FEEDBACK_RANGE[1]:g}, "
                             f"got {score!r}")
        if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
            raise ValueError(f"comment must be a string of at most {MAX_COMMENT} characters")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        stmt = (ledger.update().where(ledger.c.request_id == request_id)
                .values(feedback_score=float(score), feedback_comment=comment, feedback_ts=time.time()))
        for attempt in range(2):
            with self._begin() as conn:
                if conn.execute(stmt).rowcount:
                    return True
            if attempt == 0 and not self.flush():
                break
        return False
