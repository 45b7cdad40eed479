"""Before a model loads: its context window from its GGUF, and whether its weights and KV fit in memory.

The bytes come from the planner's arithmetic (models/formulas.py: weight_bytes from the file's tensors,
kv_bytes_per_sequence for the KV cache), so `tokenomy plan` and this check cannot disagree. The memory is what the
machine has available now (psutil's MemAvailable, or a cgroup's limit less its use when lower), or
TOKENOMY_MEMORY_LIMIT (bytes, or with a K/M/G/T suffix) when set; a model may take MEMORY_UTILIZATION of it.

With the model's layers all on a GPU (engine.n_gpu_layers resolving to all, on a GPU build), the memory is that
GPU's free VRAM from NVML (tokenomy/hardware/gpu.py: engine.main_gpu's, or all GPUs' together with main_gpu null), or
TOKENOMY_MEMORY_LIMIT, and the KV tier (host RAM) does not count against it; where NVML cannot say, or with only
some layers offloaded, the check is the RAM one, with a log line saying VRAM was not checked.

The window: with neither `n_ctx` nor `max_model_len` set, the model's trained context (its GGUF's
context_length) is the default, cut (in steps of 256 tokens) to what memory holds and to engine.kv_budget_mb of
KV; set either and the engine sizes as configured (EngineConfig.kv_cells) and the check only refuses what does
not fit.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from tokenomy.engine.config import DEFAULT_N_CTX, EngineConfig
from tokenomy.models import formulas as F
from tokenomy.models.gguf import read_gguf
from tokenomy.models.shape import ModelShape

log = logging.getLogger("tokenomy.fit")

MEMORY_UTILIZATION = 0.9   # the share of available memory weights and KV may take (the rest: the process, buffers)
MEMORY_ENV = "TOKENOMY_MEMORY_LIMIT"
MIN_WINDOW = 512           # memory cutting a default window below this (or the trained context) is a refusal;
                           # kv_budget_mb never cuts it below
STEP = 256                 # llama.cpp pads a stream's cells to 256
RUNTIME_BYTES = 96 << 20   # an engine process beside its weights and KV: the interpreter, numpy, llama.cpp and the
                           # engine's modules, touched compute buffers (measured: 86 MiB for SmolLM2-135M, 2-core
                           # AMD EPYC, 2026-12-05: RSS at ready less weights and KV; docs/models.md)
_KV_FORMAT = {"f16": "fp16", "q8_0": "q8", "q4_0": "q4"}     # EngineConfig.kv_type -> formulas.KV_BITS


class DoesNotFit(ValueError):
    """The model's weights and KV need more memory than there is; the message has the figures."""


@dataclass(frozen=True)
class Fit:
    window: int              # the engine's max_model_len
    source: str              # gguf: the trained context; memory / kv_budget_mb: it cut to fit; config: as set
    trained: int | None      # the GGUF's context_length
    cells: int               # KV cells the engine asks llama.cpp for
    weight_bytes: int        # the model's (and a draft model's) tensors
    kv_bytes: int            # the KV cache at `cells` (a draft's too)
    tier_bytes: int          # engine.kv_tier_ram_mb
    available: int           # memory available when checked
    available_source: str
    on_gpu: bool = False     # weights and KV in VRAM (available is VRAM; the KV tier stays in RAM, uncounted)

    @property
    def need(self) -> int:
        return self.weight_bytes + self.kv_bytes + (0 if self.on_gpu else self.tier_bytes)


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def available_memory() -> tuple[int, str]:
    """Bytes a new model may use and where the figure comes from: TOKENOMY_MEMORY_LIMIT, a cgroup's limit less
    its use (a container), or the machine's available RAM, whichever is set or smallest."""
    if os.environ.get(MEMORY_ENV):
        try:
            return _size(os.environ[MEMORY_ENV]), MEMORY_ENV
        except ValueError:
            raise DoesNotFit(f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r} is not a size (bytes, or 512M, 8G)") from None
    import psutil

    best = (int(psutil.virtual_memory().available), "available RAM")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            best = min(best, (int(limit) - used, "the cgroup's memory.max less its use"))
    except (OSError, ValueError):
        pass
    return best


