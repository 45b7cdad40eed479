"""The generate stage (tokenomy/pipeline/generate.py): a model's request defaults (models[].defaults) fill what a
request leaves unset, and a request's own values win; with the real SmolLM2 and an upstream stub."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import NO_CACHE, SMALL_ENGINE, live_server
from tests.helpers.upstream_stub import Stub
from tests.pipeline.test_gateway_upstream import StubServer

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

HELLO = [{"role": "user", "content": "Count to ten."}]


def test_a_models_defaults_fill_what_the_request_leaves_unset() -> None:
    cfg = {"engine": SMALL_ENGINE, "cache": NO_CACHE, "models": [
        {"name": "terse", "gguf": "smollm2-135m-instruct", "defaults": {"max_tokens": 5, "temperature": 0}}]}
    with live_server(cfg) as s:
        def ask(**kw: object) -> dict:
            r = httpx.post(s.base_url + "/chat/completions", timeout=120,
                           json={"model": "terse", "messages": HELLO, "ignore_eos": True, **kw})
            assert r.status_code == 200, r.text
            return r.json()

        first, again = ask(), ask()
        assert first["usage"]["completion_tokens"] == 5 and first["choices"][0]["finish_reason"] == "length"
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]   # greedy
        assert ask(max_tokens=9)["usage"]["completion_tokens"] == 9          # the request's own wins


def test_an_upstream_gets_the_defaults_in_its_body_and_the_reserve_holds_them() -> None:
    with StubServer(Stub()) as stub:
        cfg = {"cache": NO_CACHE, "models": [
            {"name": "up", "backend": "openai", "base_url": f"http://127.0.0.1:{stub.port}/v1", "model": "stub",
             "tokenizer": "smollm2-135m-instruct", "max_retries": 0, "defaults": {"max_tokens": 7, "top_p": 0.5}}]}
        with live_server(cfg) as s:
            r = httpx.post(s.base_url + "/chat/completions", timeout=60, json={"model": "up", "messages": HELLO})
            assert r.status_code == 200, r.text
            r = httpx.post(s.base_url + "/chat/completions", timeout=60,
                           json={"model": "up", "messages": HELLO, "max_tokens": 3, "top_p": 0.9})
            assert r.status_code == 200, r.text
        sent = stub.stub.bodies
        assert (sent[0]["max_tokens"], sent[0]["top_p"]) == (7, 0.5)
        assert (sent[1]["max_tokens"], sent[1]["top_p"]) == (3, 0.9)


def test_defaults_are_checked_when_the_file_is_read() -> None:
    from tokenomy.config import Config, ConfigError

    with pytest.raises((ConfigError, ValueError), match="max_tokens"):
        Config.model_validate({"models": [{"name": "x", "gguf": "smollm2-135m-instruct",
                                           "defaults": {"max_tokens": 0}}]})
    with pytest.raises((ConfigError, ValueError), match="seed|extra|not permitted"):
        Config.model_validate({"models": [{"name": "x", "gguf": "smollm2-135m-instruct",
                                           "defaults": {"top_p": 0.5, "seed": 1}}]})
