"""The engine loop, one thread per model: schedule -> one llama_decode -> sample and emit, nothing else."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.engine.runner import Chunk, KVFull, ModelRunner, RunnerConfig
from tokenomy.engine.sampler import Sampler, chosen_logprob, describe, token_logprobs
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.scheduler import QueueFull, Scheduler, SchedulerConfig
from tokenomy.engine.sequence import Sequence, Status, TokenEvent
from tokenomy.engine.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger("tokenomy.engine")

__all__ = ["Engine", "EngineConfig", "QueueFull", "StepStats"]


@dataclass
class EngineConfig:
    n_ctx: int = 16384
    max_model_len: int = 8192
    max_running: int = 16
    max_retired: int = 32
    max_retired_cells: int = 2048    # KV cells kept for finished sequences alone (scheduler.SchedulerConfig)
    retire_outputs: bool = False     # keep finished answers' tokens as prefixes too (scheduler.SchedulerConfig)
    max_batch_tokens: int = 512
    max_waiting: int = 256
    n_threads: int = 0
    kv_type: str = "q8_0/f16"       # K/V cache types: runner.kv_types
    prefix_caching: bool = True
    flash_attn: bool = True
    watchdog_s: float = 120.0        # engine process: no step for this long while holding requests = hung
    start_timeout_s: float = 300.0   # engine process: load and self-check must finish within this


@dataclass
class StepStats:
    steps: int = 0
    tokens: int = 0                  # tokens fed to llama_decode
    prompt_tokens: int = 0
    generated_tokens: int = 0
    busy_s: float = 0.0
    last_batch_tokens: int = 0
    last_batch_seqs: int = 0
    on_step: list[Callable[[int, int, float], None]] = field(default_factory=list)
    on_step_seqs: list[Callable[[float, dict[Any, int]], None]] = field(default_factory=list)  # dt, tokens by id


class Engine:
    def __init__(self, model_path: str, cfg: EngineConfig | None = None, name: str = "model") -> None:
        self.cfg = cfg = cfg or EngineConfig()
        self.name = name
        self.runner = ModelRunner(model_path, RunnerConfig(
            n_ctx=cfg.n_ctx, n_seq_max=cfg.max_running + cfg.max_retired, n_batch=cfg.max_batch_tokens,
            n_threads=cfg.n_threads, kv_type=cfg.kv_type, flash_attn=cfg.flash_attn,
        ))
        self.tokenizer = Tokenizer(self.runner)
        self.max_model_len = min(cfg.max_model_len, self.runner.n_ctx_train, self.runner.n_ctx)
        self.scheduler = Scheduler(SchedulerConfig(
            n_ctx=self.runner.n_ctx, n_slots=cfg.max_running + cfg.max_retired, max_running=cfg.max_running,
            max_batch_tokens=cfg.max_batch_tokens, max_waiting=cfg.max_waiting,
            prefix_caching=cfg.prefix_caching, max_retired_cells=cfg.max_retired_cells,
            retire_outputs=cfg.retire_outputs,
        ), self.runner)
        self.stats = StepStats()
        self.after_step: list[Callable[[], None]] = []   # called on the engine thread after every step
        self._inbox: list[Sequence] = []
        self._calls: list[Callable[[], None]] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- public, thread-safe --------------------------------------------------------------------------
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"engine-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread:
            self._thread.join(timeout=30)
            self._thread = None
        self.runner.close()

    def submit(self, prompt: list[int], params: SamplingParams, on_event: Callable[[TokenEvent], None],
               constraint: Any = None, request_id: str | None = None) -> Sequence:
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt is {len(prompt)} tokens; the limit is {self.max_model_len - 1}")
        seq = Sequence(prompt=list(prompt), params=params, on_event=on_event, constraint=constraint,
                       request_id=request_id)
        with self._cv:
            if len(self._inbox) + len(self.scheduler.waiting) >= self.cfg.max_waiting:
                raise QueueFull(f"the waiting queue is full ({self.cfg.max_waiting} requests)")
            self._inbox.append(seq)
            self._cv.notify()
        return seq

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True
        with self._cv:
            self._cv.notify()

    def run_in_loop(self, fn: Callable[[], None], timeout: float = 30.0) -> None:
        """Run `fn` on the engine thread between two steps and wait for it (directly if the loop is not running)."""
        if self._thread is None:
            fn()
            return
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        with self._cv:
            self._calls.append(call)
            self._cv.notify()
        done.wait(timeout)


    @property
    def queue_depth(self) -> int:
        return len(self._inbox) + len(self.scheduler.waiting)

    @property
    def oldest_wait_s(self) -> float:
        """How long the head of the queue has waited so far (0 when nothing waits)."""
        waiting = list(self._inbox) + list(self.scheduler.waiting)
        return time.perf_counter() - min(s.arrival for s in waiting) if waiting else 0.0

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def kv_usage(self) -> float:
        """Share of KV cells in use, running sequences and cached prefixes together."""
        return self.scheduler.prefix.used_cells / self.runner.n_ctx

    # ---- the loop ----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._inbox and not self._calls and not self._has_work():
                    self._cv.wait(timeout=0.5)
                if self._stop:
                    return
                self._take_inbox()
                calls, self._calls = self._calls, []
            for call in calls:
                call()
            try:
                self.step()
            except Exception as e:  # a broken step must not kill the server: fail what was in it
                log.exception("engine step failed")
                for seq in list(self.scheduler.running):
                    self._finish(seq, "error", error=str(e))
            for cb in self.after_step:
                cb()

    def _take_inbox(self) -> None:
        self.scheduler.waiting.extend(self._inbox)
        self._inbox.clear()

    def _has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> None:
        self._reap_cancelled()
        plan = self.scheduler.schedule()
        if not plan:
            return
        for seq, _ in plan:
            if seq.first_scheduled is None:
                seq.first_scheduled = time.perf_counter()
        chunks = [Chunk(seq.slot, seq.tokens[seq.n_kv:seq.n_kv + n], seq.n_kv, seq.n_kv + n == seq.num_tokens)
                  for seq, n in plan]
        t0 = time.perf_counter()
        try:
            logits = self.runner.decode(chunks)
        except KVFull:
            # llama.cpp found no room although our accounting did (fragmentation): give back the newest.
            if self.scheduler.running:
                self.scheduler.preempt(self.scheduler.running[-1])
            return
        dt = time.perf_counter() - t0
        n_tokens = sum(len(c.tokens) for c in chunks)
        st = self.stats
        st.steps += 1
        st.tokens += n_tokens
        st.busy_s += dt
        st.last_batch_tokens, st.last_batch_seqs = n_tokens, len(chunks)
        for cb in st.on_step:
            cb(n_tokens, len(chunks), dt)
        if st.on_step_seqs:
            by_seq = {seq.request_id or seq.seq_id: len(c.tokens) for (seq, _), c in zip(plan, chunks, strict=True)}
            for cb2 in st.on_step_seqs:
                cb2(dt, by_seq)
        row = 0
        for (seq, _), chunk in zip(plan, chunks, strict=True):
            self.scheduler.committed(seq, chunk.tokens)
            if seq.n_kv <= len(seq.prompt):
                st.prompt_tokens += len(chunk.tokens)
            if chunk.logits:
                try:
                    self._postprocess(seq, logits[row])
                except Exception as e:      # e.g. a grammar that cannot go on: end this sequence only
                    log.warning("sequence %s failed: %s", seq.seq_id, e)
                    self._finish(seq, "error", error=str(e),
                                 error_code=getattr(e, "error_code", "sequence_failed"))
                row += 1

    def _reap_cancelled(self) -> None:
        for seq in [s for s in self.scheduler.waiting if s.cancelled]:
            self.scheduler.waiting.remove(seq)
            self._finish(seq, "cancelled")
        for seq in [s for s in self.scheduler.running if s.cancelled]:
            self._finish(seq, "cancelled")

    # ---- after the step: sample, detokenize, stop, emit ------------------------------------------------
    def _postprocess(self, seq: Sequence, raw: Any) -> None:
        p = seq.params
        sampler: Sampler = seq.state.get("sampler") or seq.state.setdefault("sampler", Sampler(p, seq.prompt))
        detok: IncrementalDetokenizer = seq.state.get("detok") or seq.state.setdefault(
            "detok", IncrementalDetokenizer(self.runner))
        mask = seq.constraint.allowed() if seq.constraint is not None else None
        token = sampler.sample(raw, mask)
        new = [token]
        lps: list[dict[str, Any]] = []
        chosen: list[float] = []
        if p.logprobs:
            lp, tops = token_logprobs(raw, token, p.top_logprobs)
            entry = describe([(token, lp)], self.runner.piece)[0]
            entry["top_logprobs"] = describe(tops, self.runner.piece)
            lps.append(entry)
        else:
            lp = chosen_logprob(raw, token)
        seq.sum_logprob += lp
        seq.min_logprob = min(seq.min_logprob, lp)
        chosen.append(lp)
        if seq.constraint is not None:
            seq.constraint.advance([token])
            forced = seq.constraint.forced()
            if forced and token not in self.runner.eog:
                seq.constraint.advance(forced)
                new += forced
                chosen += [0.0] * len(forced)
                if p.logprobs:  # forced tokens have probability 1 under the constrained distribution
                    lps += [dict(d, top_logprobs=[]) for d in describe([(t, 0.0) for t in forced],
                                                                       self.runner.piece)]
        if seq.first_token is None:
            seq.first_token = time.perf_counter()
        finish: str | None = None
        text = ""
        emitted: list[int] = []
        for t in new:
            if t in self.runner.eog and not p.ignore_eos:
                finish = "stop"
                break
            seq.output.append(t)
            sampler.accept(t)
            emitted.append(t)
            text += detok.add(t)
            if len(seq.output) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                finish = "length"
                break
        self.stats.generated_tokens += len(emitted)
        if seq.constraint is not None and finish is None and seq.constraint.is_done():
            finish = "stop"
        if finish:
            text += detok.flush()
        seq.text += text
        out, stop_hit = self._release(seq, final=finish is not None)
        if stop_hit:
            finish = "stop"
        chosen = chosen[:len(emitted)]
        if finish:
            self._finish(seq, finish, text=out, tokens=emitted, logprobs=lps, token_logprobs=chosen)
        else:
            seq.on_event(TokenEvent(text=out, token_ids=emitted, logprobs=lps, token_logprobs=chosen))

    def _release(self, seq: Sequence, final: bool) -> tuple[str, bool]:
        """Text that can be sent now. Holds back a tail that could start a stop string; cuts at a stop string."""
        stops = seq.params.stop
        if not stops:
            out = seq.text[seq.released:]
            seq.released = len(seq.text)
            return out, False
        longest = max(len(s) for s in stops)
        search_from = max(0, seq.released - longest + 1)
        hits = [i for s in stops if (i := seq.text.find(s, search_from)) >= 0]
        if hits:
            cut = min(hits)
            out = seq.text[seq.released:cut]
            seq.text = seq.text[:cut]
            seq.released = cut
            return out, True
        keep = 0
        if not final:
            for s in stops:
                for k in range(min(len(s) - 1, len(seq.text) - seq.released), 0, -1):
                    if seq.text.endswith(s[:k]):
                        keep = max(keep, k)
                        break
        end = len(seq.text) - keep
        out = seq.text[seq.released:end]
        seq.released = end
        return out, False

    def _finish(self, seq: Sequence, reason: str, text: str = "", tokens: list[int] | None = None,
                logprobs: list[dict[str, Any]] | None = None, error: str | None = None,
                token_logprobs: list[float] | None = None, error_code: str | None = None) -> None:
        if seq.status is Status.FINISHED:
            return
        seq.finish_reason = reason
        seq.finished_at = time.perf_counter()
        self.scheduler.finish(seq, keep_prefix=reason not in ("cancelled", "error"))
        seq.on_event(TokenEvent(
            text=text, token_ids=tokens or [], logprobs=logprobs or [], finish_reason=reason, error=error,
            error_code=error_code, token_logprobs=token_logprobs or [],
            prompt_tokens=len(seq.prompt), cached_tokens=seq.cached_tokens, completion_tokens=len(seq.output),
            scheduled_at=seq.first_scheduled, first_token_at=seq.first_token,
            mean_logprob=seq.sum_logprob / max(len(seq.output), 1), min_logprob=seq.min_logprob,
        ))
