"""The check before a model loads (tokenomy/models/memory.py): the window from the GGUF, cut to what memory holds, and
a refusal with the figures when weights and KV do not fit, as the planner's arithmetic counts them; memory is made
small with TOKENOMY_MEMORY_LIMIT rather than the model large."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tokenomy.engine.config import EngineConfig
from tokenomy.models import formulas as F
from tokenomy.models.catalog import resolve_gguf
from tokenomy.models.gguf import read_gguf
from tokenomy.models.memory import (
    MEMORY_ENV,
    MEMORY_UTILIZATION,
    DoesNotFit,
    _figures,
    available_memory,
    engine_memory,
    kv_bytes,
    size,
)

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.fixture(autouse=True)
def _a_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the RAM arithmetic on any machine: the build is taken as a CPU one unless a test says
    `offload=True` (a GPU build's check: test_all_layers_on_a_gpu_...)."""
    from tokenomy.engine import vocab

    monkeypatch.setattr(vocab, "gpu_offload", lambda: False)


@pytest.fixture(scope="module")
def smollm2() -> str:
    return str(resolve_gguf("smollm2-135m-instruct"))


def test_the_default_window_is_the_trained_context(smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "64G")
    cfg, fit = size(smollm2, EngineConfig(max_running=2, max_retired=0))
    assert (fit.window, fit.source, fit.trained) == (8192, "gguf", 8192)
    assert cfg.max_model_len == 8192 and cfg.kv_cells == 2 * 8192
    # the planner's own bytes: the file's tensors, and K (q8_0) and V (f16) halves of the KV per sequence
    shape = read_gguf(smollm2)
    assert fit.weight_bytes == F.weight_bytes(shape, None).total
    per_seq = (F.kv_bytes_per_sequence(shape, "q8", 8192) + F.kv_bytes_per_sequence(shape, "fp16", 8192)) / 2
    assert fit.kv_bytes == round(2 * per_seq)


