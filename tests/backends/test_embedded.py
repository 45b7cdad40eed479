"""The embedded backend tokenizes a prompt once: the context stage's count is reused by generation."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.conftest import SMALL_ENGINE
from tokenomy.backends.base import GenRequest
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.engine.engine import EngineConfig
from tokenomy.models import resolve_gguf


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
