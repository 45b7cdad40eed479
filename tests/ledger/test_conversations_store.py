"""The Conversations API's conversations in the ledger's database: one tenant's, in order, deleted with their items,
kept for the ledger's retention from their last change, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import sqlalchemy as sa

from tokenomy.ledger.conversations_store import ConversationStore, StoredConversation
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.tables import conversation_items

DAY = 86400.0


def item(i: int) -> dict:
    return {"type": "message", "id": f"msg_{i}", "role": "user", "content": [{"type": "input_text", "text": f"é{i}"}]}


def item_rows(store: ConversationStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(conversation_items)).scalar() or 0)


def test_a_conversation_is_its_tenants_only_in_order_and_deleted_with_its_items(ledger_url):
    with Ledger(ledger_url) as led:
        store = ConversationStore(led.engine, None)
        store.create(StoredConversation("conv_a", "a", 100, {"k": "v"}), [item(0), item(1)])
        assert store.get("conv_a", "a") == StoredConversation("conv_a", "a", 100, {"k": "v"})
        assert store.get("conv_a", "b") is None and store.items("conv_a", "b") is None
        assert store.add_items("conv_a", "a", [item(2)]) and not store.add_items("conv_a", "b", [item(3)])
        assert [i["id"] for i in store.items("conv_a", "a")] == ["msg_0", "msg_1", "msg_2"]
        assert store.items("conv_a", "a")[0] == item(0)
        assert not store.update("conv_a", "b", {}) and store.update("conv_a", "a", {"k": "w"})
        assert store.get("conv_a", "a").metadata == {"k": "w"}
        assert not store.delete_item("conv_a", "b", "msg_1") and store.delete_item("conv_a", "a", "msg_1")
        assert not store.delete_item("conv_a", "a", "msg_1")
        assert store.add_items("conv_a", "a", [item(4)])       # after a deleted item: still appended last
        assert [i["id"] for i in store.items("conv_a", "a")] == ["msg_0", "msg_2", "msg_4"]
        assert not store.delete("conv_a", "b") and store.delete("conv_a", "a") and not store.delete("conv_a", "a")
        assert store.get("conv_a", "a") is None and item_rows(store) == 0


def test_retention_runs_from_the_last_change_and_prunes_items_too(ledger_url):
    now = [1_000_000.0]
    with Ledger(ledger_url) as led:
        store = ConversationStore(led.engine, 30 * DAY, clock=lambda: now[0])
        store.create(StoredConversation("conv_old", "a", 1, {}), [item(0)])
        store.create(StoredConversation("conv_kept", "a", 1, {}), [item(1)])
        now[0] += 20 * DAY
        store.add_items("conv_kept", "a", [item(2)])
        now[0] += 15 * DAY
        assert store.get("conv_old", "a") is None and store.items("conv_old", "a") is None   # never returned
        assert store.get("conv_kept", "a") is not None
        assert store.prune() == 1 and item_rows(store) == 2
