"""The engine process: one model's Engine behind a pipe, as vLLM's EngineCore runs behind its client.

The loop itself (engine.py) is unchanged; this module only moves requests and results across the boundary.
Messages are tuples:

    in:   ("submit", [rid, ...], prompt, [SamplingParams, ...], ConstraintSpec | None, request_id, stream)
          (one rid and SamplingParams per sequence: n > 1 choices of one prompt share one prefill)
          ("cancel", rid)    ("call", cid, name, *args)    ("stop",)
    out:  ("ready", info)    ("failed", message)    ("step", StepReport, [(rid, TokenEvent), ...])
          ("reply", cid, value, error)     (error: None, or why the call failed)

One "step" message carries a step's statistics and every event it produced, so a step costs one write however
many sequences it ran; a request that is not streamed gets one event, at its end, so the gateway (which shares
the cores with the step loop) wakes once per answer instead of once per token. A crash on either side is a
closed pipe on the other: the client (client.py) turns it into errors and a restart, and this process exits when
the gateway goes away.

With `server.workers` > 1 the same messages run over a Unix socket that every API worker connects to (each a
Peer, its request ids its own; main's `address`): one engine, one batch, whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from tokenomy.engine import tuning
from tokenomy.engine.engine import Engine, QueueFull
from tokenomy.engine.kv.tier import TierStats
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence import TokenEvent

log = logging.getLogger("tokenomy.engine")


@dataclass
class ConstraintSpec:
    """What the engine process needs to constrain a sequence: the output format (its grammar is compiled here,
    against the loaded model's vocabulary) and the model's structured settings."""

    fmt: Any                      # structured.OutputFormat
    break_loops: bool = True
    wrap_up: float | None = None  # share of max_tokens after which the answer winds down


@dataclass
class StepReport:
    """The engine's state after one step, and what the step did."""

    n_tokens: int = 0
    n_seqs: int = 0
    dt: float = 0.0
    tokens_by_seq: dict[Any, int] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    used_cells: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    spec: tuple[int, int, int] = (0, 0, 0)   # speculation since start: drafts, draft tokens, accepted tokens
    tiers: TierStats | None = None           # KV tiers since start
    n_ctx: int = 0                           # KV cells allocated now (KV streams grow: engine.kv_start_cells)
    rss: int = 0                             # this process's resident bytes (weights, KV written, runtime)
    owner: bool = True                       # whether this peer counts the step's engine-wide figures (the oldest
    #                                          of several peers does: each step is counted once between them)


def self_check(engine: Engine) -> None:
    """Decode a few greedy tokens of a short prompt on the real kernels: a build this CPU cannot run dies here,
    at start, instead of at the first user's request."""
    events: list[TokenEvent] = []
    done = threading.Event()

    def on_event(ev: TokenEvent) -> None:
        events.append(ev)
        if ev.finish_reason:
            done.set()

    prompt = engine.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_tokens=tuning.SELF_CHECK_TOKENS, temperature=0.0, ignore_eos=True)
    engine.submit(prompt, params, on_event)
    if not done.wait(300):
        raise RuntimeError("self-check decode did not finish in 300 s")
    last = events[-1]
    if last.finish_reason != "length" or last.completion_tokens != tuning.SELF_CHECK_TOKENS:
        raise RuntimeError(f"self-check decode ended with {last.finish_reason}: {last.error}")
    engine.run_in_loop(engine.scheduler.clear_cache)


def merged(events: list[TokenEvent], last: TokenEvent) -> TokenEvent:
    """One event for a whole answer: the text, tokens and logprobs of `events` and `last`, with `last`'s end."""
    if not events:
        return last
    every = [*events, last]
    return dataclasses.replace(
        last, text="".join(e.text for e in every), token_ids=[t for e in every for t in e.token_ids],
        logprobs=[lp for e in every for lp in e.logprobs],
        token_logprobs=[lp for e in every for lp in e.token_logprobs],
        signals=[c for e in every for c in e.signals])


