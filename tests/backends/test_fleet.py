"""The fleet with real engines: copies of the packaged SmolLM2 under different names are different models, each
loaded on its first request, placed within a memory limit, evicted by reload cost, unloaded after keep_alive."""

from __future__ import annotations

import json
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from tests.conftest import NO_CACHE, live_server
from tests.helpers.answers import assert_chat_end
from tests.helpers.bench_module import load_bench
from tests.helpers.wait import wait_until
from tokenomy.backends.embedded_launch import engine_settings
from tokenomy.cli import app
from tokenomy.config import Config, EmbeddedModelSpec

# small windows and few sequences: each engine loads quickly and holds little
ENGINE = {"n_ctx": 2048, "max_model_len": 512, "max_running": 2, "max_retired": 2, "max_batch_tokens": 256,
          "kv_tier_ram_mb": 0, "n_threads": 1}
GIB = 1 << 30


def models(*names: str, **extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": n, "gguf": "smollm2-135m-instruct", "engine": ENGINE, **extra.get(n, {})} for n in names]


def one_model_bytes(overhead_mb: int = 96) -> int:
    """What placement counts for one of these models (weights, KV, KV tier, the engine process)."""
    config = Config.model_validate({"models": models("x")})
    spec = config.models[0]
    assert isinstance(spec, EmbeddedModelSpec)
    fits: dict[str, Any] = {}
    engine_settings(spec, config, fits=fits)
    return fits["x"].need + (overhead_mb << 20)


def chat(root: str, model: str, max_tokens: int = 4, **extra: Any) -> httpx.Response:
    return httpx.post(f"{root}/v1/chat/completions", timeout=180, json={
        "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": max_tokens, **extra})


def ps(root: str) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in httpx.get(f"{root}/admin/models", timeout=30).json()["models"]}


def metric(root: str, line_start: str) -> float:
    for line in httpx.get(f"{root}/metrics", timeout=30).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_models_are_available_and_load_on_their_first_request_once() -> None:
    cfg = {"models": models("a", "b"), "cache": NO_CACHE}
    with live_server(cfg) as s:
        listed = {m["id"]: m for m in httpx.get(f"{s.base_url}/models").json()["data"]}
        assert listed["a"]["state"] == "loaded"          # the first model preloads
        assert listed["b"]["state"] == "available"
        assert listed["b"]["context_window"] == 512 and listed["b"]["memory_bytes"] > 0
        with ThreadPoolExecutor(4) as pool:              # concurrent first requests wait for one load
            answers = list(pool.map(lambda _: chat(s.root, "b"), range(4)))
        for r in answers:
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            assert_chat_end(r.json()["choices"][0]["finish_reason"], u["completion_tokens"], 4)
        line = ps(s.root)["b"]
        assert line["state"] == "loaded" and line["loads"] == 1 and line["load_s"] > 0
        assert line["rss_bytes"] > 0
        assert metric(s.root, 'tokenomy_model_loads_total{model="b"}') == 1
        health = httpx.get(f"{s.root}/health").json()
        assert health["fleet"]["memory_limit_source"].startswith("80% of")
        assert {m["name"] for m in health["fleet"]["models"] if m["state"] == "loaded"} == {"a", "b"}


def test_a_third_model_evicts_the_cheaper_to_reload_idle_one() -> None:
    one = one_model_bytes()
    cfg = {"models": models("a", "b", "c"), "cache": NO_CACHE,
           "fleet": {"memory_limit_gb": 2.5 * one / GIB}}
    with live_server(cfg) as s:
        assert chat(s.root, "b").status_code == 200      # a (preloaded) and b loaded: the limit is full
        for _ in range(6):                               # a is asked often, b once: b costs less to reload
            assert chat(s.root, "a").status_code == 200
        r = chat(s.root, "c")
        assert r.status_code == 200, r.text
        lines = ps(s.root)
        assert lines["b"]["state"] == "available" and lines["b"]["evictions"] == 1
        assert lines["a"]["state"] == "loaded" and lines["c"]["state"] == "loaded"
        assert metric(s.root, 'tokenomy_model_evictions_total{model="b"}') == 1
        assert metric(s.root, 'tokenomy_model_memory_bytes{kind="estimated",model="c"}') > 0


