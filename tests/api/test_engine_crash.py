"""An engine process that dies mid-stream or mid-prefill: its clients get an OpenAI error, the ledger records
them, /health and /metrics show the restart, the other model keeps serving, and the next request is served."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from tests.conftest import NO_CACHE, live_server
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ENGINE = {"n_ctx": 6144, "max_model_len": 1024, "max_running": 4, "max_retired": 2, "max_batch_tokens": 64}


@pytest.fixture(scope="module")
def srv():
    models = [{"name": "a", "gguf": "smollm2-135m-instruct"}, {"name": "b", "gguf": "smollm2-135m-instruct"}]
    with live_server({"models": models, "engine": ENGINE, "cache": NO_CACHE,
                      "cooldown": {"failures": 100}}) as s:
        yield s


def body(model: str, content: str, max_tokens: int, stream: bool) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, "logit_bias": {"2": -100}}


def wait_ready(srv, name: str) -> dict:
    def ready() -> dict | None:
        h = httpx.get(srv.root + "/health").json()
        return h if h["engines"][name]["state"] == "ready" else None

    return wait_until(ready, interval=0.1, what=f"engine {name} to come back")


def test_kill_mid_stream_ends_the_stream_with_an_error_and_the_other_model_serves(srv):
    engine = srv.gateway.registry.get("a").engine
    pid = engine.pid
    events: list[dict] = []
    with httpx.Client(timeout=60) as c, c.stream("POST", srv.base_url + "/chat/completions",
                                                 json=body("a", "Tell me a long story about a dragon.", 400, True),
                                                 headers={"x-request-id": "crash-stream"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 3:
                os.kill(pid, signal.SIGKILL)
    assert "error" in events[-1], events[-1]
    assert "SIGKILL" in events[-1]["error"]["message"]
    # meanwhile the other model serves
    other = httpx.post(srv.base_url + "/chat/completions", json=body("b", "Say hi.", 8, False), timeout=60)
    assert other.status_code == 200 and other.json()["choices"][0]["message"]["content"]
    health = wait_ready(srv, "a")
    assert health["engines"]["a"]["restarts"] == 1 and health["engines"]["b"]["restarts"] == 0
    assert "SIGKILL" in health["engines"]["a"]["last_exit"]
    metrics = httpx.get(srv.root + "/metrics").text
    assert 'tokenomy_engine_restarts_total{model="a"} 1.0' in metrics
    assert 'tokenomy_engine_up{model="a"} 1.0' in metrics
    again = httpx.post(srv.base_url + "/chat/completions", json=body("a", "Say hi.", 8, False), timeout=60)
    assert again.status_code == 200
    ledger = srv.gateway.ledger
    assert ledger.flush()
    failed = [r for r in ledger.query(model="a") if r.finish_reason == "error"]
    assert [(r.status, r.error_code) for r in failed] == [(200, "stream_error")]     # the 200 went out first
    assert "SIGKILL" in failed[0].error


def test_segfault_mid_prefill_is_a_503_for_each_request_it_held(srv):
    wait_ready(srv, "a")
    engine = srv.gateway.registry.get("a").engine
    before = engine.restarts
    results: list[httpx.Response] = []

    def post() -> None:
        results.append(httpx.post(srv.base_url + "/chat/completions",
                                  json=body("a", "lorem ipsum " * 150, 4, False), timeout=60))

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: engine.running + engine.queue_depth >= 2, interval=0.005, what="both requests at the engine")
    os.kill(engine.pid, signal.SIGSEGV)
    for t in threads:
        t.join(60)
    assert [r.status_code for r in results] == [503, 503], [r.text for r in results]
    err = results[0].json()["error"]
    assert "SIGSEGV" in err["message"] and err["type"]
    assert "retry-after" in {k.lower() for k in results[0].headers}
    wait_ready(srv, "a")
    assert engine.restarts == before + 1
    ok = httpx.post(srv.base_url + "/chat/completions", json=body("a", "Say hi.", 8, False), timeout=60)
    assert ok.status_code == 200
