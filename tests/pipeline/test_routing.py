"""Route strategies with two real embedded models (SmolLM2-135M and Gemma-3-270M) and an upstream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.pipeline.test_gateway_upstream import StubServer
from tests.upstream_stub import Stub

ENGINE = {"n_ctx": 2048, "max_model_len": 1024, "max_running": 4, "max_retired": 4, "max_batch_tokens": 128}


def config(extra_models=(), **routes):
    return {"engine": ENGINE, "cache": NO_CACHE,
            # wrap-up off: the small model's answers may be cut inside their JSON, which the cascade judges
            "models": [{"name": "small", "gguf": "smollm2-135m-instruct", "structured": {"wrap_up": None}},
                       {"name": "big", "gguf": "gemma3-270m", "engine": {**ENGINE, "max_running": 1}},
                       *extra_models],
            "routes": routes}


ROUTES = {
    "ruled": {"strategy": "rules", "models": ["small", "big"], "rules": [
        {"when": {"keywords": ["prove", "theorem"]}, "model": "big"},
        {"when": {"has_response_format": True}, "model": "big"},
        {"when": {"metadata": {"tier": "gold"}}, "model": "big"}]},
    "always_escalate": {"strategy": "cascade", "models": ["small", "big"], "cascade": {"min_mean_logprob": 0.0}},
    "never_escalate": {"strategy": "cascade", "models": ["small", "big"],
                       "cascade": {"min_mean_logprob": -100, "min_token_logprob": -100,
                                   "escalate_on_truncated": False}},
    "json_cascade": {"strategy": "cascade", "models": ["small", "big"],
                     "cascade": {"min_mean_logprob": -100, "min_token_logprob": -100,
                                 "escalate_on_truncated": False}},
    "shed": {"strategy": "load", "models": ["small", "big"], "load": {"slo_queue_s": 0.05}},
}


@pytest.fixture(scope="module")
def gw():
    with live_server(config(**ROUTES)) as s:
        yield s


def ask(gw, model, content="Say hi.", headers=None, **kw):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            **kw}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_rules_route_as_configured(gw):
    assert ask(gw, "ruled").json()["model"] == "small"
    r = ask(gw, "ruled", "Prove that 2 is prime.")
    assert r.json()["model"] == "big" and "rule 0" in r.headers["x-tokenomy-route"]
    assert ask(gw, "ruled", response_format={"type": "json_object"}).json()["model"] == "big"
    assert ask(gw, "ruled", headers={"x-tokenomy-meta-tier": "gold"}).json()["model"] == "big"


def test_cascade_escalates_on_low_confidence_and_keeps_confident_answers(gw):
    r = ask(gw, "always_escalate")
    assert r.json()["model"] == "big"
    assert "escalated from small" in r.headers["x-tokenomy-route"] and "mean logprob" in r.headers["x-tokenomy-route"]
    r = ask(gw, "never_escalate")
    assert r.json()["model"] == "small" and "escalated" not in r.headers["x-tokenomy-route"]
    metrics = httpx.get(gw.root + "/metrics").text
    assert 'tokenomy_route_escalations_total{from="small",route="always_escalate"} 1.0' in metrics


def test_cascade_escalates_on_invalid_json(gw):
    # 4 tokens cannot hold a JSON answer: the small model's output is invalid JSON and is escalated
    r = ask(gw, "json_cascade", "Give me a JSON object describing a cat.", max_tokens=4,
            response_format={"type": "json_object"})
    route = r.headers["x-tokenomy-route"]
    assert "escalated from small" in route and "JSON" in route


def test_cascade_on_streams_judges_a_buffer_before_the_first_byte(gw):
    for route, expect in (("always_escalate", "big"), ("never_escalate", "small")):
        body = {"model": route, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=120) as r:
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert {c["model"] for c in chunks} == {expect}
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_load_sheds_to_the_cheaper_model_when_the_preferred_queue_is_long(gw):
    assert ask(gw, "shed").json()["model"] == "big"           # idle: the capable model

    async def flood():
        async with httpx.AsyncClient(timeout=300) as c:
            body = {"model": "big", "messages": [{"role": "user", "content": "Write a long story."}],
                    "max_tokens": 60, "temperature": 0}
            busy = [asyncio.create_task(c.post(gw.base_url + "/chat/completions", json=body)) for _ in range(4)]
            await asyncio.sleep(1.0)                           # big runs one at a time: three now wait
            r = await c.post(gw.base_url + "/chat/completions", json={
                "model": "shed", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
            await asyncio.gather(*busy)
            return r

    r = asyncio.run(flood())
    assert r.json()["model"] == "small" and "load:" in r.headers["x-tokenomy-route"]


def test_cascade_to_an_upstream():
    with StubServer(Stub()) as s:
        remote = {"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{s.port}/v1",
                  "model": "stub", "tokenizer": "cl100k_base", "max_retries": 0}
        routes = {"up": {"strategy": "cascade", "models": ["small", "remote"], "cascade": {"min_mean_logprob": 0.0}}}
        with live_server(config([remote], **routes)) as g:
            r = ask(g, "up")
            assert r.json()["model"] == "remote" and r.json()["choices"][0]["message"]["content"] == \
                "Hello from the stub."
            assert s.stub.hits == 1
