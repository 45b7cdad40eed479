"""The official anthropic client, unchanged, against a live tokenomy: the Messages API on the real SmolLM2 model
(plain, streamed, tools by grammar, stop sequences, usage with cache reads, count_tokens, errors in Anthropic's
shape, keys and limits, the ledger and metrics), and a Messages request served by an OpenAI-compatible upstream."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.answers import assert_message_end, assert_message_stop
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.api import messages as messages_api
from tokenomy.structured.validate import validate

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0}       # this SDK no longer takes temperature as an argument: it rides in extra_body
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# An answer the grammar writes whole, whatever the model would say: a strict output_config.format with one value
# (non-ASCII, so the stream's pieces split UTF-8 characters), the same text in any two runs.
FIXED = {"type": "object", "properties": {"colors": {"enum": ["rot, grün, 青"]}}, "required": ["colors"],
         "additionalProperties": False}
FIXED_FORMAT = {"output_config": {"format": {"type": "json_schema", "schema": FIXED}}}


def sdk(root: str, key: str = "unused", **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root, api_key=key, max_retries=0, timeout=120, **kw)


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return sdk(server.root)


def anthropic_error(e: anthropic.APIStatusError, kind: str) -> str:
    """The message of an Anthropic-shaped error body of type `kind`."""
    assert isinstance(e.body, dict) and e.body["type"] == "error", e.body
    assert e.body["error"]["type"] == kind, e.body
    return e.body["error"]["message"]


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of a raw Messages stream."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
    return events


# ---- answers -------------------------------------------------------------------------------------------------

def test_a_message_and_its_stream_agree(claude):
    """A free answer and its stream, each whole on its own (two greedy runs of one prompt may part at a near-tie,
    tests/helpers/noise.py, so their words are not compared); an answer the grammar fixes, word for word alike."""
    full = claude.messages.create(model=MODEL, max_tokens=24, messages=HELLO, extra_body=GREEDY)
    assert full.type == "message" and full.role == "assistant" and full.model == MODEL
    assert full.id.startswith("msg_")
    assert_message_end(full, 24)
    # one text block, or none where the model's first token ended its turn
    assert [b.type for b in full.content] in (["text"], []) and all(b.text for b in full.content)
    u = full.usage
    assert u.input_tokens + u.cache_read_input_tokens > 5
    assert u.cache_creation_input_tokens == 0
    with claude.messages.stream(model=MODEL, max_tokens=24, messages=HELLO, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in final.content)
    assert [b.type for b in final.content] in (["text"], []) and all(b.text for b in final.content)
    assert_message_end(final, 24)
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == u.input_tokens + u.cache_read_input_tokens
    fixed = claude.messages.create(model=MODEL, max_tokens=48, messages=HELLO, extra_body={**GREEDY, **FIXED_FORMAT})
    assert fixed.stop_reason == "end_turn" and fixed.usage.output_tokens < 48
    assert [b.type for b in fixed.content] == ["text"]
    assert json.loads(fixed.content[0].text) == {"colors": "rot, grün, 青"}
    with claude.messages.stream(model=MODEL, max_tokens=48, messages=HELLO,
                                extra_body={**GREEDY, **FIXED_FORMAT}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == fixed.content[0].text == "".join(b.text for b in final.content)
    assert final.stop_reason == "end_turn" and final.usage.output_tokens < 48


def test_the_stream_has_anthropics_events_in_order(server):
    body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, "stream": True, **GREEDY}
    with httpx.stream("POST", server.root + "/v1/messages", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-tokenomy-request-id"] == r.headers["request-id"]
        events = sse_events(r)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    # one text block of deltas, or none where the model's first token ended its turn
    blocks = names[1:-2]
    assert blocks == [] or (blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
                            and len(blocks) > 2 and set(blocks[1:-1]) == {"content_block_delta"}), names
    assert all(n == d["type"] for n, d in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 5
    delta = events[-2][1]
    assert_message_end({**delta["delta"], "usage": delta["usage"]}, 8)


def test_max_tokens_and_stop_sequences(claude):
    """The stop sequence is the last word of a free answer to the same greedy request, which the next run writes
    again unless a near-tie between the two runs' kernels sends it elsewhere (tests/helpers/noise.py). What is
    asserted holds either way (assert_message_stop: no stop sequence in the text, and the one named that ended
    it, or an ordinary end) and still fails where stop sequences are ignored: the same words again would hold
    the stop."""
    cut = claude.messages.create(model=MODEL, max_tokens=3, messages=HELLO, extra_body=GREEDY)
    assert_message_end(cut, 3)
    free = claude.messages.create(model=MODEL, max_tokens=24, messages=HELLO, extra_body=GREEDY)
    words = "".join(b.text for b in free.content).split()
    stops = ["zzqx", words[-1]] if words else ["zzqx"]       # none where the model's first token ended its turn
    stopped = claude.messages.create(model=MODEL, max_tokens=24, messages=HELLO, stop_sequences=stops,
                                     extra_body=GREEDY)
    assert_message_stop(stopped, stops, 24)
    with claude.messages.stream(model=MODEL, max_tokens=24, messages=HELLO, stop_sequences=stops,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "".join(b.text for b in final.content)
    assert_message_stop(final, stops, 24)


def test_a_repeated_long_prompt_is_read_from_the_prefix_cache_and_counted_alike(claude):
    system = "You answer questions about the tokenomy test suite. " + " ".join(
        f"Rule {i}: answer briefly and never invent test number {i * 7}." for i in range(40))
    kw = dict(model=MODEL, max_tokens=4, system=system, messages=[{"role": "user", "content": "Which rule is 3?"}])
    first = claude.messages.create(**kw, extra_body=GREEDY).usage
    second = claude.messages.create(**kw, extra_body=GREEDY).usage
    total = first.input_tokens + first.cache_read_input_tokens
    assert total > 400 and second.input_tokens + second.cache_read_input_tokens == total
    assert second.cache_read_input_tokens > first.cache_read_input_tokens and second.cache_read_input_tokens > 400
    assert second.input_tokens < first.input_tokens
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=kw["messages"])
    assert counted.input_tokens == total


# ---- tools ---------------------------------------------------------------------------------------------------

def test_a_tool_use_round_trip(claude):
    """The one tool, forced (`any`), with one city its schema allows: the grammar writes the whole call, so the
    message and its stream carry the same input whatever the model would say; the tool_use block's stop reason,
    id and the next turn are the API's."""
    paris = {**WEATHER, "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris"]}},
                                         "required": ["city"]}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = claude.messages.create(model=MODEL, max_tokens=48, messages=ask, tools=[paris],
                               tool_choice={"type": "any"}, extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    calls = [b for b in r.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    assert calls[0].input == {"city": "Paris"} and validate(json.dumps(calls[0].input), paris["input_schema"]).ok
    with claude.messages.stream(model=MODEL, max_tokens=48, messages=ask, tools=[paris],
                                tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and [b.input for b in streamed] == [{"city": "Paris"}]
    turn = ask + [{"role": "assistant", "content": r.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                "content": "Sunny, 24 degrees."}]}]
    answer = claude.messages.create(model=MODEL, max_tokens=24, messages=turn, tools=[paris],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert_message_end(answer, 24)
    assert [b.type for b in answer.content] in (["text"], [])        # no tool_use: tool_choice none
    with_tools = claude.messages.count_tokens(model=MODEL, messages=ask, tools=[paris]).input_tokens
    without = claude.messages.count_tokens(model=MODEL, messages=ask).input_tokens
    assert with_tools > without + 20 and with_tools == r.usage.input_tokens + r.usage.cache_read_input_tokens


def test_thinking_and_other_fields_no_model_here_honours_are_accepted_and_ignored(claude):
    history = [{"role": "user", "content": "Hi."},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "greet back", "signature": "x"},
                                                 {"type": "text", "text": "Hello!"}]},
               {"role": "user", "content": [{"type": "text", "text": "Name a color.",
                                             "cache_control": {"type": "ephemeral"}}]}]
    r = claude.messages.create(model=MODEL, max_tokens=6, messages=history, metadata={"user_id": "u-1"},
                               thinking={"type": "enabled", "budget_tokens": 1024}, service_tier="auto",
                               extra_body={**GREEDY, "context_management": {"edits": []}, "mcp_servers": [],
                                           "output_config": {"effort": "low"}})
    assert_message_end(r, 6)
    assert [b.type for b in r.content] in (["text"], [])        # a text block, or none: the model's end token first