def test_lru_by_count_evicts_the_least_recently_used_whatever_its_rate() -> None:
    """llama.cpp router's rule (fleet.eviction lru, fleet.max_loaded), the baseline bench/fleet.py measures: b is
    asked most, but a last, so c's load evicts b, where the cost rule would evict a."""
    cfg = {"models": models("a", "b", "c"), "cache": NO_CACHE, "fleet": {"eviction": "lru", "max_loaded": 2}}
    with live_server(cfg) as s:
        for _ in range(4):
            assert chat(s.root, "b").status_code == 200
        assert chat(s.root, "a").status_code == 200      # a (preloaded) used last
        r = chat(s.root, "c")
        assert r.status_code == 200, r.text
        lines = ps(s.root)
        assert [lines[n]["state"] for n in "abc"] == ["loaded", "available", "loaded"]
        assert lines["b"]["evictions"] == 1


# a request that runs for a while (seconds): most of the window's tokens, none drafted (a small model's loops would
# be drafted many tokens a step)
LONG = {"model": "b", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 480, "ignore_eos": True,
        "speculative": False, "stream": True}


def test_no_eviction_under_a_running_request_and_a_503_naming_the_figures() -> None:
    one = one_model_bytes()
    cfg = {"models": models("a", "b", "c"), "cache": NO_CACHE,
           "fleet": {"memory_limit_gb": 2.5 * one / GIB}}
    with live_server(cfg) as s:
        assert chat(s.root, "b").status_code == 200
        for _ in range(6):                               # b would be the one to evict, were it idle
            assert chat(s.root, "a").status_code == 200
        body = LONG
        with httpx.stream("POST", f"{s.base_url}/chat/completions", json=body, timeout=180) as streaming:
            lines = streaming.iter_lines()
            wait_until(lambda: ps(s.root)["b"]["running"] == 1, what="b to run the request")
            r = chat(s.root, "c")                        # evicts a, the idle one, though b is cheaper
            assert r.status_code == 200, r.text
            assert ps(s.root)["a"]["state"] == "available"
            assert ps(s.root)["b"]["state"] == "loaded"
            rest = list(lines)
            assert "data: [DONE]" in rest
        # every loaded model busy: b and c each run a request, and a has no room
        held = LONG
        with httpx.stream("POST", f"{s.base_url}/chat/completions", json=held, timeout=180), \
                httpx.stream("POST", f"{s.base_url}/chat/completions", json={**held, "model": "c"}, timeout=180):
            wait_until(lambda: [ps(s.root)[n]["running"] for n in "bc"] == [1, 1], what="b and c to run")
            r = chat(s.root, "a")
            assert r.status_code == 503, r.text
            message = r.json()["error"]["message"]
            assert "needs" in message and "GiB" in message and "held by" in message and "running" in message
            assert int(r.headers["retry-after"]) >= 1


def test_keep_alive_zero_unloads_after_the_request_and_minus_one_keeps() -> None:
    cfg = {"models": models("a", "b", "c"), "cache": NO_CACHE, "fleet": {"keep_alive": "1s"}}
    with live_server(cfg) as s:
        assert chat(s.root, "b", keep_alive=-1).status_code == 200
        assert chat(s.root, "c", keep_alive=0).status_code == 200
        wait_until(lambda: ps(s.root)["c"]["state"] == "available", what="c to unload after keep_alive 0")
        wait_until(lambda: ps(s.root)["a"]["state"] == "available", what="a to unload after fleet.keep_alive 1s")
        lines = ps(s.root)
        assert lines["b"]["state"] == "loaded" and lines["b"]["keep_alive_left_s"] is None
        bad = chat(s.root, "b", keep_alive="soon")
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]["message"]


def test_admin_load_and_unload_end_the_engine_process() -> None:
    cfg = {"models": models("a", "b"), "cache": NO_CACHE}
    with live_server(cfg) as s:
        r = httpx.post(f"{s.root}/admin/models/b/load", timeout=180)
        assert r.status_code == 200 and r.json()["state"] == "loaded"
        pid = dict(s.gateway.engines())["b"].pid
        assert psutil.pid_exists(pid)
        shown = CliRunner().invoke(app, ["ps", "--base-url", s.base_url])      # `tokenomy ps` against it
        assert shown.exit_code == 0, shown.output
        rows = {line.split()[0]: line.split() for line in shown.output.splitlines()[1:-1]}
        assert rows["a"][1] == "loaded" and rows["b"][1] == "loaded" and rows["b"][6] == "1"
        unloaded = CliRunner().invoke(app, ["unload", "b", "--base-url", s.base_url])
        assert unloaded.exit_code == 0 and unloaded.output.strip() == "b: unloaded", unloaded.output
        assert ps(s.root)["b"]["state"] == "available"
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert httpx.post(f"{s.root}/admin/models/nope/load").status_code == 404


