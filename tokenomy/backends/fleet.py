"""The fleet: which embedded models are loaded, loaded when asked for, placed by memory, evicted by reload cost.

Every embedded model is *available*; its engine process starts on its first request (or at start with `preload`).
Requests that arrive while it loads wait for that one load, at most `fleet.max_waiting` of them and for
`fleet.load_wait_s`; the rest get a 503 with Retry-After. Before a load, the model's planned bytes (weights, KV at
its window and the KV tier: models/memory.py, the planner's arithmetic) must fit beside the loaded and loading
models' within the limits: RAM (fleet.memory_limit_gb) and, for a model whose layers are all on a GPU, that GPU's
memory (fleet.gpu_memory_limit_gb; its weights and KV go there, its KV tier and engine process stay in RAM). When
they do not, idle models that would free memory where it is short are evicted cheapest first, where

    cost = seconds its last load took x its requests per second over fleet.rate_window_s

(what evicting it is expected to cost in reload time), ties going to the longest idle. A model with a request
running, `pin: true` or keep_alive -1 is never evicted; when the evictable ones cannot make room the request gets a
503 naming the figures. After its last request a model stays loaded for its keep_alive (the request's, else the
model's, else fleet.keep_alive; Ollama's meaning), then its engine process ends. A model is never unloaded under a
running request: an unload asked meanwhile happens when the last one ends.

Ollama's scheduler (server/sched.go) evicts the idle runner with the shortest keep-alive; llama.cpp's router mode by
count. Neither weighs what the reload costs, which is what an eviction spends.

With `server.workers` > 1 the supervisor runs the one Fleet (server/fleet_host.py), its loaded models' backends
the engine processes it hosts (HostedEngine: `engine`, `close()`), and each API worker sees it through a
FleetProxy (backends/fleet_proxy.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenomy.backends.base import BackendError
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.config import Config, EmbeddedModelSpec, keep_alive_seconds
from tokenomy.context.tokens import TokenCount
from tokenomy.engine.client import EngineClient
from tokenomy.engine.config import EngineConfig
from tokenomy.generation import Delta, GenRequest
from tokenomy.hardware import gpu
from tokenomy.models.memory import Fit, engine_memory

if TYPE_CHECKING:
    from tokenomy.metrics.prometheus import FleetCounters

log = logging.getLogger("tokenomy.fleet")

GIB = 1 << 30
RSS_TOLERANCE = 0.2        # a measured engine RSS (or GPU memory) further than this from the estimate is logged


class FleetFull(BackendError):
    """A model cannot be loaded now: no room that evicting idle models could make, too many waiting for its
    load, or the load failed. A 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message, status=503, retryable=True, retry_after=retry_after)


@dataclass
class GpuLimit:
    """One GPU's memory the fleet places fully offloaded models in, and where the figure comes from."""

    limit_bytes: int
    source: str


@dataclass
class Placement:
    """The memory the fleet places models in, and where the figures come from (for /health): RAM, and each GPU's
    (by device name, "GPU 0", or "GPUs" for models split over every GPU), added as its first model is."""

    limit_bytes: int
    source: str
    gpus: dict[str, GpuLimit] = field(default_factory=dict)


