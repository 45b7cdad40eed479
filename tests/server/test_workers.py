"""`tokenomy serve --workers 2`, run as a user runs it (the CLI, in its own process), on two embedded models
(the real SmolLM2), with rate limits and budgets in the Redis of tests/helpers/services.py: one engine process per model
whatever the number of workers (each loaded when first asked for), both workers answer, a rate limit and a budget
hold across them, /metrics sums them, and a worker killed mid-request is replaced while its request fails and the
rest serve on.

Which worker answers is the kernel's choice (they share one listening socket); a test that needs a given worker
keeps a connection to it open (`pinned`), learnt from /health's `worker.pid` on that connection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import NO_CACHE, free_port
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

ENGINE = {"n_ctx": 6144, "max_model_len": 1024, "max_running": 4, "max_retired": 2, "max_batch_tokens": 64,
          "n_threads": 1}
RPM_KEY, BUDGET_KEY, OPEN_KEY = (f"sk-{uuid.uuid4().hex}" for _ in range(3))
BUDGET_TOKENS = 100     # a short question and 8 tokens of answer hold about 45: two fit, a third does not


class Served:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path, ollama_port: int) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.root = f"http://127.0.0.1:{port}"
        self.ollama_root = f"http://127.0.0.1:{ollama_port}"      # server.ollama_port: the same APIs

    def tree(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def engines(self) -> list[psutil.Process]:
        return [p for p in self.tree() if "tokenomy.engine.core" in command(p)]

    def workers(self) -> list[psutil.Process]:
        return [p for p in self.tree() if "worker_main" in command(p)]


def command(p: psutil.Process) -> str:
    """A live process's command line; "" for one that ended (a zombie not yet reaped included)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


@contextmanager
def serve_cli(home: Path, config: dict[str, Any]) -> Iterator[Served]:
    """`tokenomy serve -c` on `config` (its server.workers: 2) in its own process, TOKENOMY_HOME `home`, once
    /health answers and both workers run; stopped with SIGTERM after."""
    path = home / "tokenomy.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = home / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "-c", str(path)],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TOKENOMY_HOME": str(home)})
    s = Served(proc, port, log, config["server"].get("ollama_port") or 0)

    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(s.root + "/health", timeout=5).status_code == 200 and len(s.workers()) == 2
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=300, interval=0.2, what="tokenomy serve --workers 2 to answer")
        yield s
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def served(redis_url: str) -> Iterator[Served]:
    home = Path(tempfile.mkdtemp(prefix="tokenomy-workers-test-"))
    config = {
        "models": [{"name": "a", "gguf": "smollm2-135m-instruct"}, {"name": "b", "gguf": "smollm2-135m-instruct"}],
        "engine": ENGINE, "cache": NO_CACHE, "ledger": f"sqlite:///{home}/ledger.db",
        "limits": {"store": redis_url},
        "keys": [{"key": RPM_KEY, "name": "rpm", "rpm": 3},
                 {"key": BUDGET_KEY, "name": "budget", "tenant": f"t-{uuid.uuid4().hex[:8]}",
                  "budget": {"tokens_per_day": BUDGET_TOKENS}},
                 {"key": OPEN_KEY, "name": "open"}],
        "server": {"workers": 2, "public": ["/health", "/metrics"], "ollama_port": free_port()},
    }
    with serve_cli(home, config) as s:
        yield s


def pinned(s: Served, count: int = 2) -> dict[int, httpx.Client]:
    """One open connection to each of `count` workers, by worker pid (connections to a worker already held are
    closed; the kernel's choice is retried until every worker has one)."""
    out: dict[int, httpx.Client] = {}

    def one_more() -> bool:
        c = httpx.Client(base_url=s.root, timeout=120, limits=httpx.Limits(max_connections=1))
        pid = c.get("/health").json()["worker"]["pid"]
        if pid in out:
            c.close()
        else:
            out[pid] = c
        return len(out) == count

    wait_until(one_more, timeout=120, interval=0, what=f"a connection to each of {count} workers")
    return out