def available_vram(main_gpu: int | None) -> tuple[int, str] | None:
    """Bytes of VRAM a fully offloaded model may use and where the figure comes from: TOKENOMY_MEMORY_LIMIT when
    set, else NVML's free memory of main_gpu (through CUDA_VISIBLE_DEVICES when it lists indices), or of all GPUs
    together with main_gpu None; None where NVML cannot say."""
    if os.environ.get(MEMORY_ENV):
        return available_memory()
    from tokenomy.hardware import gpu

    gpus = gpu.memory()
    if not gpus:
        return None
    if main_gpu is None:
        return sum(g.free_bytes for g in gpus), f"free VRAM of {len(gpus)} GPU(s), NVML"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    index = int(visible[main_gpu]) if main_gpu < len(visible) and visible[main_gpu].strip().isdigit() else main_gpu
    if index >= len(gpus):
        return None
    return gpus[index].free_bytes, f"free VRAM of GPU {index}, NVML"


def kv_bytes(shape: ModelShape, cfg: EngineConfig, cells: int) -> int:
    """KV bytes llama.cpp holds for `cells` cells: K at kv_type's first format and V at its second, each half of
    formulas.kv_bytes_per_sequence; with KV streams, n_seqs streams of cells / n_seqs (padded to 256) each.
    Sliding-window layers count as full ones: the runner keeps their whole KV (swa_full) so prefixes stay
    reusable."""
    shape = replace(shape, sliding_window=None)
    k, _, v = cfg.kv_type.partition("/")
    streams = 1 if cfg.kv_unified else cfg.n_seqs
    per = math.ceil(cells / streams / STEP) * STEP
    one = sum(F.kv_bytes_per_sequence(shape, _KV_FORMAT[t], per) for t in (k, v or k)) / 2
    return round(streams * one)


@dataclass(frozen=True)
class EngineMemory:
    """What an engine process for one model holds, in bytes: at start (weights + KV at the cells it allocates at
    start + runtime) and at most (its KV streams grown to the window, and its KV tier's RAM full). Weights and KV
    are the planner's arithmetic (formulas.py); the runtime is RUNTIME_BYTES. With all layers on a GPU the weights
    and KV are in VRAM and the runtime and the tier in RAM."""

    weight_bytes: int
    kv_start_bytes: int
    kv_max_bytes: int
    runtime_bytes: int
    tier_bytes: int
    start_cells: int
    max_cells: int

    @property
    def at_start(self) -> int:
        return self.weight_bytes + self.kv_start_bytes + self.runtime_bytes

    @property
    def at_most(self) -> int:
        return self.weight_bytes + self.kv_max_bytes + self.runtime_bytes + self.tier_bytes


def engine_memory(path: str, cfg: EngineConfig, draft_path: str | None = None) -> EngineMemory:
    """The memory of an engine process for the GGUF at `path` with `cfg` as it will load (the config `size`
    returns: its window set): weights (and a draft model's) + KV at cfg.start_cells (KV streams start at
    engine.kv_start_cells and grow) and at cfg.kv_cells (grown to the window; a draft model's context has that
    many from the start) + RUNTIME_BYTES, and the KV tier's RAM (engine.kv_tier_ram_mb) at most. The engine
    reports what it really holds (EngineClient.rss) to check it against."""
    shape = read_gguf(path)
    draft = read_gguf(draft_path) if draft_path else None
    weights = F.weight_bytes(shape, None).total + (F.weight_bytes(draft, None).total if draft else 0)
    draft_kv = kv_bytes(draft, cfg, cfg.kv_cells) if draft else 0
    start = kv_bytes(shape, cfg, cfg.start_cells) + draft_kv
    most = kv_bytes(shape, cfg, cfg.kv_cells) + draft_kv
    return EngineMemory(weights, start, most, RUNTIME_BYTES, cfg.kv_tier_ram_mb << 20, cfg.start_cells,
                        cfg.kv_cells)


def _figures(fit: Fit, committed: int) -> str:
    gib = 1 << 30
    other = f", {committed / gib:.2f} GiB already taken by the models before it" if committed else ""
    tier = "" if fit.on_gpu else f" + KV tier {fit.tier_bytes / gib:.2f} GiB"
    return (f"weights {fit.weight_bytes / gib:.2f} GiB + KV {fit.kv_bytes / gib:.2f} GiB ({fit.cells} cells)"
            f"{tier} = {fit.need / gib:.2f} GiB, over the "
            f"{MEMORY_UTILIZATION:.0%} of {fit.available / gib:.2f} GiB ({fit.available_source}) a model may use"
            + other)


