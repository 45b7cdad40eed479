"""OpenAI's Responses API through the official openai client, unchanged (`client.responses`), on a live tokenomy
with the real SmolLM2 model: plain and streamed answers, a function-tool round trip, structured output, stored
responses and their continuation on the engine's prefix cache, tenants kept apart, limits, and the ledger."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_response_end
from tokenomy.ledger.tables import responses as stored_responses

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
KEYS = [{"key": "sk-resp-a", "tenant": "a", "name": "a"}, {"key": "sk-resp-a2", "tenant": "a", "name": "a2"},
        {"key": "sk-resp-b", "tenant": "b", "name": "b"},
        {"key": "sk-resp-rpm", "tenant": "c", "name": "rpm", "rpm": 1},
        {"key": "sk-resp-budget", "tenant": "d", "name": "budget", "budget": {"tokens_per_day": 10}}]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}
# An answer the grammar writes whole, whatever the model would say: one allowed value (non-ASCII, so the stream's
# pieces split UTF-8 characters), the same text in any two runs.
FIXED = {"type": "json_schema", "name": "colors", "strict": True, "schema": {
    "type": "object", "properties": {"colors": {"enum": ["rot, grün, 青"]}}, "required": ["colors"],
    "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def keyed() -> Iterator[Any]:
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": KEYS}) as s:
        yield s


def client_for(server: Any, key: str = "sk-resp-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def row_of(server: Any, response_id: str) -> Any:
    server.gateway.ledger.flush()
    return server.gateway.ledger.get("req_" + response_id.removeprefix("resp_"))


def stored_count(server: Any) -> int:
    with server.gateway.responses.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(stored_responses)).scalar() or 0)


def test_a_string_input_and_instructions(keyed):
    a = client_for(keyed)
    raw = a.responses.with_raw_response.create(model=MODEL, input="Name three colors.", max_output_tokens=24,
                                               temperature=0)
    r = raw.parse()
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert_response_end(r, 24)          # completed or incomplete, whichever the model's words came to
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "output_text" and r.output_text == msg.content[0].text
    u = r.usage
    assert u.input_tokens > 5 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert raw.headers["x-tokenomy-request-id"] == "req_" + r.id.removeprefix("resp_")
    row = row_of(keyed, r.id)
    assert (row.api, row.tenant, row.status, row.completion_tokens) == ("responses", "a", 200, u.output_tokens)
    auth = {"authorization": "Bearer sk-resp-a"}
    assert 'endpoint="responses"' in httpx.get(keyed.root + "/metrics", headers=auth).text
    doc = httpx.get(keyed.root + "/openapi.json", headers=auth).json()
    post = doc["paths"]["/v1/responses"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ResponsesRequest")
    told = a.responses.create(model=MODEL, instructions="You answer in one word.", input="Name three colors.",
                              max_output_tokens=8, temperature=0)
    chat = a.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name three colors."}])
    assert told.instructions == "You answer in one word."          # rendered as the system message, as chat's:
    assert told.usage.input_tokens == chat.usage.prompt_tokens      # the same prompt, token for token, so the
    assert chat.usage.prompt_tokens_details.cached_tokens >= chat.usage.prompt_tokens - 1    # prefix cache has it


def test_a_stream_is_the_greedy_answer_in_ordered_events(keyed):
    """The answer is one the grammar writes whole (FIXED), so the response, its stream and the SDK's accumulated
    stream are word for word alike whatever the model would say (two free greedy runs may part at a near-tie:
    tests/helpers/noise.py)."""
    a = client_for(keyed)
    kw: dict[str, Any] = dict(model=MODEL, input="Say hello.", max_output_tokens=48, temperature=0,
                              text={"format": FIXED})
    full = a.responses.create(**kw)
    assert_response_end(full, 48)
    assert full.status == "completed" and json.loads(full.output_text) == {"colors": "rot, grün, 青"}
    events = list(a.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{full.status}"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == full.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == full.usage.output_tokens
    with a.responses.stream(**kw) as stream:            # the SDK's own event accumulator
        final = stream.get_final_response()
    assert final.output_text == full.output_text and final.status == full.status


def test_every_object_and_event_the_server_sends_is_whole_by_the_sdks_models(keyed):
    """Issue 49: the server's own bodies and SSE events, read raw, parse as openai.types.responses' models with
    no declared field missing (tests/dialect/test_responses_wire.py's `whole`): a message, a function call, an
    answer cut short, whole and streamed, and a stored response read back."""
    from openai.types.responses import Response, ResponseStreamEvent

    from tests.dialect.test_responses_wire import whole

    headers = {"authorization": "Bearer sk-resp-a"}
    asks = [{"input": "Say hello.", "max_output_tokens": 24},
            {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 40},
            {"input": "Tell me a long story.", "max_output_tokens": 2}]
    kinds = set()
    with httpx.Client(base_url=keyed.base_url, headers=headers, timeout=120) as http:
        for ask in asks:
            body = {"model": MODEL, "temperature": 0, **ask}
            obj = http.post("/responses", json=body).json()
            whole(Response, obj)
            kinds |= {item["type"] for item in obj["output"]} | {obj["status"]}
            whole(Response, http.get(f"/responses/{obj['id']}").json())
            with http.stream("POST", "/responses", json={**body, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        ev = json.loads(line[len("data: "):])
                        whole(ResponseStreamEvent, ev)
                        kinds.add(ev["type"])
    # an incomplete answer most likely too (2 tokens), but the model may end by then: the unit test has one for sure
    assert {"message", "function_call", "response.created", "response.in_progress", "response.completed",
            "response.output_item.added", "response.output_item.done"} <= kinds


def test_a_function_tool_round_trip(keyed):
    a = client_for(keyed)
    tools: list[Any] = [WEATHER]
    first = a.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools,
                               tool_choice="required", max_output_tokens=40, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert call.id.startswith("fc_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C and sunny"}
    chained = a.responses.create(model=MODEL, previous_response_id=first.id, input=[result], tools=tools,
                                 tool_choice="none", max_output_tokens=24, temperature=0)
    assert [o.type for o in chained.output] == ["message"] and chained.previous_response_id == first.id
    assert_response_end(chained, 24)
    whole = a.responses.create(model=MODEL, tools=tools, tool_choice="none", max_output_tokens=24, temperature=0,
                               input=[{"role": "user", "content": "What is the weather in Paris?"},
                                      call.model_dump(exclude_none=True), result])
    assert_response_end(whole, 24)   # the stored conversation renders as the one sent whole, token for token:
    assert whole.usage.input_tokens == chained.usage.input_tokens
    events = list(a.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools,
                                     tool_choice="required", max_output_tokens=40, temperature=0, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args) == json.loads(done.arguments)        # its own run's call (the city may differ
    jsonschema.validate(json.loads(args), WEATHER["parameters"])  # from the first's at a near-tie)
    assert events[-1].type == "response.completed" and events[-1].response.output[0].name == "get_weather"


def test_json_schema_output_validates(keyed):
    a = client_for(keyed)
    r = a.responses.create(model=MODEL, input="Invent a person.", max_output_tokens=40, temperature=0,
                           text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                            "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema"

    class Person(BaseModel):
        name: str
        age: int

    parsed = a.responses.parse(model=MODEL, input="Invent a person.", max_output_tokens=40, temperature=0,
                               text_format=Person)
    assert isinstance(parsed.output_parsed, Person)


def test_max_output_tokens_makes_an_incomplete_response(keyed):
    """An answer that reaches max_output_tokens is `incomplete` (the mapping itself: tests/dialect); whether a
    3-token answer gets there is the model's choice, so the test holds the status to the usage, not to a guess. The
    grammar cannot force it: a limit under a schema's shortest answer is refused before anything is generated."""
    a = client_for(keyed)
    r = a.responses.create(model=MODEL, input="Write a long story.", max_output_tokens=3, temperature=0)
    assert_response_end(r, 3)
    events = list(a.responses.create(model=MODEL, input="Write a long story.", max_output_tokens=3, temperature=0,
                                     stream=True))
    done = events[-1].response
    assert events[-1].type == "response." + done.status
    assert_response_end(done, 3)


def test_bad_requests_are_openai_errors(keyed):
    a = client_for(keyed)
    bad: list[tuple[dict[str, Any], type[Exception], str | None]] = [
        (dict(input=[{"type": "bogus"}]), openai.BadRequestError, "input[0].type"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
         openai.BadRequestError, "input[0].content[0].type"),
        (dict(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]), openai.BadRequestError,
         "tools[0].type"),
        (dict(background=True), openai.BadRequestError, "background"),
        (dict(temperature=5), openai.BadRequestError, "temperature"),
        (dict(model="no-such-model"), openai.NotFoundError, "model"),
        (dict(previous_response_id="resp_nothing"), openai.NotFoundError, "previous_response_id"),
    ]
    for extra, error, param in bad:
        with pytest.raises(error) as e:
            a.responses.create(**{"model": MODEL, "input": "Hi", "max_output_tokens": 2, **extra})
        body = e.value.response.json()["error"]
        assert set(body) == {"message", "type", "param", "code"} and body["param"] == param, (extra, body)
    with pytest.raises(openai.BadRequestError, match="input_image"):
        a.responses.create(model=MODEL, max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}])
    with pytest.raises(openai.BadRequestError, match="file_search"):
        a.responses.create(model=MODEL, input="Hi", tools=[{"type": "file_search", "vector_store_ids": ["v"]}])
    r = httpx.post(keyed.base_url + "/responses", headers={"authorization": "Bearer sk-resp-a"},
                   content=b'{"model": "x", "input": [')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    keyed.gateway.ledger.flush()
    refused = [row for row in keyed.gateway.ledger.query(tenant="a") if row.status == 400]
    assert refused and all(row.api == "responses" for row in refused)


