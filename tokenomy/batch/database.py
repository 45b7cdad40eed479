"""Durable files, batches and batch items, in the ledger's database (SQLAlchemy Core; SQLite or PostgreSQL).

Three tables of their own, made by the ledger's migrations (ledger/tables.py; nothing else reads them):
- `batch_files`: uploaded input files (purpose batch) and the output and error files a batch writes;
- `batches`: one row per batch, in OpenAI's vocabulary (status, the *_at times, file ids, metadata);
- `batch_items`: one row per input line: its custom_id and body, its state (pending | done | failed), how many
  times it was started, and its result line (the output or error file's JSON line).

Every owner-facing read takes the owner (the key id, "" without keys): another key's file or batch is "not found".
Item results are committed one by one as they finish, so a restart runs only items still pending; the output and
error files are assembled from the items when the batch ends, in input order.

Several gateways on one database share the work through leases: a worker claims an item (atomically, with its
start count) before running it, and the batch before ending it, for `lease_s` seconds that it renews while it
works; another worker takes an item or a batch only once its lease has run out (its worker died or hung).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tokenomy.batch.input_lines import error_line, parse_input
from tokenomy.dialect.json_input import readable
from tokenomy.ledger.tables import BATCH_TABLES_VERSION, batches, current_version
from tokenomy.ledger.tables import BATCH_TIMES as TIMES
from tokenomy.ledger.tables import batch_files as files
from tokenomy.ledger.tables import batch_items as items

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
CHUNK = 500             # items inserted at once: what a batch's creation holds beside its file's bytes
WINDOW_S = {"24h": 86400}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


@dataclass
class Item:
    batch_id: str
    line: int
    custom_id: str | None
    body: dict[str, Any]
    attempts: int


class BatchStore:
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        """`clock` is the wall clock every stamp, window and lease is read from (a test hands in its own)."""
        self.engine = engine
        self.clock = clock
        with engine.connect() as conn:
            if current_version(conn) < BATCH_TABLES_VERSION:
                raise RuntimeError(f"{engine.url!r} has no batch tables yet: open it as a Ledger first, whose "
                                   "migrations make them")

    def _dicts(self, q: sa.Select) -> list[dict[str, Any]]:
        """A query's rows as plain dicts, what file_object, batch_object and the runner read."""
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    # ---- files -------------------------------------------------------------------------------------------
    def create_file(self, owner: str, purpose: str, filename: str, content: bytes) -> dict[str, Any]:
        row = {"id": new_id("file-"), "owner": owner, "purpose": purpose, "filename": filename[:256],
               "bytes": len(content), "created_at": int(self.clock()), "content": content}
        with self.engine.begin() as conn:
            conn.execute(files.insert().values(**row))
        return file_object(row)

    def get_file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        found = self._dicts(sa.select(files).where(files.c.id == file_id, files.c.owner == owner))
        return found[0] if found else None

    def list_files(self, owner: str, purpose: str | None = None) -> list[dict[str, Any]]:
        q = sa.select(*[c for c in files.c if c.name != "content"]).where(files.c.owner == owner)
        if purpose:
            q = q.where(files.c.purpose == purpose)
        return [file_object(r) for r in self._dicts(q.order_by(files.c.created_at.desc()))]

    def delete_file(self, file_id: str, owner: str) -> bool:
        with self.engine.begin() as conn:
            return bool(conn.execute(files.delete().where(files.c.id == file_id, files.c.owner == owner)).rowcount)

    # ---- batches -----------------------------------------------------------------------------------------
    def create_batch(self, owner: str, tenant: str, input_file_id: str, endpoint: str, window: str,
                     meta: dict[str, str] | None, content: bytes, max_line_bytes: int = 4 << 20) -> dict[str, Any]:
        """A batch and its items, in one transaction: lines that cannot run (input_lines.parse_input) are failed
        items at once. The lines are read and inserted CHUNK at a time, never all held as objects."""
        now = int(self.clock())
        bid = new_id("batch_")
        row = {"id": bid, "owner": owner, "tenant": tenant, "endpoint": endpoint, "input_file_id": input_file_id,
               "completion_window": window, "status": "validating", "created_at": now,
               "expires_at": now + WINDOW_S[window], "metadata": json.dumps(meta) if meta else None}
        with self.engine.begin() as conn:
            conn.execute(batches.insert().values(**row))
            chunk: list[dict[str, Any]] = []
            first_id = f"req_{bid.removeprefix('batch_')}_{{}}".format     # worker.request_id's first start
            for i, (cid, body, err) in enumerate(parse_input(content, endpoint, max_line_bytes, first_id)):
                chunk.append({"batch_id": bid, "line": i, "custom_id": cid,
                              "body": json.dumps(body) if body else None, "state": "failed" if err else "pending",
                              "attempts": 0, "result": json.dumps(err) if err else None})
                if len(chunk) >= CHUNK:
                    conn.execute(items.insert(), chunk)
                    chunk = []
            if chunk:
                conn.execute(items.insert(), chunk)
        return self.batch_object(row)

    def get_batch(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """The batch's object; `owner` None: whoever owns it (the runner)."""
        q = sa.select(batches).where(batches.c.id == batch_id)
        if owner is not None:
            q = q.where(batches.c.owner == owner)
        found = self._dicts(q)          # the primary key: one row or none
        return self.batch_object(found[0]) if found else None

    def list_batches(self, owner: str | None, limit: int = 20, after: str | None = None) -> list[dict[str, Any]]:
        """The owner's batches, newest first; `owner` None: everyone's (an admin key)."""
        q = sa.select(batches).order_by(batches.c.created_at.desc(), batches.c.id.desc())
        if owner is not None:
            q = q.where(batches.c.owner == owner)
        rows = self._dicts(q)
        if after is not None:
            ids = [r["id"] for r in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        return [self.batch_object(r) for r in rows[:limit]]

    def active(self) -> list[dict[str, Any]]:
        return self._dicts(sa.select(batches).where(batches.c.status.in_(ACTIVE)).order_by(batches.c.created_at))

    def set_status(self, batch_id: str, status: str, only_from: tuple[str, ...] = ACTIVE) -> bool:
        """Move a batch to `status` (stamping its *_at time) if it is in one of `only_from`."""
        values: dict[str, Any] = {"status": status}
        stamp = f"{status}_at" if status != "in_progress" else "in_progress_at"
        if stamp in TIMES:
            values[stamp] = int(self.clock())
        with self.engine.begin() as conn:
            return bool(conn.execute(batches.update().where(batches.c.id == batch_id, batches.c.status.in_(only_from))
                                     .values(**values)).rowcount)

    def counts(self, batch_id: str) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(items.c.state, sa.func.count()).where(items.c.batch_id == batch_id)
                                .group_by(items.c.state)).all()
        by = {state: int(n) for state, n in rows}
        return {"total": sum(by.values()), "completed": by.get("done", 0), "failed": by.get("failed", 0)}

    def batch_object(self, row: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's Batch object. Stored JSON is read through json_input.readable, so a value stored before the
        checks existed (a lone surrogate in metadata) never makes a read fail."""
        errors = readable(json.loads(row["errors"])) if row.get("errors") else None
        return {"id": row["id"], "object": "batch", "endpoint": row["endpoint"], "errors": errors,
                "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
                "status": row["status"], "output_file_id": row.get("output_file_id"),
                "error_file_id": row.get("error_file_id"), "created_at": row["created_at"],
                **{t: row.get(t) for t in TIMES}, "expires_at": row["expires_at"],
                "request_counts": self.counts(row["id"]),
                "metadata": readable(json.loads(row["metadata"])) if row.get("metadata") else None}

    # ---- items -------------------------------------------------------------------------------------------
    def pending(self, batch_id: str, limit: int, skip: set[int], worker: str | None = None) -> list[Item]:
        """Pending items in line order, less `skip`; given a `worker`, only those free for it to claim (no other
        worker's lease runs)."""
        q = sa.select(items).where(items.c.batch_id == batch_id, items.c.state == "pending")
        if worker is not None:
            q = q.where(sa.or_(items.c.lease_until.is_(None), items.c.lease_until < self.clock(),
                               items.c.lease_owner == worker))
        q = q.order_by(items.c.line).limit(limit + len(skip))
        with self.engine.connect() as conn:
            rows = [r for r in conn.execute(q) if r.line not in skip]
        return [Item(r.batch_id, r.line, r.custom_id, json.loads(r.body), r.attempts) for r in rows[:limit]]

    def claim(self, item: Item, worker: str, lease_s: float) -> bool:
        """Take the item for `worker` for `lease_s` seconds and count a start, in one statement, if it is still
        pending and no other worker's lease on it runs; whether it was taken. The start is counted before the
        request runs, so a later start gets another request id."""
        now = self.clock()
        with self.engine.begin() as conn:
            return conn.execute(items.update().where(
                items.c.batch_id == item.batch_id, items.c.line == item.line, items.c.state == "pending",
                items.c.attempts == item.attempts,
                sa.or_(items.c.lease_until.is_(None), items.c.lease_until < now, items.c.lease_owner == worker))
                .values(attempts=items.c.attempts + 1, lease_owner=worker, lease_until=now + lease_s)).rowcount == 1

    def claim_batch(self, batch_id: str, worker: str, lease_s: float) -> bool:
        """Take the batch's ending (cancel, expiry, results) for `worker` unless another worker's lease runs."""
        now = self.clock()
        with self.engine.begin() as conn:
            return conn.execute(batches.update().where(
                batches.c.id == batch_id,
                sa.or_(batches.c.lease_until.is_(None), batches.c.lease_until < now, batches.c.lease_owner == worker))
                .values(lease_owner=worker, lease_until=now + lease_s)).rowcount == 1

    def renew(self, worker: str, lease_s: float) -> None:
        """Extend every lease `worker` holds on a pending item or an active batch."""
        until = self.clock() + lease_s
        with self.engine.begin() as conn:
            conn.execute(items.update().where(items.c.lease_owner == worker, items.c.state == "pending")
                         .values(lease_until=until))
            conn.execute(batches.update().where(batches.c.lease_owner == worker, batches.c.status.in_(ACTIVE))
                         .values(lease_until=until))

    def release(self, worker: str) -> None:
        """Give up every lease `worker` holds on pending items (a worker stopping: others may take them now)."""
        with self.engine.begin() as conn:
            conn.execute(items.update().where(items.c.lease_owner == worker, items.c.state == "pending")
                         .values(lease_owner=None, lease_until=None))

    def finish(self, item: Item, ok: bool, result: dict[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(items.update().where(items.c.batch_id == item.batch_id, items.c.line == item.line,
                                              items.c.state == "pending")
                         .values(state="done" if ok else "failed", result=json.dumps(result)))

    def fail_pending(self, batch_id: str, code: str, message: str) -> int:
        """End every pending item with an error line (a cancelled or expired batch)."""
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(items.c.line, items.c.custom_id).where(
                items.c.batch_id == batch_id, items.c.state == "pending")).all()
            for line, cid in rows:
                conn.execute(items.update().where(items.c.batch_id == batch_id, items.c.line == line)
                             .values(state="failed", result=json.dumps(error_line(cid, code, message))))
        return len(rows)

    def write_results(self, batch_id: str, owner: str) -> None:
        """Assemble the output file (successes) and error file (failures), in input order, once."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(items.c.state, items.c.result).where(items.c.batch_id == batch_id)
                                .order_by(items.c.line)).all()
        out = [r.result for r in rows if r.state == "done"]
        err = [r.result for r in rows if r.state == "failed"]
        values = {}
        if out:
            values["output_file_id"] = self.create_file(owner, "batch_output", f"{batch_id}_output.jsonl",
                                                        ("\n".join(out) + "\n").encode())["id"]
        if err:
            values["error_file_id"] = self.create_file(owner, "batch_output", f"{batch_id}_error.jsonl",
                                                       ("\n".join(err) + "\n").encode())["id"]
        if values:
            with self.engine.begin() as conn:
                conn.execute(batches.update().where(batches.c.id == batch_id).values(**values))


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's File object."""
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed", "status_details": None,
            "expires_at": None}