def test_a_model_that_does_not_fit_at_all_gets_a_503_with_its_figures() -> None:
    cfg = {"models": models("a", "b", a={"preload": False}), "cache": NO_CACHE, "fleet": {"memory_limit_gb": 0.01}}
    with live_server(cfg) as s:
        r = chat(s.root, "b")
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert "does not fit at all" in message and "GiB" in message and "fleet.memory_limit_gb" in message
        assert ps(s.root)["b"]["state"] == "available"


def on_gpu_0(monkeypatch: pytest.MonkeyPatch, free_bytes: int, measured: int | None = None) -> None:
    """Models with engine.main_gpu 0 are sized as if all their layers were on a GPU 0 with `free_bytes` free (this
    machine has none: the engines still run on the CPU); main_gpu 1 stays in RAM. NVML says each engine process
    holds `measured` bytes of GPU memory."""
    import tokenomy.hardware.gpu as nvml
    import tokenomy.models.memory as memory

    monkeypatch.setattr(memory, "_on_gpu", lambda name, layers, n_layers, main_gpu:
                        (free_bytes, "free VRAM of GPU 0, NVML (simulated)") if main_gpu == 0 else None)
    monkeypatch.setattr(nvml, "process_memory", lambda pid: measured)


def test_models_on_a_gpu_are_placed_in_its_memory_and_only_a_model_there_is_evicted_for_one(monkeypatch,
                                                                                            caplog) -> None:
    on_gpu_0(monkeypatch, 64 * GIB, measured=5 * GIB)
    caplog.set_level(logging.INFO, logger="tokenomy.fleet")
    config = Config.model_validate({"models": models("x", x={"engine": {**ENGINE, "main_gpu": 0}})})
    fits: dict[str, Any] = {}
    engine_settings(config.models[0], config, fits=fits)                   # type: ignore[arg-type]
    vram = fits["x"].weight_bytes + fits["x"].kv_bytes
    gpu, ram = {"engine": {**ENGINE, "main_gpu": 0}}, {"engine": {**ENGINE, "main_gpu": 1}}
    cfg = {"models": models("g1", "g2", "g3", "r", g1=gpu, g2=gpu, g3=gpu, r=ram), "cache": NO_CACHE,
           "fleet": {"gpu_memory_limit_gb": 2.5 * vram / GIB, "memory_limit_gb": 8}}
    with live_server(cfg) as s:
        for name in ("g1", "g2", "g1", "g2", "g1", "g2", "r"):      # r, asked least, is the cheapest to reload
            assert chat(s.root, name).status_code == 200
        view = httpx.get(f"{s.root}/admin/models", timeout=30).json()
        assert view["gpus"]["GPU 0"]["memory_limit_source"] == "fleet.gpu_memory_limit_gb"
        assert view["gpus"]["GPU 0"]["memory_held_bytes"] == 2 * vram
        lines = ps(s.root)
        assert (lines["g1"]["device"], lines["g1"]["vram_bytes"], lines["r"]["device"]) == ("GPU 0", vram, "RAM")
        # what NVML says the engine holds there is shown, and logged when it is off the estimate by over 20%
        assert (lines["g1"]["vram_measured_bytes"], lines["r"]["vram_measured_bytes"]) == (5 * GIB, None)
        assert any("g1's memory on GPU 0 5.00 GiB is" in r.getMessage() for r in caplog.records)
        assert not any("r's memory on" in r.getMessage() for r in caplog.records)
        r = chat(s.root, "g3")                                      # GPU 0 is full, RAM is not
        assert r.status_code == 200, r.text
        lines = ps(s.root)
        assert lines["r"]["state"] == "loaded" and lines["r"]["evictions"] == 0     # evicting r frees no VRAM
        assert sorted(lines[n]["state"] for n in ("g1", "g2")) == ["available", "loaded"]
        shown = CliRunner().invoke(app, ["ps", "--base-url", s.base_url])
        assert shown.exit_code == 0 and "GPU 0: " in shown.output and "fleet.gpu_memory_limit_gb" in shown.output
    pinned = {"engine": {**ENGINE, "main_gpu": 0}, "pin": True}
    cfg = {"models": models("g1", "g2", "g3", g1=pinned, g2=pinned, g3=gpu), "cache": NO_CACHE,
           "fleet": {"memory_share": 0.5}}
    on_gpu_0(monkeypatch, int(4.5 * vram))                          # a 50% share holds two
    with live_server(cfg) as s:
        assert chat(s.root, "g2").status_code == 200
        r = chat(s.root, "g3")
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "GiB of GPU 0" in message and "50% of the free VRAM of GPU 0" in message and "pinned" in message


