"""OpenAI's Conversations API through the official openai client (`client.conversations`), on a live tokenomy with
the real SmolLM2 model: create, retrieve, update, delete, items, `conversation` on a response, tenants apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_response_end

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
KEYS = [{"key": "sk-conv-a", "tenant": "a", "name": "a"}, {"key": "sk-conv-b", "tenant": "b", "name": "b"}]


@pytest.fixture(scope="module")
def keyed() -> Iterator[Any]:
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": KEYS}) as s:
        yield s


def client_for(server: Any, key: str = "sk-conv-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def test_create_retrieve_update_and_delete_a_conversation(keyed):
    a = client_for(keyed)
    conv = a.conversations.create(metadata={"topic": "demo"},
                                  items=[{"type": "message", "role": "user", "content": "Hello there."}])
    assert conv.id.startswith("conv_") and conv.object == "conversation" and conv.metadata == {"topic": "demo"}
    assert a.conversations.retrieve(conv.id).created_at == conv.created_at
    assert a.conversations.update(conv.id, metadata={"topic": "other"}).metadata == {"topic": "other"}
    assert a.conversations.retrieve(conv.id).metadata == {"topic": "other"}
    items = list(a.conversations.items.list(conv.id))
    assert len(items) == 1 and items[0].type == "message" and items[0].content[0].text == "Hello there."
    gone = a.conversations.delete(conv.id)
    assert gone.deleted and gone.id == conv.id and gone.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        a.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        a.conversations.items.list(conv.id)


def test_items_create_list_retrieve_and_delete(keyed):
    a = client_for(keyed)
    conv = a.conversations.create()
    added = a.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "user", "content": "one"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
        {"type": "message", "role": "user", "content": "three"}])
    assert [i.id for i in added.data] and len(added.data) == 3
    ids = [i.id for i in added.data]
    assert [i.id for i in a.conversations.items.list(conv.id, order="asc")] == ids
    assert [i.id for i in a.conversations.items.list(conv.id)] == ids[::-1]          # desc by default
    page = a.conversations.items.list(conv.id, order="asc", limit=2)
    assert [i.id for i in page.data] == ids[:2] and page.has_more
    assert [i.id for i in page.get_next_page().data] == ids[2:]
    assert a.conversations.items.retrieve(ids[1], conversation_id=conv.id).content[0].text == "two"
    after = a.conversations.items.delete(ids[1], conversation_id=conv.id)
    assert after.id == conv.id and after.object == "conversation"
    assert [i.id for i in a.conversations.items.list(conv.id, order="asc")] == [ids[0], ids[2]]
    with pytest.raises(openai.NotFoundError):
        a.conversations.items.retrieve(ids[1], conversation_id=conv.id)
    with pytest.raises(openai.BadRequestError) as e:
        a.conversations.items.create(conv.id, items=[{"type": "message", "role": "wizard", "content": "x"}])
    assert "role" in e.value.body["message"]


def test_a_response_reads_and_extends_its_conversation(keyed):
    a = client_for(keyed)
    conv = a.conversations.create(items=[{"type": "message", "role": "user", "content": "My name is Ada."}])
    bare = a.responses.create(model=MODEL, input="What is my name?", max_output_tokens=16, temperature=0)
    r = a.responses.create(model=MODEL, conversation=conv.id, input="What is my name?", max_output_tokens=16,
                           temperature=0)
    assert_response_end(r, 16)
    assert r.conversation is not None and r.conversation.id == conv.id
    assert r.usage.input_tokens > bare.usage.input_tokens            # the conversation's item was read first
    items = list(a.conversations.items.list(conv.id, order="asc"))
    assert [i.type for i in items] == ["message", "message", "message"]
    assert [i.role for i in items] == ["user", "user", "assistant"]
    assert items[1].content[0].text == "What is my name?" and items[2].id == r.output[0].id
    # streamed, with {"id": ...}: the conversation grows by this turn too
    events = list(a.responses.create(model=MODEL, conversation={"id": conv.id}, input="And again?",
                                     max_output_tokens=8, temperature=0, stream=True))
    assert events[-1].response.conversation.id == conv.id
    assert events[-1].response.usage.input_tokens > r.usage.input_tokens
    assert len(list(a.conversations.items.list(conv.id))) == 5
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model=MODEL, conversation="conv_missing", input="hi", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError):
        a.responses.create(model=MODEL, conversation=conv.id, previous_response_id=r.id, input="hi",
                           max_output_tokens=4)


def test_another_tenant_gets_404_and_nothing_changes(keyed):
    a, b = client_for(keyed), client_for(keyed, "sk-conv-b")
    conv = a.conversations.create(metadata={"k": "v"}, items=[{"role": "user", "content": "secret"}])
    [item] = list(a.conversations.items.list(conv.id))
    for call in (lambda: b.conversations.retrieve(conv.id),
                 lambda: b.conversations.update(conv.id, metadata={"k": "w"}),
                 lambda: b.conversations.delete(conv.id),
                 lambda: b.conversations.items.list(conv.id),
                 lambda: b.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
                 lambda: b.conversations.items.retrieve(item.id, conversation_id=conv.id),
                 lambda: b.conversations.items.delete(item.id, conversation_id=conv.id),
                 lambda: b.responses.create(model=MODEL, conversation=conv.id, input="hi", max_output_tokens=4)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert a.conversations.retrieve(conv.id).metadata == {"k": "v"}
    assert [i.id for i in a.conversations.items.list(conv.id)] == [item.id]


def test_without_a_ledger_conversations_are_not_served():
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "ledger": None}) as s:
        with httpx.Client(base_url=s.base_url, timeout=60) as http:
            assert http.post("/conversations", json={}).status_code in (404, 405)
            r = http.post("/responses", json={"model": MODEL, "input": "hi", "conversation": "conv_1",
                                              "max_output_tokens": 4})
            assert r.status_code == 400 and r.json()["error"]["param"] == "conversation"
