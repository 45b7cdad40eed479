"""Stored Responses API answers in the ledger's database: one tenant's, kept for the ledger's retention, on SQLite
and PostgreSQL alike."""

from __future__ import annotations

import sqlalchemy as sa

from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.responses_store import ResponseStore, StoredResponse
from tokenomy.ledger.tables import responses

DAY = 86400.0


def stored(rid: str, tenant: str, ts: float) -> StoredResponse:
    return StoredResponse(id=rid, ts=ts, tenant=tenant, key_id="k1", request_id="req_" + rid,
                          conversation=[{"role": "user", "content": "Hi é"}, {"role": "assistant", "content": "Hello"}],
                          input_items=[{"type": "message", "id": "msg_1", "role": "user",
                                        "content": [{"type": "input_text", "text": "Hi é"}]}],
                          response={"id": rid, "object": "response", "output": []})


def count(store: ResponseStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(responses)).scalar() or 0)


def test_a_response_is_its_tenants_only_and_deleted_once(ledger_url):
    now = [1_000_000.0]
    with Ledger(ledger_url) as led:
        store = ResponseStore(led.engine, 30 * DAY, clock=lambda: now[0])
        store.put(stored("resp_a", "a", now[0]))
        got = store.get("resp_a", "a")
        assert got is not None and got == stored("resp_a", "a", now[0])
        assert store.get("resp_a", "b") is None and store.get("resp_missing", "a") is None
        assert not store.delete("resp_a", "b") and store.get("resp_a", "a") is not None
        assert store.delete("resp_a", "a") and not store.delete("resp_a", "a")
        assert store.get("resp_a", "a") is None


def test_retention_hides_then_prunes_old_responses(ledger_url):
    now = [1_000_000.0]
    with Ledger(ledger_url) as led:
        store = ResponseStore(led.engine, 2 * DAY, prune_every_s=0, clock=lambda: now[0])
        store.put(stored("resp_old", "a", now[0] - 3 * DAY))     # already past the retention: never returned
        assert store.get("resp_old", "a") is None
        store.put(stored("resp_new", "a", now[0]))               # the next put prunes (prune_every_s=0)
        assert count(store) == 1 and store.pruned == 1
        now[0] += 3 * DAY
        assert store.get("resp_new", "a") is None and store.prune() == 1 and count(store) == 0