def _on_gpu(name: str, layers: int, n_layers: int, main_gpu: int | None) -> tuple[int, str] | None:
    """The VRAM figure when all `layers` of the model go to a GPU and NVML (or TOKENOMY_MEMORY_LIMIT) has one;
    None, with a log line where VRAM goes unchecked, when the check is the RAM one."""
    if layers == 0:
        return None
    if 0 < layers < n_layers:
        log.info("%s: %d of its %d layers on the GPU: VRAM not checked, the memory check counts all in RAM", name,
                 layers, n_layers)
        return None
    vram = available_vram(main_gpu)
    if vram is None:
        log.info("%s: all layers on the GPU, but NVML cannot say how much VRAM is free: VRAM not checked, the "
                 "memory check is the RAM one", name)
    return vram


def size(path: str, cfg: EngineConfig, *, committed: int = 0, draft_path: str | None = None,
         offload: bool | None = None) -> tuple[EngineConfig, Fit]:
    """The engine config to load `path` with (the window from its GGUF when none is set) and the figures; raises
    DoesNotFit, naming them, when weights + KV + the KV tier exceed MEMORY_UTILIZATION of the available memory
    less `committed` (the bytes of models loaded before it in RAM). With all layers on a GPU (`offload`: whether
    the llama.cpp build can, vocab.gpu_offload() when None) weights + KV are checked against its free VRAM,
    which already excludes the models loaded before it."""
    shape = read_gguf(path)
    draft = read_gguf(draft_path) if draft_path else None
    weights = F.weight_bytes(shape, None).total + (F.weight_bytes(draft, None).total if draft else 0)
    tier = cfg.kv_tier_ram_mb << 20
    if offload is None:
        from tokenomy.engine.vocab import gpu_offload

        offload = gpu_offload()
    vram = _on_gpu(Path(path).name, cfg.gpu_layers(offload), shape.layers, cfg.main_gpu)
    on_gpu = vram is not None
    available, where = vram if vram is not None else available_memory()
    committed = 0 if on_gpu else committed
    budget = available * MEMORY_UTILIZATION - committed

    def fit(cells: int, window: int, source: str) -> Fit:
        kv = kv_bytes(shape, cfg, cells) + (kv_bytes(draft, cfg, cells) if draft else 0)
        return Fit(window, source, shape.context_length, cells, weights, kv, tier, available, where, on_gpu)

    trained = shape.context_length
    if cfg.max_model_len is not None and trained is not None:
        try:        # what the engine checks once llama.cpp gave it the cells: said at start, not at the first load
            cfg.window(cfg.kv_cells if cfg.kv_unified else cfg.stream_cells, trained)
        except ValueError as e:
            raise DoesNotFit(f"{Path(path).name}: {e}") from None
    if cfg.n_ctx is not None or cfg.max_model_len is not None or trained is None:
        cells = cfg.kv_cells
        window = cfg.max_model_len or min(cells if cfg.kv_unified else cells // cfg.n_seqs, trained or cells)
        chosen = fit(cells, window, "config" if trained else "engine default")
        if chosen.need > budget:
            raise DoesNotFit(f"{Path(path).name} does not fit: {_figures(chosen, committed)}; lower engine.n_ctx "
                             "or max_model_len, max_running, or kv_tier_ram_mb, or pick a smaller quantization")
        return cfg, chosen

    def cells_for(window: int) -> int:
        return max(DEFAULT_N_CTX, window) if cfg.kv_unified else cfg.n_seqs * window

    window = trained
    full = fit(cells_for(window), trained, "gguf")
    chosen = full
    kv_budget = cfg.kv_budget_mb << 20
    least_window = min(MIN_WINDOW, trained)
    while window > STEP and (chosen.need > budget or chosen.kv_bytes > kv_budget and window > least_window):
        window = (window - 1) // STEP * STEP
        chosen = fit(cells_for(window), min(window, trained), "memory")
    if chosen.source == "memory" and full.need <= budget:
        chosen = replace(chosen, source="kv_budget_mb")
    if chosen.need > budget or chosen.window < least_window:
        least = fit(cells_for(least_window), least_window, "memory")
        raise DoesNotFit(f"{Path(path).name} does not fit even with a {least.window}-token window: "
                         f"{_figures(least, committed)} (its trained context, {trained} tokens, would need "
                         f"{full.need / (1 << 30):.2f} GiB); free memory, lower max_running or kv_tier_ram_mb, "
                         "or pick a smaller quantization")
    update = {"max_model_len": chosen.window, **({"n_ctx": chosen.cells} if cfg.kv_unified else {})}
    return cfg.model_copy(update=update), chosen
