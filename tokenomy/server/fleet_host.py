"""The supervisor's fleet (`server.workers` > 1): one Fleet (backends/fleet.py) for every API worker, whose
engines are the supervisor's children, each on a Unix socket that the workers connect to.

Placement, keep_alive and eviction need every request on a model counted in one place, so the supervisor owns the
fleet and the workers ask it (backends/fleet_proxy.py has the messages). The Fleet runs on an event loop of its
own, on a thread of the supervisor; each worker's pipe is read on a thread of its own (server/workers.py Child),
which hands the messages to that loop. A worker that dies has its requests released and its holds let go (the
engines cancelled its sequences when its connections closed). An unload first asks every worker to close its
connection to the engine ("drop", answered or DROP_S), then stops the process, so no worker sees a loaded
model's engine go away. An engine that dies while its model is loaded is started again by the supervisor, at the
same socket, as any engine of the supervisor is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from tokenomy.backends.fleet import Fleet, FleetFull
from tokenomy.backends.fleet_proxy import MIRRORED, Link
from tokenomy.config import EmbeddedModelSpec
from tokenomy.engine.client import EngineAddress

log = logging.getLogger("tokenomy.fleet")

DROP_S = 10.0         # how long an unload waits for the workers to close their connections to its engine
MIRROR_S = 0.25       # how often the workers' view of the fleet is brought up to date, when it changed


class HostedEngine:
    """A loaded fleet model's engine process, as the Fleet holds a loaded model's backend: `engine` is the Child
    the supervisor keeps running (its pid, state, and the calls the fleet makes: server/workers.py)."""

    def __init__(self, host: FleetHost, name: str, engine: Any) -> None:
        self.host, self.name, self.engine = host, name, engine

    async def close(self) -> None:
        """Every worker lets go of the engine, then its process stops (and is not started again)."""
        await self.host.drop(self.name)
        await asyncio.to_thread(self.engine.retire)


class FleetHost:
    """The fleet of the supervisor. `start_engine(name, address)` starts a model's engine process on its socket
    and returns its Child once ready (blocking; EngineStartError when it does not get there)."""

    def __init__(self, fleet: Fleet, start_engine: Callable[[str, EngineAddress], Any]) -> None:
        self.fleet = fleet
        self.engines: dict[str, EngineAddress] = {}      # each model's socket and settings, for the workers
        self.generation: Counter[str] = Counter()       # loads of each model so far: a new engine to connect to
        self.running: dict[Link, Counter[str]] = {}     # each worker's requests running, by model
        self.holding: dict[Link, Counter[str]] = {}     # each worker's holds, by model
        self._start_engine = start_engine
        self._view: dict[str, Any] | None = None
        self._pushing = False
        self.loop = asyncio.new_event_loop()
        fleet.on_loaded.append(lambda name, engine: self.generation.update([name]))
        threading.Thread(target=self.loop.run_forever, name="fleet", daemon=True).start()
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._mirror_forever()))

    def add(self, spec: EmbeddedModelSpec, engine: EngineAddress) -> None:
        """Make `spec` available: its engine starts at `engine.address` when it loads."""
        self.engines[spec.name] = engine
        self.on_loop(self.fleet.add, spec, engine.path, engine.cfg, engine.fit,
                     lambda: HostedEngine(self, spec.name, self._start_engine(spec.name, engine)))

    def run(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run `coro` on the fleet's loop (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` run on the fleet's loop (from any other thread), and its result."""
        async def call() -> Any:
            return fn(*args)
        return self.run(call()).result()

    def preload(self, name: str) -> Future[Any]:
        return self.run(self.fleet.load(name, "preload: true"))

    def hello(self) -> dict[str, Any]:
        """What a worker starts with (FleetProxy): each model's engine socket and settings, and the fleet's state."""
        return {"models": dict(self.engines), "view": self.on_loop(self.view)}

    def view(self) -> dict[str, Any]:
        """The fleet's state as the workers mirror it (on the loop)."""
        now = time.monotonic()
        p = self.fleet.placement
        return {"placement": dataclasses.replace(p, gpus=dict(p.gpus)),
                "models": {n: {**{f: getattr(m, f) for f in MIRRORED}, "rate_now": round(m.rate(now), 4)}
                           for n, m in self.fleet.models.items()}}

    def _changed(self) -> None:
        """Something a worker did may have changed the fleet: bring the workers' view up to date (once this turn of
        the loop is done)."""
        if not self._pushing:
            self._pushing = True
            self.loop.call_soon(self._push)

    def _push(self) -> None:
        self._pushing = False
        view = self.view()
        if view != self._view:
            self._view = view
            for link in list(self.running):
                link.tell(("mirror", view))

    async def _mirror_forever(self) -> None:
        """What changes on its own (a keep_alive's end, a load finishing, request rates) reaches the workers too."""
        while True:
            self._push()
            await asyncio.sleep(MIRROR_S)

    # ---- a worker's pipe (called on its reading thread) ----------------------------------------------------------
    def attach(self, link: Link) -> None:
        self.loop.call_soon_threadsafe(self._attach, link)

    def receive(self, link: Link, msg: tuple) -> None:
        self.loop.call_soon_threadsafe(self._handle, link, msg)

    def detach(self, link: Link) -> None:
        """The worker is gone: its requests are released, its holds let go."""
        self.loop.call_soon_threadsafe(self._forget, link)

    # ---- on the loop ---------------------------------------------------------------------------------------------
    def _attach(self, link: Link) -> None:
        self.running[link], self.holding[link] = Counter(), Counter()
        link.tell(("mirror", self.view()))      # what changed since its hello

    def _forget(self, link: Link) -> None:
        self._changed()
        link.close()
        for name, n in self.running.pop(link, Counter()).items():
            for _ in range(n):
                self.fleet.release(self.fleet.models[name])
        for name, n in self.holding.pop(link, Counter()).items():
            for _ in range(n):
                self.fleet.unhold(name)

    def _handle(self, link: Link, msg: tuple) -> None:
        self._changed()
        kind = msg[0]
        if kind == "reply":
            link.settle(*msg[1:])
            return
        if kind == "call":
            self.loop.create_task(self._answer(link, msg[1], msg[2], *msg[3:]))
            return
        running, holding = self.running.get(link), self.holding.get(link)
        m = self.fleet.models.get(msg[1])
        if running is None or holding is None or m is None:
            return
        if kind == "more":        # the worker runs a request on m, so m is loaded: nothing to wait for
            if m.state != "loaded":
                log.error("fleet: a worker ran a request on %s while it was %s", m.name, m.state)
                return
            self.fleet.arrive(m)
            self.fleet.take(m)
            running[m.name] += 1
        elif kind == "release" and running[m.name] > 0:
            running[m.name] -= 1
            self.fleet.release(m, msg[2])
        elif kind == "hold" and self.fleet.hold(m.name):
            holding[m.name] += 1
        elif kind == "unhold" and holding[m.name] > 0:
            holding[m.name] -= 1
            self.fleet.unhold(m.name)

    async def _answer(self, link: Link, cid: int, what: str, name: str, *args: Any) -> None:
        value: Any = None
        error: tuple[str, float] | None = None
        try:
            m = self.fleet.models[name]
            if what == "acquire":
                await self.fleet.acquire(m)
                running = self.running.get(link)
                if running is None:      # the worker went away meanwhile
                    self.fleet.release(m)
                    return
                running[name] += 1
                value = (self.generation[name], self.view())
            elif what == "load":
                await self.fleet.load(name)
                value = self.view()
            elif what == "unload":
                value = (await self.fleet.unload(name), self.view())
            elif what == "keep":
                value = (await self.fleet.keep(name, args[0]), self.view())
            else:
                raise ValueError(f"no fleet call {what!r}")
        except FleetFull as e:
            error = (str(e), e.retry_after or 5.0)
        except Exception as e:       # a fault here fails this call, never the supervisor
            log.exception("fleet: %s %s failed", what, name)
            error = (f"{what} {name!r} failed: {type(e).__name__}: {e}", 5.0)
        link.answer(cid, value, error)
        self._changed()

    async def drop(self, name: str) -> None:
        """Ask every worker to close its connection to `name`'s engine; wait for their answers, at most DROP_S."""
        asked = [asyncio.wrap_future(link.call("drop", name)) for link in list(self.running)]
        if asked:
            done, late = await asyncio.wait(asked, timeout=DROP_S)
            for fut in done:
                fut.exception()      # a worker gone meanwhile: nothing to wait for
            if late:
                log.warning("fleet: %d workers did not let go of %s's engine in %g s; stopping it anyway", len(late),
                            name, DROP_S)

    def close(self) -> None:
        """Stop every engine the fleet holds, and the loop."""
        try:
            self.run(self.fleet.close()).result(60)
        except Exception:
            log.exception("fleet: stopping the engines failed")
        self.loop.call_soon_threadsafe(self.loop.stop)
