"""Stored Responses API answers, in the ledger's database (table `stored_responses`, ledger migration 9), so every
gateway replica on that database can continue a conversation by `previous_response_id` or read it back.

Contract:
- A stored response belongs to the tenant that made it: `get` and `delete` take the caller's tenant and find
  nothing of another tenant's, exactly as for an id that never existed (the API answers 404, never a leak).
- What is kept: the response object as the client got it, the input items its request sent, and the conversation
  the next turn continues, as internal chat messages (the earlier turns, this request's input, this answer; never
  the `instructions`, which OpenAI does not carry over to the next turn either).
- Retention: the ledger's `retention_days`, as for stored prompts. A response older than that is never returned,
  and is deleted on open and then at most every `prune_every_s` by whichever `put` comes next.
- The methods block on the database: the API calls them in a worker thread, never on the event loop. `put`
  returns once the row is committed, so the answer that names a response id only leaves after the response is
  there for the next turn, on any replica.
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
from sqlalchemy.engine import Engine

from tokenomy.ledger.tables import responses

log = logging.getLogger("tokenomy.ledger")


@dataclass
class StoredResponse:
    id: str
    ts: float
    tenant: str
    key_id: str | None
    request_id: str
    conversation: list[dict[str, Any]]
    input_items: list[dict[str, Any]]
    response: dict[str, Any]

    def to_db(self) -> dict[str, Any]:
        def dump(x: Any) -> str:
            return json.dumps(x, separators=(",", ":"), ensure_ascii=False)

        return {"id": self.id, "ts": self.ts, "tenant": self.tenant, "key_id": self.key_id,
                "request_id": self.request_id, "conversation": dump(self.conversation),
                "input_items": dump(self.input_items), "response": dump(self.response)}

    @classmethod
    def from_db(cls, data: Any) -> StoredResponse:
        return cls(id=data["id"], ts=float(data["ts"]), tenant=data["tenant"], key_id=data["key_id"],
                   request_id=data["request_id"], conversation=json.loads(data["conversation"]),
                   input_items=json.loads(data["input_items"]), response=json.loads(data["response"]))


class ResponseStore:
    def __init__(self, engine: Engine, retention_s: float | None, prune_every_s: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        """`engine`: the ledger's (its migrations made the table); `retention_s`: the ledger's retention of stored
        bodies (None: kept for ever); `clock`: the wall clock stamps and the retention are read from."""
        if retention_s is not None and not retention_s > 0:
            raise ValueError("retention_s must be positive or None")
        self.engine, self.retention_s, self.prune_every_s, self.clock = engine, retention_s, prune_every_s, clock
        self.pruned = 0
        self._lock = threading.Lock()
        self._last_prune = time.monotonic()
        self.prune()

    def put(self, stored: StoredResponse) -> None:
        with self.engine.begin() as conn:
            conn.execute(responses.insert().values(**stored.to_db()))
        if self.retention_s is not None and time.monotonic() - self._last_prune >= self.prune_every_s:
            try:
                self.prune()
            except Exception:       # the answer was stored; a failed prune is retried later
                log.exception("ledger: pruning stored responses failed")

    def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        """The tenant's stored response, or None (no such id, another tenant's, or past the retention)."""
        q = sa.select(responses).where(responses.c.id == response_id, responses.c.tenant == tenant)
        if self.retention_s is not None:
            q = q.where(responses.c.ts >= self.clock() - self.retention_s)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return StoredResponse.from_db(row._mapping) if row is not None else None

    def delete(self, response_id: str, tenant: str) -> bool:
        """Delete the tenant's stored response; whether there was one."""
        with self.engine.begin() as conn:
            return bool(conn.execute(responses.delete().where(responses.c.id == response_id,
                                                              responses.c.tenant == tenant)).rowcount)

    def prune(self, now: float | None = None) -> int:
        """Delete stored responses older than the retention; returns how many."""
        with self._lock:
            self._last_prune = time.monotonic()
        if self.retention_s is None:
            return 0
        cutoff = (self.clock() if now is None else now) - self.retention_s
        with self.engine.begin() as conn:
            n = conn.execute(responses.delete().where(responses.c.ts < cutoff)).rowcount or 0
        self.pruned += n
        return n
