"""The gateway's side of an engine process (core.py): submit and cancel, live state, and restarts after crashes.

The model's weights, KV cache and step loop live in a child process with its own interpreter lock; the gateway
keeps only the vocabulary (tokenizing, chat templates). When the child dies (a native crash, an OOM kill,
kill -9) or stops making progress for `watchdog_s` while it holds requests, every request it held ends with an
error event (error_code "engine_died"), and the child is started again with exponential backoff. Submissions
while it restarts raise EngineUnavailable at once, so other models keep serving and callers can fall back.

With an `address` the client does not start the engine but connects to one that a supervisor runs
(`server.workers`, server/workers.py), as each of several API workers does: a closed connection fails the requests
it held in the same way, and the client connects again once the supervisor has the engine back.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.core import ConstraintSpec, StepReport
from tokenomy.engine.engine import StepStats
from tokenomy.engine.kv.tier import TierStats
from tokenomy.engine.launch import Launch, launch
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence import TokenEvent
from tokenomy.engine.tokenizer import Tokenizer
from tokenomy.engine.vocab import Vocab

log = logging.getLogger("tokenomy.engine")

class EngineStartError(RuntimeError):
    pass


class EngineUnavailable(RuntimeError):
    pass


def describe_exit(code: int | None) -> str:
    """How a process ended, in words, with the likely cause where the signal tells it."""
    if code is None:
        return "stopped responding"
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = {
        "SIGILL": " (an instruction this CPU cannot run: llama-cpp-python was built for another CPU, or with AMX; "
                  "reinstall it for this machine with `bash install.sh`, see docs/engine.md)",
        "SIGKILL": " (killed: out of memory, the watchdog, or an operator)",
        "SIGSEGV": " (a native crash in llama.cpp)",
    }.get(name, "")
    return f"died of {name}{hint}"


def _reap(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Wait for the process to end; kill it if it will not."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class EngineAddress:
    """An engine process that another process runs (the supervisor of `server.workers`): where it listens, and
    the GGUF, engine config and sizing it was started with."""

    address: str          # its Unix socket
    path: str
    cfg: EngineConfig
    fit: Any              # engine.fit.Fit


@dataclass(eq=False)
class Handle:
    """One submitted request, as the gateway sees it."""

    rid: int
    on_event: Callable[[TokenEvent], None]
    submitted_at: float
    started: bool = False


class EngineClient:
    def __init__(self, model_path: str, cfg: EngineConfig | None = None, name: str = "model",
                 address: str | None = None, wait: bool = True, launched: Launch | None = None) -> None:
        """Start the engine process (or, with `address`, connect to the one a supervisor runs: server.workers;
        with `launched`, take over the one launch.launch started for this model) and, with `wait`, wait for its
        self-check (raising EngineStartError); without, the caller does other work meanwhile and calls
        wait_ready() before the first submit."""
        self.cfg = cfg = cfg or EngineConfig()
        self.name = name
        self.path = model_path
        self.address = address            # an engine process to connect to (server.workers); None: start one
        self.owns_steps = True            # whether this client counts the engine's steps (StepReport.owner)
        self._starting: Launch | None = (launched or self._start()) if address is None else None
        try:                 # the child loads the model while this process reads the vocabulary
            self.vocab = Vocab(model_path, vocab_only=True)
        except BaseException:
            if self._starting is not None:
                self._starting[0].kill()
            raise
        self.tokenizer = Tokenizer(self.vocab)
        self.stats = StepStats()          # its callbacks run on the reader thread, once per engine step
        self.state = "starting"           # starting | ready | restarting | stopped
        self.restarts = 0
        self.last_exit: str | None = None
        self.pid: int | None = None
        self.max_model_len = self.n_ctx = 0    # the engine process reports these when it is ready (_spawn)
        self.n_gpu_layers = 0                  # layers it asked llama.cpp to offload (-1: all; 0: a CPU build)
        self.rss = 0                           # the engine process's resident bytes, at its last report
        self.running = 0
        self.used_cells = 0
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0
        self.spec = (0, 0, 0)              # speculation since the process started: drafts, drafted, accepted
        self.tier_stats = TierStats()      # KV tiers since the process started
        self._waiting = 0
        self._pending: dict[int, Handle] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._last_progress = time.monotonic()
        self._up_since = 0.0
        self._failures = 0
        if wait:
            self.wait_ready()
        threading.Thread(target=self._watchdog, name=f"engine-watchdog-{name}", daemon=True).start()

    # ---- process lifecycle -----------------------------------------------------------------------------
    def wait_ready(self) -> None:
        """Wait for the start that __init__ began (with wait=False) to pass its self-check; raise EngineStartError
        naming the cause. Returns at once when it has."""
        starting, self._starting = self._starting, None
        if starting is not None:
            self._finish(*starting)
        elif self.address is not None and self.state == "starting":
            self._attach(self.address)

    def _spawn(self) -> None:
        """Start the engine process and wait for its self-check; raise EngineStartError naming the cause."""
        if self.address is not None:
            self._attach(self.address)
            return
        self._finish(*self._start())

    def _start(self) -> Launch:
        """Start the engine process and send it the model to load; _finish waits for its answer."""
        return launch(self.path, self.cfg, self.name)

    def _finish(self, proc: subprocess.Popen, conn: Connection) -> None:
        what = f"the engine process for {self.name!r} ({self.path})"
        try:
            if not conn.poll(self.cfg.start_timeout_s):
                proc.kill()
                raise EngineStartError(
                    f"{what} did not finish its start-up self-check in {self.cfg.start_timeout_s:g} s")
            msg = conn.recv()
        except (EOFError, OSError):
            _reap(proc)
            raise EngineStartError(f"{what} {describe_exit(proc.returncode)} during its start-up self-check") from None
        if msg[0] != "ready":
            _reap(proc)
            raise EngineStartError(f"{what} failed its start-up self-check: {msg[1]}")
        self._ready(msg[1], proc, conn)

    def _attach(self, address: str) -> None:
        """Connect to the engine process at `address` (a Unix socket) and read what it is; EngineStartError when
        it does not answer (not up yet, or restarting)."""
        from multiprocessing.connection import Client

        what = f"the engine process for {self.name!r} at {address}"
        try:
            conn = Client(address, family="AF_UNIX")
            if not conn.poll(self.cfg.start_timeout_s):
                conn.close()
                raise EngineStartError(f"{what} did not answer in {self.cfg.start_timeout_s:g} s")
            msg = conn.recv()
        except (EOFError, OSError) as e:
            raise EngineStartError(f"{what} is not reachable: {e}") from None
        self._ready(msg[1], None, conn)

    def _ready(self, info: dict[str, Any], proc: subprocess.Popen | None, conn: Connection) -> None:
        self.max_model_len, self.n_ctx, self.pid = info["max_model_len"], info["n_ctx"], info["pid"]
        self.n_gpu_layers, self.rss = info["n_gpu_layers"], info.get("rss", 0)
        self.running = self._waiting = self.used_cells = 0
        if info.get("report") is not None:   # an engine that ran before we came: its counters so far
            self._apply(info["report"])
        self._proc, self._conn = proc, conn
        self._up_since = self._last_progress = time.monotonic()
        self.state = "ready"
        threading.Thread(target=self._read, args=(proc, conn), name=f"engine-reader-{self.name}",
                         daemon=True).start()

    def _read(self, proc: subprocess.Popen | None, conn: Connection) -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception:             # a message we cannot read: the channel is no longer trustworthy
                log.exception("engine %s sent an unreadable message; restarting it", self.name)
                self._kill(proc)
                break
            self._last_progress = time.monotonic()
            if msg[0] == "step":
                if msg[1] is not None:
                    self._apply(msg[1])
                for rid, ev in msg[2]:
                    self._dispatch(rid, ev)
            elif msg[0] == "reply":
                fut = self._calls.pop(msg[1], None)
                if fut is not None and msg[3] is None:
                    fut.set_result(msg[2])
                elif fut is not None:
                    fut.set_exception(RuntimeError(f"the engine for model {self.name!r} could not answer: {msg[3]}"))
        if proc is None:
            conn.close()
            if self.state != "stopped":
                self._crashed("closed its connection (the engine process ended; its supervisor starts it again)")
            return
        _reap(proc)
        if self.state != "stopped":
            self._crashed(describe_exit(proc.returncode))

    def _kill(self, proc: subprocess.Popen | None) -> None:
        """Kill the engine process: ours, or the supervisor's (which starts it again) by its pid."""
        if proc is not None:
            proc.kill()
        elif self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def _crashed(self, reason: str) -> None:
        with self._lock:
            if self.state != "ready":
                return
            self.state = "restarting"
            pending, self._pending = self._pending, {}
            calls, self._calls = self._calls, {}
            self.restarts += 1
            self.last_exit = reason
            self._failures = 0 if time.monotonic() - self._up_since > tuning.STABLE_S else self._failures + 1
        log.error("engine %s %s; failing %d requests and restarting", self.name, reason, len(pending))
        message = f"The engine for model {self.name!r} {reason}; it is restarting. Retry the request."
        for h in pending.values():
            h.on_event(TokenEvent(text="", token_ids=[], logprobs=[], finish_reason="error", error=message,
                                  error_code="engine_died"))
        for fut in calls.values():
            fut.set_exception(EngineUnavailable(message))
        threading.Thread(target=self._restart, name=f"engine-restart-{self.name}", daemon=True).start()

    def _restart(self) -> None:
        attempt = self._failures
        while self.state == "restarting":
            wait = tuning.BACKOFF_S[min(attempt, len(tuning.BACKOFF_S) - 1)]
            # connecting is cheap: try often, so requests resume as soon as the supervisor's engine is back
            time.sleep(min(wait, tuning.BACKOFF_S[0]) if self.address is not None else wait)
            if self.state != "restarting":
                return
            try:
                self._spawn()
                log.warning("engine %s restarted (restart %d)", self.name, self.restarts)
                return
            except EngineStartError as e:
                self.last_exit = str(e)
                log.error("engine %s could not restart: %s", self.name, e)
                attempt += 1

    def _watchdog(self) -> None:
        while self.state != "stopped":
            time.sleep(min(1.0, self.cfg.watchdog_s / 4))
            proc = self._proc
            if (self.state == "ready" and self._pending and (proc is not None or self.address is not None)
                    and time.monotonic() - self._last_progress > self.cfg.watchdog_s):
                log.error("engine %s made no progress for %.0f s with %d requests: killing it", self.name,
                          self.cfg.watchdog_s, len(self._pending))
                self._kill(proc)     # the reader sees the pipe close and restarts it
                self._last_progress = time.monotonic()

    def stop(self) -> None:
        self.state = "stopped"
        starting, self._starting = self._starting, None
        if starting is not None:            # started without waiting, never waited for
            starting[1].close()
            _reap(starting[0])
        try:
            self._send(("stop",))
        except EngineUnavailable:
            pass
        if self._proc is not None:
            _reap(self._proc)
        elif self._conn is not None:    # a supervisor's engine: we leave it, it serves the other workers on
            self._conn.close()
        self.vocab.close()

    # ---- requests ----------------------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: SamplingParams, on_event: Callable[[TokenEvent], None],
               constraint: ConstraintSpec | None = None, request_id: str | None = None,
               stream: bool = True) -> Handle:
        """Queue a sequence; events arrive on the reader thread (with stream=False, one final event carrying the
        whole answer). Errors the engine finds later (queue full, a bad schema, a crash) arrive as a final event
        with finish_reason "error" and an error_code."""
        return self.submit_n(prompt, [params], [on_event], constraint, request_id, stream)[0]

    def submit_n(self, prompt: list[int], params: list[SamplingParams], on_events: list[Callable[[TokenEvent], None]],
                 constraint: ConstraintSpec | None = None, request_id: str | None = None,
                 stream: bool = True) -> list[Handle]:
        """Queue one sequence per choice of one prompt (`params[i]` and `on_events[i]` are choice i's), sharing one
        prefill (Engine.submit_n); each has its own handle and events, as `submit` gives one."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt is {len(prompt)} tokens; the limit is {self.max_model_len - 1}")
        with self._lock:
            if self.state != "ready":
                raise EngineUnavailable(f"The engine for model {self.name!r} is {self.state} "
                                        f"(last exit: {self.last_exit}). Retry shortly.")
            if not self._pending:
                self._last_progress = time.monotonic()   # the watchdog times progress from here
            now = time.perf_counter()
            handles = [Handle(next(self._ids), on_event, now) for on_event in on_events]
            for h in handles:
                self._pending[h.rid] = h
        try:
            self._send(("submit", [h.rid for h in handles], list(prompt), list(params), constraint, request_id,
                        stream))
        except EngineUnavailable:
            for h in handles:
                self._pending.pop(h.rid, None)
            raise
        return handles

    def cancel(self, h: Handle) -> None:
        if h.rid in self._pending:
            try:
                self._send(("cancel", h.rid))
            except EngineUnavailable:
                pass

    def call(self, name: str, *args: Any, timeout: float = 30.0) -> Any:
        """Ask the engine process something (core.Core._call): "state", "clear_cache", "score"; RuntimeError
        when the call failed there, EngineUnavailable when the process is not up or died meanwhile."""
        fut: Future[Any] = Future()
        cid = next(self._ids)
        self._calls[cid] = fut
        try:
            self._send(("call", cid, name, *args))
        except EngineUnavailable:
            self._calls.pop(cid, None)
            raise
        return fut.result(timeout)

    def score(self, ids: list[int], window: int) -> tuple[Any, float]:
        """Each token's surprisal in windows of `window` tokens, and the model's seconds (core.Core.score): for an
        engine that serves nothing else, as a prompt compressor's does."""
        return self.call("score", list(ids), window, timeout=tuning.SCORE_TIMEOUT_S + 30)

    def clear_cache(self) -> None:
        self.call("clear_cache")

    def _send(self, msg: tuple) -> None:
        conn = self._conn
        if conn is None:
            raise EngineUnavailable(f"The engine for model {self.name!r} is not running.")
        try:
            with self._send_lock:
                conn.send(msg)
        except (OSError, ValueError) as e:
            raise EngineUnavailable(f"The engine for model {self.name!r} is not reachable: {e}") from e

    def _apply(self, r: StepReport) -> None:
        self.running, self._waiting, self.used_cells = r.running, r.waiting, r.used_cells
        self.preemptions, self.prefix_hit_tokens = r.preemptions, r.prefix_hit_tokens
        self.prefix_query_tokens = r.prefix_query_tokens
        self.spec = r.spec
        self.owns_steps = r.owner
        if r.n_ctx:
            self.n_ctx, self.rss = r.n_ctx, r.rss
        if r.tiers is not None:
            self.tier_stats = r.tiers
        if r.n_tokens:
            try:
                for cb in self.stats.on_step:
                    cb(r.n_tokens, r.n_seqs, r.dt)
                for cb2 in self.stats.on_step_seqs:
                    cb2(r.dt, r.tokens_by_seq)
            except Exception:       # a watcher's fault (metrics, energy) must not stop this reader and its requests
                log.exception("engine %s: a step watcher failed", self.name)

    def _dispatch(self, rid: int, ev: TokenEvent) -> None:
        h = self._pending.pop(rid, None) if ev.finish_reason is not None else self._pending.get(rid)
        if h is None:
            return
        h.started = True
        h.on_event(ev)

    # ---- live state (the engine's last step report, and what is in flight) ---------------------------------
    @property
    def queue_depth(self) -> int:
        return max(self._waiting, len(self._pending) - self.running)

    @property
    def oldest_wait_s(self) -> float:
        waiting = [h.submitted_at for h in list(self._pending.values()) if not h.started]
        return time.perf_counter() - min(waiting) if waiting else 0.0

    @property
    def kv_usage(self) -> float:
        return self.used_cells / self.n_ctx if self.n_ctx else 0.0

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "restarts": self.restarts, "last_exit": self.last_exit, "pid": self.pid,
                "n_gpu_layers": self.n_gpu_layers, "kv_cells": self.n_ctx, "rss_bytes": self.rss}
