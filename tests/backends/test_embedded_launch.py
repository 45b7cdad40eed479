"""Engine processes launched before the gateway is built (`tokenomy serve`): the backends take them over, and a
start that fails part-way kills those already launched."""

from __future__ import annotations

import psutil
import pytest

from tests.conftest import SMALL_ENGINE
from tests.helpers.wait import wait_until
from tokenomy.backends.embedded_launch import launch_engines
from tokenomy.config import Config
from tokenomy.gateway import build_backend
from tokenomy.models.memory import MEMORY_ENV, DoesNotFit


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


def test_the_backend_takes_over_the_engine_process_launched_for_its_model() -> None:
    config = Config.model_validate({"engine": SMALL_ENGINE,
                                    "models": [{"name": "small", "gguf": "smollm2-135m-instruct"}]})
    before = children()
    launched = launch_engines(config)
    pid = launched["small"].launch[0].pid
    assert pid in children() - before
    backend = build_backend(config.models[0], config, launched=launched, wait=True)
    try:
        assert launched == {}                   # taken over once: a reload starts its own
        assert backend.engine.pid == pid and backend.engine.state == "ready"
        assert children() - before == {pid}     # no second engine process
    finally:
        backend.engine.stop()
    wait_until(lambda: pid not in children(), what="the engine process to end")


def test_a_model_that_does_not_fit_kills_the_engines_launched_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "1G")
    config = Config.model_validate({"models": [
        {"name": "small", "gguf": "smollm2-135m-instruct", "engine": {**SMALL_ENGINE, "n_ctx": 4096}},
        {"name": "big", "gguf": "smollm2-135m-instruct", "engine": {**SMALL_ENGINE, "n_ctx": 1 << 20}}]})
    before = children()
    with pytest.raises(DoesNotFit, match="does not fit"):
        launch_engines(config)
    wait_until(lambda: children() <= before, what="the first model's engine process to end")
