"""The embedded backend tokenizes a prompt once: the context stage's count is reused by generation."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from tests.conftest import SMALL_ENGINE
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.config import StructuredSettings
from tokenomy.engine.config import EngineConfig
from tokenomy.generation import GenRequest
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


@pytest.fixture(scope="module")
def backend():
    b = EmbeddedBackend("smollm2-135m-instruct", str(resolve_gguf("smollm2-135m-instruct")),
                        EngineConfig(**SMALL_ENGINE))
    yield b
    b.engine.stop()


def counting(backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = backend.engine.tokenizer.encode_chat

    def encode_chat(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(backend.engine.tokenizer, "encode_chat", encode_chat)
    return calls


async def answer(backend: EmbeddedBackend, req: GenRequest) -> tuple[str, int]:
    text, prompt_tokens = "", 0
    async for d in backend.stream(req):
        text += d.text
        if d.usage is not None:
            prompt_tokens = d.usage.prompt_tokens
    return text, prompt_tokens


def test_count_then_generate_tokenizes_once(backend, monkeypatch) -> None:
    calls = counting(backend, monkeypatch)
    req = GenRequest(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Say hi."}],
                     params={"max_tokens": 4, "temperature": 0})
    count = backend.count_tokens(req)
    # The generate stage re-targets the request with dataclasses.replace: same inputs, so the ids are reused.
    text, prompt_tokens = asyncio.run(answer(backend, dataclasses.replace(req, request_id="r1")))
    assert calls[0] == 1
    assert prompt_tokens == count.tokens and text


def test_changed_messages_are_tokenized_again(backend, monkeypatch) -> None:
    calls = counting(backend, monkeypatch)
    req = GenRequest(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Say hi."}],
                     params={"max_tokens": 4, "temperature": 0})
    short = backend.count_tokens(req).tokens
    longer = dataclasses.replace(req, messages=[{"role": "user", "content": "Say hi to my friend Ada, please."}])
    _, prompt_tokens = asyncio.run(answer(backend, longer))
    assert calls[0] == 2  # a stale count is never used for a different prompt
    assert prompt_tokens > short
    other = dataclasses.replace(req, model="gemma")
    other.counted = ("another-backend", *req.counted[1:])
    assert backend.prompt_tokens(other) and calls[0] == 3  # another backend's ids are never trusted


def test_a_count_with_tools_counts_the_tools_text_the_engine_is_fed(backend, monkeypatch) -> None:
    calls = counting(backend, monkeypatch)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    req = GenRequest(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Weather in Paris?"}],
                     params={"max_tokens": 64, "temperature": 0}, tools=tools, tool_choice="required")
    bare = backend.count_tokens(dataclasses.replace(req, tools=None, tool_choice=None)).tokens
    count = backend.count_tokens(req).tokens
    _, prompt_tokens = asyncio.run(answer(backend, dataclasses.replace(req, request_id="r2")))
    assert prompt_tokens == count > bare + 20      # the tools' system text is counted, as it is fed
    assert calls[0] == 2                           # and the count's ids are the ones generated from


def structured_backend(**settings) -> EmbeddedBackend:
    return EmbeddedBackend("smollm2-135m-instruct", str(resolve_gguf("smollm2-135m-instruct")),
                           EngineConfig(**SMALL_ENGINE), structured=StructuredSettings(**settings))


def schema_request(schema: dict, prompt: str, max_tokens: int, bias: dict[int, float] | None = None) -> GenRequest:
    params: dict = {"max_tokens": max_tokens, "temperature": 0}
    if bias:
        params["logit_bias"] = {str(t): b for t, b in bias.items()}
    return GenRequest(model="smollm2-135m-instruct", messages=[{"role": "user", "content": prompt}], params=params,
                      response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})


def token(backend: EmbeddedBackend, piece: str) -> int:
    """The one token id whose text is `piece`."""
    ids = backend.engine.tokenizer.encode(piece, add_special=False)
    assert len(ids) == 1 and backend.engine.tokenizer.decode(ids) == piece, (piece, ids)
    return ids[0]


async def finish(backend: EmbeddedBackend, req: GenRequest) -> tuple[str, str | None, int]:
    text, reason, completion = "", None, 0
    async for d in backend.stream(req):
        text += d.text
        if d.finish_reason is not None:
            reason, completion = d.finish_reason, d.usage.completion_tokens if d.usage else 0
    return text, reason, completion


def test_wrap_up_ends_a_long_answer_as_valid_json() -> None:
    """A logit_bias of +100 on two words makes the story run on whatever the model would write: greedy takes one
    of them at every step the grammar allows it (the loop breaker bans at most one token a step), so the string
    never closes by itself. Without wrap-up the answer is cut at max_tokens as JSON that does not parse; with it,
    past its soft limit the mask keeps only closing tokens (the bias cannot reach a masked token) and the answer
    ends as valid JSON inside max_tokens."""
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    plain, wrapped = structured_backend(), structured_backend(wrap_up=0.5)
    try:
        words = {token(plain, " Rome"): 100.0, token(plain, " history"): 100.0}
        req = schema_request(schema, "Tell me everything you know about the history of Rome, in detail.", 24, words)
        text, reason, completion = asyncio.run(finish(plain, req))
        assert reason == "length" and completion == 24, (reason, completion, text)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
        text, reason, completion = asyncio.run(finish(wrapped, req))
        assert reason == "stop" and completion <= 24, (reason, completion, text)
        assert isinstance(json.loads(text)["story"], str), text
    finally:
        plain.engine.stop()
        wrapped.engine.stop()


def test_max_array_items_bounds_unbounded_lists() -> None:
    """A logit_bias of +100 on '",' (close an item, then the comma before the next) makes the model start another
    item whenever the grammar lets it: unbounded, the list grows until wrap-up closes it; bounded to two, the
    grammar refuses the third item and the list has exactly two."""
    schema = {"type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string"}}},
              "required": ["fruits"]}
    b, free = structured_backend(max_array_items=2, wrap_up=0.8), structured_backend(wrap_up=0.8)
    try:
        req = schema_request(schema, "Name five fruits: apple, banana and three more.", 64,
                             {token(free, '",'): 100.0})
        text, reason, completion = asyncio.run(finish(free, req))
        assert reason == "stop" and completion <= 64, (reason, completion, text)
        assert len(json.loads(text)["fruits"]) > 2, text
        text, reason, completion = asyncio.run(finish(b, req))
        assert reason == "stop" and completion <= 64, (reason, completion, text)
        fruits = json.loads(text)["fruits"]
        assert len(fruits) == 2 and all(isinstance(f, str) for f in fruits), text
    finally:
        b.engine.stop()
        free.engine.stop()


def test_a_fresh_engine_answers_a_short_structured_request_as_it_does_with_room_to_spare() -> None:
    """Issue 49: the first grammar of a process was timed with the tokenizer's one-time tables, judged too slow to
    re-plan, and wound down from its first token whenever max_tokens was modest. Each engine here is a fresh
    process; the modest budget is the roomy answer's length over the shipped wrap-up share, so the answer fits
    before any wrap-up is due whatever the model writes."""
    from tokenomy.models.catalog import SMALL_MODEL_STRUCTURED

    share = SMALL_MODEL_STRUCTURED["wrap_up"]
    schema = {"type": "object", "properties": {"status": {"type": "string"}, "value": {"type": "integer"}},
              "required": ["status", "value"]}
    prompt = "status=ok and value=42"
    roomy_backend = structured_backend(**SMALL_MODEL_STRUCTURED)
    try:
        roomy, reason, used = asyncio.run(finish(roomy_backend, schema_request(schema, prompt, 300)))
    finally:
        roomy_backend.engine.stop()
    assert reason == "stop" and used < 300 * share
    modest_tokens = int(used / share) + 2
    fresh = structured_backend(**SMALL_MODEL_STRUCTURED)
    try:
        modest, reason, _ = asyncio.run(finish(fresh, schema_request(schema, prompt, modest_tokens)))
    finally:
        fresh.engine.stop()
    assert reason == "stop" and modest == roomy