class Peer:
    """One gateway process on the other end of a pipe: its channel, and the events of its sequences that the
    current step produced (flushed after the step, as one message)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.outbox: list[tuple[int, TokenEvent]] = []
        self.alive = True
        self._lock = threading.Lock()

    def send(self, msg: tuple) -> None:
        with self._lock:
            self.conn.send(msg)


class Core:
    """The engine's side of the pipes. One peer (the gateway that started this process), or several (the API
    workers of `server.workers`, each connected to this process's socket: serve_socket). Request ids are each
    peer's own; a peer that goes away has its sequences cancelled."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._peers: list[Peer] = []               # oldest first; the first counts the steps (StepReport.owner)
        self._peers_lock = threading.Lock()
        self._report = StepReport()
        self._seqs: dict[tuple[Peer, int], Any] = {}
        self._key_peer: dict[Any, tuple[Peer, int]] = {}   # a step's tokens_by_seq key -> its peer, live sequences
        self._compiling: set[tuple[Peer, int]] = set()        # constrained submissions whose grammar is compiling
        self._cancelled_early: set[tuple[Peer, int]] = set()  # ... and were cancelled meanwhile
        self._compile_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar")
        self._compiler: Any = None
        self._compiler_lock = threading.Lock()
        engine.stats.on_step.append(self._on_step)
        engine.stats.on_step_seqs.append(self._on_step_seqs)
        engine.after_step.append(self._flush)

    # ---- engine thread ---------------------------------------------------------------------------------
    def _on_step(self, n_tokens: int, n_seqs: int, dt: float) -> None:
        self._report.n_tokens, self._report.n_seqs, self._report.dt = n_tokens, n_seqs, dt

    def _on_step_seqs(self, dt: float, by_seq: dict[Any, int]) -> None:
        self._report.tokens_by_seq = dict(by_seq)

    def snapshot(self) -> StepReport:
        """The engine's state and its counters since start, with no step in it."""
        s = self.engine.scheduler
        r = StepReport(running=len(s.running), waiting=self.engine.queue_depth, used_cells=s.used_cells,
                       preemptions=s.preemptions, prefix_hit_tokens=s.prefix_hit_tokens,
                       prefix_query_tokens=s.prefix_query_tokens)
        st = self.engine.stats
        r.spec = (st.spec_drafts, st.spec_draft_tokens, st.spec_accepted_tokens)
        r.tiers = self.engine.tiers.stats
        r.n_ctx, r.rss = self.engine.runner.n_ctx, resident_bytes()
        return r

    def _flush(self) -> None:
        step, snap = self._report, self.snapshot()
        self._report = StepReport()
        r = dataclasses.replace(snap, n_tokens=step.n_tokens, n_seqs=step.n_seqs, dt=step.dt,
                                tokens_by_seq=step.tokens_by_seq)
        peers = list(self._peers)
        for i, peer in enumerate(peers):
            out, peer.outbox = peer.outbox, []
            if not out and not r.n_tokens:
                continue
            for rid, ev in out:
                if ev.finish_reason is not None:
                    self._forget(peer, rid)
            # several peers: the first counts the step's engine-wide figures, and each gets the tokens of its own
            # sequences (the others' under the key None, so a step's energy is still shared by all its tokens)
            mine = r if len(peers) == 1 else dataclasses.replace(
                r, owner=i == 0, tokens_by_seq=self._split(peer, r.tokens_by_seq))
            try:
                peer.send(("step", mine, out))
            except (OSError, ValueError):   # it went away: its reader thread drops it
                pass

    def _split(self, peer: Peer, by_seq: dict[Any, int]) -> dict[Any, int]:
        out: dict[Any, int] = {}
        rest = 0
        for key, n in by_seq.items():
            owner = self._key_peer.get(key)
            if owner is not None and owner[0] is peer:
                out[key] = n
            else:
                rest += n
        if rest:
            out[None] = rest
        return out

    def _forget(self, peer: Peer, rid: int) -> None:
        seq = self._seqs.pop((peer, rid), None)
        if seq is None:
            return
        key = seq.request_id or seq.seq_id
        owner = self._key_peer.get(key)
        if owner is not None:
            if owner[1] <= 1:
                self._key_peer.pop(key, None)
            else:
                self._key_peer[key] = (owner[0], owner[1] - 1)

    # ---- the pipes ---------------------------------------------------------------------------------------
    def serve(self, conn: Connection) -> None:
        """Read one peer's messages until its pipe closes or it says stop; then cancel what it left running."""
        peer = Peer(conn)
        with self._peers_lock:
            self._peers.append(peer)
        try:
            self._serve(peer)
        finally:
            with self._peers_lock:
                self._peers.remove(peer)
            peer.alive = False
            for (p, rid), seq in list(self._seqs.items()):
                if p is peer:            # its final events have nobody to go to: forget them here
                    self.engine.cancel(seq)
                    self._forget(peer, rid)
            self._compiling = {k for k in self._compiling if k[0] is not peer}
            try:
                conn.close()
            except OSError:
                pass

    def _serve(self, peer: Peer) -> None:
        while True:
            try:
                msg = peer.conn.recv()
            except (EOFError, OSError):
                return                       # the gateway is gone
            kind = msg[0]
            if kind == "submit":
                self._submit(peer, *msg[1:])
            elif kind == "cancel":
                key = (peer, msg[1])
                seq = self._seqs.get(key)
                if seq is not None:
                    self.engine.cancel(seq)
                elif key in self._compiling:
                    self._cancelled_early.add(key)
            elif kind == "call":
                try:
                    peer.send(self.answer(msg))
                except (OSError, ValueError):    # the peer went away (a closed pipe raises either)
                    return
            elif kind == "stop":
                return

    def _submit(self, peer: Peer, rids: list[int], prompt: list[int], params: list[SamplingParams],
                spec: ConstraintSpec | None, request_id: str | None, stream: bool) -> None:
        if spec is None:
            self._start(peer, rids, prompt, params, None, request_id, stream)
        else:
            self._compiling.update((peer, rid) for rid in rids)
            self._compile_pool.submit(self._start_constrained, peer, rids, prompt, params, spec, request_id, stream)

    def _start_constrained(self, peer: Peer, rids: list[int], prompt: list[int], params: list[SamplingParams],
                           spec: ConstraintSpec, request_id: str | None, stream: bool) -> None:
        from tokenomy.structured import ConstraintError, NoRoom, SchemaError, start_constraint

        try:
            grammar = self.compiler().compile(spec.fmt)
            constraints = [start_constraint(grammar, p.max_tokens, spec.break_loops, spec.wrap_up) for p in params]
        except NoRoom as e:
            self._reject_all(peer, rids, "invalid_request", str(e), param="max_tokens")
            return
        except ConstraintError as e:   # no answer can end: _error reports it as an unsatisfiable schema
            self._reject_all(peer, rids, "invalid_schema", str(e), param="response_format")
            return
        except SchemaError as e:
            self._reject_all(peer, rids, "invalid_schema", f"Invalid schema: {e.reason}", param=e.param)
            return
        except Exception as e:
            self._reject_all(peer, rids, "invalid_schema", f"the schema could not be prepared: {e}")
            return
        if not peer.alive:                 # it went away while the grammar compiled
            return
        self._start(peer, rids, prompt, params, constraints, request_id, stream)
        self._compiling.difference_update((peer, rid) for rid in rids)

    def _start(self, peer: Peer, rids: list[int], prompt: list[int], params: list[SamplingParams],
               constraints: list[Any] | None, request_id: str | None, stream: bool) -> None:
        if any((peer, rid) in self._cancelled_early for rid in rids):
            self._cancelled_early.difference_update((peer, rid) for rid in rids)
            self._reject_all(peer, rids, "cancelled", "cancelled before it started")
            return

        def on_event_of(rid: int) -> Any:
            held: list[TokenEvent] = []

            def on_event(ev: TokenEvent) -> None:     # engine thread, inside a step: flushed after it
                if stream:
                    peer.outbox.append((rid, ev))
                elif ev.finish_reason is None:
                    held.append(ev)
                else:
                    peer.outbox.append((rid, merged(held, ev)))
            return on_event

        try:
            seqs = self.engine.submit_n(prompt, params, [on_event_of(rid) for rid in rids], constraints,
                                        request_id=request_id)
            for rid, seq in zip(rids, seqs, strict=True):
                self._seqs[(peer, rid)] = seq
                key = seq.request_id or seq.seq_id
                held = self._key_peer.get(key)
                self._key_peer[key] = (peer, (held[1] if held else 0) + 1)
                if seq.is_finished:          # it ended before it was filed here: _flush found nothing to drop
                    self._forget(peer, rid)
                elif not peer.alive:         # it went away meanwhile
                    self.engine.cancel(seq)
        except QueueFull as e:
            self._reject_all(peer, rids, "queue_full", str(e))
        except ValueError as e:
            self._reject_all(peer, rids, "invalid_request", str(e))

    def _reject_all(self, peer: Peer, rids: list[int], code: str, message: str, param: str | None = None) -> None:
        self._compiling.difference_update((peer, rid) for rid in rids)
        for rid in rids:
            ev = TokenEvent(text="", token_ids=[], logprobs=[], finish_reason="error", error=message,
                            error_code=code, error_param=param)
            try:
                peer.send(("step", None, [(rid, ev)]))
            except (OSError, ValueError):
                return

    def compiler(self) -> Any:
        """Grammar compiler over this model's vocabulary, built on first use (llguidance)."""
        with self._compiler_lock:
            if self._compiler is None:
                from tokenomy.structured import GrammarCompiler
                from tokenomy.structured.token_tables import tokenizer_from_vocab

                r = self.engine.runner
                self._compiler = GrammarCompiler(tokenizer_from_vocab(r.vocab, n_vocab=r.n_vocab))
            return self._compiler

    def answer(self, msg: tuple) -> tuple:
        """The ("reply", id, result, error) to a ("call", id, name, *args): a failed call fails that call, not the
        process."""
        try:
            return ("reply", msg[1], self._call(msg[2], *msg[3:]), None)
        except Exception as e:
            return ("reply", msg[1], None, f"{type(e).__name__}: {e}")

    def _call(self, name: str, *args: Any) -> Any:
        """Introspection and maintenance for tests and operators ("state", "clear_cache"; runs beside the loop, so
        reads are a snapshot), "score" (ids, window) -> (surprisal, seconds): see `score`, and the KV tiers kept
        across processes of the same model (backends/fleet.py): "persist_tiers" (dir) and "adopt_tiers" (dir) ->
        entries written or read (KVTiers.persist, adopt), on the engine thread."""
        s = self.engine.scheduler
        if name == "state":
            return {"running": len(s.running), "waiting": self.engine.queue_depth, "used_cells": s.used_cells,
                    "retired": len(s.layout.prefix.retired), "pid": os.getpid()}
        if name == "clear_cache":
            self.engine.run_in_loop(s.clear_cache)
            return True
        if name == "score":
            return self.score(*args)
        if name in ("persist_tiers", "adopt_tiers"):
            tiers, count = self.engine.tiers, [0]

            def move() -> None:     # a failure loses saved prefixes, nothing a request needs
                try:
                    count[0] = tiers.persist(args[0]) if name == "persist_tiers" else tiers.adopt(args[0])
                except Exception:
                    log.exception("%s failed", name)

            self.engine.run_in_loop(move)
            return count[0]
        raise ValueError(f"unknown call {name}")

    def score(self, ids: list[int], window: int, timeout: float = tuning.SCORE_TIMEOUT_S) -> tuple[np.ndarray, float]:
        """Each token's surprisal, -log p(token | the tokens before it in its window of `window` tokens) (inf for a
        window's first token: no context to judge it), and the seconds the model took. The engine of a scorer
        (context/compress.py) serves no sequences: scoring takes its whole KV, so a busy engine refuses."""
        if self.engine.running or self.engine.queue_depth or self._seqs:
            raise RuntimeError("this engine is serving requests; scoring needs an engine of its own")
        if not 0 < window <= self.engine.cfg.max_batch_tokens:
            raise ValueError(f"window {window} is not within 1..max_batch_tokens ({self.engine.cfg.max_batch_tokens})")
        out: list[tuple[np.ndarray, float]] = []
        self.engine.run_in_loop(lambda: out.append(surprisal(self.engine, ids, window)), timeout)
        if not out:
            raise TimeoutError(f"scoring {len(ids)} tokens did not finish in {timeout:g} s")
        return out[0]