def held_engines(gate: str) -> list[psutil.Process]:
    """The engine processes started under the gate (other live servers' engines, a session fixture's, are not)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.environ().get("TOKENOMY_TEST_ENGINE_GATE") == gate and "tokenomy.engine.core" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:        # another server's process that ended meanwhile
            pass
    return found


# Python runs this in every process started while the test holds the gate: an engine process waits at its start
# (inside its load, as the fleet sees it) until the gate file is gone, so the kill lands in the load every time.
HOLD = """import os, time
gate = os.environ.get("TOKENOMY_TEST_ENGINE_GATE")
while gate and os.path.exists(gate):
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_an_engine_killed_during_its_load_fails_that_load_and_the_next_request_loads_again(
        tmp_path, monkeypatch) -> None:
    cfg = {"models": models("a", "b"), "cache": NO_CACHE}
    with live_server(cfg) as s:
        (tmp_path / "sitecustomize.py").write_text(HOLD)
        gate = tmp_path / "gate"
        gate.touch()
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        monkeypatch.setenv("TOKENOMY_TEST_ENGINE_GATE", str(gate))
        got: list[httpx.Response] = []
        t = threading.Thread(target=lambda: got.append(chat(s.root, "b")))
        t.start()
        child = wait_until(lambda: held_engines(str(gate)), what="b's engine process to start")[0]
        assert ps(s.root)["b"]["state"] == "loading"
        child.kill()
        t.join(180)
        assert got[0].status_code == 503, got[0].text
        line = ps(s.root)["b"]
        assert line["state"] == "available" and "SIGKILL" in line["last_error"]
        gate.unlink()
        r = chat(s.root, "b")
        assert r.status_code == 200, r.text
        assert ps(s.root)["b"]["loads"] == 1


def test_a_conversation_survives_an_unload_and_reload_of_its_model() -> None:
    """The next turn after the model was unloaded and loaded again reads its history from the KV saved at unload:
    counted in the usage's cached tokens, not timed."""
    cfg = {"models": models("a", "b", b={"engine": {**ENGINE, "kv_tier_ram_mb": 64}}), "cache": NO_CACHE}
    history = [{"role": "system", "content": "You answer questions about the weather. " * 30},
               {"role": "user", "content": "Is it going to rain today?"}]
    with live_server(cfg) as s:
        first = httpx.post(f"{s.base_url}/chat/completions", timeout=180, json={
            "model": "b", "messages": history, "max_tokens": 8, "temperature": 0})
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        prompt = first.json()["usage"]["prompt_tokens"]
        assert prompt > 200, prompt
        assert httpx.post(f"{s.root}/admin/models/b/unload", timeout=60).json()["outcome"] == "unloaded"
        assert ps(s.root)["b"]["state"] == "available"
        turn = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": "And tomorrow?"}]
        second = httpx.post(f"{s.base_url}/chat/completions", timeout=180, json={
            "model": "b", "messages": turn, "max_tokens": 8, "temperature": 0})
        assert second.status_code == 200, second.text
        line = ps(s.root)["b"]
        assert line["loads"] == 2 and line["adopted_prefixes"] >= 1
        usage = second.json()["usage"]
        # a cold prefill of this turn would compute every prompt token; the reloaded model reuses the first turn's
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.8 * prompt


@pytest.mark.slow
def test_the_fleet_bench_runs_both_rules_on_one_trace(monkeypatch, capsys) -> None:
    """bench/fleet.py as its docstring says: both rules on the same requests, the loads and ratios counted by the
    servers (not a timing claim: that is the bench's, docs/fleet.md)."""
    bench = load_bench("fleet.py")
    work = bench.trace(3, 12, 1.1, 0)
    assert work == bench.trace(3, 12, 1.1, 0) and len({m for m, _ in work}) > 1     # seeded, and a mix
    monkeypatch.setattr(sys, "argv", ["fleet.py", "--models", "3", "--fits", "2", "--requests", "8", "--rounds", "1",
                                      "--json"])
    bench.main()
    got = json.loads(capsys.readouterr().out)
    for row in got["rows"].values():
        assert row["requests"] == 8 and 1 <= row["loads"] <= 3 and row["load_s"] > 0
        assert 0 < row["ttft_p50_s"] <= row["ttft_p95_s"]
    assert got["load_s_lru_over_cost"] > 0
