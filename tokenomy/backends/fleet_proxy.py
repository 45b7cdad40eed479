"""The fleet as an API worker of `server.workers` sees it: the supervisor owns it (server/fleet_host.py), a worker
asks it.

With several API workers one process must decide what is loaded, or each would place, load and evict on figures
of its own. The supervisor runs the one Fleet (backends/fleet.py) and its models' engine processes; each worker
holds a FleetProxy, whose FleetModels (MirroredModel) the pipeline, the admin API, the Ollama API and the ps view
use as with one process. The worker's control pipe to the supervisor (a Link) carries:

    worker -> supervisor   ("call", id, "acquire", name)        a request needs `name`: loaded (or its load waited
                                                                 for) and counted running; answers its generation
                           ("more", name)                        one more request while this worker runs one on it
                           ("release", name, keep_alive)         a request on `name` ended
                           ("call", id, "load" | "unload", name), ("call", id, "keep", name, keep_alive)
                           ("hold", name), ("unhold", name)      a Responses WebSocket's chain (Fleet.hold)
    supervisor -> worker   ("reply", id, value, error)           error: (message, retry_after), raised as FleetFull
                           ("mirror", view)                      the fleet's state, whenever it changes
                           ("call", id, "drop", name)            an unload: close the connection to its engine first

While this worker runs a request on a model the supervisor cannot unload it, so the next one needs no round trip
("more"). A worker connects to a model's engine socket (engine/client.py, `address`) on its first request after
each load: the acquire's generation says when the engine is a new one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.backends.fleet import Fleet, FleetFull, FleetModel
from tokenomy.config import Config
from tokenomy.engine.client import EngineAddress

log = logging.getLogger("tokenomy.fleet")

# What the supervisor's FleetModels tell the workers' (FleetHost.view): their state and figures. `last_used` is a
# time.monotonic() reading, the same clock in every process of the machine.
MIRRORED = ("state", "active", "waiting", "holds", "loads", "evictions", "load_s", "load_s_total", "rss_bytes",
            "vram_measured_bytes", "last_used", "keep_for", "error", "adopted_prefixes")


class Link:
    """One end of a control pipe that carries calls both ways. call() sends ("call", id, *what) and returns a
    Future of the other end's ("reply", id, value, error), which whoever reads the pipe hands to settle(); answer()
    sends one. An error is (message, retry_after), raised as FleetFull, or a string (an engine's), raised as
    RuntimeError. close() fails the calls still waiting."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.closed = False
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._calls: dict[int, Future[Any]] = {}

    def send(self, msg: tuple) -> None:
        """OSError or ValueError when the other end is gone."""
        with self._lock:
            self.conn.send(msg)

    def tell(self, msg: tuple) -> bool:
        """Send without an answer; False when the other end is gone."""
        try:
            self.send(msg)
            return True
        except (OSError, ValueError):
            return False

    def call(self, *what: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        cid = next(self._ids)
        self._calls[cid] = fut
        if self.closed or not self.tell(("call", cid, *what)):
            self._calls.pop(cid, None)
            fut.set_exception(FleetFull("the supervisor's fleet cannot be reached; retry shortly"))
        return fut

    def answer(self, cid: int, value: Any, error: Any = None) -> None:
        self.tell(("reply", cid, value, error))

    def settle(self, cid: int, value: Any, error: Any) -> None:
        fut = self._calls.pop(cid, None)
        if fut is None or fut.done():
            return
        if error is None:
            fut.set_result(value)
        elif isinstance(error, tuple):
            fut.set_exception(FleetFull(*error))
        else:
            fut.set_exception(RuntimeError(str(error)))

    def close(self) -> None:
        self.closed = True
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(FleetFull("the other end of the fleet's control pipe went away; retry shortly"))


class MirroredModel(FleetModel):
    """A fleet model in an API worker: its state and figures are the supervisor's (FleetProxy.mirror), its backend
    this worker's connection to the engine while it is loaded."""

    def __init__(self, fleet: Fleet, spec: Any, engine: EngineAddress) -> None:
        super().__init__(fleet, spec, engine.path, engine.cfg, engine.fit, _not_here)
        self.address = engine.address
        self.rate_now = 0.0             # its requests per second, as the supervisor counts them
        self.running_here = 0           # requests this worker runs on it
        self.leased = -1                # the generation of the engine this worker last acquired it on
        self.connected = -1             # the generation `backend` is connected to
        self.connecting: asyncio.Lock | None = None

    def rate(self, now: float) -> float:
        return self.rate_now


def _not_here() -> EmbeddedBackend:
    raise RuntimeError("an API worker's fleet models are loaded by the supervisor (server/fleet_host.py)")


class FleetProxy(Fleet):
    """The supervisor's fleet, from an API worker: `hello` (FleetHost.hello) names each model's engine socket and
    settings, and the fleet's state when the worker started."""

    def __init__(self, config: Config, link: Link, hello: dict[str, Any]) -> None:
        super().__init__(config, hello["view"]["placement"])
        self.link = link
        self.loop: asyncio.AbstractEventLoop | None = None
        for spec in config.models:
            engine = hello["models"].get(spec.name)
            if engine is not None:
                self.models[spec.name] = MirroredModel(self, spec, engine)
        self.mirror(hello["view"])

    # ---- the supervisor's messages (on the worker's pipe-reading thread) ------------------------------------------
    def receive(self, msg: tuple) -> None:
        kind, loop = msg[0], self.loop
        if kind == "reply":
            self.link.settle(*msg[1:])
        elif kind == "mirror":
            if loop is None:
                self.mirror(msg[1])
            else:
                loop.call_soon_threadsafe(self.mirror, msg[1])
        elif kind == "call" and msg[2] == "drop":
            if loop is None:          # nothing connects before the worker serves
                self.link.answer(msg[1], True)
            else:
                asyncio.run_coroutine_threadsafe(self._drop(msg[1], msg[3]), loop)

    def mirror(self, view: dict[str, Any]) -> None:
        """Take the supervisor's state of the fleet (FleetHost.view)."""
        self.placement = view["placement"]
        for name, fields in view["models"].items():
            m = self.models.get(name)
            if isinstance(m, MirroredModel):
                for f in MIRRORED:
                    setattr(m, f, fields[f])
                m.rate_now = fields["rate_now"]

    async def _drop(self, cid: int, name: str) -> None:
        m = self.models.get(name)
        try:
            if isinstance(m, MirroredModel) and m.backend is not None and not m.running_here:
                backend, m.backend, m.connected = m.backend, None, -1
                await backend.close()
        finally:
            self.link.answer(cid, True)

    # ---- requests ---------------------------------------------------------------------------------------------
    async def acquire(self, m: FleetModel) -> EmbeddedBackend:
        assert isinstance(m, MirroredModel)
        if m.running_here and m.backend is not None and m.connected == m.leased:
            m.running_here += 1
            self.link.tell(("more", m.name))
            return m.backend
        generation, view = await self._ask("acquire", m.name, release=m.name)
        self.mirror(view)
        m.running_here += 1
        m.leased = generation
        try:
            return await self._connect(m, generation)
        except Exception as e:
            self.release(m)
            raise FleetFull(f"model {m.name!r} is loaded, but this worker could not connect to its engine: {e}; "
                            "retry shortly") from e

    def release(self, m: FleetModel, keep_alive: Any = None) -> None:
        assert isinstance(m, MirroredModel)
        m.running_here -= 1
        self.link.tell(("release", m.name, keep_alive))

    async def _connect(self, m: MirroredModel, generation: int) -> EmbeddedBackend:
        """This worker's connection to the engine of `generation` (made now when it has none to that one)."""
        if m.connecting is None:
            m.connecting = asyncio.Lock()
        async with m.connecting:
            if m.backend is not None and m.connected == generation:
                return m.backend
            old, m.backend, m.connected = m.backend, None, -1
            if old is not None:
                await old.close()
            backend = await asyncio.to_thread(EmbeddedBackend, m.name, m.path, m.cfg, structured=m.spec.structured,
                                              address=m.address)
            m.backend, m.connected = backend, generation
            for hook in self.on_loaded:
                hook(m.name, backend.engine)
            return backend

    async def _ask(self, *what: Any, release: str | None = None) -> Any:
        """The supervisor's answer to a call. Cancelled meanwhile (the client went away), an acquire that then
        succeeds is released (`release`: its model), so no request is counted running that is not."""
        fut = self.link.call(*what)
        try:
            return await asyncio.shield(asyncio.wrap_future(fut))
        except asyncio.CancelledError:
            if release is not None:
                fut.add_done_callback(lambda f: f.exception() is None and self.link.tell(("release", release, None)))
            raise

    # ---- the admin API, the Ollama API, the Responses socket ---------------------------------------------------
    async def load(self, name: str, why: str = "asked") -> FleetModel:
        self.mirror(await self._ask("load", name))
        return self.models[name]

    async def unload(self, name: str, why: str = "asked", eviction: bool = False) -> str:
        outcome, view = await self._ask("unload", name)
        self.mirror(view)
        return outcome

    async def keep(self, name: str, keep_alive: Any) -> str:
        outcome, view = await self._ask("keep", name, keep_alive)
        self.mirror(view)
        return outcome

    def hold(self, name: str) -> bool:
        m = self.models.get(name)
        if m is None or m.state != "loaded":
            return False
        return self.link.tell(("hold", name))

    def unhold(self, name: str) -> None:
        self.link.tell(("unhold", name))

    async def remove(self, name: str) -> None:
        raise RuntimeError("models are added and removed at the supervisor's start with server.workers")

    # ---- the gateway's life ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()

    def wait_preloads(self) -> None:
        """Nothing to wait for: the supervisor preloads before the workers serve."""

    async def close(self) -> None:
        for m in self.models.values():
            backend, m.backend = m.backend, None
            if backend is not None:
                await backend.close()

