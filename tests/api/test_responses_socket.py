"""The Responses API in WebSocket mode (tokenomy/api/responses_socket.py) through the official openai client,
unchanged (`client.beta.responses.connect()`), on a live tokenomy with the real SmolLM2 model: several turns on one
socket, continuation from the socket's memory with `store: false`, the error for an unknown previous response, the
eviction after a failed turn, reconnects, keys and budgets per turn, one ledger row per turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import websockets.exceptions
import websockets.sync.client

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_response_end
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
KEYS = [{"key": "sk-ws-a", "tenant": "a", "name": "a"}, {"key": "sk-ws-b", "tenant": "b", "name": "b"},
        {"key": "sk-ws-budget", "tenant": "d", "name": "budget", "budget": {"tokens_per_day": 10}}]
ENDS = ("response.completed", "response.incomplete", "response.failed", "error")
ECHO = {"type": "function", "name": "echo", "description": "Echo a word", "strict": True,
        "parameters": {"type": "object", "properties": {"word": {"type": "string", "maxLength": 8}},
                       "required": ["word"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def keyed() -> Iterator[Any]:
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": KEYS}) as s:
        yield s


def client_for(server: Any, key: str = "sk-ws-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def turn(conn: Any, **params: Any) -> list[Any]:
    """Send one response.create and read its events up to the one that ends it."""
    conn.response.create(model=MODEL, **params)
    events = []
    for event in conn:
        events.append(event)
        if event.type in ENDS:
            return events
    raise AssertionError(f"the socket closed after {[e.type for e in events]}")


def rows(server: Any, tenant: str) -> list[Any]:
    server.gateway.ledger.flush()
    return [r for r in server.gateway.ledger.query(tenant=tenant) if r.api == "responses"]


def test_several_turns_continue_from_the_sockets_memory_without_a_store(keyed):
    before = len(rows(keyed, "a"))
    with client_for(keyed).beta.responses.connect() as conn:
        first = turn(conn, input="Name a color.", max_output_tokens=8, temperature=0, store=False)
        types = [e.type for e in first]
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] in ENDS[:2]
        assert [e.sequence_number for e in first] == list(range(len(first)))
        done = first[-1].response
        assert_response_end(done, 8)
        [msg] = done.output
        assert done.store is False and msg.content[0].text == "".join(
            e.delta for e in first if e.type == "response.output_text.delta")
        second = turn(conn, input="And another.", max_output_tokens=8, temperature=0, store=False,
                      previous_response_id=done.id)
        last = second[-1].response
        assert last.previous_response_id == done.id and last.id != done.id
        assert_response_end(last, 8)
        # the second prompt holds the first turn, whose prefix the engine still has
        assert last.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens
        assert last.usage.input_tokens_details.cached_tokens >= done.usage.input_tokens - 1
        third = turn(conn, input="One more.", max_output_tokens=4, store=False, previous_response_id=last.id)
        assert third[-1].type in ENDS[:2]
        # the chain's model is held loaded in the fleet while the socket is open: never evicted, no keep_alive
        held = keyed.gateway.fleet.models[MODEL]
        assert held.holds == 1 and not held.evictable()
        assert next(m for m in keyed.gateway.fleet.ps()["models"] if m["name"] == MODEL)["held"] == 1
    wait_until(lambda: held.holds == 0, what="the closed socket to let its model go")
    assert len(rows(keyed, "a")) == before + 3                  # one ledger row per turn
    with pytest.raises(openai.NotFoundError):                    # store: false wrote nothing
        client_for(keyed).responses.retrieve(done.id)


def test_the_chains_kv_is_pinned_so_other_traffic_in_between_does_not_evict_it():
    engine = {**SMALL_ENGINE, "max_running": 2, "max_retired": 1, "kv_tier_ram_mb": 0}   # 3 streams, no RAM tier
    with live_server({"engine": engine, "cache": NO_CACHE}) as s:
        client = client_for(s)
        with client.beta.responses.connect() as conn:
            done = turn(conn, input="Name a color.", max_output_tokens=8, temperature=0, store=False)[-1].response
            for word in ("apples", "rivers", "stones", "clouds"):     # more conversations than the free streams
                client.responses.create(model=MODEL, input=f"Say {word}.", max_output_tokens=2, store=False)
            last = turn(conn, input="Another.", max_output_tokens=4, temperature=0, store=False,
                        previous_response_id=done.id)[-1].response
        # the first turn's prompt and answer were still in the engine: more than its prompt was reused
        assert last.usage.input_tokens_details.cached_tokens > done.usage.input_tokens


def test_an_unknown_previous_response_is_an_error_event_and_the_socket_goes_on(keyed):
    before = len(rows(keyed, "a"))
    with client_for(keyed).beta.responses.connect() as conn:
        [err] = turn(conn, input="Hi", max_output_tokens=2, previous_response_id="resp_unknown")
        assert err.type == "error" and err.status == 400
        assert (err.error.code, err.error.param) == ("previous_response_not_found", "previous_response_id")
        ok = turn(conn, input="Hi", max_output_tokens=2, store=False)
        assert ok[-1].type in ENDS[:2]
    refused = rows(keyed, "a")[before:]
    assert [r.status for r in refused] == [400, 200]


def test_a_failed_turn_evicts_the_response_it_would_have_continued(keyed):
    with client_for(keyed).beta.responses.connect() as conn:
        first = turn(conn, input="Hi", max_output_tokens=2, store=False)[-1].response
        [bad] = turn(conn, input="Hi", max_output_tokens=2, store=False, previous_response_id=first.id,
                     tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}])
        assert bad.type == "error" and bad.status == 400 and bad.error.code == "unsupported_tool"
        [gone] = turn(conn, input="Hi", max_output_tokens=2, store=False, previous_response_id=first.id)
        assert gone.type == "error" and gone.error.code == "previous_response_not_found"


def test_after_a_reconnect_only_stored_responses_continue(keyed):
    c = client_for(keyed)
    with c.beta.responses.connect() as conn:
        stored = turn(conn, input="Hi", max_output_tokens=2)[-1].response
        kept = turn(conn, input="Hi", max_output_tokens=2, store=False)[-1].response
    assert stored.store is True and c.responses.retrieve(stored.id).id == stored.id
    with c.beta.responses.connect() as conn:
        again = turn(conn, input="Again", max_output_tokens=2, previous_response_id=stored.id)
        assert again[-1].type in ENDS[:2] and again[-1].response.previous_response_id == stored.id
        [lost] = turn(conn, input="Again", max_output_tokens=2, previous_response_id=kept.id)
        assert lost.type == "error" and lost.error.code == "previous_response_not_found"
    with client_for(keyed, "sk-ws-b").beta.responses.connect() as conn:      # another tenant's is not found
        [other] = turn(conn, input="Again", max_output_tokens=2, previous_response_id=stored.id)
        assert other.type == "error" and other.error.code == "previous_response_not_found"


def test_a_function_call_round_trip_on_the_socket(keyed):
    with client_for(keyed).beta.responses.connect() as conn:
        events = turn(conn, input="Echo the word apple.", tools=[ECHO], tool_choice="required",
                      max_output_tokens=40, temperature=0, store=False)
        [call] = events[-1].response.output
        assert call.type == "function_call" and call.name == "echo" and json.loads(call.arguments)["word"]
        assert "response.function_call_arguments.done" in [e.type for e in events]
        out = {"type": "function_call_output", "call_id": call.call_id, "output": "apple"}
        reply = turn(conn, input=[out], tools=[ECHO], tool_choice="none", max_output_tokens=8, store=False,
                     previous_response_id=events[-1].response.id)
        assert [o.type for o in reply[-1].response.output] == ["message"]


def test_keys_and_budgets_are_checked_per_turn(keyed):
    with pytest.raises(websockets.exceptions.InvalidStatus) as e:
        with client_for(keyed, "sk-nobody").beta.responses.connect():
            pass
    assert e.value.response.status_code == 401
    before = len(rows(keyed, "d"))
    with client_for(keyed, "sk-ws-budget").beta.responses.connect() as conn:
        for _ in range(2):          # its prompt alone is more than the budget's 10 tokens, every turn
            [err] = turn(conn, input="Hi", max_output_tokens=2)
            assert err.type == "error" and err.status == 429 and "budget" in err.error.message
    assert [r.status for r in rows(keyed, "d")[before:]] == [429, 429]


def test_messages_that_are_not_a_response_create_are_error_events(keyed):
    url = keyed.base_url.replace("http://", "ws://") + "/responses"
    with websockets.sync.client.connect(url, additional_headers={"authorization": "Bearer sk-ws-a"}) as ws:
        ws.send("{not json")
        assert json.loads(ws.recv())["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "response.cancel"}))
        err = json.loads(ws.recv())
        assert err["type"] == "error" and err["status"] == 400 and err["error"]["code"] == "unsupported_event_type"
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 0}))
        err = json.loads(ws.recv())
        assert err["status"] == 400 and err["error"]["param"] == "max_output_tokens"
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "Hi", "max_output_tokens": 2,
                            "stream_id": "lane-1"}))
        events = []
        while not events or events[-1]["type"] not in ENDS:
            events.append(json.loads(ws.recv()))
        assert {e.get("stream_id") for e in events} == {"lane-1"}
