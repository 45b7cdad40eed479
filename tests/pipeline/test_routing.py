"""Route strategies with two real embedded models (SmolLM2-135M and Gemma-3-270M) and an upstream."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until_async
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.structured.token_tables import load_tokenizer

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ENGINE = {"n_ctx": 8192, "max_model_len": 1024, "max_running": 4, "max_retired": 4, "max_batch_tokens": 128}


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
    # top1 is a probability: below 0 never happens, below 1.01 always does
    "token_never": {"strategy": "token", "models": ["small", "big"], "token": {"signal": "top1", "threshold": 0.0}},
    "token_always": {"strategy": "token", "models": ["small", "big"],
                     "token": {"signal": "top1", "threshold": 1.01}},
    "token_some": {"strategy": "token", "models": ["small", "big"],
                   "token": {"signal": "margin", "threshold": 0.5, "segment": "token"}},
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
    # logit_bias -100 on every token of the small model's vocabulary with a '}' in it: no object can close, so the
    # small model's 4 tokens are invalid JSON whatever it would write ('{}' fits in 4), and the answer is escalated
    vocab = load_tokenizer()                   # the small model's (the packaged SmolLM2's)
    closing = [i for i in range(vocab.vocab_size) if b"}" in vocab.decode_bytes([i])]
    r = ask(gw, "json_cascade", "Give me a JSON object describing a cat.", max_tokens=4,
            response_format={"type": "json_object"}, logit_bias={str(i): -100 for i in closing})
    route = r.headers["x-tokenomy-route"]
    assert "escalated from small" in route and "JSON" in route


def test_cascade_on_streams_judges_a_buffer_before_the_first_byte(gw):
    for route, expect in (("always_escalate", "big"), ("never_escalate", "small")):
        body = {"model": route, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=120) as r:
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert {c["model"] for c in chunks} == {expect}
        # one answer, ended once, of whatever words (a first token that ends the turn leaves no text)
        assert [c["choices"][0]["finish_reason"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]] in (["stop"], ["length"])


def test_a_cascade_judges_the_first_of_several_choices_and_streams_them_all(gw):
    for route, expect in (("always_escalate", "big"), ("never_escalate", "small")):
        body = {"model": route, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                "temperature": 0, "stream": True, "n": 2}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=120) as r:
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        assert {c["model"] for c in chunks} == {expect}
        finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert sorted(finishes) == [0, 1]


def test_load_sheds_to_the_cheaper_model_when_the_preferred_queue_is_long(gw):
    assert ask(gw, "shed").json()["model"] == "big"           # idle: the capable model
    big, slo = gw.gateway.registry.get("big"), ROUTES["shed"]["load"]["slo_queue_s"]

    async def flood():
        async with httpx.AsyncClient(timeout=300) as c:
            body = {"model": "big", "messages": [{"role": "user", "content": "Write a long story."}],
                    "max_tokens": 60, "temperature": 0}
            busy = [asyncio.create_task(c.post(gw.base_url + "/chat/completions", json=body)) for _ in range(4)]
            # big runs one at a time: the three others wait, longer than the route's SLO
            await wait_until_async(lambda: big.expected_wait_s() > slo, what="a queue at the big model")
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


def _usage_models(r):
    return r.json()["usage"].get("models", {})


def test_token_route_without_handovers_is_the_small_models_own_answer(gw):
    plain = ask(gw, "small", "Name a colour.", max_tokens=12).json()
    r = ask(gw, "token_never", "Name a colour.", max_tokens=12)
    body = r.json()
    assert body["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert body["model"] == "small" and body["usage"]["handovers"] == 0
    assert set(_usage_models(r)) == {"small"}
    assert body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


def test_token_route_hands_unsure_tokens_to_the_large_model_and_bills_both(gw):
    r = ask(gw, "token_always", "Name a colour.", max_tokens=12)
    body, models = r.json(), _usage_models(r)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")     # an answer, of whatever words
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["handovers"] >= 1 and set(models) == {"small", "big"}
    assert models["big"]["completion_tokens"] >= body["usage"]["handovers"]
    # each handover re-reads the text so far on the large model: its prompt tokens grow with the handovers
    assert models["big"]["prompt_tokens"] > body["usage"]["handovers"] * 5
    u = body["usage"]
    assert u["completion_tokens"] == sum(m["completion_tokens"] for m in models.values())
    assert u["prompt_tokens"] == sum(m["prompt_tokens"] for m in models.values())
    assert float(r.headers["x-tokenomy-cost-usd"]) > 0
    metrics = httpx.get(gw.root + "/metrics").text
    assert 'tokenomy_token_route_tokens_total{model="big",route="token_always"}' in metrics
    assert 'tokenomy_token_route_handovers_count{route="token_always"}' in metrics


def test_token_route_streams_the_same_answer_as_one_stream(gw):
    whole = ask(gw, "token_some", "Name two animals.", max_tokens=16).json()
    body = {"model": "token_some", "messages": [{"role": "user", "content": "Name two animals."}],
            "max_tokens": 16, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=120) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] in ("stop", "length")
    assert chunks[-1]["usage"]["handovers"] == whole["usage"]["handovers"]


def test_token_route_sends_structured_output_to_the_large_model_whole(gw):
    r = ask(gw, "token_always", "A JSON object with a name.", max_tokens=24, response_format={"type": "json_object"})
    assert r.json()["model"] == "big" and "structured output" in r.headers["x-tokenomy-route"]
    assert "models" not in r.json()["usage"]


def test_token_route_sends_several_choices_to_the_large_model_whole(gw):
    r = ask(gw, "token_always", n=2)
    assert r.json()["model"] == "big" and "several choices" in r.headers["x-tokenomy-route"]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1] and "models" not in r.json()["usage"]


def test_a_token_route_keeps_one_router_until_a_reload_gives_the_route_new_settings(gw):
    from tokenomy.config import RouteSpec
    from tokenomy.pipeline.route import Route

    stage = next(s for s in gw.gateway.pipeline.stages if isinstance(s, Route))
    assert ask(gw, "token_always", "Name a colour.", max_tokens=6).json()["usage"]["handovers"] >= 1
    router = stage._token_routers["token_always"][1]
    ask(gw, "token_always", "Name a fruit.", max_tokens=6)
    assert stage._token_routers["token_always"][1] is router        # built once for the route, not per request
    routes, old = gw.gateway.routes, gw.gateway.routes["token_always"]
    try:        # what a config reload does: the route gets a new spec, here one that never hands over
        routes["token_always"] = RouteSpec.model_validate(
            {**old.model_dump(), "token": {"signal": "top1", "threshold": 0.0}})
        assert ask(gw, "token_always", "Name a colour.", max_tokens=6).json()["usage"]["handovers"] == 0
        assert stage._token_routers["token_always"][1] is not router
    finally:
        routes["token_always"] = old


def test_token_route_to_an_upstream_large_model_and_its_outage():
    with StubServer(Stub()) as s:
        remote = {"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{s.port}/v1",
                  "model": "stub", "tokenizer": "cl100k_base", "max_retries": 0, "timeout_s": 5}
        routes = {"tok": {"strategy": "token", "models": ["small", "remote"],
                          "token": {"signal": "top1", "threshold": 1.01}}}
        with live_server(config([remote], **routes)) as g:
            r = ask(g, "tok", max_tokens=6)
            text = r.json()["choices"][0]["message"]["content"]
            assert text.startswith("Hello")                    # the stub's first word, kept to its word boundary
            first, second = s.stub.bodies[0], s.stub.bodies[1]
            # the large model gets the small model's chat template (no BOS) and the answer so far
            assert first["prompt"].startswith("<|im_start|>") and first["prompt"].endswith("assistant\n")
            assert second["prompt"] == first["prompt"] + "Hello"
            assert set(_usage_models(r)) >= {"remote"}
            # a stop string across two segments ("Hello" + "Hello") cuts the answer before it
            r = ask(g, "tok", max_tokens=6, stop=["oH"])
            assert r.json()["choices"][0]["message"]["content"] == "Hell"
            assert r.json()["choices"][0]["finish_reason"] == "stop"
            s.stub.fail_status, s.stub.fail_times = 500, 10**6   # the upstream goes down
            r = ask(g, "tok", max_tokens=6)
            assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            assert r.json()["usage"]["handovers"] == 0 and r.json()["model"] == "small"
            metrics = httpx.get(g.root + "/metrics").text
            assert 'tokenomy_token_route_large_failures_total{route="tok"} 1.0' in metrics