def surprisal(engine: Engine, ids: list[int], window: int) -> tuple[np.ndarray, float]:
    """Core.score's work, on the engine thread: one decode per window, logits at every position."""
    from tokenomy.engine.runner import Chunk

    runner = engine.runner
    out = np.full(len(ids), np.inf, dtype=np.float32)
    t0 = time.perf_counter()
    engine.scheduler.clear_cache()
    try:
        for w in range(0, len(ids), window):
            part = ids[w:w + window]
            runner.clear()
            rows = runner.decode([Chunk(0, part, 0, logits=len(part))])[:-1].astype(np.float64)
            top = rows.max(axis=1)
            lse = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
            out[w + 1:w + len(part)] = lse - rows[np.arange(len(part) - 1), part[1:]]
    finally:
        runner.clear()
    return out, time.perf_counter() - t0


def resident_bytes() -> int:
    """This process's resident memory in bytes (RSS: /proc/self/statm's second field; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def info(engine: Engine, core: Core | None = None) -> dict[str, Any]:
    """What a peer learns when it connects: the window, the KV cells, the pid, and (with `core`) the engine's
    counters so far (a gateway that joins a running engine counts from them, not from zero)."""
    out: dict[str, Any] = {"max_model_len": engine.max_model_len, "n_ctx": engine.runner.n_ctx, "pid": os.getpid(),
                           "n_gpu_layers": engine.runner.gpu_layers, "rss": resident_bytes()}
    if core is not None:
        out["report"] = core.snapshot()
    return out


def main(fd: int, address: str | None = None) -> None:
    """The engine process (launch.ENTRY runs it on one end of a socket pair): read (model path, EngineConfig,
    name), load, self-check, report ready, serve until the pipe closes. Interrupts are its parent's to handle: it
    stops this process by closing the pipe.

    With `address` (a Unix socket path: the engine of `server.workers`, server/workers.py) the pipe only starts and
    stops it: the API workers connect to `address`, each a peer of the same Core, and a worker that goes away has
    its sequences cancelled while the others go on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    model_path, cfg, name = conn.recv()
    try:
        # every llama_decode runs on the engine thread, the self-check's too: llama.cpp's OpenMP team belongs
        # to the thread that first computes, and a second calling thread made each step three times slower
        engine = Engine(model_path, cfg, name=name).start()
        self_check(engine)
    except Exception as e:  # a native crash never gets here: the client reads the exit signal instead
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    core = Core(engine)
    try:
        if address is None:
            conn.send(("ready", info(engine)))
            core.serve(conn)
        else:
            serve_socket(core, conn, address)
    finally:
        engine.stop()


def serve_socket(core: Core, parent: Connection, address: str) -> None:
    """Accept peers on `address` until the parent's pipe closes or says stop, each served on a thread of its own;
    the parent's calls (Core._call: the fleet's persist_tiers and adopt_tiers, server/fleet_host.py) are answered on
    its pipe."""
    from multiprocessing.connection import Listener

    listener = Listener(address, family="AF_UNIX", backlog=64)

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return                   # the listener was closed: the process is stopping
            try:
                conn.send(("ready", info(core.engine, core)))
            except (OSError, ValueError):
                continue
            threading.Thread(target=core.serve, args=(conn,), name="engine-peer", daemon=True).start()

    threading.Thread(target=accept, name="engine-accept", daemon=True).start()
    parent.send(("ready", info(core.engine)))
    try:
        while True:
            msg = parent.recv()             # EOFError when the parent goes away
            if msg[0] == "stop":
                return
            if msg[0] == "call":
                parent.send(core.answer(msg))
    except (EOFError, OSError):
        return
    finally:
        listener.close()