def test_the_beta_client_and_the_models_list_work(claude):
    r = claude.beta.messages.create(model=MODEL, max_tokens=4, messages=HELLO, betas=["prompt-caching-2024-07-31"])
    assert_message_end(r, 4)
    assert [b.type for b in r.content] in (["text"], []) and all(b.text for b in r.content)
    assert [m.id for m in claude.models.list().data] == [MODEL]
    assert claude.models.retrieve(MODEL).id == MODEL
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.models.retrieve("nope")
    anthropic_error(e.value, "not_found_error")


# ---- errors --------------------------------------------------------------------------------------------------

def test_bad_requests_are_anthropic_shaped_400s(claude, server):
    cases = [
        ({"messages": HELLO}, "max_tokens: Field required"),
        ({"max_tokens": 0, "messages": HELLO}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
         f"messages.0.content.1: image blocks are not supported: the model '{MODEL}' reads text only"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                     "content": [{"type": "document"}]}]}]},
         "document blocks are not supported"),
        ({"max_tokens": 4, "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "server tool 'web_search_20250305'"),
        ({"max_tokens": 4, "messages": HELLO + [{"role": "assistant", "content": "Red"}]}, "prefill"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0"),
        ({"max_tokens": "4", "messages": HELLO}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": 4, "messages": HELLO, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "any"}}, "needs tools"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                                                     "content": "1"}]}]},
         "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x"),
        ({"max_tokens": 4, "messages": HELLO * 2049}, "messages: List should have at most 2048 items"),
        ({"max_tokens": 2**63, "messages": HELLO}, "max_tokens: Input should be less than or equal to 1048576"),
    ]
    for extra, expected in cases:
        with pytest.raises(anthropic.BadRequestError) as e:      # the SDK's own request path, without its checks
            claude.post("/v1/messages", cast_to=object, body={"model": MODEL, **extra})
        assert expected in anthropic_error(e.value, "invalid_request_error"), (extra, e.value.body)
    with pytest.raises(anthropic.BadRequestError) as e:      # a streamed request refused: a 400, not a stream
        with claude.messages.stream(model=MODEL, messages=HELLO, max_tokens=4, stop_sequences=[""]):
            pass
    assert "stop_sequences" in anthropic_error(e.value, "invalid_request_error")
    r = httpx.post(server.root + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_models_paths_and_methods_are_anthropic_shaped(claude, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-nope", max_tokens=4, messages=HELLO)
    assert "'claude-nope' does not exist" in anthropic_error(e.value, "not_found_error")
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.count_tokens(model="claude-nope", messages=HELLO)
    anthropic_error(e.value, "not_found_error")
    r = httpx.get(server.root + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = httpx.post(server.root + "/v1/messages/nope", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(server.root + "/v1/chat/completions", json={"model": MODEL})       # OpenAI's shape stays
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_body_over_the_limit_is_a_413_in_anthropics_shape():
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "server": {"max_body_bytes": 2048}}) as srv:
        with pytest.raises(anthropic.APIStatusError) as e:
            sdk(srv.root).messages.create(model=MODEL, max_tokens=4,
                                          messages=[{"role": "user", "content": "x" * 4096}])
    assert e.value.status_code == 413
    anthropic_error(e.value, "request_too_large")


# ---- keys, limits, ledger, metrics -------------------------------------------------------------------------

KEYS = [{"key": "sk-a", "tenant": "a"}, {"key": "sk-once", "tenant": "b", "rpm": 1},
        {"key": "sk-other", "tenant": "c", "models": ["other"]}]


@pytest.fixture(scope="module")
def keyed():
    routes = {"other": {"strategy": "fixed", "models": [MODEL]}}
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "keys": KEYS, "routes": routes}) as srv:
        yield srv


def test_keys_by_x_api_key_or_bearer(keyed):
    r = sdk(keyed.root, "sk-a").messages.create(model=MODEL, max_tokens=3, messages=HELLO)
    assert r.type == "message" and r.model == MODEL
    assert_message_end(r, 3)
    bearer = anthropic.Anthropic(base_url=keyed.root, auth_token="sk-a", max_retries=0, timeout=120)
    assert bearer.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 5
    with pytest.raises(anthropic.AuthenticationError) as e:
        sdk(keyed.root, "sk-wrong").messages.create(model=MODEL, max_tokens=3, messages=HELLO)
    assert "Incorrect API key" in anthropic_error(e.value, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        sdk(keyed.root, "sk-wrong").messages.count_tokens(model=MODEL, messages=HELLO)
    with pytest.raises(anthropic.AuthenticationError):       # refused before the stream starts
        with sdk(keyed.root, "sk-wrong").messages.stream(model=MODEL, max_tokens=3, messages=HELLO):
            pass
    r = httpx.post(keyed.root + "/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": HELLO})
    assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]
    other = sdk(keyed.root, "sk-other")
    for call in (lambda: other.messages.create(model=MODEL, max_tokens=3, messages=HELLO),
                 lambda: other.messages.count_tokens(model=MODEL, messages=HELLO)):
        with pytest.raises(anthropic.PermissionDeniedError) as e:
            call()
        anthropic_error(e.value, "permission_error")
    assert [m.id for m in sdk(keyed.root, "sk-a").models.list().data] == [MODEL, "other"]
    assert [m.id for m in other.models.list().data] == ["other"]


def test_a_key_over_its_rate_limit_gets_a_429_rate_limit_error(keyed):
    once = sdk(keyed.root, "sk-once")
    once.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as e:
        once.messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    assert "1 requests per minute" in anthropic_error(e.value, "rate_limit_error")
    assert int(e.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError):
        with once.messages.stream(model=MODEL, max_tokens=2, messages=HELLO):
            pass


def test_the_ledger_and_the_metrics_say_messages(keyed):
    raw = sdk(keyed.root, "sk-a").messages.with_raw_response.create(model=MODEL, max_tokens=3, messages=HELLO)
    request_id = raw.headers["x-tokenomy-request-id"]
    with pytest.raises(anthropic.BadRequestError):
        sdk(keyed.root, "sk-a").messages.create(model=MODEL, max_tokens=3, messages=[])
    ledger = keyed.gateway.ledger
    ledger.flush()
    row = ledger.get(request_id)
    assert row.api == "messages" and row.status == 200 and row.tenant == "a" and row.model == MODEL
    assert row.completion_tokens == raw.parse().usage.output_tokens
    refused = [r for r in ledger.query() if r.api == "messages" and r.status == 400]
    assert refused and refused[-1].tenant == "a"
    metrics = httpx.get(keyed.root + "/metrics", headers={"authorization": "Bearer sk-a"}).text
    assert f'tokenomy_requests_total{{endpoint="messages",model="{MODEL}",status="ok"}}' in metrics


# ---- an OpenAI-compatible upstream behind the Messages API ------------------------------------------------

def upstream_config(port: int, broken_port: int) -> dict:
    remote = {"backend": "openai", "model": "stub", "tokenizer": MODEL, "max_retries": 0, "timeout_s": 30}
    return {"cache": NO_CACHE, "models": [
        {"name": "broken", "base_url": f"http://127.0.0.1:{broken_port}/v1", **remote},
        {"name": "remote", "base_url": f"http://127.0.0.1:{port}/v1", **remote}],
        "routes": {"chat": {"strategy": "fixed", "models": ["broken", "remote"]}}}


def test_a_fallback_to_an_openai_upstream_answers_in_messages_shape():
    with StubServer(Stub(tool_arguments='{"city": "Paris"}')) as stub, \
            StubServer(Stub(fail_status=500, fail_times=1000)) as broken, \
            live_server(upstream_config(stub.port, broken.port)) as gw:
        claude = sdk(gw.root)
        system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
        r = claude.messages.create(model="chat", max_tokens=16, messages=HELLO, system=system)
        assert r.content[0].text == "Hello from the stub." and r.stop_reason == "end_turn" and r.model == "remote"
        assert r.usage.input_tokens == 7 and r.usage.output_tokens == 5
        with claude.messages.stream(model="chat", max_tokens=16, messages=HELLO) as stream:
            assert "".join(stream.text_stream) == "Hello from the stub."
        stopped = claude.messages.create(model="chat", max_tokens=16, messages=HELLO, stop_sequences=["stub"])
        assert stopped.content[0].text == "Hello from the " and stopped.stop_reason == "stop_sequence"
        assert stopped.stop_sequence == "stub"
        tools = [{**WEATHER, "cache_control": {"type": "ephemeral"}}]
        call = claude.messages.create(model="chat", max_tokens=16, messages=HELLO, tools=tools)
        assert call.stop_reason == "tool_use"
        assert [(b.type, b.name, b.input) for b in call.content] == [("tool_use", "get_weather", {"city": "Paris"})]
        assert call.content[0].id == "toolu_stub1"
        with claude.messages.stream(model="chat", max_tokens=16, messages=HELLO, tools=tools) as stream:
            deltas = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert "".join(deltas) == '{"city": "Paris"}' and len(deltas) == 2
        assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"
        sent = stub.stub.bodies
        assert sent and all("cache_control" not in json.dumps(b) for b in sent)   # markers stay in tokenomy
        assert sent[-1]["tools"][0]["function"]["name"] == "get_weather"


def test_a_slow_first_token_starts_the_stream_with_pings_and_a_late_failure_is_an_error_event(monkeypatch):
    monkeypatch.setattr(messages_api, "FIRST_EVENT_S", 0.0)
    monkeypatch.setattr(messages_api, "PING_S", 0.05)
    body = {"model": "remote", "max_tokens": 8, "messages": HELLO, "stream": True}
    with StubServer(Stub(delay=1.0)) as slow, live_server(upstream_config(slow.port, slow.port)) as gw:
        with httpx.stream("POST", gw.root + "/v1/messages", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = sse_events(r)
        names = [n for n, _ in events]
        assert names[0] == "message_start" and names[1] == "ping" and names[-1] == "message_stop"
        first_block = names.index("content_block_start")
        assert set(names[1:first_block]) == {"ping"}
        text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
        assert text == "Hello from the stub."
        with sdk(gw.root).messages.stream(model="remote", max_tokens=8, messages=HELLO) as stream:
            assert "".join(stream.text_stream) == "Hello from the stub."    # the SDK skips the pings
        r = httpx.post(gw.root + "/v1/messages", json={**body, "model": "nope"})     # still known at once: a 404
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with StubServer(Stub(delay=5.0)) as slow, \
            live_server(upstream_config(slow.port, slow.port) | {"models": [
                {"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{slow.port}/v1",
                 "model": "stub", "tokenizer": MODEL, "max_retries": 0, "timeout_s": 1.0}], "routes": {}}) as gw:
        with httpx.stream("POST", gw.root + "/v1/messages", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = sse_events(r)
        assert events[0][0] == "message_start" and events[-1][0] == "error"
        assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] in ("api_error", "overloaded_error")
        assert "message_stop" not in [n for n, _ in events]


def test_an_upstream_failing_mid_stream_ends_the_stream_with_an_error_event():
    with StubServer(Stub(stall_after=2)) as stub, live_server(upstream_config(stub.port, stub.port) | {"models": [
            {"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{stub.port}/v1", "model": "stub",
             "tokenizer": MODEL, "max_retries": 0, "timeout_s": 1.0}], "routes": {}}) as gw:
        with pytest.raises(anthropic.APIStatusError) as e:
            with sdk(gw.root).messages.stream(model="remote", max_tokens=8, messages=HELLO) as stream:
                for _ in stream:
                    pass
        anthropic_error(e.value, "api_error")
