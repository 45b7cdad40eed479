"""`backend: anthropic`: the internal request as a Messages body (checked against the official SDK's types), the
answer read back from a fake Messages server (tests/helpers/messages_stub.py), its errors, prompt-cache markers, the key
from the environment, and a model served through the gateway with a fallback when it fails."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from pydantic import TypeAdapter
from typer.testing import CliRunner

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.messages_stub import DEFAULT_TEXT, Failure, MessagesStub, text, tool_use
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.backends.anthropic import AnthropicBackend
from tokenomy.backends.anthropic_request import JSON_TOOL, messages_request
from tokenomy.backends.base import BackendError, InvalidRequest
from tokenomy.backends.openai import OpenAIBackend
from tokenomy.config import AnthropicModelSpec, Config, ConfigError
from tokenomy.generation import Delta, GenRequest
from tokenomy.pipeline.generate import merge_tool_calls

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

KEY_ENV = "TOKENOMY_TEST_ANTHROPIC_KEY"
KEY = "sk-ant-test-123"
MARK = {"type": "ephemeral"}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALLS = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
         {"id": "call.2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]
TOOL_TURN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and Rome?"},
             {"role": "assistant", "content": None, "tool_calls": CALLS},
             {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
             {"role": "tool", "tool_call_id": "call.2", "content": "rain"}]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture
def stub() -> Iterator[tuple[MessagesStub, int]]:
    s = MessagesStub(key=KEY)
    with StubServer(s) as server:        # type: ignore[arg-type]   (any ASGI app)
        yield s, server.port


def spec(port: int = 9, **kw: Any) -> AnthropicModelSpec:
    return AnthropicModelSpec(**{"name": "claude", "backend": "anthropic", "base_url": f"http://127.0.0.1:{port}",
                                 "model": "claude-stub", "api_key_env": KEY_ENV, "timeout_s": 10, **kw})


def chat(messages: list[dict[str, Any]] | None = None, **kw: Any) -> GenRequest:
    return GenRequest(model="claude", messages=messages or [{"role": "user", "content": "Hi"}], **kw)


def answer(backend: AnthropicBackend, req: GenRequest) -> list[Delta]:
    async def go() -> list[Delta]:
        try:
            return [d async for d in backend.stream(req)]
        finally:
            await backend.close()
    return asyncio.run(go())


def materialized(x: Any) -> Any:
    """A value validated by pydantic against the SDK's TypedDicts, its lazily checked iterables read out."""
    if isinstance(x, dict):
        return {k: materialized(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or type(x).__name__ == "ValidatorIterator":
        return [materialized(v) for v in x]
    return x


def assert_valid(body: dict[str, Any]) -> None:
    """The body is a streamed MessageCreateParams of the official `anthropic` SDK, with no key it does not know
    (a dropped key would make the validated copy differ)."""
    assert materialized(TypeAdapter(MessageCreateParamsStreaming).validate_python(body)) == body


# ---- the request -----------------------------------------------------------------------------------------------

def test_a_conversation_with_tool_calls_becomes_messages_blocks() -> None:
    req = chat(TOOL_TURN, tools=[WEATHER], params={"max_tokens": 50, "temperature": 1.5, "top_p": 0.9, "top_k": 20,
                                                   "stop": ["END", "\n"], "seed": 7, "presence_penalty": 1.0},
               user="u-42")
    body = messages_request(req, "claude-stub", 4096).body
    assert_valid(body)
    assert body == {
        "model": "claude-stub", "max_tokens": 50, "stream": True,      # no sampling keys: see below
        "stop_sequences": ["END"],                       # "\n" is matched by the backend: Messages refuses it
        "metadata": {"user_id": "u-42"},
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [                 # both results in one user turn
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "rain"}]}],
        "tools": [{"name": "weather", "description": "The weather in a city.",
                   "input_schema": WEATHER["function"]["parameters"]}]}
    # a Messages server that honours sampling (`sampling: true`; not Claude after Opus 4.6, nor today's SDK types)
    sampled = messages_request(req, "claude-stub", 4096, sampling=True).body
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (1.0, 0.9, 20)   # temperature at most 1
    no_max = messages_request(chat(), "claude-stub", 777).body
    assert no_max["max_tokens"] == 777 and "tools" not in no_max and "system" not in no_max
    completion = messages_request(GenRequest(model="claude", kind="completion", prompt="Once upon"), "m", 9).body
    assert completion["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Once upon"}]}]


