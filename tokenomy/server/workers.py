"""`server.workers: N`: N API processes on one port, in front of one engine process per loaded embedded model.

The supervisor (`serve`, in the process `tokenomy serve` started) sizes every embedded model and owns the fleet
(fleet_host.py), which starts a model's engine process when it loads, accepting the workers on a Unix socket
(engine/core.py, serve_socket), and stops it when it unloads (a token route's models start at once and stay); binds
the port once; and starts N workers that share the listening socket (the kernel hands each connection to one of
them, as uvicorn's and gunicorn's workers do). Each worker builds the whole Gateway, its embedded backends
connected to the engines' sockets (engine/client.py), and serves it with uvicorn, so the pipeline is the same as
with one process. A worker that dies is started again at once (its connections fail; the others serve on); an
engine that dies is started again with backoff and the workers reconnect to it. SIGTERM or SIGINT stops the workers
(uvicorn's graceful shutdown closes each gateway), then the engines.

Every child is a fresh interpreter (`python -c`), as the engine process already was, on one end of a socket
pair: its start-up arguments come over it, its death is its end closing, and a child whose supervisor died (even
by kill -9) sees its end close and stops. Shared state lives where docs/workers.md says.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tokenomy.backends.fleet_proxy import Link
from tokenomy.config import Config, ConfigError, EmbeddedModelSpec
from tokenomy.engine import tuning
from tokenomy.engine.client import EngineAddress, EngineStartError, describe_exit
from tokenomy.engine.launch import ENTRY as ENGINE_ENTRY
from tokenomy.server.fleet_host import FleetHost

log = logging.getLogger("tokenomy.workers")

WORKER_ENTRY = "import sys; from tokenomy.server.workers import worker_main; worker_main(int(sys.argv[1]))"
WORKER_START_S = 600.0      # a worker loads the semantic cache's embedder and index before it serves
STOP_S = 15.0               # uvicorn's graceful shutdown (5 s) and the gateway's close, then kill
STABLE_S = 10.0             # a worker that ran this long is restarted at once; sooner, with backoff


class WorkerStartError(RuntimeError):
    pass


class Child:
    """One process the supervisor keeps running: `launch` starts it and returns once it said ready. Its pipe is a
    Link: the supervisor's calls to it get their answers there (`call`), and its other messages go to `on_message`
    (an API worker's to the fleet: fleet_host.py), read on the thread that waits for its exit."""

    def __init__(self, name: str, argv: list[str], hello: tuple | Callable[[], tuple], env: dict[str, str],
                 timeout_s: float, pass_fds: tuple[int, ...] = (), new_session: bool = False,
                 on_message: Callable[[Link, tuple], None] | None = None) -> None:
        self.name, self.argv, self.hello, self.env, self.timeout_s = name, argv, hello, env, timeout_s
        self.pass_fds, self.new_session, self.on_message = pass_fds, new_session, on_message
        self.proc: subprocess.Popen | None = None
        self.link: Link | None = None
        self.info: Any = None
        self.started_at = 0.0
        self.restarts = 0
        self.retired = False     # stopped for good (a fleet model unloaded): not started again

    def launch(self) -> None:
        """Start the process and wait for its ("ready", info); RuntimeError naming why it did not get there."""
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-c", self.argv[0], str(theirs.fileno()), *self.argv[1:]],
                                pass_fds=(theirs.fileno(), *self.pass_fds), env=self.env,
                                start_new_session=self.new_session)
        theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send(self.hello() if callable(self.hello) else self.hello)
            if not conn.poll(self.timeout_s):
                proc.kill()
                raise RuntimeError(f"{self.name} was not ready in {self.timeout_s:g} s")
            msg = conn.recv()
        except (EOFError, OSError):
            proc.wait()
            raise RuntimeError(f"{self.name} {describe_exit(proc.returncode)} while starting") from None
        if msg[0] != "ready":
            proc.wait()
            raise RuntimeError(f"{self.name} could not start: {msg[1]}")
        self.proc, self.link, self.info, self.started_at = proc, Link(conn), msg[1], time.monotonic()

    def wait_exit(self) -> str:
        """Read its messages until the process ends (its end of the pipe closes); how it ended."""
        assert self.link is not None and self.proc is not None
        link = self.link
        try:
            while True:
                msg = link.conn.recv()
                if msg[0] == "reply":
                    link.settle(*msg[1:])
                elif self.on_message is not None:
                    self.on_message(link, msg)
        except (EOFError, OSError):
            pass
        link.close()
        link.conn.close()
        try:
            self.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return describe_exit(self.proc.returncode)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def state(self) -> str:
        """"ready" while it runs, else "restarting" (an engine's: EngineClient's words)."""
        alive = self.proc is not None and self.proc.poll() is None and self.link is not None and not self.link.closed
        return "ready" if alive else "restarting"

    def call(self, name: str, *args: Any, timeout: float = 30.0) -> Any:
        """Ask the process (an engine: core.Core._call) and wait for its answer; RuntimeError when it failed."""
        if self.link is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.link.call(name, *args).result(timeout)

    def retire(self) -> None:
        """Stop it for good."""
        self.retired = True
        self.stop(None)

    def stop(self, how: int | None) -> None:
        """Ask it to stop (a signal; None: say stop on its pipe), and kill it after STOP_S."""
        proc, link = self.proc, self.link
        if proc is None or proc.poll() is not None:
            return
        if how is None and link is not None:
            link.tell(("stop",))
        elif how is not None:
            proc.send_signal(how)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Supervisor:
    def __init__(self, config: Config, config_path: str | None, models: list[str], host: str, port: int,
                 workers: int) -> None:
        # the workers' config says how many they are (--workers may override the file's)
        config = config.model_copy(update={"server": config.server.model_copy(update={"workers": workers})})
        self.config, self.config_path, self.models = config, config_path, models
        self.host, self.port, self.n = host, port, workers
        self.stopping = threading.Event()
        self.dir = Path(tempfile.mkdtemp(prefix="tokenomy-workers-"))     # 0700: the engines' sockets
        self.metrics_dir = self.dir / "metrics"
        self.metrics_dir.mkdir()
        self.env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)}
        self.engines: dict[str, Child] = {}         # the engines of token routes' models, started at start
        self.addresses: dict[str, EngineAddress] = {}
        self.hosted: dict[str, Child] = {}          # the fleet's engines, by model, the latest of each
        self.fleet: FleetHost | None = None          # made by start()
        self.workers: list[Child] = []
        self.socks: list[socket.socket] = []      # the port's, and server.ollama_port's when set

    # ---- start ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """The fleet and the engines of token routes, then the port, then the workers; each ready before the next,
        and the preloaded models loading meanwhile. Raises what stops a start."""
        from tokenomy.backends.embedded_launch import engine_settings, preloads, sized_alone, token_routed
        from tokenomy.backends.fleet import Fleet, default_placement
        from tokenomy.config.home import data_dir
        from tokenomy.models.memory import Fit

        c = self.config
        fleet = FleetHost(Fleet(c, default_placement(c), self._counters(),
                                kv_dir=data_dir() / "fleet-kv" if c.fleet.keep_conversations else None),
                          self._start_fleet_engine)
        self.fleet = fleet
        fits: dict[str, Fit] = {}
        routed, left_out = token_routed(c), set()
        embedded = [spec for spec in c.models if isinstance(spec, EmbeddedModelSpec)]
        for i, spec in enumerate(embedded):
            address = str(self.dir / f"engine-{i}.sock")
            if spec.name in routed:     # a token route drives its engines itself: started now, outside the fleet
                path, cfg = engine_settings(spec, c, fits=fits)
                child = Child(f"the engine process for {spec.name!r}", [ENGINE_ENTRY, address],
                              (path, cfg, spec.name), self.env, cfg.start_timeout_s)
                self._launch_engine(child, address)
                self.engines[spec.name] = child
                self.addresses[spec.name] = EngineAddress(address, path, cfg, fits[spec.name])
                continue
            settings = sized_alone(spec, c)
            if settings is None:
                left_out.add(spec.name)
                continue
            fleet.add(spec, EngineAddress(address, *settings))
        self.config = c = c.model_copy(update={"models": [m for m in c.models if m.name not in left_out]})
        preloading = {spec.name: fleet.preload(spec.name) for spec in embedded
                      if spec.name in fleet.engines and preloads(c, spec)}
        ports = [self.port] + ([c.server.ollama_port] if c.server.ollama_port else [])
        self.socks = [listen(self.host, port) for port in ports]
        fds = [sock.fileno() for sock in self.socks]
        for i in range(self.n):
            child = Child(f"API worker {i}", [WORKER_ENTRY], self._hello(fds, i), self.env, WORKER_START_S,
                          pass_fds=tuple(fds), new_session=True, on_message=fleet.receive)
            try:
                child.launch()
            except RuntimeError as e:
                raise WorkerStartError(str(e)) from None
            assert child.link is not None
            fleet.attach(child.link)
            self.workers.append(child)
        for child in self.engines.values():
            threading.Thread(target=self._keep, args=(child, True), name=f"keep-{child.name}", daemon=True).start()
        for child in self.workers:
            threading.Thread(target=self._keep, args=(child, False), name=f"keep-{child.name}", daemon=True).start()
        for name, loading in preloading.items():
            try:
                loading.result()
            except Exception as e:
                raise EngineStartError(f"preloading {name!r}: {e}") from None

    def _hello(self, fds: list[int], index: int) -> Callable[[], tuple]:
        """What worker `index` starts with, made at each start (the fleet's state is then's)."""
        fleet = self.fleet
        assert fleet is not None
        return lambda: (self.config, self.config_path, self.models, self.addresses, fleet.hello(), fds, index)

    def _counters(self) -> Any:
        """The fleet's counters, in the workers' multiprocess files so that every worker's /metrics has them."""
        from tokenomy.metrics.prometheus import FleetCounters

        return FleetCounters.in_files(str(self.metrics_dir))

    def _start_fleet_engine(self, name: str, engine: EngineAddress) -> Child:
        """A fleet model's engine process, started (blocking) on its socket and kept running until retired."""
        child = Child(f"the engine process for {name!r}", [ENGINE_ENTRY, engine.address],
                      (engine.path, engine.cfg, name), self.env, engine.cfg.start_timeout_s)
        self._launch_engine(child, engine.address)
        self.hosted[name] = child
        threading.Thread(target=self._keep, args=(child, True), name=f"keep-{child.name}", daemon=True).start()
        return child

    def _launch_engine(self, child: Child, address: str) -> None:
        Path(address).unlink(missing_ok=True)      # a dead engine's socket file
        try:
            child.launch()
        except RuntimeError as e:
            raise EngineStartError(str(e)) from None

    def _keep(self, child: Child, engine: bool) -> None:
        """Start `child` again whenever it ends, until the supervisor stops (or, an engine, it is retired)."""
        failures = 0
        while True:
            link = child.link
            how = child.wait_exit()
            if not engine and link is not None and self.fleet is not None:
                self.fleet.detach(link)
            if self.stopping.is_set() or child.retired:
                return
            pid = child.pid
            if not engine and pid is not None:
                from tokenomy.metrics.prometheus import forget_process

                forget_process(pid, str(self.metrics_dir))
            failures = 0 if time.monotonic() - child.started_at > STABLE_S else failures + 1
            log.error("%s (pid %s) %s; starting it again", child.name, pid, how)
            while not self.stopping.is_set() and not child.retired:
                if failures or engine:
                    self.stopping.wait(tuning.BACKOFF_S[min(failures, len(tuning.BACKOFF_S) - 1)])
                if self.stopping.is_set() or child.retired:
                    return
                try:
                    if engine:
                        self._launch_engine(child, child.argv[1])
                    else:
                        child.launch()
                        assert child.link is not None and self.fleet is not None
                        self.fleet.attach(child.link)
                    child.restarts += 1
                    log.warning("%s started again (pid %d)", child.name, child.pid or -1)
                    break
                except (RuntimeError, OSError) as e:
                    log.error("%s could not start again: %s", child.name, e)
                    failures += 1

    # ---- stop ----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Workers first (they finish or fail what they hold), then the engines, then the files."""
        self.stopping.set()
        threads = [threading.Thread(target=w.stop, args=(signal.SIGTERM,)) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for child in self.engines.values():
            child.stop(None)
        if self.fleet is not None:
            self.fleet.close()
        for sock in self.socks:
            sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> dict[str, Any]:
        """The live processes: the engines' by model, the workers' in order (for tests and operators)."""
        live = {**{n: c for n, c in self.hosted.items() if not c.retired}, **self.engines}
        return {"engines": {n: c.pid for n, c in live.items()}, "workers": [c.pid for c in self.workers]}


def listen(host: str, port: int) -> socket.socket:
    """The port's listening socket, bound once here and inherited by every worker."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(config: Config, config_path: str | None, models: list[str], host: str, port: int, workers: int,
          ready: Any = None) -> None:
    """Run the supervisor until SIGTERM or SIGINT. `ready(supervisor)` is called once everything serves."""
    sup = Supervisor(config, config_path, models, host, port, workers)

    def on_signal(signum: int, frame: Any) -> None:
        sup.stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        sup.start()
        if ready is not None:
            ready(sup)
        while not sup.stopping.wait(0.5):
            pass
    finally:
        sup.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def worker_main(fd: int) -> None:
    """One API worker (Child runs it): build the Gateway on the supervisor's engines and serve the inherited
    sockets (the port's, and server.ollama_port's) with uvicorn until SIGTERM, or until the supervisor's end of the
    pipe closes."""
    import uvicorn

    from tokenomy.api.app import create_app
    from tokenomy.backends.fleet_proxy import FleetProxy
    from tokenomy.gateway import Gateway
    from tokenomy.server.process import configure_logging, uvicorn_options

    configure_logging()
    conn = Connection(fd)
    config, config_path, models, engines, fleet_hello, sock_fds, index = conn.recv()
    link = Link(conn)
    fleet = FleetProxy(config, link, fleet_hello)
    try:
        gateway = Gateway(config, config_path, models=models, engines=engines, fleet=fleet, worker=index)
    except Exception as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    socks = [socket.socket(fileno=fd) for fd in sock_fds]

    def watch() -> None:      # the supervisor's messages; it said stop, or went away: stop as SIGTERM would
        try:
            while (msg := conn.recv())[0] != "stop":
                fleet.receive(msg)
        except (EOFError, OSError):
            pass
        link.close()
        os.kill(os.getpid(), signal.SIGTERM)

    conn.send(("ready", {"pid": os.getpid()}))
    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    server = uvicorn.Server(uvicorn.Config(create_app(gateway), log_level="warning", timeout_graceful_shutdown=5,
                                           **uvicorn_options()))
    server.run(sockets=socks)
