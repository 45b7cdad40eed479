"""Client disconnects free their KV; a full queue answers 429 with Retry-After."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import live_server
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"


def wait_idle(engine) -> None:
    wait_until(lambda: engine.running == 0 and engine.queue_depth == 0, what="the engine idle")


def test_disconnect_mid_stream_and_mid_prefill_frees_kv(server):
    engine = server.gateway.registry.get(MODEL).engine
    wait_idle(engine)
    engine.clear_cache()
    idle = engine.call("state")["used_cells"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as c, c.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                n += 1
            if n >= 5:
                break            # leave mid-stream: closing the response drops the connection
    wait_idle(engine)
    assert engine.call("state")["used_cells"] == idle
    # mid-prefill: a long prompt, abandoned well before its first token
    long_body = {"model": MODEL, "messages": [{"role": "user", "content": "lorem ipsum " * 500}],
                 "max_tokens": 50}
    try:
        httpx.post(server.base_url + "/chat/completions", json=long_body, timeout=0.3)
    except httpx.TimeoutException:
        pass
    wait_idle(engine)
    assert engine.call("state")["used_cells"] == idle


def test_full_queue_gets_429_with_retry_after():
    engine_cfg = {"n_ctx": 2048, "max_model_len": 1024, "max_running": 1, "max_retired": 1,
                  "max_batch_tokens": 64, "max_waiting": 1}
    with live_server({"engine": engine_cfg}) as srv:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a poem."}], "max_tokens": 64,
                "temperature": 0}

        async def burst():
            async with httpx.AsyncClient(timeout=120) as c:
                return await asyncio.gather(*[c.post(srv.base_url + "/chat/completions", json=body)
                                              for _ in range(6)])

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 429 in codes, codes
        limited = [r for r in responses if r.status_code == 429]
        assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
        assert all(r.json()["error"]["type"] == "rate_limit_error" for r in limited)
        metrics = httpx.get(srv.root + "/metrics").text
        assert 'tokenomy_rejections_total{reason="queue_full"}' in metrics