@pytest.mark.parametrize("choice,response_format,want_choice,json_tool", [
    ("auto", None, {"type": "auto"}, None),
    ("required", None, {"type": "any"}, None),
    ("none", None, {"type": "none"}, None),
    ({"type": "function", "function": {"name": "weather"}}, None, {"type": "tool", "name": "weather"}, None),
    (None, {"type": "json_object"}, {"type": "any"}, JSON_TOOL),            # a client tool, or the answer
    ("none", {"type": "json_object"}, {"type": "tool", "name": JSON_TOOL}, JSON_TOOL),
    ("required", {"type": "json_object"}, {"type": "any"}, None),           # a tool call is required: no answer
])
def test_tool_choice_and_response_format(choice: Any, response_format: Any, want_choice: dict, json_tool: Any) -> None:
    asked = messages_request(chat(tools=[WEATHER], tool_choice=choice, response_format=response_format), "m", 64)
    assert_valid(asked.body)
    assert asked.body["tool_choice"] == want_choice and asked.json_tool == json_tool
    names = [t["name"] for t in asked.body["tools"]]
    assert names == (["weather", JSON_TOOL] if json_tool else ["weather"])


def test_a_json_schema_answer_is_asked_for_by_a_forced_tool() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    asked = messages_request(chat(response_format={"type": "json_schema", "json_schema": {"name": "c", "schema":
                                                                                         schema}}), "m", 64)
    assert asked.body["tools"] == [{"name": JSON_TOOL, "description": asked.body["tools"][0]["description"],
                                    "input_schema": schema}]
    assert asked.body["tool_choice"] == {"type": "tool", "name": JSON_TOOL} and not asked.wrapped
    listed = messages_request(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "l", "schema": {"type": "array", "items": {"type": "integer"}}}}), "m", 64)
    assert listed.wrapped and listed.body["tools"][0]["input_schema"] == {
        "type": "object", "properties": {"answer": {"type": "array", "items": {"type": "integer"}}},
        "required": ["answer"]}


