"""Embedded models' engine settings, and their processes launched before the gateway is built.

`tokenomy serve` launches each embedded model's engine process first (launch_engines), and only then imports and
builds the gateway, whose backends take the processes over (Gateway(launched=...)): the children load their models
while the parent imports the web framework and builds the rest (docs/install.md has the phases of a start). This
module imports only what that needs."""

from __future__ import annotations

import logging
import os

from tokenomy.config import AnthropicModelSpec, Config, EmbeddedModelSpec
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.launch import Launched, launch
from tokenomy.models.catalog import resolve_gguf
from tokenomy.models.memory import DoesNotFit, Fit, engine_memory, size

log = logging.getLogger("tokenomy")


def engine_settings(spec: EmbeddedModelSpec, config: Config, *, n_threads: int | None = None,
                    fits: dict[str, Fit] | None = None) -> tuple[str, EngineConfig]:
    """An embedded model's GGUF path and the engine config to load it with: the model's engine settings, its
    window from its GGUF unless set, once its weights and KV are known to fit beside the models in ``fits``, where
    its own Fit is added (models/memory.py); ``n_threads`` overrides the engine's threads. DoesNotFit for a model
    memory cannot hold."""
    cfg = spec.engine or config.engine
    if n_threads is not None:
        cfg = cfg.model_copy(update={"n_threads": n_threads})
    path = str(resolve_gguf(spec.gguf))
    if cfg.draft_model:
        cfg = cfg.model_copy(update={"draft_model": str(resolve_gguf(cfg.draft_model))})
    fits = {} if fits is None else fits
    in_ram = sum(f.need for f in fits.values() if not f.on_gpu)     # VRAM's free figure excludes its own
    cfg, fit = size(path, cfg, committed=in_ram, draft_path=cfg.draft_model)
    fits[spec.name] = fit
    start = engine_memory(path, cfg, cfg.draft_model)
    log.info("loading %s from %s: a %d-token window (%s), %.2f GiB of weights and KV (%.2f GiB at start: KV "
             "streams of %d cells, grown as sequences need)", spec.name, path, fit.window, fit.source,
             (fit.weight_bytes + fit.kv_bytes) / (1 << 30), (start.weight_bytes + start.kv_start_bytes) / (1 << 30),
             start.start_cells // cfg.n_seqs if not cfg.kv_unified else start.start_cells)
    cores = os.cpu_count() or 1
    if cfg.n_threads in (0, cores) and cores > 1:
        log.warning("engine %s decodes on all %d cores: any other CPU work on this machine stalls every step "
                    "(measured 3.6x slower with one core busy; docs/engine.md). On a shared machine set "
                    "engine.n_threads to %d.", spec.name, cores, cores - 1)
    return path, cfg


def token_routed(config: Config) -> set[str]:
    """The models of token routes: their router drives the engines step by step (router/token_routing.py), so they
    are loaded at start and stay loaded, outside the fleet."""
    return {m for r in config.routes.values() if "token" in r.strategies for m in r.models}


def sized_alone(spec: EmbeddedModelSpec, config: Config) -> tuple[str, EngineConfig, Fit] | None:
    """A fleet model's GGUF path, engine config and Fit, sized alone (placement weighs it against the others when
    it loads); None, logged, for a model fleet.discover found that memory cannot hold at all (DoesNotFit for a
    configured one)."""
    sized: dict[str, Fit] = {}
    try:
        path, cfg = engine_settings(spec, config, fits=sized)
    except DoesNotFit as e:
        if not spec.discovered:
            raise
        log.warning("fleet: %s (found by fleet.discover) is left out: %s", spec.name, e)
        return None
    return path, cfg, sized[spec.name]


def preloads(config: Config, spec: EmbeddedModelSpec) -> bool:
    """Whether `spec` loads when tokenomy starts: its `preload`, else true for the first embedded model only (the
    others load on their first request: backends/fleet.py)."""
    if spec.preload is not None:
        return spec.preload
    if spec.name in token_routed(config):
        return True      # a token route drives its engines itself: loaded at start, outside the fleet
    return next((m for m in config.models if isinstance(m, EmbeddedModelSpec)), None) is spec


def launch_engines(config: Config) -> dict[str, Launched]:
    """Launch every preloaded embedded model's engine process (preloads), after the checks that stop a start
    before any model loads (an upstream key's variable unset: ConfigError; a model memory cannot hold: DoesNotFit).
    On a failure the processes already launched are killed."""
    for spec in config.models:
        if isinstance(spec, AnthropicModelSpec):
            spec.api_key()
    fits: dict[str, Fit] = {}
    launched: dict[str, Launched] = {}
    try:
        for spec in config.models:
            if isinstance(spec, EmbeddedModelSpec) and preloads(config, spec):
                path, cfg = engine_settings(spec, config, fits=fits)
                launched[spec.name] = Launched(path, cfg, fits[spec.name], launch(path, cfg, spec.name))
    except BaseException:
        for started in launched.values():
            started.launch[0].kill()
            started.launch[0].wait()
        raise
    return launched