def test_the_window_is_cut_to_what_memory_holds(smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg0 = EngineConfig(max_running=2, max_retired=0, kv_tier_ram_mb=0)
    shape = read_gguf(smollm2)
    # room for the weights and two streams of 2,800 tokens (padded to 2,816, as llama.cpp pads), not 8,192
    room = F.weight_bytes(shape, None).total + kv_bytes(shape, cfg0, 2 * 2800)
    monkeypatch.setenv(MEMORY_ENV, str(int(room / MEMORY_UTILIZATION) + 1))
    cfg, fit = size(smollm2, cfg0)
    assert fit.source == "memory" and fit.window == 2816 and fit.window % 256 == 0
    assert cfg.max_model_len == 2816 and fit.need <= room


def test_a_model_that_does_not_fit_is_refused_with_the_figures(smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "64M")
    with pytest.raises(DoesNotFit) as e:
        size(smollm2, EngineConfig())
    assert str(e.value).startswith("SmolLM2-135M-Instruct.Q4_1.gguf does not fit even with a 512-token window: "
                                   "weights 0.09 GiB + KV ")
    assert "of 0.06 GiB (TOKENOMY_MEMORY_LIMIT) a model may use" in str(e.value)
    # with the cells set, the configured size is checked as it is
    monkeypatch.setenv(MEMORY_ENV, "512M")
    with pytest.raises(DoesNotFit, match=r"does not fit: weights 0\.09 GiB \+ KV 1\.61 GiB \(98304 cells\)"):
        size(smollm2, EngineConfig(n_ctx=98304, kv_tier_ram_mb=0))
    cfg, fit = size(smollm2, EngineConfig(n_ctx=4096, max_model_len=1024, max_running=2, max_retired=2,
                                          kv_tier_ram_mb=0))
    assert (fit.window, fit.source, cfg.n_ctx) == (1024, "config", 4096)
    # a window no KV stream holds is refused here, at start, as the engine would refuse it at its load
    with pytest.raises(DoesNotFit, match="max_model_len 1024 does not fit a KV stream: .* raise n_ctx to at least "
                                         "24576"):
        size(smollm2, EngineConfig(n_ctx=4096, max_model_len=1024, kv_tier_ram_mb=0))


def test_models_loaded_before_count_against_the_next(smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "1G")
    cfg = EngineConfig(n_ctx=4096, kv_tier_ram_mb=0)
    _, fit = size(smollm2, cfg)
    with pytest.raises(DoesNotFit, match="0.85 GiB already taken by the models before it"):
        size(smollm2, cfg, committed=int(0.85 * (1 << 30)))
    assert fit.need < 200 * MIB


def test_available_memory_reads_the_machine_or_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    free, where = available_memory()
    assert free > 0 and where in ("available RAM", "the cgroup's memory.max less its use")
    monkeypatch.setenv(MEMORY_ENV, "1.5G")
    assert available_memory() == (int(1.5 * (1 << 30)), MEMORY_ENV)
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(DoesNotFit, match="is not a size"):
        available_memory()


def test_serve_refuses_a_model_memory_cannot_hold_in_one_line() -> None:
    env = {**os.environ, MEMORY_ENV: "64M", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tokenomy.cli", "serve", "smollm2-135m-instruct", "--port", "9"],
                          env=env, capture_output=True, text=True, timeout=120,
                          cwd=tempfile.mkdtemp(prefix="tokenomy-fit-"))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tokenomy: SmolLM2-135M-Instruct.Q4_1.gguf does not fit even with a 512-token window")
    assert "Traceback" not in done.stderr


def test_a_window_left_to_the_model_stays_within_the_kv_budget(smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_ENV, "64G")
    cfg, fit = size(smollm2, EngineConfig(kv_budget_mb=256))      # 24 streams at 8,192 would take 3.2 GiB
    assert (fit.window, fit.source) == (512, "kv_budget_mb") and fit.kv_bytes <= 256 * MIB
    assert cfg.max_model_len == 512
    _, least = size(smollm2, EngineConfig(kv_budget_mb=64))        # the budget alone never cuts below 512
    assert (least.window, least.source) == (512, "kv_budget_mb")
    _, asked = size(smollm2, EngineConfig(kv_budget_mb=256, max_model_len=4096))   # a window asked for is kept
    assert (asked.window, asked.source) == (4096, "config")


def test_sliding_window_layers_count_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner keeps sliding-window layers' whole KV (swa_full), so Gemma 3's 18 layers all count."""
    monkeypatch.setenv(MEMORY_ENV, "64G")
    gemma = str(resolve_gguf("gemma3-270m"))
    shape = read_gguf(gemma)
    assert shape.sliding_window == 512 and shape.count("sliding") == 15
    _, fit = size(gemma, EngineConfig(n_ctx=4096, max_running=1, max_retired=0, kv_unified=True))
    assert fit.kv_bytes == 18 * 4096 * 1 * 256 * (34 / 32 + 2)      # layers x cells x K,V dims x (q8_0 + f16) bytes


def test_all_layers_on_a_gpu_are_checked_against_vram_without_the_ram_kv_tier(
        smollm2: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOKENOMY_MEMORY_LIMIT stands for the VRAM here (no GPU): room for the weights and the full window's KV, not
    for the 1 GiB KV tier as well, which stays in host RAM."""
    cfg0 = EngineConfig(max_running=2, max_retired=0)
    shape = read_gguf(smollm2)
    room = F.weight_bytes(shape, None).total + kv_bytes(shape, cfg0, 2 * 8192)
    monkeypatch.setenv(MEMORY_ENV, str(int(room / MEMORY_UTILIZATION) + 1))
    _, gpu = size(smollm2, cfg0, offload=True, committed=1 << 30)      # VRAM's free figure excludes the others
    assert (gpu.on_gpu, gpu.window, gpu.source) == (True, 8192, "gguf") and gpu.need == room
    assert "KV tier" not in _figures(gpu, 0)
    with pytest.raises(DoesNotFit, match=r"KV tier 1\.00 GiB"):                 # in RAM the tier counts too
        size(smollm2, cfg0, offload=False)
    with pytest.raises(DoesNotFit, match=r"KV tier 1\.00 GiB"):
        size(smollm2, cfg0.model_copy(update={"n_gpu_layers": 0}), offload=True)


def test_without_nvml_or_with_some_layers_the_check_is_the_ram_one_and_says_so(
        smollm2: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from tokenomy.hardware import gpu

    if gpu.memory() is not None:
        pytest.skip("NVML sees a GPU here")
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    cfg = EngineConfig(n_ctx=4096, kv_tier_ram_mb=0)
    with caplog.at_level("INFO", logger="tokenomy.fit"):
        _, fit = size(smollm2, cfg, offload=True)
        assert not fit.on_gpu and fit.available_source != MEMORY_ENV
        assert "NVML cannot say how much VRAM is free: VRAM not checked" in caplog.text
        _, part = size(smollm2, cfg.model_copy(update={"n_gpu_layers": 10}), offload=True)
        assert not part.on_gpu and "10 of its 30 layers on the GPU: VRAM not checked" in caplog.text


def test_the_estimate_counts_kv_at_the_cells_allocated_at_start_and_at_most(smollm2: str) -> None:
    cfg = EngineConfig(max_model_len=8192)                 # 24 streams of 1,024 cells at start, of 8,192 at most
    est = engine_memory(smollm2, cfg)
    shape = read_gguf(smollm2)
    assert est.weight_bytes == F.weight_bytes(shape, None).total
    assert (est.start_cells, est.max_cells) == (24 * 1024, 24 * 8192)
    assert (est.kv_start_bytes, est.kv_max_bytes) == (kv_bytes(shape, cfg, 24 * 1024), kv_bytes(shape, cfg, 24 * 8192))
    assert est.kv_max_bytes == 8 * est.kv_start_bytes
    assert est.at_most - est.at_start == est.kv_max_bytes - est.kv_start_bytes + (cfg.kv_tier_ram_mb << 20)
    whole = engine_memory(smollm2, cfg.model_copy(update={"kv_start_cells": None}))
    assert whole.kv_start_bytes == whole.kv_max_bytes == est.kv_max_bytes


@pytest.mark.slow
def test_an_engine_at_the_default_window_holds_what_the_estimate_says_at_start(smollm2: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine process `tokenomy serve` would start for the packaged model (its window from the GGUF) reports its
    RSS once ready; it is within 1.5x of the estimate either way (weights and KV are exact arithmetic; what is not
    is the runtime, a constant measured on one machine and build, and weight pages a CPU's repacking copies or
    leaves untouched), and below what holding every stream's whole window from the start would take."""
    from tokenomy.engine.client import EngineClient

    monkeypatch.setenv(MEMORY_ENV, "64G")
    cfg, fit = size(smollm2, EngineConfig(n_threads=1))
    est = engine_memory(smollm2, cfg)
    assert fit.window == 8192 and est.kv_start_bytes < est.kv_max_bytes
    engine = EngineClient(smollm2, cfg, name="estimate")
    try:
        assert est.at_start / 1.5 <= engine.rss <= 1.5 * est.at_start
        assert engine.rss < est.weight_bytes + est.kv_max_bytes
        assert engine.n_ctx == est.start_cells
    finally:
        engine.stop()
