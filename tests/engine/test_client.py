"""The engine process on the real SmolLM2: a crash, a kill or a hang ends the requests it held with an error, and
the engine comes back; a broken model fails at start with its cause."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.helpers.wait import wait_until
from tokenomy.engine.client import EngineClient, EngineStartError, EngineUnavailable, describe_exit
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.models.catalog import resolve_gguf

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

CFG = dict(n_ctx=16384, max_model_len=2048, max_running=4, max_retired=4, max_batch_tokens=64)


class Collect:
    def __init__(self) -> None:
        self.events = []
        self.first = threading.Event()
        self.done = threading.Event()

    def __call__(self, ev) -> None:
        self.events.append(ev)
        self.first.set()
        if ev.finish_reason:
            self.done.set()

    @property
    def last(self):
        return self.events[-1]


def ask(engine: EngineClient, text: str, max_tokens: int = 8) -> Collect:
    c = Collect()
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": text}])
    engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True), c)
    return c


def wait_ready(engine: EngineClient) -> None:
    wait_until(lambda: engine.state == "ready", what=f"the engine to be ready: {engine.describe()}")


@pytest.fixture(scope="module")
def engine():
    # the default watchdog (120 s): on a loaded 2-core machine a cold engine's first step took 5.8 s, and a 3 s
    # watchdog killed it mid-test; the hung-engine test shortens it once the engine is warm
    e = EngineClient(str(resolve_gguf("smollm2-135m-instruct")), EngineConfig(**CFG), name="small")
    yield e
    e.stop()


def test_serves_in_a_child_process(engine) -> None:
    c = ask(engine, "Say hi.")
    assert c.done.wait(60)
    assert c.last.finish_reason == "length" and c.last.completion_tokens == 8
    assert engine.pid != os.getpid() and engine.state == "ready"
    # what it holds, as /health shows it: a short request leaves the streams at kv_start_cells (8 of 1,024)
    health = engine.describe()
    assert health["kv_cells"] == engine.n_ctx == 8 * 1024 and health["rss_bytes"] == engine.rss > 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_kill_mid_stream_errors_the_request_and_restarts(engine, sig) -> None:
    restarts, old_pid = engine.restarts, engine.pid
    c = ask(engine, "Tell me a long story about a dragon.", max_tokens=400)
    assert c.first.wait(60)
    os.kill(engine.pid, sig)
    assert c.done.wait(30)
    last = c.last
    assert last.finish_reason == "error" and last.error_code == "engine_died"
    assert signal.Signals(sig).name in last.error
    assert engine.restarts == restarts + 1 and engine.last_exit.startswith(f"died of {signal.Signals(sig).name}")
    assert engine.state == "restarting"        # the first restart waits BACKOFF_S[0]: new work is refused at once
    with pytest.raises(EngineUnavailable):
        ask(engine, "Say hi.")
    wait_ready(engine)
    assert engine.pid != old_pid
    again = ask(engine, "Say hi.")
    assert again.done.wait(60) and again.last.finish_reason == "length"


def test_kill_mid_prefill_errors_every_request_it_held(engine) -> None:
    wait_ready(engine)
    stepped = threading.Event()
    engine.stats.on_step.append(lambda *_: stepped.set())   # the engine reports a step that ran tokens
    held = [ask(engine, "lorem ipsum " * 300, max_tokens=4) for _ in range(3)]
    assert stepped.wait(60)                             # it has started on them ...
    engine.stats.on_step.pop()
    assert not any(c.first.is_set() for c in held)      # ... and is still prefilling, 64 tokens a step
    os.kill(engine.pid, signal.SIGKILL)
    for c in held:
        assert c.done.wait(30) and c.last.error_code == "engine_died"
    wait_ready(engine)
    assert engine.running == 0 and engine.queue_depth == 0


def test_a_hung_engine_is_killed_by_the_watchdog(engine, monkeypatch) -> None:
    wait_ready(engine)
    restarts = engine.restarts
    c = ask(engine, "Tell me a long story about a dragon.", max_tokens=400)
    assert c.first.wait(60)
    monkeypatch.setattr(engine.cfg, "watchdog_s", 3.0)  # the client's watchdog reads it each round
    os.kill(engine.pid, signal.SIGSTOP)                # alive but making no progress
    assert c.done.wait(30)
    assert c.last.error_code == "engine_died" and "SIGKILL" in c.last.error
    assert engine.restarts == restarts + 1
    wait_ready(engine)


def test_an_engine_that_cannot_start_fails_at_start_with_the_cause() -> None:
    # 16M KV cells of SmolLM2 need hundreds of GB: llama.cpp cannot create the context in the engine process (all
    # of it at start: streams that start small would only fail to grow)
    with pytest.raises(EngineStartError) as info:
        EngineClient(str(resolve_gguf("smollm2-135m-instruct")),
                     EngineConfig(n_ctx=1 << 24, max_model_len=2048, kv_start_cells=None))
    assert "start-up self-check" in str(info.value) and "could not create a context" in str(info.value)


def test_exit_descriptions_name_the_cause_and_the_fix() -> None:
    ill = describe_exit(-signal.SIGILL)
    assert "SIGILL" in ill and "install.sh" in ill
    assert "out of memory" in describe_exit(-signal.SIGKILL)
    assert describe_exit(3) == "exited with status 3"


def test_an_engine_started_without_waiting_serves_once_waited_for_and_stops_unwaited() -> None:
    # Gateway(wait=False): the engine loads while the rest of the server is built, and serves after wait_ready()
    path = str(resolve_gguf("smollm2-135m-instruct"))
    e = EngineClient(path, EngineConfig(**CFG), name="later", wait=False)
    try:
        assert e.state == "starting" and e.pid is None
        e.wait_ready()
        assert e.state == "ready" and e.max_model_len == 2048
        c = ask(e, "Say hi.")
        assert c.done.wait(60) and c.last.error is None
        e.wait_ready()                        # a second wait returns at once
    finally:
        e.stop()
    never_waited = EngineClient(path, EngineConfig(**CFG), name="unwaited", wait=False)
    child = never_waited._starting[0]
    never_waited.stop()                       # closes its end of the pipe: the child exits, and is reaped
    assert child.returncode is not None
