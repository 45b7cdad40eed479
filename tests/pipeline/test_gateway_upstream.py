"""The gateway in front of real upstream processes: routing, streaming passthrough, fallbacks, cool-downs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from tests.conftest import NO_CACHE, SMALL_ENGINE, free_port, live_server
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tokenomy.structured.token_tables import load_tokenizer

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MSG = [{"role": "user", "content": "Say hi."}]


def start_tokenomy(port: int) -> subprocess.Popen:
    # its own folder: the default cache and ledger live in the working directory, and an answer cached by an
    # earlier run (another version, other kernels) must not stand in for this one
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port)],
                            cwd=tempfile.mkdtemp(prefix="tokenomy-upstream-"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None              # exited: stop waiting, and fail below

    try:
        wait_until(healthy, timeout=120, interval=0.2, what="the upstream tokenomy to start")
    except AssertionError:
        proc.kill()
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"upstream tokenomy exited with {proc.returncode} before it served")
    return proc


class StubServer:
    def __init__(self, stub: Stub) -> None:
        self.stub, self.port = stub, free_port()
        self.server = uvicorn.Server(uvicorn.Config(stub, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        wait_until(lambda: self.server.started, what="the stub server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def gateway_config(upstream_port: int, **remote: object) -> dict:
    return {
        "engine": SMALL_ENGINE,
        "cache": NO_CACHE,
        "models": [
            {"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{upstream_port}/v1",
             "model": "smollm2-135m-instruct", "tokenizer": "smollm2-135m-instruct", "max_retries": 0,
             "timeout_s": 30, **remote},
            {"name": "local", "backend": "embedded", "gguf": "smollm2-135m-instruct"},
        ],
        "routes": {"chat": {"strategy": "fixed", "models": ["remote", "local"]}},
        "cooldown": {"failures": 2, "window_s": 60, "cooldown_s": 60},
    }


@pytest.fixture(scope="module")
def upstream():
    port = free_port()
    proc = start_tokenomy(port)
    yield proc, port
    proc.kill()


def test_routes_to_upstream_streams_then_falls_back_when_it_dies(upstream):
    """Every answer is ' red' eight times, whatever the model would say (logit_bias +100 on that token, which the
    gateway passes on): the upstream's answer through the gateway, straight from it, streamed, and the embedded
    fallback's are compared word for word, which two free greedy runs in other processes, on other kernels,
    could not be (tests/helpers/noise.py)."""
    proc, port = upstream
    [red] = load_tokenizer().tokenize_str(" red")
    ask = dict(messages=MSG, max_tokens=8, temperature=0, logit_bias={str(red): 100})
    with live_server(gateway_config(port)) as gw:
        c = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        raw = c.chat.completions.with_raw_response.create(model="chat", **ask)
        r = raw.parse()
        assert r.model == "remote" and raw.headers["x-tokenomy-route"].startswith("remote")
        assert raw.headers["x-tokenomy-request-id"].startswith("req_")
        assert r.choices[0].message.content == " red" * 8 and r.choices[0].finish_reason == "length"
        direct = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x").chat.completions.create(
            model="smollm2-135m-instruct", **ask)
        assert r.choices[0].message.content == direct.choices[0].message.content
        assert r.usage.prompt_tokens == direct.usage.prompt_tokens
        chunks = list(c.chat.completions.create(model="chat", **ask, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == r.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens

        proc.kill()
        proc.wait()
        for stream in (False, True):
            raw = c.chat.completions.with_raw_response.create(model="chat", **ask, stream=stream)
            assert "local" in raw.headers["x-tokenomy-route"]
            if stream:
                body = raw.parse()
                text = "".join(x.choices[0].delta.content or "" for x in body if x.choices)
            else:
                text = raw.parse().choices[0].message.content
            assert text == r.choices[0].message.content          # the same answer, from the local engine
        # after two failures the dead upstream is cooled down and skipped without a connection attempt
        assert gw.gateway.registry.cooling("remote")
        # a pinned dead model has no fallback: 503 in OpenAI's error format
        resp = httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_backend"


def test_failure_mid_stream_ends_with_an_error_event_not_a_silent_cut():
    with StubServer(Stub(stall_after=2)) as stub, live_server(gateway_config(stub.port, timeout_s=1.5)) as gw:
        body = {"model": "chat", "messages": MSG, "stream": True}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert any('"content":"Hello"' in x for x in lines)
        assert '"error"' in lines[-1] and "mid-stream" in lines[-1]
        assert "data: [DONE]" not in lines[:-1]


def test_slow_upstream_times_out_and_falls_back():
    with StubServer(Stub(delay=15)) as stub, live_server(gateway_config(stub.port, timeout_s=0.5)) as gw:
        httpx.post(gw.base_url + "/chat/completions", json={"model": "local", "messages": MSG, "max_tokens": 1},
                   timeout=60)                                   # warm-up: tokenizers, first decode
        t0 = time.time()
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": MSG,
                                                                 "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "local"
        assert time.time() - t0 < 10                           # did not wait for the slow upstream
        assert stub.stub.hits == 1


def test_upstream_429_is_retried_then_falls_back():
    stub = Stub(fail_status=429, fail_times=100)
    with StubServer(stub) as s, live_server(gateway_config(s.port, max_retries=2)) as gw:
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": MSG,
                                                                 "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "local"
        assert stub.hits == 3                                   # one try + two retries
        metrics = httpx.get(gw.root + "/metrics").text
        assert 'tokenomy_upstream_errors_total{backend="remote",kind="429"} 3.0' in metrics


def test_upstream_without_usage_is_counted_and_marked():
    with StubServer(Stub(no_usage=True)) as s, live_server(gateway_config(s.port)) as gw:
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG}, timeout=60)
        assert r.status_code == 200
        u = r.json()["usage"]
        assert u["completion_tokens"] > 0 and u["prompt_tokens"] > 0
        assert r.headers.get("x-tokenomy-usage") == "counted"


def test_streamed_answers_leave_the_upstream_connection_open_for_the_next_request():
    # Reading each stream to its end (past data: [DONE]) returns the connection to the pool; a response closed
    # early would be dropped, and every request would pay a new TCP connection.
    with StubServer(Stub()) as s, live_server(gateway_config(s.port)) as gw:
        for stream in (True, False, True, True):
            r = httpx.post(gw.base_url + "/chat/completions", timeout=60,
                           json={"model": "remote", "messages": MSG, "stream": stream})
            assert r.status_code == 200 and "stub" in r.text
        assert s.stub.hits == 4
        assert len(s.stub.peers) == 1, s.stub.peers


def test_a_frozen_upstream_is_not_sent_the_request_again_and_the_deadline_holds():
    with StubServer(Stub(delay=15)) as s, live_server(gateway_config(s.port, timeout_s=1.0, max_retries=2)) as gw:
        t0 = time.time()
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG}, timeout=60)
        assert r.status_code == 503 and time.time() - t0 < 5
        assert s.stub.hits == 1                        # a read timeout: it may be generating; never sent twice
    with StubServer(Stub(delay=15)) as s, live_server(gateway_config(s.port, timeout_s=10, deadline_s=1.0,
                                                                     max_retries=2)) as gw:
        t0 = time.time()
        r = httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG}, timeout=60)
        assert r.status_code == 503 and time.time() - t0 < 5 and "deadline" in r.json()["error"]["message"]
    with StubServer(Stub(delay=15)) as s, live_server(gateway_config(s.port, timeout_s=0.5, max_retries=2,
                                                                     retry_after_send=True, deadline_s=30)) as gw:
        httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG}, timeout=60)
        assert s.stub.hits == 3                        # allowed explicitly: one try and two retries


def test_an_upstream_that_answers_a_stream_with_one_json_body_is_read_as_the_answer():
    with StubServer(Stub(json_for_stream=True)) as s, live_server(gateway_config(s.port)) as gw:
        body = {"model": "remote", "messages": MSG, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and '"finish_reason":"stop"' in "".join(lines)
        text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                       for x in lines[:-1] if json.loads(x[6:])["choices"])
        assert "stub" in text
        plain = httpx.post(gw.base_url + "/chat/completions", json={"model": "remote", "messages": MSG}, timeout=30)
        assert plain.json()["choices"][0]["message"]["content"] == text


def test_n_best_of_and_a_prediction_pass_through_to_the_upstream_and_come_back_per_choice():
    with StubServer(Stub()) as s, live_server(gateway_config(s.port)) as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        pred = {"type": "content", "content": "Hello from the stub."}
        r = client.chat.completions.create(model="remote", messages=MSG, n=2, prediction=pred)
        assert s.stub.bodies[-1]["n"] == 2 and s.stub.bodies[-1]["prediction"] == pred
        assert [c.index for c in r.choices] == [0, 1] and all("stub" in c.message.content for c in r.choices)
        assert r.usage.completion_tokens == 10            # the upstream's count, both choices
        details = r.usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (3, 1)
        chunks = list(client.chat.completions.create(model="remote", messages=MSG, n=2, stream=True,
                                                     stream_options={"include_usage": True}))
        for i in (0, 1):
            mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
            assert "".join(c.delta.content or "" for c in mine) == r.choices[i].message.content
            assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
        assert chunks[-1].usage.completion_tokens == 10
        best = client.completions.create(model="remote", prompt="Hi", n=2, best_of=3)
        sent = s.stub.bodies[-1]
        assert (sent["best_of"], sent["n"], sent["stream"]) == (3, 2, False)   # OpenAI streams no best_of
        assert [c.index for c in best.choices] == [0, 1]
