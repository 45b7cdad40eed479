"""The cache stage in the live gateway: exact and semantic hits, stream replay, opt-outs, tenants, Redis."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import SMALL_ENGINE, free_port, live_server

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"


def chat(gw, content, key=None, stream=False, headers=None, **kw):
    h = dict(headers or {})
    if key:
        h["authorization"] = f"Bearer {key}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "temperature": 0, "stream": stream, **kw}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=h, timeout=120)


def stream_events(r):
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


@pytest.fixture(scope="module")
def gw():
    # QQP-calibrated: at the default 2% budget only identical questions are served; 20% serves paraphrases
    cfg = {"engine": SMALL_ENGINE, "keys": [{"key": "sk-a", "tenant": "a"}, {"key": "sk-b", "tenant": "b"}],
           "cache": {"semantic": {"error_budget": 0.2, "threshold": 0.85}}}
    with live_server(cfg) as s:
        yield s


def test_exact_hit_replays_the_answer_and_streams_keep_their_shape(gw):
    first = chat(gw, "Name a red fruit.", "sk-a")
    assert first.headers["x-tokenomy-cache"] == "miss"
    again = chat(gw, "Name a red fruit.", "sk-a")
    assert again.headers["x-tokenomy-cache"] == "exact"
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert again.json()["usage"]["completion_tokens"] == first.json()["usage"]["completion_tokens"]
    # a streamed request is stored as a stream and replayed with the same event shape
    s1 = chat(gw, "Name a green fruit.", "sk-a", stream=True)
    s2 = chat(gw, "Name a green fruit.", "sk-a", stream=True)
    assert s1.headers["x-tokenomy-cache"] == "miss" and s2.headers["x-tokenomy-cache"] == "exact"
    e1, e2 = stream_events(s1), stream_events(s2)
    assert e2[0]["choices"][0]["delta"]["role"] == "assistant"
    text = lambda ev: "".join(c["choices"][0]["delta"].get("content") or "" for c in ev if c["choices"])  # noqa: E731
    assert text(e1) == text(e2) and e2[-1]["usage"] == e1[-1]["usage"] and s2.text.endswith("data: [DONE]\n\n")


def test_never_across_tenants(gw):
    chat(gw, "Name a blue flower.", "sk-a")
    assert chat(gw, "Name a blue flower.", "sk-a").headers["x-tokenomy-cache"] == "exact"
    assert chat(gw, "Name a blue flower.", "sk-b").headers["x-tokenomy-cache"] == "miss"


def test_cache_control_and_randomness(gw):
    chat(gw, "Name a yellow fruit.", "sk-a", headers={"cache-control": "no-store"})
    assert chat(gw, "Name a yellow fruit.", "sk-a").headers["x-tokenomy-cache"] == "miss"      # was not stored
    assert chat(gw, "Name a yellow fruit.", "sk-a", headers={"cache-control": "no-cache"}
                ).headers["x-tokenomy-cache"] == "miss"                                          # not looked up
    assert chat(gw, "Name a yellow fruit.", "sk-a").headers["x-tokenomy-cache"] == "exact"
    chat(gw, "Name a purple fruit.", "sk-a", temperature=1.0)
    assert chat(gw, "Name a purple fruit.", "sk-a", temperature=1.0).headers["x-tokenomy-cache"] == "miss"
    chat(gw, "Name an orange fruit.", "sk-a", temperature=1.0, seed=3)
    assert chat(gw, "Name an orange fruit.", "sk-a", temperature=1.0, seed=3).headers["x-tokenomy-cache"] == "exact"


def test_several_choices_are_never_cached_and_a_prediction_is_not_part_of_the_key(gw):
    for _ in range(2):
        r = chat(gw, "Name a yellow fruit.", "sk-a", n=2)
        assert r.headers["x-tokenomy-cache"] == "miss" and len(r.json()["choices"]) == 2     # the second too
    first = chat(gw, "Spell the word cat backwards.", "sk-a")       # asked by no other test of this module
    assert first.headers["x-tokenomy-cache"] == "miss"
    predicted = chat(gw, "Spell the word cat backwards.", "sk-a",
                     prediction={"type": "content", "content": first.json()["choices"][0]["message"]["content"]})
    assert predicted.headers["x-tokenomy-cache"] == "exact"     # the same greedy answer, whatever was predicted


def test_semantic_hit_on_a_paraphrase_but_not_on_a_different_question(gw):
    first = chat(gw, "What is the capital city of France?", "sk-a")
    para = chat(gw, "what's the capital city of france?", "sk-a")
    assert para.headers["x-tokenomy-cache"] == "semantic"
    assert para.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert chat(gw, "What is the capital city of Germany?", "sk-a").headers["x-tokenomy-cache"] == "miss"
    assert chat(gw, "what's the capital city of france?", "sk-b").headers["x-tokenomy-cache"] == "miss"


def test_replicas_share_the_exact_cache_through_redis(redis_url):
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    cfg = {"engine": SMALL_ENGINE, "cache": {"store": redis_url, "semantic": {"enabled": False}}}
    with live_server(cfg) as one, live_server(cfg) as two:
        assert chat(one, "Name a white animal.").headers["x-tokenomy-cache"] == "miss"
        assert chat(two, "Name a white animal.").headers["x-tokenomy-cache"] == "exact"


def test_redis_down_serves_uncached_and_counts_errors():
    cfg = {"engine": SMALL_ENGINE, "cache": {"store": f"redis://127.0.0.1:{free_port()}/0",
                                             "semantic": {"enabled": False}}}
    with live_server(cfg) as g:
        for _ in range(2):
            r = chat(g, "Name a black animal.")
            assert r.status_code == 200 and r.headers["x-tokenomy-cache"] == "miss"
        assert g.gateway.exact_cache.errors >= 1


def test_a_batch_answer_is_stored_at_the_batch_price_it_was_charged(tmp_path):
    # The stored cost is what a later hit reports as saved; for a batch request it is what the batch row paid
    # (the model's batch price), not the list price. No model runs: the upstream is never asked.
    import asyncio

    from tokenomy.config import Config
    from tokenomy.gateway import Gateway
    from tokenomy.generation import GenRequest, Usage
    from tokenomy.pipeline.cache import cache_messages, cache_params
    from tokenomy.pipeline.request import RequestContext, Result

    cfg = Config.model_validate({
        "models": [{"name": "up", "backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                    "price": {"input": 1.0, "cached_input": 0.5, "output": 2.0, "batch_discount": 0.5}}],
        "cache": {"path": str(tmp_path), "semantic": {"enabled": False}}, "ledger": None})
    gw = Gateway(cfg)
    stage = next(s for s in gw.pipeline.stages if s.name == "cache")

    async def generate(ctx: RequestContext) -> None:        # what the generate stage leaves behind
        ctx.model, ctx.finish_reason = "up", "stop"
        ctx.usage = Usage(prompt_tokens=1000, completion_tokens=500)
        ctx.result = Result(text="an answer", finish_reason="stop", usage=ctx.usage)

    async def run() -> dict[str, tuple[float, float]]:
        paid = {}
        for rid, batch in (("req_i", None), ("req_b", "batch_1")):
            ctx = RequestContext(gen=GenRequest(model="up", messages=[{"role": "user", "content": rid}],
                                                params={"temperature": 0}), request_id=rid, batch_id=batch)
            await stage(ctx, generate)
            gw.meter(ctx)
            hit = gw.exact_cache.lookup(ctx.tenant, "up", cache_messages(ctx), cache_params(ctx))
            paid[rid] = (ctx.cost_usd, hit.saved_usd)
        await gw.close()
        return paid

    paid = asyncio.run(run())
    assert paid["req_i"][0] == pytest.approx(0.002) and paid["req_b"][0] == pytest.approx(0.001)
    assert all(charged == pytest.approx(stored) for charged, stored in paid.values())


def test_each_cache_switches_off_on_its_own():
    from tests.helpers.upstream_stub import Stub
    from tests.pipeline.test_gateway_upstream import StubServer

    with StubServer(Stub()) as s:
        up = [{"name": MODEL, "backend": "openai", "model": "stub", "base_url": f"http://127.0.0.1:{s.port}/v1",
               "tokenizer": "cl100k_base"}]
        # the exact cache off: the semantic cache still serves a paraphrase (and the same question again)
        cfg = {"models": up, "cache": {"exact": {"enabled": False},
                                       "semantic": {"error_budget": 0.2, "threshold": 0.85}}}
        with live_server(cfg) as g:
            assert chat(g, "What is the capital city of France?").headers["x-tokenomy-cache"] == "miss"
            assert chat(g, "what's the capital city of france?").headers["x-tokenomy-cache"] == "semantic"
            assert chat(g, "What is the capital city of France?").headers["x-tokenomy-cache"] == "semantic"
            assert g.gateway.exact_cache is None
        # the semantic cache off: the exact one serves the same question, never a paraphrase
        cfg = {"models": up, "cache": {"semantic": {"enabled": False}}}
        with live_server(cfg) as g:
            chat(g, "What is the capital city of France?")
            assert chat(g, "What is the capital city of France?").headers["x-tokenomy-cache"] == "exact"
            assert chat(g, "what's the capital city of france?").headers["x-tokenomy-cache"] == "miss"
