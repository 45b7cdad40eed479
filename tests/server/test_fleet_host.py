"""The fleet of `tokenomy serve --workers 2` (server/fleet_host.py, backends/fleet_proxy.py), run as a user runs it,
on three copies of the real SmolLM2 under a limit of two loaded models: only the preloaded model's engine runs at
start; a model both workers ask for at once loads once, in one engine process of the supervisor's that both use;
a request running on one worker keeps its model from another worker's unload and from eviction; a worker killed
mid-request leaves nothing counted running; an unloaded model's engine ends and the workers connect to the next
one without taking its end for a crash."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import NO_CACHE
from tests.helpers.wait import wait_until
from tests.server.test_workers import ENGINE, Served, command, pinned, serve_cli

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ADMIN = f"sk-{uuid.uuid4().hex}"
AUTH = {"authorization": f"Bearer {ADMIN}"}
LONG = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 960,
        "temperature": 0, "stream": True, "logit_bias": {"2": -100}}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    home = Path(tempfile.mkdtemp(prefix="tokenomy-fleet-host-test-"))
    config = {
        "models": [{"name": n, "gguf": "smollm2-135m-instruct"} for n in ("a", "b", "c")],
        "engine": ENGINE, "cache": NO_CACHE, "ledger": f"sqlite:///{home}/ledger.db",
        "keys": [{"key": ADMIN, "name": "admin", "admin": True}],
        "fleet": {"max_loaded": 2},
        "server": {"workers": 2, "public": ["/health", "/metrics"]},
    }
    with serve_cli(home, config) as s:
        yield s


def chat(c: httpx.Client, model: str, content: str = "Say hi.") -> httpx.Response:
    return c.post("/v1/chat/completions", headers=AUTH, json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0})


def ps(c: httpx.Client) -> dict[str, dict]:
    r = c.get("/admin/models", headers=AUTH)
    assert r.status_code == 200, r.text
    return {m["name"]: m for m in r.json()["models"]}


def engine_of(s: Served, model: str) -> list[int]:
    """The pids of the engine processes serving `model` (its socket is engine-{index}.sock)."""
    sock = f"engine-{'abc'.index(model)}.sock"
    return [p.pid for p in s.engines() if sock in command(p)]


def loads(text: str, model: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "tokenomy_model_loads_total" and s.labels.get("model") == model)


def test_a_model_both_workers_ask_for_at_once_loads_once_in_one_engine_of_the_supervisors(served: Served) -> None:
    assert [len(engine_of(served, m)) for m in "abc"] == [1, 0, 0]     # a preloads; b and c load when asked for
    conns = pinned(served)
    assert {n: m["state"] for n, m in ps(next(iter(conns.values()))).items()} == \
        {"a": "loaded", "b": "available", "c": "available"}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda c: chat(c, "b"), conns.values()))
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    (b,) = engine_of(served, "b")
    assert next(p for p in served.engines() if p.pid == b).ppid() == served.proc.pid
    for c in conns.values():       # both workers are connected to that one engine, and count its one load
        assert c.get("/health").json()["engines"]["b"]["pid"] == b
        assert loads(c.get("/metrics").text, "b") == 1
        wait_until(lambda c=c: ps(c)["b"]["state"] == "loaded" and ps(c)["b"]["loads"] == 1, timeout=30,
                   what="the worker's view of the fleet")
        c.close()


def test_a_request_running_on_one_worker_keeps_its_model_from_the_other_workers_unload_and_eviction(
        served: Served) -> None:
    (_, busy), (_, other) = pinned(served).items()
    assert chat(busy, "a").status_code == 200 and chat(other, "b").status_code == 200   # a and b loaded: the limit
    b = engine_of(served, "b")
    chunks = 0
    with busy.stream("POST", "/v1/chat/completions", json={"model": "b", **LONG}, headers=AUTH) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunks += 1
            if chunks == 3:      # b runs a request on the first worker: the second may not take it away
                wait_until(lambda: ps(other)["b"]["running"] == 1, timeout=10, what="the other worker to see it")
                assert other.post("/admin/models/b/unload", headers=AUTH).json()["outcome"] == "deferred"
                assert chat(other, "c").status_code == 200      # c needs a place: a, idle, gives it, not b
                assert engine_of(served, "a") == [] and engine_of(served, "b") == b
                assert {n: m["state"] for n, m in ps(other).items()} == \
                    {"a": "available", "b": "loaded", "c": "loaded"}
            json.loads(line[6:])
    assert chunks > 3
    # the deferred unload happens once the request has ended
    wait_until(lambda: engine_of(served, "b") == [] and ps(other)["b"]["state"] == "available", timeout=60,
               what="b to unload after its request")
    assert ps(other)["a"]["evictions"] == 1
    busy.close()
    other.close()


def test_a_worker_killed_mid_request_leaves_nothing_counted_running(served: Served) -> None:
    (victim, cv), (_, co) = pinned(served).items()
    chunks = 0
    with pytest.raises(httpx.HTTPError):
        with cv.stream("POST", "/v1/chat/completions", json={"model": "c", **LONG}, headers=AUTH) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if chunks == 3:
                        wait_until(lambda: ps(co)["c"]["running"] == 1, timeout=10, what="the other worker to see it")
                        os.kill(victim, signal.SIGKILL)
    wait_until(lambda: ps(co)["c"]["running"] == 0, timeout=60, what="the dead worker's request to be released")
    assert co.post("/admin/models/c/unload", headers=AUTH).json()["outcome"] == "unloaded"
    assert engine_of(served, "c") == []
    co.close()
    wait_until(lambda: len(served.workers()) == 2 and victim not in {p.pid for p in served.workers()},
               timeout=120, interval=0.1, what="a new worker")


def test_an_unloaded_models_next_engine_is_connected_to_without_taking_the_last_ones_end_for_a_crash(
        served: Served) -> None:
    conns = pinned(served)
    for c in conns.values():
        assert chat(c, "b").status_code == 200
    (first,) = engine_of(served, "b")
    (_, c0), (_, c1) = conns.items()
    r = c0.post("/api/generate", json={"model": "b", "keep_alive": 0}, headers=AUTH)     # Ollama's way to unload
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    assert engine_of(served, "b") == []
    for c in (c1, c0):
        assert chat(c, "b", content="Again?").status_code == 200
    (second,) = engine_of(served, "b")
    assert second != first
    for c in conns.values():
        assert c.get("/health").json()["engines"]["b"]["pid"] == second
        c.close()
    log = served.log.read_text()
    assert "closed its connection" not in log and "could not restart" not in log, log[-3000:]


def test_a_responses_socket_on_one_worker_holds_its_model_against_eviction_by_another(served: Served) -> None:
    from openai import OpenAI

    (_, c0), (_, c1) = pinned(served).items()
    client = OpenAI(base_url=served.root + "/v1", api_key=ADMIN, max_retries=0)
    with client.beta.responses.connect() as conn:      # whichever worker the kernel hands the socket to
        conn.response.create(model="a", input="Name a color.", max_output_tokens=4, store=False)
        ends = {"response.completed", "response.incomplete", "response.failed", "error"}
        assert next(e for e in conn if e.type in ends).type in ("response.completed", "response.incomplete")
        for c in (c0, c1):
            wait_until(lambda c=c: ps(c)["a"]["held"] == 1, timeout=10, what="every worker to see a held")
        for model in ("b", "c"):      # a third model needs a place: b, not the held a, gives it
            assert chat(c1, model).status_code == 200
        assert {n: m["state"] for n, m in ps(c1).items()} == {"a": "loaded", "b": "available", "c": "loaded"}
    wait_until(lambda: ps(c0)["a"]["held"] == 0, timeout=30, what="the closed socket to let a go")
    c0.close()
    c1.close()


def test_a_model_that_cannot_be_placed_while_the_loaded_ones_run_gets_a_503_naming_them(served: Served) -> None:
    conns = list(pinned(served).values())
    for c in conns:
        chat(c, "a")
    streams, readers = [], []
    try:
        for c, model in zip(conns, ("a", "c"), strict=True):      # the two places, each running a request
            s = c.stream("POST", "/v1/chat/completions", json={"model": model, **LONG}, headers=AUTH)
            r = s.__enter__()
            streams.append(s)
            assert r.status_code == 200
            readers.append(r.iter_lines())      # kept: a reader let go of closes its connection
            next(line for line in readers[-1] if line.startswith("data: {"))
        with httpx.Client(base_url=served.root, timeout=60) as c:
            wait_until(lambda: (ps(c)["a"]["running"], ps(c)["c"]["running"]) == (1, 1), timeout=30,
                       what="both requests to count")
            r = chat(c, "b")
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
        message = r.json()["error"]["message"]
        assert "fleet.max_loaded (2)" in message and "a " in message and "1 running" in message, message
    finally:
        for s in streams:
            s.__exit__(None, None, None)
    wait_until(lambda: all(ps(conns[0])[m]["running"] == 0 for m in "abc"), timeout=60,
               what="the cancelled requests to be released")
    for c in conns:
        c.close()