class FleetModel:
    """One embedded model of the fleet, as a backend: its state (available, loading, loaded, unloading), its engine
    while loaded (an EmbeddedBackend; the supervisor's HostedEngine under server.workers), its planned bytes, and
    what its loads and requests have measured."""

    def __init__(self, fleet: Fleet, spec: EmbeddedModelSpec, path: str, cfg: EngineConfig, fit: Fit,
                 make: Callable[[], EmbeddedBackend]) -> None:
        self.fleet = fleet
        self.name = spec.name
        self.spec = spec
        self.path, self.cfg, self.fit = path, cfg, fit
        start = engine_memory(path, cfg, cfg.draft_model)      # what its engine holds once loaded
        self.start_vram_bytes = start.weight_bytes + start.kv_start_bytes if fit.on_gpu else 0
        self.start_bytes = start.at_start           # in RAM, start_vram_bytes of it on its GPU
        self._make = make
        self.state = "available"
        self.backend: EmbeddedBackend | None = None
        self.active = 0                         # requests running on it now
        self.waiting = 0                        # requests waiting for its load
        self.loads = self.evictions = 0
        self.load_s: float | None = None        # seconds its last load took
        self.load_s_total = 0.0
        self.rss_bytes: int | None = None       # its engine process's RSS, measured after the load
        self.vram_measured_bytes: int | None = None     # and the GPU memory it holds (NVML), on a GPU
        self.last_used = 0.0                    # monotonic time its last request ended (or it loaded)
        self.keep_for: float | None = 0.0       # the keep_alive its last request left (None: keep)
        self.unload_when_idle: str | None = None   # an unload asked while a request ran: why
        self.removed = False                    # no longer served (Fleet.remove): left out of the ps view
        self.holds = 0                          # open Responses WebSockets whose chain it serves (Fleet.hold)
        self.recent: deque[float] = deque()     # arrival times within fleet.rate_window_s
        self.error: str | None = None           # why the last load failed
        self.adopted_prefixes = 0               # saved prefixes its last load took back from the one before
        self._loading: asyncio.Future[EmbeddedBackend] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # ---- figures ---------------------------------------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        """All the bytes placement counts for it: weights, KV at its window, its KV tier, and the engine process's
        own (fleet.engine_overhead_mb); `ram_bytes` + `vram_bytes`."""
        return self.ram_bytes + self.vram_bytes

    @property
    def device(self) -> str | None:
        """The GPU whose memory holds its weights and KV ("GPU 0"; "GPUs" split over all), None: RAM."""
        if not self.fit.on_gpu:
            return None
        return "GPUs" if self.cfg.main_gpu is None else f"GPU {self.cfg.main_gpu}"

    @property
    def vram_bytes(self) -> int:
        """Its weights and KV when they are on a GPU, else 0."""
        return self.fit.weight_bytes + self.fit.kv_bytes if self.fit.on_gpu else 0

    @property
    def ram_bytes(self) -> int:
        """What it holds in RAM: the engine process, and its KV tier (with weights and KV, off a GPU)."""
        return self.fleet.overhead_bytes + (self.fit.tier_bytes if self.fit.on_gpu else self.fit.need)

    @property
    def engine(self) -> EngineClient | None:
        """Its engine while loaded (None while it is available, loading or unloading)."""
        return self.backend.engine if self.backend is not None and self.state == "loaded" else None

    def rate(self, now: float) -> float:
        """Its requests per second over fleet.rate_window_s."""
        window = self.fleet.rate_window_s
        while self.recent and now - self.recent[0] > window:
            self.recent.popleft()
        return len(self.recent) / window

    def eviction_cost(self, now: float) -> float:
        """Expected reload seconds per second that evicting it spends: last load seconds x request rate."""
        return (self.load_s or 0.0) * self.rate(now)

    def keep_alive_left(self, now: float) -> float | None:
        """Seconds until its keep_alive unloads it (None: kept; 0 while a request runs it is not counting)."""
        if self.state != "loaded" or self.keep_for is None:
            return None
        if self.active:
            return self.keep_for
        return max(self.last_used + self.keep_for - now, 0.0)

    def evictable(self) -> bool:
        return self.state == "loaded" and self.active == 0 and self.holds == 0 and not self.spec.pin \
            and self.keep_for is not None

    def describe(self, now: float) -> dict[str, Any]:
        """Its line of the ps view (/health, the dashboard, `tokenomy ps`)."""
        return {"name": self.name, "state": self.state, "context_window": self.fit.window,
                "memory_bytes": self.memory_bytes, "device": self.device or "RAM", "vram_bytes": self.vram_bytes,
                "start_bytes": self.start_bytes, "rss_bytes": self.rss_bytes,
                "vram_measured_bytes": self.vram_measured_bytes,
                "running": self.active,
                "waiting": self.waiting, "held": self.holds, "idle_s": round(now - self.last_used, 1)
                if self.state == "loaded" and not self.active else 0.0,
                "keep_alive_left_s": self.keep_alive_left(now), "pinned": self.spec.pin, "loads": self.loads,
                "evictions": self.evictions, "load_s": self.load_s, "load_s_total": round(self.load_s_total, 3),
                "requests_per_s": round(self.rate(now), 4), "adopted_prefixes": self.adopted_prefixes,
                "last_error": self.error}

    # ---- the Backend protocol ------------------------------------------------------------------------------
    async def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The loaded engine's answer (loading it first); FleetFull (503) when it cannot be loaded in time."""
        t0, loaded = time.perf_counter(), self.state == "loaded"
        backend = await self.fleet.acquire(self)
        waited = 0.0 if loaded else time.perf_counter() - t0
        try:
            async for d in backend.stream(req):
                if waited and d.usage is not None:
                    d.usage.load_s = waited
                yield d
        finally:
            self.fleet.release(self, req.params.get("keep_alive"))

    def count_tokens(self, req: GenRequest) -> TokenCount:
        """Exact from the engine's tokenizer once loaded; before, an estimate (4 characters a token) so that
        counting never starts a load."""
        if self.backend is not None:
            return self.backend.count_tokens(req)
        text = req.prompt or "".join(str(m.get("content") or "") for m in req.messages or [])
        return TokenCount(len(text) // 4 + 1, exact=False)

    async def health(self) -> bool:
        if self.backend is not None:
            return await self.backend.health()
        return self.error is None or self.state != "available"

    def expected_wait_s(self) -> float:
        if self.backend is not None:
            return self.backend.expected_wait_s()
        return self.load_s or 0.0

    def queued(self) -> float | None:
        return self.backend.queued() if self.backend is not None else float(self.waiting)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        backend, self.backend = self.backend, None
        self.state = "available"
        if backend is not None:
            await backend.close()


class Fleet:
    """The embedded models of one gateway, and the memory they are placed in."""

    def __init__(self, config: Config, placement: Placement, counters: FleetCounters | None = None,
                 kv_dir: Path | None = None) -> None:
        """`kv_dir`: where unloaded models' saved prefixes wait for their next load (fleet.keep_conversations);
        None: they are dropped with the engine."""
        s = config.fleet
        self.placement = placement
        self.keep_alive = keep_alive_seconds(s.keep_alive)
        self.overhead_bytes = s.engine_overhead_mb << 20
        self.kv_dir = kv_dir
        self.max_waiting, self.load_wait_s, self.rate_window_s = s.max_waiting, s.load_wait_s, s.rate_window_s
        self.eviction, self.max_loaded = s.eviction, s.max_loaded
        self.share, self.gpu_limit_gb = s.memory_share, s.gpu_memory_limit_gb
        self.counters = counters
        self.models: dict[str, FleetModel] = {}
        self.on_loaded: list[Callable[[str, EngineClient], None]] = []
        self._placing: asyncio.Lock | None = None
        self._preloading: dict[str, float] = {}     # preloaded models still starting: when they started

    def add(self, spec: EmbeddedModelSpec, path: str, cfg: EngineConfig, fit: Fit,
            make: Callable[[], EmbeddedBackend]) -> FleetModel:
        """Make `spec` available; `make` starts its engine (blocking until it is ready)."""
        m = FleetModel(self, spec, path, cfg, fit, make)
        if m.device is not None and m.device not in self.placement.gpus:
            if self.gpu_limit_gb is not None:
                pool = GpuLimit(int(self.gpu_limit_gb * GIB), "fleet.gpu_memory_limit_gb")
            else:
                pool = GpuLimit(int(fit.available * self.share), f"{self.share:.0%} of the {fit.available_source} when "
                            f"its first model was placed ({fit.available / GIB:.2f} GiB)")
            self.placement.gpus[m.device] = pool
        m.keep_for = self._keep(m, None)
        self.models[spec.name] = m
        return m

    def preload(self, m: FleetModel, starting: EmbeddedBackend) -> None:
        """`m` loads at start: its engine, `starting`, was started without waiting; wait_preloads() or start()
        waits for it. Counted against the limit from now (placement refuses nothing at start)."""
        m.state, m.backend = "loading", starting
        self._preloading[m.name] = time.perf_counter()

    def wait_preloads(self) -> None:
        """Wait, blocking, for every preloaded engine to pass its self-check (EngineStartError for one that
        failed)."""
        for name in list(self._preloading):
            self._finish_preload(self.models[name])

    def start(self) -> None:
        """On the running loop: finish the preloads in the background (requests for them wait as for any load), and
        start the keep_alive of the models loaded already."""
        for m in self.models.values():
            if m.state == "loaded" and m.keep_for is not None and not m.active and not m.holds:
                self._arm(m)
        for name in list(self._preloading):
            m = self.models[name]
            m._loading = asyncio.ensure_future(self._background_preload(m))

    async def _background_preload(self, m: FleetModel) -> EmbeddedBackend:
        try:
            await asyncio.to_thread(self._finish_preload, m)
        except Exception as e:
            raise FleetFull(f"model {m.name!r} failed to load: {e}; retry shortly") from e
        finally:
            m._loading = None
        assert m.backend is not None
        if m.keep_for is not None and not m.active and not m.holds:
            self._arm(m)
        return m.backend

    def _finish_preload(self, m: FleetModel) -> None:
        t0 = self._preloading.pop(m.name, None)
        if t0 is None or m.backend is None:
            return
        try:
            m.backend.engine.wait_ready()
        except Exception as e:
            m.state, m.error = "available", f"{type(e).__name__}: {e}"
            backend, m.backend = m.backend, None
            backend.engine.stop()
            log.error("fleet: preloading %s failed: %s", m.name, e)
            raise
        self._adopt_prefixes(m, m.backend)
        m.state = "loaded"
        self._loaded(m, time.perf_counter() - t0, "preload: true")

    # ---- figures -------------------------------------------------------------------------------------------
    def held_bytes(self, but: FleetModel | None = None, device: str | None = None) -> int:
        """The planned RAM bytes of the loaded and loading models (`but` left out); with `device`, their bytes on
        that GPU."""
        return sum(m.ram_bytes if device is None else m.vram_bytes for m in self.models.values()
                   if m is not but and m.state in ("loaded", "loading", "unloading")
                   and (device is None or m.device == device))

    def ps(self) -> dict[str, Any]:
        """The ps view: the memory limits and where they come from, what is held, and each model's line."""
        now = time.monotonic()
        return {"memory_limit_bytes": self.placement.limit_bytes, "memory_limit_source": self.placement.source,
                "memory_held_bytes": self.held_bytes(),
                "gpus": {d: {"memory_limit_bytes": p.limit_bytes, "memory_limit_source": p.source,
                             "memory_held_bytes": self.held_bytes(device=d)} for d, p in self.placement.gpus.items()},
                "models": [m.describe(now) for m in self.models.values() if not m.removed]}

    # ---- acquire and release, per request ---------------------------------------------------------------------
    async def acquire(self, m: FleetModel) -> EmbeddedBackend:
        """The loaded backend of `m`, loading it first (or waiting for the load under way), with one request
        counted as running on it until release(). FleetFull when it cannot be loaded now."""
        self.arrive(m)
        while m.state != "loaded":
            if m.waiting >= self.max_waiting:
                raise FleetFull(f"model {m.name!r} is loading and {m.waiting} requests already wait for it "
                                f"(fleet.max_waiting); retry shortly", retry_after=max(m.load_s or 5.0, 1.0))
            m.waiting += 1
            try:
                if m.state == "unloading" and m._loading is not None:
                    await asyncio.shield(m._loading)
                    continue
                if m._loading is None:
                    m._loading = asyncio.ensure_future(self._load(m, "a request"))
                await asyncio.wait_for(asyncio.shield(m._loading), self.load_wait_s)
            except TimeoutError:
                raise FleetFull(f"model {m.name!r} did not load within fleet.load_wait_s "
                                f"({self.load_wait_s:g} s); retry shortly") from None
            finally:
                m.waiting -= 1
        return self.take(m)

    def arrive(self, m: FleetModel) -> None:
        """A request for `m` arrived: counted in its rate, and its keep_alive stopped."""
        m.recent.append(time.monotonic())
        if m._timer is not None:
            m._timer.cancel()
            m._timer = None

    def take(self, m: FleetModel) -> EmbeddedBackend:
        """One more request running on `m`, which is loaded, until release()."""
        assert m.backend is not None and m.state == "loaded"
        m.active += 1
        return m.backend

    def release(self, m: FleetModel, keep_alive: Any = None) -> None:
        """One request on `m` ended: start its keep_alive (the request's when given), or unload it now."""
        m.active -= 1
        m.last_used = time.monotonic()
        m.keep_for = self._keep(m, keep_alive)
        if m.active:
            return
        if m.unload_when_idle is not None:
            why, m.unload_when_idle = m.unload_when_idle, None
            asyncio.ensure_future(self.unload(m.name, why))
        elif m.keep_for is not None and not m.holds:
            self._arm(m)

    def hold(self, name: str) -> bool:
        """Keep `name` loaded while a client holds it (a Responses WebSocket whose chain it serves, so that the
        chain's KV stays in its engine): neither evicted nor unloaded by its keep_alive until unhold(); placement
        still counts it. False when `name` is no loaded fleet model (nothing held)."""
        m = self.models.get(name)
        if m is None or m.state != "loaded":
            return False
        m.holds += 1
        if m._timer is not None:
            m._timer.cancel()
            m._timer = None
        return True

    def unhold(self, name: str) -> None:
        """One hold of `name` ended: its keep_alive counts from now once nothing holds or runs on it."""
        m = self.models.get(name)
        if m is None or m.holds == 0:
            return
        m.holds -= 1
        m.last_used = time.monotonic()
        if not m.holds and not m.active and m.keep_for is not None and m.state == "loaded":
            self._arm(m)

    def _keep(self, m: FleetModel, asked: Any) -> float | None:
        if asked is not None:
            try:
                return keep_alive_seconds(asked)
            except ValueError:
                pass     # the dialect refused bad values already; anything else falls back
        if m.spec.keep_alive is not None:
            return keep_alive_seconds(m.spec.keep_alive)
        return self.keep_alive

    def _arm(self, m: FleetModel) -> None:
        if m._timer is not None:
            m._timer.cancel()
        assert m.keep_for is not None
        why = "keep_alive 0" if m.keep_for == 0 else f"idle for its keep_alive ({m.keep_for:g} s)"
        m._timer = asyncio.get_running_loop().call_later(
            m.keep_for, lambda: asyncio.ensure_future(self.unload(m.name, why)))

    # ---- load, place, evict, unload ---------------------------------------------------------------------------
    async def load(self, name: str, why: str = "asked (POST /admin/models/{name}/load)") -> FleetModel:
        """Load `name` now (no-op when loaded); FleetFull when it cannot be placed or its engine fails."""
        m = self.models[name]
        if m.state == "loaded":
            return m
        if m._loading is None:
            m._loading = asyncio.ensure_future(self._load(m, why))
        await asyncio.shield(m._loading)
        if m.state == "loaded" and m.keep_for is not None and not m.active and not m.holds:
            self._arm(m)
        return m

    async def keep(self, name: str, keep_alive: Any) -> str:
        """A request with nothing to generate (Ollama's load and unload): keep_alive 0 unloads `name` (returns what
        unload() did); anything else loads it and keeps it for that keep_alive (None: the model's or the fleet's),
        returning "loaded"."""
        m = self.models[name]
        if keep_alive is not None and self._keep(m, keep_alive) == 0:
            return await self.unload(name, "keep_alive 0 (a request to unload)")
        await self.load(name, "a request to load")
        m.keep_for = self._keep(m, keep_alive)
        m.last_used = time.monotonic()
        if m._timer is not None:
            m._timer.cancel()
            m._timer = None
        if m.keep_for is not None and not m.active and not m.holds:
            self._arm(m)
        return "loaded"

    async def _load(self, m: FleetModel, why: str) -> EmbeddedBackend:
        try:
            if self._placing is None:
                self._placing = asyncio.Lock()
            async with self._placing:        # one placement decision at a time
                await self._make_room(m)
                m.state = "loading"
            t0 = time.perf_counter()
            try:
                backend = await asyncio.to_thread(m._make)
            except Exception as e:
                m.state, m.error = "available", f"{type(e).__name__}: {e}"
                log.error("fleet: loading %s failed after %.1f s: %s", m.name, time.perf_counter() - t0, e)
                raise FleetFull(f"model {m.name!r} failed to load: {e}; retry shortly") from e
            await asyncio.to_thread(self._adopt_prefixes, m, backend)
            m.backend, m.state, m.error = backend, "loaded", None
            self._loaded(m, time.perf_counter() - t0, why)
            return backend
        finally:
            m._loading = None

    def _loaded(self, m: FleetModel, load_s: float, why: str) -> None:
        m.loads += 1
        m.load_s = load_s
        m.load_s_total += load_s
        m.last_used = time.monotonic()
        pid = m.engine.pid if m.engine is not None else None
        m.rss_bytes = _rss(pid)
        m.vram_measured_bytes = gpu.process_memory(pid) if m.device is not None and pid is not None else None
        ram = m.start_bytes - m.start_vram_bytes
        log.info("fleet: loaded %s in %.2f s (why: %s); engine RSS %s, estimated %.2f GiB at load%s and %.2f GiB as "
                 "placed (KV grown to the window, its tier full); %.2f of %.2f GiB held", m.name, load_s, why,
                 _gib(m.rss_bytes), ram / GIB, "" if m.device is None else
                 f"; on {m.device} {_gib(m.vram_measured_bytes)}, estimated {m.start_vram_bytes / GIB:.2f} GiB",
                 m.memory_bytes / GIB, self.held_bytes() / GIB, self.placement.limit_bytes / GIB)
        for what, measured, est in (("engine RSS", m.rss_bytes, ram),
                                    (f"memory on {m.device}", m.vram_measured_bytes, m.start_vram_bytes)):
            if measured is not None and est and abs(measured - est) > RSS_TOLERANCE * est:
                log.warning("fleet: %s's %s %.2f GiB is %+.0f%% off its estimate at load %.2f GiB "
                            "(models/memory.py engine_memory)", m.name, what, measured / GIB,
                            100 * (measured - est) / est, est / GIB)
        if self.counters is not None:
            self.counters.loads.labels(m.name).inc()
            self.counters.load_seconds.labels(m.name).observe(load_s)
        engine = m.engine
        if engine is not None:
            for hook in self.on_loaded:
                hook(m.name, engine)

    async def _make_room(self, m: FleetModel) -> None:
        """Evict idle models, cheapest reload first, until `m` fits in RAM and on its GPU; FleetFull naming the
        figures when it cannot. Only a model that frees memory where it is short (or a place, under max_loaded) is
        evicted: a model in RAM makes no room on a GPU."""
        weights_kv = f"weights {m.fit.weight_bytes / GIB:.2f} + KV {m.fit.kv_bytes / GIB:.2f} at a " \
            f"{m.fit.window}-token window"
        tier_engine = f"KV tier {m.fit.tier_bytes / GIB:.2f} + engine {self.overhead_bytes / GIB:.2f}"
        # (where, its limit, the limit's source, what m needs there, of what, the device held_bytes counts)
        pools = [("RAM", self.placement.limit_bytes, self.placement.source, m.ram_bytes,
                  tier_engine if m.device is not None else f"{weights_kv} + {tier_engine}", None)]
        gpu = self.placement.gpus.get(m.device) if m.device is not None else None
        if gpu is not None:
            pools.append((m.device, gpu.limit_bytes, gpu.source, m.vram_bytes, weights_kv, m.device))
        for where, limit, source, need, parts, _ in pools:
            if need > limit:
                raise FleetFull(f"model {m.name!r} does not fit at all: it needs {need / GIB:.2f} GiB of {where} "
                                f"({parts}), over the fleet's {limit / GIB:.2f} GiB ({source})", retry_after=60.0)
        now = time.monotonic()
        while True:
            short = [(where, limit, source, need, device) for where, limit, source, need, _, device in pools
                     if need > limit - self.held_bytes(m, device)]
            if not short and not self._too_many(m):
                return
            order = (lambda v: v.last_used) if self.eviction == "lru" else \
                (lambda v: (v.eviction_cost(now), v.last_used))
            victims = sorted((v for v in self.models.values() if v is not m and v.evictable()
                              and (not short or any(d is None or v.device == d for *_, d in short))), key=order)
            if not victims:
                held = [f"{v.name} {v.memory_bytes / GIB:.2f} GiB on {v.device or 'RAM'} ({self._why_kept(v)})"
                        for v in self.models.values() if v is not m and v.state != "available"]
                room = "; ".join(
                    f"it needs {need / GIB:.2f} GiB of {where}, {max(limit - self.held_bytes(m, device), 0) / GIB:.2f}"
                    f" GiB of the fleet's {limit / GIB:.2f} GiB ({source}) is free"
                    for where, limit, source, need, device in short) or \
                    f"fleet.max_loaded ({self.max_loaded}) models are loaded"
                raise FleetFull(f"model {m.name!r} cannot load: {room}, held by {', '.join(held) or 'nothing'}; "
                                "nothing can be evicted now", retry_after=5.0)
            v = victims[0]
            why = f"least recently used ({now - v.last_used:.1f} s idle)" if self.eviction == "lru" else \
                f"lowest reload cost ({v.load_s or 0:.2f} s load x {v.rate(now) * 60:.2f} requests/min)"
            await self.unload(v.name, f"evicted for {m.name}: {why}", eviction=True)

    def _too_many(self, m: FleetModel) -> bool:
        """Whether loading `m` would pass fleet.max_loaded."""
        held = sum(1 for v in self.models.values() if v is not m and v.state in ("loaded", "loading", "unloading"))
        return self.max_loaded is not None and held >= self.max_loaded

    @staticmethod
    def _why_kept(v: FleetModel) -> str:
        if v.state != "loaded":
            return v.state
        if v.active:
            return f"{v.active} running"
        return "pinned" if v.spec.pin else "keep_alive -1" if v.keep_for is None else "idle"

    async def unload(self, name: str, why: str = "asked (POST /admin/models/{name}/unload)",
                     eviction: bool = False) -> str:
        """End `name`'s engine process; with a request running, when the last one ends. Returns what happened:
        unloaded, deferred, or not_loaded."""
        m = self.models[name]
        if m._loading is not None and m.state == "loading":
            try:
                await asyncio.shield(m._loading)
            except FleetFull:
                return "not_loaded"
        if m.state != "loaded":
            return "not_loaded"
        if m.active:
            m.unload_when_idle = why
            log.info("fleet: %s will unload when its %d running requests end (why: %s)", m.name, m.active, why)
            return "deferred"
        if m._timer is not None:
            m._timer.cancel()
            m._timer = None
        m.state = "unloading"
        backend, m.backend = m.backend, None
        done: asyncio.Future[EmbeddedBackend] = asyncio.get_running_loop().create_future()
        m._loading = done        # a request arriving meanwhile waits for this, then loads it again
        try:
            if backend is not None:
                await asyncio.to_thread(self._persist_prefixes, m, backend)
                await backend.close()
        finally:
            m.state = "available"
            m._loading = None
            done.set_result(backend)  # type: ignore[arg-type]
        if eviction:
            m.evictions += 1
            if self.counters is not None:
                self.counters.evictions.labels(m.name).inc()
        log.info("fleet: unloaded %s (why: %s); %.2f of %.2f GiB held", m.name, why, self.held_bytes() / GIB,
                 self.placement.limit_bytes / GIB)
        return "unloaded"

    async def remove(self, name: str) -> None:
        """Make `name` unavailable (no longer in the ps view): unloaded now, or when its running requests end (they
        finish on it); the caller stops routing to it first."""
        m = self.models.get(name)
        if m is None:
            return
        m.removed = True
        if await self.unload(name, "removed") != "deferred":
            del self.models[name]

    # ---- a conversation survives a swap: the KV tier's saved prefixes wait on disk for the next load ------------
    def _prefix_dir(self, m: FleetModel) -> Path | None:
        if self.kv_dir is None or not m.cfg.kv_tier_ram_mb or not m.cfg.prefix_caching:
            return None
        return self.kv_dir / "".join(c if c.isalnum() or c in "-_." else "_" for c in m.name)

    def _fingerprint(self, m: FleetModel) -> str:
        """What saved KV depends on: the model's file and its engine's KV layout."""
        return json.dumps({"path": m.path, "cfg": m.cfg.model_dump(mode="json")}, sort_keys=True)

    def _persist_prefixes(self, m: FleetModel, backend: EmbeddedBackend) -> None:
        where = self._prefix_dir(m)
        if where is None or backend.engine.state != "ready":
            return
        try:
            n = backend.engine.call("persist_tiers", str(where / "kv"), timeout=120)
            (where / "fingerprint.json").write_text(self._fingerprint(m))
            log.info("fleet: %s's %d saved prefixes written to %s for its next load", m.name, n, where)
        except Exception as e:      # the conversations will be prefilled again; nothing a request needs
            log.warning("fleet: %s's saved prefixes could not be written: %s", m.name, e)

    def _adopt_prefixes(self, m: FleetModel, backend: EmbeddedBackend) -> None:
        where = self._prefix_dir(m)
        if where is None or not (where / "fingerprint.json").exists():
            return
        try:
            if (where / "fingerprint.json").read_text() != self._fingerprint(m):
                log.info("fleet: %s's saved prefixes are of another file or KV layout: dropped", m.name)
                return
            n = backend.engine.call("adopt_tiers", str(where / "kv"), timeout=120)
            m.adopted_prefixes = n
            log.info("fleet: %s took back %d saved prefixes from its last load", m.name, n)
        except Exception as e:
            log.warning("fleet: %s's saved prefixes could not be read: %s", m.name, e)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    async def close(self) -> None:
        for m in self.models.values():
            await m.close()


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.2f} GiB"


def _rss(pid: int | None) -> int | None:
    """A process's resident bytes, or None when it cannot be read."""
    if pid is None:
        return None
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except Exception:
        return None


def default_placement(config: Config) -> Placement:
    """fleet.memory_limit_gb, else fleet.memory_share of the memory free now (models/memory.available_memory)."""
    s = config.fleet
    if s.memory_limit_gb is not None:
        return Placement(int(s.memory_limit_gb * GIB), "fleet.memory_limit_gb")
    from tokenomy.models.memory import available_memory

    free, where = available_memory()
    return Placement(int(free * s.memory_share), f"{s.memory_share:.0%} of {where} at start ({free / GIB:.2f} GiB)")