def chat(c: httpx.Client, key: str, content: str = "Say hi.", model: str = "a", **extra: Any) -> httpx.Response:
    return c.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                  json={"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8,
                        "temperature": 0, **extra})


def samples(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_one_engine_process_per_model_whatever_the_workers(served: Served) -> None:
    engines, workers = served.engines(), served.workers()
    assert len(workers) == 2
    # model a preloads; b loads on its first request (the supervisor's fleet: tests/server/test_fleet_host.py)
    assert len(engines) == 1, [p.cmdline() for p in served.tree()]
    conns = pinned(served)
    for c in conns.values():
        for model in ("a", "b"):
            assert chat(c, OPEN_KEY, model=model).status_code == 200
    engines = served.engines()
    assert len(engines) == 2, [p.cmdline() for p in served.tree()]        # models a and b: one each
    assert all(p.ppid() == served.proc.pid for p in engines + workers)     # the supervisor's, not a worker's
    # each worker is connected to those two engines
    for c in conns.values():
        health = c.get("/health").json()
        assert {e["pid"] for e in health["engines"].values()} == {p.pid for p in engines}
        c.close()


def test_both_workers_answer_from_the_shared_engines(served: Served) -> None:
    conns = pinned(served)
    for pid, c in conns.items():
        for model in ("a", "b"):
            r = chat(c, OPEN_KEY, model=model, ignore_eos=True)     # 8 tokens, whatever the model would say
            assert r.status_code == 200, r.text
            choice, usage = r.json()["choices"][0], r.json()["usage"]
            assert choice["finish_reason"] == "length" and usage["completion_tokens"] == 8, r.text
        assert c.get("/health").json()["worker"]["pid"] == pid     # the same connection: that worker answered
        c.close()


def test_the_ollama_port_reaches_every_worker(served: Served) -> None:
    pids: set[int] = set()

    def one_more() -> bool:
        with httpx.Client(base_url=served.ollama_root, timeout=30) as c:
            pids.add(c.get("/health").json()["worker"]["pid"])
            assert c.get("/api/version").status_code == 200
        return len(pids) == 2

    wait_until(one_more, timeout=120, interval=0, what="a connection on the Ollama port to each worker")
    assert pids == {p.pid for p in served.workers()}


def test_a_rate_limit_holds_across_workers(served: Served) -> None:
    (a, ca), (b, cb) = pinned(served).items()
    codes = [chat(c, RPM_KEY).status_code for c in (ca, cb, ca, cb, ca)]
    assert codes == [200, 200, 200, 429, 429]       # rpm 3 between them, not 3 each
    ca.close()
    cb.close()


def test_a_budget_holds_across_workers(served: Served) -> None:
    (a, ca), (b, cb) = pinned(served).items()
    answers = [chat(c, BUDGET_KEY, content=f"Say hi {i}.") for i, c in enumerate((ca, cb, ca, cb))]
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert len(ok) >= 2 and answers[0].status_code == answers[1].status_code == 200   # one on each worker
    assert refused and {r.json()["error"]["code"] for r in refused} == {"budget_exceeded"}
    assert sum(r.json()["usage"]["total_tokens"] for r in ok) <= BUDGET_TOKENS
    ca.close()
    cb.close()


def test_metrics_sum_every_worker(served: Served) -> None:
    conns = pinned(served)
    before = samples(next(iter(conns.values())).get("/metrics").text, "tokenomy_requests_total")
    for c in conns.values():
        assert chat(c, OPEN_KEY, content="Count me.").status_code == 200
    seen = [samples(c.get("/metrics").text, "tokenomy_requests_total") for c in conns.values()]
    assert seen == [before + 2, before + 2]      # both requests, whichever worker answers the scrape
    text = next(iter(conns.values())).get("/metrics").text
    # an engine's steps are counted once, by one of the workers: each request decoded its 8 tokens in 8 steps at
    # most (some steps carry two sequences), never twice as many
    steps = samples(text, "tokenomy_engine_batch_tokens_count")
    generated = samples(text, "vllm:generation_tokens_total")
    assert 0 < steps <= generated + samples(text, "vllm:request_success_total")
    for c in conns.values():
        c.close()


def test_a_worker_killed_mid_request_is_replaced_and_only_its_request_fails(served: Served) -> None:
    engines = {p.pid for p in served.engines()}
    conns = pinned(served)
    (victim, cv), (other, co) = conns.items()
    body = {"model": "a", "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 960, "temperature": 0, "stream": True, "logit_bias": {"2": -100}}
    chunks = 0
    with pytest.raises(httpx.HTTPError):
        with cv.stream("POST", "/v1/chat/completions", json=body,
                       headers={"authorization": f"Bearer {OPEN_KEY}"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    json.loads(line[6:])
                    chunks += 1
                    if chunks == 3:
                        os.kill(victim, signal.SIGKILL)
    assert chunks >= 3
    # the other worker serves on, on the same engine
    assert chat(co, OPEN_KEY, content="Still there?").status_code == 200
    # the engine stops the dead worker's sequence (nothing left running) and is the same process
    wait_until(lambda: samples(co.get("/metrics").text, "tokenomy_engine_running_seqs") == 0, timeout=60,
               what="the killed worker's sequence to be cancelled")
    assert {p.pid for p in served.engines()} == engines
    # a new worker takes the dead one's place, and answers
    wait_until(lambda: len(served.workers()) == 2 and victim not in {p.pid for p in served.workers()},
               timeout=120, interval=0.1, what="a new worker")
    fresh = pinned(served)
    assert victim not in fresh and other in fresh
    for c in fresh.values():
        assert chat(c, OPEN_KEY, content="And you?").status_code == 200
        c.close()
    co.close()
    assert "API worker" in served.log.read_text()   # the supervisor said what happened


def test_an_engine_killed_is_started_again_and_every_worker_reconnects(served: Served) -> None:
    engine_a = next(p for p in served.engines() if "engine-0.sock" in command(p))
    conns = pinned(served)
    engine_a.kill()
    for c in conns.values():      # model b is untouched; model a answers 503 (engine_died) or, restarted, 200
        assert chat(c, OPEN_KEY, model="b", content="Are you there?").status_code == 200
        assert chat(c, OPEN_KEY, content="And model a?").status_code in (200, 503)

    def a_serves_on(c: httpx.Client) -> bool:
        engines = c.get("/health").json()["engines"]
        return engines["a"]["state"] == "ready" and engines["a"]["pid"] not in (None, engine_a.pid)

    for c in conns.values():
        wait_until(lambda c=c: a_serves_on(c), timeout=180, interval=0.2, what="the worker to reconnect to engine a")
        assert chat(c, OPEN_KEY, content="Back again?").status_code == 200
        c.close()
    assert len(served.engines()) == 2


def test_sigterm_stops_every_process(served: Served) -> None:
    tree = served.tree()
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0
    wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree), timeout=60,
               what="the engines and workers to stop")


def test_workers_refuse_limits_counted_per_process_and_an_in_memory_ledger() -> None:
    from pydantic import ValidationError

    from tokenomy.config import Config

    limited = {"server": {"workers": 2}, "keys": [{"key": "sk-a", "rpm": 10}]}
    with pytest.raises(ValidationError, match="limits.store: redis://"):
        Config.model_validate(limited)
    assert Config.model_validate({**limited, "limits": {"store": "redis://127.0.0.1:6379/0"}}).server.workers == 2
    with pytest.raises(ValidationError, match="in-memory ledger"):
        Config.model_validate({"server": {"workers": 2}, "ledger": "sqlite://"})
    # --workers on the command line is checked the same way (server/command.py)
    assert "Redis" in (Config.model_validate({"keys": limited["keys"]}).workers_problem(3) or "")
    assert Config.model_validate({"keys": limited["keys"]}).workers_problem(1) is None
