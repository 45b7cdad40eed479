"""The Conversations API's conversations and their items, in the ledger's database (tables `conversations` and
`conversation_items`, ledger migration 13), so every replica on that database serves the same conversation.

Contract, as for stored responses (ledger/responses_store.py):
- A conversation belongs to the tenant that made it: every method takes the caller's tenant and finds nothing of
  another tenant's, exactly as for an id that never existed (the API answers 404).
- Items are kept as the API lists them, in order (position 0 first); deleting a conversation deletes its items.
- Retention: the ledger's `retention_days`, counted from the conversation's last change (an item added, its
  metadata updated); an older conversation is never returned, and is deleted with its items by `prune`, run on
  open and then at most every `prune_every_s` by whichever write comes next.
- The methods block on the database: the API calls them in a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tokenomy.ledger.tables import conversation_items as items_table
from tokenomy.ledger.tables import conversations as conversations_table

log = logging.getLogger("tokenomy.ledger")


def _dump(x: Any) -> str:
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False)


@dataclass
class StoredConversation:
    id: str
    tenant: str
    created_at: int
    metadata: dict[str, str]

    def body(self) -> dict[str, Any]:
        """The conversation object of OpenAI's reference."""
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationStore:
    def __init__(self, engine: Engine, retention_s: float | None, prune_every_s: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        """`engine`: the ledger's (its migrations made the tables); `retention_s`: the ledger's retention of stored
        bodies (None: kept for ever)."""
        if retention_s is not None and not retention_s > 0:
            raise ValueError("retention_s must be positive or None")
        self.engine, self.retention_s, self.prune_every_s, self.clock = engine, retention_s, prune_every_s, clock
        self._lock = threading.Lock()
        self._last_prune = time.monotonic()
        self.prune()

    # ---- conversations -------------------------------------------------------------------------------------
    def create(self, conversation: StoredConversation, items: list[dict[str, Any]]) -> None:
        with self.engine.begin() as conn:
            conn.execute(conversations_table.insert().values(
                id=conversation.id, tenant=conversation.tenant, created_at=conversation.created_at,
                ts=self.clock(), metadata=_dump(conversation.metadata)))
            self._append(conn, conversation.id, items, 0)
        self._maybe_prune()

    def get(self, conversation_id: str, tenant: str) -> StoredConversation | None:
        """The tenant's conversation, or None (no such id, another tenant's, or past the retention)."""
        with self.engine.connect() as conn:
            row = self._row(conn, conversation_id, tenant)
        if row is None:
            return None
        return StoredConversation(row.id, row.tenant, int(row.created_at), json.loads(row.metadata))

    def update(self, conversation_id: str, tenant: str, metadata: dict[str, str]) -> bool:
        with self.engine.begin() as conn:
            return bool(conn.execute(conversations_table.update().where(
                *self._owned(conversation_id, tenant)).values(metadata=_dump(metadata), ts=self.clock())).rowcount)

    def delete(self, conversation_id: str, tenant: str) -> bool:
        """Delete the tenant's conversation and its items; whether there was one."""
        with self.engine.begin() as conn:
            if not conn.execute(conversations_table.delete().where(
                    *self._owned(conversation_id, tenant))).rowcount:
                return False
            conn.execute(items_table.delete().where(items_table.c.conversation_id == conversation_id))
        return True

    # ---- items -------------------------------------------------------------------------------------------
    def items(self, conversation_id: str, tenant: str) -> list[dict[str, Any]] | None:
        """The conversation's items in order, or None when the tenant has no such conversation."""
        with self.engine.connect() as conn:
            if self._row(conn, conversation_id, tenant) is None:
                return None
            rows = conn.execute(sa.select(items_table.c.item).where(
                items_table.c.conversation_id == conversation_id).order_by(items_table.c.position)).all()
        return [json.loads(r.item) for r in rows]

    def add_items(self, conversation_id: str, tenant: str, items: list[dict[str, Any]]) -> bool:
        """Append `items` (each with an `id`); False when the tenant has no such conversation."""
        with self.engine.begin() as conn:
            if self._row(conn, conversation_id, tenant) is None:
                return False
            last = conn.execute(sa.select(sa.func.max(items_table.c.position)).where(
                items_table.c.conversation_id == conversation_id)).scalar()
            self._append(conn, conversation_id, items, 0 if last is None else int(last) + 1)
            conn.execute(conversations_table.update().where(conversations_table.c.id == conversation_id)
                         .values(ts=self.clock()))
        self._maybe_prune()
        return True

    def delete_item(self, conversation_id: str, tenant: str, item_id: str) -> bool:
        """Delete one item; False when the tenant has no such conversation or it has no such item."""
        with self.engine.begin() as conn:
            if self._row(conn, conversation_id, tenant) is None:
                return False
            return bool(conn.execute(items_table.delete().where(items_table.c.conversation_id == conversation_id,
                                                                items_table.c.id == item_id)).rowcount)

    # ---- retention ---------------------------------------------------------------------------------------
    def prune(self, now: float | None = None) -> int:
        """Delete conversations (and their items) unchanged for longer than the retention; returns how many."""
        with self._lock:
            self._last_prune = time.monotonic()
        if self.retention_s is None:
            return 0
        cutoff = (self.clock() if now is None else now) - self.retention_s
        with self.engine.begin() as conn:
            old = sa.select(conversations_table.c.id).where(conversations_table.c.ts < cutoff)
            conn.execute(items_table.delete().where(items_table.c.conversation_id.in_(old)))
            return int(conn.execute(conversations_table.delete().where(conversations_table.c.ts < cutoff)).rowcount
                       or 0)

    def _maybe_prune(self) -> None:
        if self.retention_s is not None and time.monotonic() - self._last_prune >= self.prune_every_s:
            try:
                self.prune()
            except Exception:       # the write went through; a failed prune is retried later
                log.exception("ledger: pruning conversations failed")

    def _owned(self, conversation_id: str, tenant: str) -> list[Any]:
        where = [conversations_table.c.id == conversation_id, conversations_table.c.tenant == tenant]
        if self.retention_s is not None:
            where.append(conversations_table.c.ts >= self.clock() - self.retention_s)
        return where

    def _row(self, conn: Connection, conversation_id: str, tenant: str) -> Any:
        return conn.execute(sa.select(conversations_table).where(*self._owned(conversation_id, tenant))).first()

    @staticmethod
    def _append(conn: Connection, conversation_id: str, items: list[dict[str, Any]], start: int) -> None:
        if items:
            conn.execute(items_table.insert(), [{"conversation_id": conversation_id, "position": start + i,
                                                 "id": item["id"], "item": _dump(item)}
                                                for i, item in enumerate(items)])