def test_a_codex_shaped_request_is_served(keyed):
    """What Codex CLI sends: developer and user items, function tools beside web_search, local_shell and a custom
    (freeform) tool, store false, reasoning, include, prompt_cache_key, client_metadata, streamed."""
    shell = {"type": "function", "name": "shell", "description": "Runs a shell command", "strict": False,
             "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                                             "workdir": {"type": "string"}},
                            "required": ["command"], "additionalProperties": False}}
    body = {"model": MODEL, "instructions": "You are a coding agent.", "stream": True, "store": False,
            "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be safe."}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]}],
            "tools": [shell, {"type": "web_search", "external_web_access": False}, {"type": "local_shell"},
                      {"type": "custom", "name": "apply_patch", "description": "Patch files",
                       "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}],
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-session",
            "client_metadata": {"originator": "codex_exec"}, "text": {"verbosity": "low"}, "max_output_tokens": 8}
    before = stored_count(keyed)
    with httpx.stream("POST", keyed.base_url + "/responses", json=body, timeout=120,
                      headers={"authorization": "Bearer sk-resp-a"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response." + events[-1]["response"]["status"]
    assert_response_end(events[-1]["response"], 8)
    assert [t["name"] for t in events[-1]["response"]["tools"]] == ["shell", "apply_patch"]
    assert events[-1]["response"]["store"] is False and stored_count(keyed) == before


def test_store_get_input_items_and_delete(keyed):
    a = client_for(keyed)
    r = a.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=6, temperature=0,
                           metadata={"job": "t1"})
    assert r.store is True and r.metadata == {"job": "t1"}
    got = a.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    same_tenant = client_for(keyed, "sk-resp-a2").responses.retrieve(r.id)     # another key of tenant a
    assert same_tenant.id == r.id
    items = a.responses.input_items.list(r.id)
    [item] = items.data
    assert item.type == "message" and item.role == "user" and item.content[0].text == "Name a fruit."
    assert items.first_id == item.id and items.has_more is False
    a.responses.delete(r.id)
    for call in (lambda: a.responses.retrieve(r.id), lambda: a.responses.delete(r.id),
                 lambda: a.responses.create(model=MODEL, input="More.", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert keyed.gateway.responses.retention_s == keyed.gateway.ledger.prompt_retention_s   # the ledger's


def test_store_false_writes_nothing(keyed):
    a = client_for(keyed)
    before = stored_count(keyed)
    r = a.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=4, store=False)
    assert r.store is False and stored_count(keyed) == before
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(r.id)
    streamed = list(a.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=4, store=False,
                                       stream=True))
    assert streamed[-1].response.store is False and stored_count(keyed) == before


def test_a_continuation_reuses_the_first_turns_prefix_cache(keyed):
    a = client_for(keyed)
    first = a.responses.create(model=MODEL, input="Name three animals.", max_output_tokens=24, temperature=0)
    second = a.responses.create(model=MODEL, previous_response_id=first.id, input="Name two more.",
                                max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    # the stored conversation is in the prompt: more than both turns of the first answer
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # ... and renders the first turn's prompt again, token for token, so the engine's prefix cache serves it
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    row = row_of(keyed, second.id)
    assert row.cached_tokens == second.usage.input_tokens_details.cached_tokens and row.api == "responses"
    streamed = list(a.responses.create(model=MODEL, previous_response_id=second.id, input="And one more.",
                                       max_output_tokens=4, temperature=0, stream=True))
    done = streamed[-1].response
    assert done.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens


def test_another_tenant_gets_404_never_the_response(keyed):
    a, b = client_for(keyed), client_for(keyed, "sk-resp-b")
    r = a.responses.create(model=MODEL, input="A secret: quokka.", max_output_tokens=4)   # no hex id holds a "q"
    for call in (lambda: b.responses.retrieve(r.id), lambda: b.responses.delete(r.id),
                 lambda: b.responses.input_items.list(r.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert "quokka" not in e.value.response.text
    with pytest.raises(openai.NotFoundError) as taken:
        b.responses.create(model=MODEL, input="What was the secret?", previous_response_id=r.id)
    with pytest.raises(openai.NotFoundError) as never:
        b.responses.create(model=MODEL, input="What was the secret?", previous_response_id="resp_never")
    assert taken.value.response.json()["error"]["message"].replace(r.id, "X") == \
        never.value.response.json()["error"]["message"].replace("resp_never", "X")
    assert a.responses.retrieve(r.id).id == r.id            # b's delete did nothing
    with pytest.raises(openai.AuthenticationError):
        client_for(keyed, "sk-nobody").responses.retrieve(r.id)


def test_rate_limits_and_budgets_apply(keyed):
    rpm = client_for(keyed, "sk-resp-rpm")
    rpm.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    with pytest.raises(openai.RateLimitError) as e:
        rpm.responses.create(model=MODEL, input="Hi", max_output_tokens=1)
    assert e.value.response.headers.get("retry-after")
    budget = client_for(keyed, "sk-resp-budget")
    with pytest.raises(openai.RateLimitError, match="budget") as e:   # its prompt alone is more than 10 tokens
        budget.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert "more than the whole budget" in e.value.message


def test_without_a_ledger_nothing_is_stored_and_continuation_is_refused():
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "ledger": None}) as s:
        c = client_for(s, "unused")
        r = c.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
        assert r.store is False and r.output
        with pytest.raises(openai.BadRequestError, match="ledger"):
            c.responses.create(model=MODEL, input="Hi", max_output_tokens=2, previous_response_id=r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)


def test_a_fallback_to_an_openai_upstream_answers_in_responses_shape():
    """A route whose first model fails falls back to an OpenAI-compatible upstream, and the answer, streamed or
    not, text or a function call, comes back as a Responses object."""
    from tests.api.test_messages_api import upstream_config
    from tests.helpers.upstream_stub import Stub
    from tests.pipeline.test_gateway_upstream import StubServer

    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    with StubServer(Stub(tool_arguments='{"city": "Paris"}')) as stub, \
            StubServer(Stub(fail_status=500, fail_times=1000)) as broken, \
            live_server(upstream_config(stub.port, broken.port)) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
        r = client.responses.create(model="chat", input="Say hello.", store=False)
        assert r.status == "completed" and r.model == "remote" and r.output_text == "Hello from the stub."
        assert r.usage.input_tokens == 7 and r.usage.output_tokens == 5
        events = list(client.responses.create(model="chat", input="Say hello.", store=False, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello from the stub."
        assert events[-1].type == "response.completed"
        call = client.responses.create(model="chat", input="Weather in Paris?", tools=[tool], store=False)
        [item] = [o for o in call.output if o.type == "function_call"]
        assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Paris"}
        assert stub.stub.bodies[-1]["tools"][0]["function"]["name"] == "get_weather"


def test_compact_returns_items_a_later_input_takes_and_bills_its_tokens(keyed):
    """Issue 49: POST /v1/responses/compact through the SDK's client.responses.compact: every user message, then
    one compaction item holding the summary; a later input takes them; the summary's tokens are on a ledger row."""
    from openai.types.responses import CompactedResponse, ResponseInputMessageItem

    from tests.dialect.test_responses_wire import whole

    a = client_for(keyed)
    first = a.responses.create(model=MODEL, input="My name is Ada and I like green.", max_output_tokens=16,
                               temperature=0)
    raw = a.responses.with_raw_response.compact(model=MODEL, previous_response_id=first.id,
                                                input=[{"role": "user", "content": "And I live in Paris."}],
                                                extra_body={"max_output_tokens": 24})   # a short summary: quick
    c = raw.parse()
    assert c.object == "response.compaction" and c.usage.output_tokens > 0 and c.usage.input_tokens > 0
    kinds = [item.type for item in c.output]
    assert kinds == ["message", "message", "compaction"]
    body = json.loads(raw.text)
    assert [m["content"][0]["text"] for m in body["output"][:2]] == ["My name is Ada and I like green.",
                                                                   "And I live in Paris."]
    assert body["output"][-1]["encrypted_content"]
    whole(CompactedResponse, {**body, "output": body["output"][-1:]})
    for m in body["output"][:2]:
        whole(ResponseInputMessageItem, m)
    row = row_of(keyed, c.id)
    assert row is not None and row.completion_tokens == c.usage.output_tokens
    assert row.prompt_tokens == c.usage.input_tokens
    later = a.responses.create(model=MODEL, input=[*body["output"], {"role": "user", "content": "Where do I live?"}],
                               max_output_tokens=16, temperature=0)
    assert_response_end(later, 16)
    assert later.usage.input_tokens > c.usage.output_tokens      # the summary is part of the prompt


def test_compact_refuses_a_missing_model_and_an_unknown_previous_response(keyed):
    with httpx.Client(base_url=keyed.base_url, headers={"authorization": "Bearer sk-resp-a"}, timeout=60) as http:
        r = http.post("/responses/compact", json={"input": "hello"})
        assert r.status_code == 400 and r.json()["error"]["message"] and "type" in r.json()["error"]
        r = http.post("/responses/compact", json={"model": MODEL, "previous_response_id": "resp_nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
        r = http.post("/responses/compact", json={"model": MODEL, "input": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input"