@pytest.mark.parametrize("req,fragment", [
    (chat([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]),
     "arguments are not JSON"),
    (chat([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]), "JSON object"),
    (chat([{"role": "system", "content": "only a system prompt"}]), "at least one user or assistant message"),
    (chat(tools=[{"type": "code_interpreter"}]), "only function tools"),
    (chat(tools=[{"type": "function", "function": {"name": JSON_TOOL}}], response_format={"type": "json_object"}),
     "may not be named"),
    (chat(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
])
def test_what_messages_cannot_express_is_a_clear_invalid_request(req: GenRequest, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        messages_request(req, "m", 64)


def _marks(body: dict[str, Any]) -> list[str]:
    """Where the body's cache breakpoints are: tool names, system[i], messages[i] (the message of the block)."""
    out = [f"tool {t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    out += [f"system[{i}]" for i, b in enumerate(body.get("system", [])) if "cache_control" in b]
    for i, m in enumerate(body["messages"]):
        out += [f"messages[{i}]" for b in m["content"] if "cache_control" in b]
    return out


def test_cache_markers_are_kept_placed_on_the_stable_prefix_and_never_more_than_four() -> None:
    conversation = [{"role": "system", "content": "Rules.", "cache_control": MARK},
                    {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                    {"role": "user", "content": "Q2", "cache_control": MARK}]
    tools = [{**WEATHER, "cache_control": MARK}]
    req = chat(copy.deepcopy(conversation), tools=tools)
    keep = messages_request(req, "m", 64, "keep").body
    assert_valid(keep)
    assert _marks(keep) == ["tool weather", "system[0]", "messages[2]"]
    assert keep["system"][0]["cache_control"] == MARK and keep["messages"][2]["content"][-1]["cache_control"] == MARK
    # auto: the answer before the newest user turn is the end of what the last request sent and got back
    auto = messages_request(req, "m", 64, "auto").body
    assert_valid(auto)
    assert _marks(auto) == ["tool weather", "system[0]", "messages[1]", "messages[2]"]
    assert _marks(messages_request(req, "m", 64, "off").body) == []
    unmarked = chat([{k: v for k, v in m.items() if k != "cache_control"} for m in conversation], tools=[WEATHER])
    assert _marks(messages_request(unmarked, "m", 64, "auto").body) == ["system[0]", "messages[1]"]
    no_system = chat([{"role": "user", "content": "Q1"}], tools=[WEATHER])
    assert _marks(messages_request(no_system, "m", 64, "auto").body) == ["tool weather"]   # end of the tools
    # four marked by the client already: auto adds none (Messages refuses a fifth)
    full = chat([{"role": "system", "content": "S", "cache_control": MARK}] + [
        {"role": r, "content": f"t{i}", "cache_control": MARK} for i, r in enumerate(["user", "assistant", "user"])]
        + [{"role": "assistant", "content": "t3"}, {"role": "user", "content": "t4"}])
    marks = _marks(messages_request(full, "m", 64, "auto").body)
    assert len(marks) == 4 and "messages[3]" not in marks
    assert req.messages == conversation, "the internal request is left as it was"


def test_the_openai_upstream_strips_cache_markers() -> None:
    from tokenomy.config import OpenAIModelSpec

    b = OpenAIBackend(OpenAIModelSpec(name="up", backend="openai", base_url="http://127.0.0.1:9/v1"))
    _, body = b._body(chat([{"role": "user", "content": "Hi", "cache_control": MARK}],
                           tools=[{**WEATHER, "cache_control": MARK}]))
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["tools"] == [WEATHER]
    plain = chat()
    assert b._body(plain)[1]["messages"] is plain.messages          # nothing to strip: not copied
    asyncio.run(b.close())


# ---- the answer, against a fake Messages server ----------------------------------------------------------------

@pytest.mark.parametrize("json_answers", [False, True], ids=["sse", "one-json-message"])
def test_a_plain_answer_with_cache_reads_and_writes_in_its_usage(stub: Any, json_answers: bool) -> None:
    s, port = stub
    s.json_answers = json_answers
    s.replies.append(text(input_tokens=20, cache_read=300, cache_write=40, output_tokens=6))
    deltas = answer(AnthropicBackend(spec(port)), chat())
    assert "".join(d.text for d in deltas) == DEFAULT_TEXT
    if not json_answers:
        assert len([d for d in deltas if d.text]) > 1                       # streamed in pieces
    last = deltas[-1]
    assert last.finish_reason == "stop"
    u = last.usage
    assert (u.prompt_tokens, u.cached_tokens, u.cache_write_tokens, u.completion_tokens) == (360, 300, 40, 6)
    assert not u.counted and u.ttft_s is not None
    (r,) = s.requests
    assert r["path"] == "/v1/messages" and r["headers"]["authorization"] == f"Bearer {KEY}"
    assert r["headers"]["anthropic-version"] == "2023-06-01"
    assert_valid(r["body"])


def test_an_answer_without_usage_is_counted_and_marked_so(stub: Any) -> None:
    s, port = stub
    s.replies.append(text(usage=False))
    deltas = answer(AnthropicBackend(spec(port, tokenizer="smollm2-135m-instruct")), chat())
    u = deltas[-1].usage
    assert u.counted and u.prompt_tokens > 0 and u.completion_tokens > 0 and u.cache_write_tokens == 0


def test_a_tool_call_round_trip(stub: Any) -> None:
    s, port = stub
    s.replies += [tool_use("weather", {"city": "Paris"}, tool_id="toolu_01A"), text("Sunny in Paris.")]
    first = chat([{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER])
    deltas = answer(AnthropicBackend(spec(port)), first)
    calls = merge_tool_calls([c for d in deltas for c in d.tool_calls or []])
    assert calls == [{"id": "toolu_01A", "type": "function",
                      "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]
    assert deltas[-1].finish_reason == "tool_calls"
    second = chat(first.messages + [{"role": "assistant", "content": None, "tool_calls": calls},
                                    {"role": "tool", "tool_call_id": "toolu_01A", "content": "sunny, 24 C"}],
                  tools=[WEATHER])
    deltas = answer(AnthropicBackend(spec(port)), second)
    assert "".join(d.text for d in deltas) == "Sunny in Paris." and deltas[-1].finish_reason == "stop"
    sent = s.bodies[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01A", "name": "weather",
                                                         "input": {"city": "Paris"}}]}
    assert sent[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A",
                                                    "content": "sunny, 24 C"}]}
    for body in s.bodies:
        assert_valid(body)


def test_a_json_answer_comes_back_as_text(stub: Any) -> None:
    s, port = stub
    s.replies += [tool_use(JSON_TOOL, {"city": "Paris", "degrees": 24}), tool_use(JSON_TOOL, {"answer": [1, 2, 3]})]
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
    deltas = answer(AnthropicBackend(spec(port)), chat(response_format=fmt))
    assert json.loads("".join(d.text for d in deltas)) == {"city": "Paris", "degrees": 24}
    assert deltas[-1].finish_reason == "stop" and not any(d.tool_calls for d in deltas)
    fmt = {"type": "json_schema", "json_schema": {"name": "l", "schema": {"type": "array"}}}
    deltas = answer(AnthropicBackend(spec(port)), chat(response_format=fmt))
    assert json.loads("".join(d.text for d in deltas)) == [1, 2, 3]          # unwrapped


def test_stop_sequences_and_max_tokens(stub: Any) -> None:
    s, port = stub
    s.replies += [text("Count: one two", stop_reason="stop_sequence", stop_sequence="three"),
                  text("Count: one", stop_reason="max_tokens"),
                  text("first line\nsecond line", input_tokens=15, cache_read=5, output_tokens=40)]
    deltas = answer(AnthropicBackend(spec(port)), chat(params={"stop": "three"}))
    assert deltas[-1].finish_reason == "stop" and s.bodies[0]["stop_sequences"] == ["three"]
    deltas = answer(AnthropicBackend(spec(port)), chat(params={"max_tokens": 2}))
    assert deltas[-1].finish_reason == "length" and s.bodies[1]["max_tokens"] == 2
    # a newline stop, which Messages refuses: the backend cuts the answer itself and counts what it kept
    deltas = answer(AnthropicBackend(spec(port, tokenizer="smollm2-135m-instruct")), chat(params={"stop": ["\n"]}))
    assert "".join(d.text for d in deltas) == "first line" and deltas[-1].finish_reason == "stop"
    u = deltas[-1].usage
    assert "stop_sequences" not in s.bodies[2] and u.counted
    assert (u.prompt_tokens, u.cached_tokens) == (20, 5) and 0 < u.completion_tokens < 40


def test_a_bad_request_is_not_retried(stub: Any) -> None:
    s, port = stub
    s.failures.append(Failure(400, "invalid_request_error", message="messages: roles must alternate"))
    with pytest.raises(InvalidRequest, match="roles must alternate"):
        answer(AnthropicBackend(spec(port, max_retries=3)), chat())
    assert len(s.requests) == 1


def test_busy_upstreams_are_retried_as_retry_after_says_then_handed_up(stub: Any) -> None:
    # the statuses' meaning is the upstream client's (tests/backends/test_upstream.py has the whole table)
    s, port = stub
    s.failures += [Failure(429, "rate_limit_error", retry_after="0"), Failure(529, "overloaded_error", "0")]
    deltas = answer(AnthropicBackend(spec(port, max_retries=2)), chat())
    assert "".join(d.text for d in deltas) == DEFAULT_TEXT and len(s.requests) == 3
    # a wait longer than the backend waits out goes up at once, with the upstream's retry-after
    s.failures.append(Failure(529, "overloaded_error", retry_after="30"))
    with pytest.raises(BackendError) as e:
        answer(AnthropicBackend(spec(port, max_retries=2)), chat())
    assert (e.value.status, e.value.retry_after, e.value.retryable) == (503, 30, True) and len(s.requests) == 4
    s.failures += [Failure(429, "rate_limit_error", retry_after="0")] * 2
    with pytest.raises(BackendError, match="after 2 tries"):
        answer(AnthropicBackend(spec(port, max_retries=1)), chat())
    s.failures += [Failure(503, "api_error", retry_after="7")]
    with pytest.raises(BackendError) as err:
        answer(AnthropicBackend(spec(port, max_retries=0)), chat())
    assert err.value.retryable and err.value.retry_after == 7


def test_a_wrong_key_or_model_fails_this_deployment_only(stub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s, port = stub
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    with pytest.raises(BackendError, match=f"answered 401; check \\${KEY_ENV}\\).*invalid API key") as e:
        answer(AnthropicBackend(spec(port, max_retries=3)), chat())
    assert e.value.retryable and e.value.lasting and len(s.requests) == 1   # another model may serve; not asked again


def test_an_error_event_mid_stream_is_a_backend_error(stub: Any) -> None:
    s, port = stub
    s.replies.append(text(error_after_start={"type": "overloaded_error", "message": "Overloaded"}))
    with pytest.raises(BackendError, match="overloaded_error: Overloaded"):
        answer(AnthropicBackend(spec(port)), chat())


# ---- the key -----------------------------------------------------------------------------------------------------

def test_the_key_comes_from_the_environment_and_its_absence_stops_the_start(stub: Any, tmp_path: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    s, port = stub
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match=f"\\${KEY_ENV}, which is not set"):
        AnthropicBackend(spec(port))
    assert "anthropic" in repr(AnthropicBackend(spec(port, api_key_env=None))).lower()
    s.key = None                                        # a Messages server that needs no key gets none
    answer(AnthropicBackend(spec(port, api_key_env=None)), chat())
    assert "authorization" not in s.requests[-1]["headers"] and "x-api-key" not in s.requests[-1]["headers"]
    monkeypatch.setenv(KEY_ENV, KEY)
    assert KEY not in repr(AnthropicBackend(spec(port)))
    assert Config.model_validate({"models": [{"name": "c", "backend": "anthropic"}]}).models[0].api_key_env == \
        "ANTHROPIC_API_KEY"
    # `tokenomy serve` refuses to start, naming the variable, before it loads any model
    from tokenomy.cli import app

    monkeypatch.delenv(KEY_ENV)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"models:\n  - {{name: small, gguf: smollm2-135m-instruct}}\n"
                   f"  - {{name: claude, backend: anthropic, api_key_env: {KEY_ENV}}}\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(cfg), "--port", "9"])
    assert result.exit_code == 1 and f"${KEY_ENV}, which is not set" in result.stderr


# ---- through the gateway ---------------------------------------------------------------------------------------

PRICE = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}


def gateway_config(port: int) -> dict[str, Any]:
    return {"engine": SMALL_ENGINE, "cache": NO_CACHE,
            "models": [{"name": "claude", "backend": "anthropic", "base_url": f"http://127.0.0.1:{port}",
                        "model": "claude-stub", "api_key_env": KEY_ENV, "max_retries": 0, "timeout_s": 30,
                        "price": PRICE},
                       {"name": "local", "backend": "embedded", "gguf": "smollm2-135m-instruct"}],
            "routes": {"chat": {"strategy": "fixed", "models": ["claude", "local"]}},
            "cooldown": {"failures": 5, "window_s": 60, "cooldown_s": 60}}


def test_a_chat_completion_served_by_a_messages_upstream_priced_and_falling_back(stub: Any) -> None:
    s, port = stub
    msg = [{"role": "user", "content": "Say hi."}]
    with live_server(gateway_config(port)) as gw:
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        s.replies.append(text(input_tokens=20, cache_read=1000, cache_write=200, output_tokens=6))
        raw = c.chat.completions.with_raw_response.create(model="chat", messages=msg, max_tokens=16)
        r = raw.parse()
        assert r.choices[0].message.content == DEFAULT_TEXT and r.model == "claude"
        assert raw.headers["x-tokenomy-route"].startswith("claude")
        assert (r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens) == (1220, 1000)
        want = (20 * 3.0 + 1000 * 0.3 + 200 * 3.75 + 6 * 15.0) / 1e6
        assert float(raw.headers["x-tokenomy-cost-usd"]) == pytest.approx(want, abs=1e-8)   # printed to 8 places
        assert s.bodies[-1]["max_tokens"] == 16 and s.bodies[-1]["model"] == "claude-stub"

        s.replies.append(text("Streamed hello.", input_tokens=30))
        chunks = list(c.chat.completions.create(model="claude", messages=msg, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == "Streamed hello."
        assert chunks[-1].usage.prompt_tokens == 30

        # the upstream fails (5xx, or overloaded beyond what is worth waiting): the route's next model answers
        s.failures += [Failure(500, "api_error"), Failure(529, "overloaded_error", retry_after="60")]
        for _ in range(2):
            raw = c.chat.completions.with_raw_response.create(model="chat", messages=msg, max_tokens=4,
                                                              temperature=0)
            assert raw.headers["x-tokenomy-route"].startswith("local") and "fell back to local" in \
                raw.headers["x-tokenomy-route"]
            assert raw.parse().model == "local"
        # pinned to it, with nothing to fall back on: Anthropic's overload reaches the client as a 503 with its wait
        # (docs/upstreams.md, "Failures": the deployment is busy, not the client over its own rate)
        s.failures.append(Failure(529, "overloaded_error", retry_after="60"))
        resp = httpx.post(gw.base_url + "/chat/completions", json={"model": "claude", "messages": msg})
        assert resp.status_code == 503 and resp.headers["retry-after"] == "60"
        s.failures.append(Failure(400, "invalid_request_error", message="prompt is too long"))
        resp = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": msg})
        assert resp.status_code == 400 and "prompt is too long" in resp.json()["error"]["message"]

        assert gw.gateway.ledger.flush()
        rows = gw.gateway.ledger.query()
        first = rows[0]
        assert (first.model, first.backend, first.prompt_tokens, first.cached_tokens, first.cache_write_tokens) == \
            ("claude", "anthropic", 1220, 1000, 200)
        assert first.cost_input_usd == pytest.approx(20 * 3.0 / 1e6)
        assert first.cost_cached_input_usd == pytest.approx(1000 * 0.3 / 1e6)
        assert first.cost_cache_write_usd == pytest.approx(200 * 3.75 / 1e6) and first.price_cache_write == 3.75
        assert first.cost_usd == pytest.approx(want)
        assert [r.model for r in rows[2:4]] == ["local", "local"] and rows[2].cache_write_tokens == 0
        from tokenomy.report.crosscheck import row_problems
        from tokenomy.report.figures import figures

        assert row_problems([r.to_db() for r in rows]) == []
        shown = figures(rows)                  # what `tokenomy report` and the dashboard show
        assert shown["tokens"]["cache_write"] == 200
        assert shown["cost_usd"]["cache_write"] == pytest.approx(200 * 3.75 / 1e6)


def test_the_stub_answers_as_the_official_sdk_reads_messages(stub: Any) -> None:
    """The fake server is only worth testing against if Anthropic's own client reads it."""
    import anthropic

    s, port = stub
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0)
    s.replies += [tool_use("weather", {"city": "Paris"}, cache_read=5, cache_write=7), text()]
    with client.messages.stream(model="m", max_tokens=32, messages=[{"role": "user", "content": "Hi"}]) as st:
        final = st.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Paris"}
    assert (final.stop_reason, final.usage.cache_read_input_tokens, final.usage.cache_creation_input_tokens) == \
        ("tool_use", 5, 7)
    whole = client.messages.create(model="m", max_tokens=32, messages=[{"role": "user", "content": "Hi"}])
    assert whole.content[0].text == DEFAULT_TEXT and whole.stop_reason == "end_turn"
