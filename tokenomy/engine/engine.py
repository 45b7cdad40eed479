"""The engine loop, one thread per model: schedule -> one llama_decode -> sample and emit; between steps, save what
finished to the KV tiers."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.tier import KVTiers, engine_dir
from tokenomy.engine.runner import Chunk, KVFull, ModelRunner
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.scheduler import QueueFull, Scheduler
from tokenomy.engine.sequence import Sequence, Status, TokenEvent
from tokenomy.engine.sequence_output import SequenceOutput
from tokenomy.engine.spec import speculate
from tokenomy.engine.spec.cost import StepCost
from tokenomy.engine.spec.draft import DraftModel
from tokenomy.engine.spec.prediction import Prediction
from tokenomy.engine.tokenizer import Tokenizer

log = logging.getLogger("tokenomy.engine")

__all__ = ["Engine", "EngineConfig", "QueueFull", "StepStats"]

@dataclass
class StepStats:
    steps: int = 0
    tokens: int = 0                  # tokens fed to llama_decode
    prompt_tokens: int = 0           # prompt tokens computed (fed), not those a cached prefix or a fork gave
    generated_tokens: int = 0
    busy_s: float = 0.0
    last_batch_tokens: int = 0
    last_batch_seqs: int = 0
    spec_drafts: int = 0             # sequence-steps that verified a draft
    spec_draft_tokens: int = 0       # tokens drafted
    spec_accepted_tokens: int = 0    # of those, accepted
    on_step: list[Callable[[int, int, float], None]] = field(default_factory=list)
    on_step_seqs: list[Callable[[float, dict[Any, int]], None]] = field(default_factory=list)  # dt, tokens by id


class Engine:
    def __init__(self, model_path: str, cfg: EngineConfig | None = None, name: str = "model") -> None:
        self.cfg = cfg = cfg or EngineConfig()
        self.name = name
        self.runner = ModelRunner(model_path, cfg)
        try:
            self.max_model_len = cfg.window(self.runner.max_ctx_seq, self.runner.n_ctx_train)
            if cfg.context_overflow == "shift" and not self.runner.can_shift:
                raise RuntimeError("context_overflow shift: this model's KV cache cannot shift positions")
        except Exception:
            self.runner.close()
            raise
        self.tokenizer = Tokenizer(self.runner)
        self.stats = StepStats()
        self.step_cost = StepCost()   # measured seconds per step by tokens fed (sizes the drafts)
        self.drafter = DraftModel(cfg.draft_model, cfg, self.runner) if cfg.draft_model else None
        self.tiers = KVTiers(cfg.kv_tier_ram_mb << 20, engine_dir(cfg.kv_tier_disk_dir, name),
                             cfg.kv_tier_disk_mb << 20)
        self.tiers.recompute_s = self.prefill_seconds
        self.scheduler = Scheduler(cfg, self.runner, self.runner.n_ctx, self.tiers)
        self.speculator = speculate.Speculator(cfg, self.max_model_len, self.drafter)
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
        self.tiers.close()
        if self.drafter is not None:
            self.drafter.close()
        self.runner.close()

    def submit(self, prompt: list[int], params: SamplingParams, on_event: Callable[[TokenEvent], None],
               constraint: Any = None, request_id: str | None = None) -> Sequence:
        return self.submit_n(prompt, [params], [on_event], [constraint], request_id)[0]

    def submit_n(self, prompt: list[int], params: list[SamplingParams], on_events: list[Callable[[TokenEvent], None]],
                 constraints: list[Any] | None = None, request_id: str | None = None) -> list[Sequence]:
        """Queue the sequences of one request: one per choice (n > 1: `params[i]`, `on_events[i]` and
        `constraints[i]` are choice i's). They share one prefill: the first computes the prompt's KV and the others
        are forked from it when it has (Scheduler.fork). Raises QueueFull when the queue has no room for them all."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt is {len(prompt)} tokens; the limit is {self.max_model_len - 1}")
        limit = self.max_model_len if self.cfg.context_overflow == "error" else sys.maxsize
        seqs: list[Sequence] = []
        for i, (p, on_event) in enumerate(zip(params, on_events, strict=True)):
            seq = Sequence(prompt=list(prompt), params=p, on_event=on_event,
                           constraint=constraints[i] if constraints else None, request_id=request_id,
                           fork_of=seqs[0] if seqs else None)
            seq.out = SequenceOutput(p, seq.prompt, seq.output, self.runner, limit)
            if p.prediction is not None:
                seq.prediction = Prediction(p.prediction)
            seqs.append(seq)
        seqs[0].forks = seqs[1:]
        with self._cv:
            if len(self._inbox) + len(self.scheduler.waiting) + len(seqs) > self.cfg.max_waiting:
                raise QueueFull(f"the waiting queue is full ({self.cfg.max_waiting} requests)")
            self._inbox.extend(seqs)
            self._cv.notify()
        return seqs

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


    def _batch_tokens(self) -> int:
        """Tokens a step of batch work may feed: the most (up to batch_step_tokens, halving) whose measured step
        time is within batch_step_ms, at least one; batch_step_tokens while the cost is not measured yet."""
        n = self.cfg.batch_step_tokens
        if not self.cfg.batch_step_ms:
            return n
        limit = self.cfg.batch_step_ms / 1000
        while n > 1 and (t := self.step_cost.predict(n)) is not None and t > limit:
            n //= 2
        return n

    def prefill_seconds(self, n: int) -> float | None:
        """Estimated seconds to prefill `n` tokens alone, in steps of max_batch_tokens, from measured steps
        (None before the engine has measured enough)."""
        full, rest = divmod(n, self.cfg.max_batch_tokens)
        per_step = self.step_cost.predict(self.cfg.max_batch_tokens)
        last = self.step_cost.predict(rest) if rest else 0.0
        if per_step is None or last is None:
            return None
        return full * per_step + last

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
        return self.scheduler.used_cells / self.runner.n_ctx

    # ---- the loop ----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.drafter is not None:
            self.drafter.calibrate()
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
            try:
                self.scheduler.save_finished()
            except Exception:  # a failed save loses a tier entry, nothing a request needs
                log.exception("saving finished prefixes to the KV tiers failed")

    def _take_inbox(self) -> None:
        self.scheduler.waiting.extend(self._inbox)
        self._inbox.clear()

    def _has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> None:
        """Schedule, draft, decode, commit, output."""
        self._reap_cancelled()
        self._grow()
        if self.cfg.context_overflow == "shift":
            for seq in self.scheduler.running:
                if seq.n_kv + seq.pending > self.max_model_len:    # the next step would write past the window
                    self.scheduler.shift(seq, tuning.SINK_TOKENS)
        self.scheduler.batch_tokens = self._batch_tokens()
        plan = self.scheduler.schedule()
        if not plan:
            return
        drafts = self.speculator.drafts(plan, self.scheduler.free_cells, self.step_cost)
        chunks = [_chunk(seq, n, drafts.get(seq, [])) for seq, n in plan]
        logits = self._decode(plan, chunks)
        if logits is None:
            return
        for (seq, n), chunk in zip(plan, chunks, strict=True):
            self.stats.prompt_tokens += max(0, min(len(seq.prompt), seq.n_kv + n) - seq.n_kv)   # not its draft
            self.scheduler.committed(seq, chunk.tokens)
        row = 0
        for (seq, _), chunk in zip(plan, chunks, strict=True):
            if chunk.logits:
                rows = logits[row:row + chunk.logits]
                if seq.forks and not seq.output:
                    self._fork(seq, rows[:1])
                self._process_output(seq, rows, drafts.get(seq, []))
                row += chunk.logits

    def _grow(self) -> None:
        """With KV streams smaller than the window (engine.kv_start_cells), make them larger before a step that
        needs it: a running sequence whose next step (a chunk of its prompt, or its token and a draft) could pass
        its stream's cells, or a waiting one whose tokens would fill the stream, gets streams of twice the cells
        (more if it needs them, at most the window's): the runner makes its context again (ModelRunner.grow)."""
        runner = self.runner
        if runner.n_ctx_seq >= runner.max_ctx_seq:
            return
        seqs = [*self.scheduler.running, *self.scheduler.waiting]
        need = max((s.num_kv_tokens + tuning.MAX_DRAFT + 1 for s in seqs), default=0)
        if need <= runner.n_ctx_seq:
            return
        t0 = time.perf_counter()
        before = runner.n_ctx_seq
        try:
            grown = runner.grow(max(need, 2 * before))
        except RuntimeError as e:     # no memory for larger streams: what needs them ends, the rest goes on
            log.error("%s: %s", self.name, e)
            self.scheduler.layout.n_ctx = runner.n_ctx
            for seq in seqs:
                if seq.num_kv_tokens + tuning.MAX_DRAFT + 1 > runner.n_ctx_seq:
                    self._finish(seq, "error", error=f"the KV cache could not grow to hold this sequence: {e}",
                                 error_code="kv_cache_full")
            return
        if grown:
            self.scheduler.layout.n_ctx = runner.n_ctx
            log.info("%s: KV streams grown from %d to %d cells (%d in all) for a sequence of %d tokens, in %.2f s",
                     self.name, before, runner.n_ctx_seq, runner.n_ctx, need, time.perf_counter() - t0)

    def _decode(self, plan: list[tuple[Sequence, int]], chunks: list[Chunk]) -> Any:
        """One llama_decode over the step's chunks; its logits rows, or None when llama.cpp found no room."""
        now = time.perf_counter()
        for seq, _ in plan:
            if seq.first_scheduled is None:
                seq.first_scheduled = now
        t0 = time.perf_counter()
        try:
            logits = self.runner.decode(chunks)
        except KVFull:
            # llama.cpp found no room although our accounting did (fragmentation): give back the newest.
            if self.scheduler.running:
                self.scheduler.preempt(self.scheduler.running[-1])
            return None
        dt = time.perf_counter() - t0
        n_tokens = sum(len(c.tokens) for c in chunks)
        self.step_cost.observe(n_tokens, dt)
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
        return logits

    def _fork(self, first: Sequence, row: Any) -> None:
        """`first` has just computed its prompt's KV, and `row` is its last prompt token's logits: start the other
        sequences of its request that still wait on a copy of that KV (Scheduler.fork), each sampling its first token
        from the same row. One that finds no place now is admitted later as usual (the prompt from the prefix
        cache)."""
        for seq in first.forks:
            if seq.status is Status.WAITING and not seq.cancelled and self.scheduler.fork(first, seq):
                seq.first_scheduled = first.first_scheduled
                self._process_output(seq, row, [])

    def _process_output(self, seq: Sequence, rows: Any, draft: list[int]) -> None:
        """Sample from the sequence's logits rows (one, or one per fed token when it carried a draft), drop
        the KV of rejected draft tokens and send what it produced; a failure ends this sequence only (for
        example a grammar that cannot go on)."""
        assert seq.out is not None
        try:
            e = seq.out.after_logits(rows, seq.constraint, draft)
        except Exception as ex:
            log.warning("sequence %s failed: %s", seq.seq_id, ex)
            self._finish(seq, "error", error=str(ex), error_code=getattr(ex, "error_code", "sequence_failed"))
            return
        if draft:
            valid = seq.n_kv - len(draft) + e.accepted     # KV of the last token and the accepted drafts
            if seq.n_kv > valid:
                self.scheduler.cut(seq.slot, valid)
                seq.n_kv = valid
            seq.spec_acceptance = speculate.update_acceptance(seq.spec_acceptance, len(draft), e.accepted)
            seq.spec_drafted += len(draft)
            seq.spec_accepted += e.accepted
            st = self.stats
            st.spec_drafts += 1
            st.spec_draft_tokens += len(draft)
            st.spec_accepted_tokens += e.accepted
        if seq.first_token is None:
            seq.first_token = time.perf_counter()
        self.stats.generated_tokens += len(e.tokens)
        ev = TokenEvent(text=e.text, token_ids=e.tokens, logprobs=e.logprobs, token_logprobs=e.token_logprobs,
                        signals=e.signals)
        if e.finish_reason:
            self._finish(seq, e.finish_reason, ev)
        else:
            seq.on_event(ev)

    def _reap_cancelled(self) -> None:
        for seq in [s for s in self.scheduler.waiting if s.cancelled]:
            self.scheduler.waiting.remove(seq)
            self._finish(seq, "cancelled")
        for seq in [s for s in self.scheduler.running if s.cancelled]:
            self._finish(seq, "cancelled")

    def _finish(self, seq: Sequence, reason: str, last: TokenEvent | None = None, error: str | None = None,
                error_code: str | None = None) -> None:
        """End the sequence: free its slot (keeping its prefix unless it failed) and send its final event,
        `last`'s text and tokens with the request's counts and times."""
        if seq.status is Status.FINISHED:
            return
        seq.finish_reason = reason
        seq.finished_at = time.perf_counter()
        # a handover's answer goes on in a new sequence whose prompt is this one's tokens: keep them all; a forked
        # sequence's prompt is its request's first sequence's, which keeps it
        keep = reason not in ("cancelled", "error") and seq.fork_of is None
        self.scheduler.finish(seq, keep_prefix=keep, keep_output=reason == "handover")
        if self.drafter is not None:
            self.drafter.release(seq.seq_id)
        ev = last or TokenEvent(text="", token_ids=[], logprobs=[])
        out = seq.out
        ev.finish_reason, ev.error, ev.error_code = reason, error, error_code
        ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens = len(seq.prompt), seq.cached_tokens, len(seq.output)
        ev.draft_tokens, ev.draft_accepted = seq.spec_drafted, seq.spec_accepted
        ev.scheduled_at, ev.first_token_at = seq.first_scheduled, seq.first_token
        ev.mean_logprob = out.mean_logprob if out else 0.0
        ev.min_logprob = out.min_logprob if out else 0.0
        ev.stop_sequence = out.stops.matched if out and reason == "stop" else None
        seq.on_event(ev)


def _chunk(seq: Sequence, n: int, draft: list[int]) -> Chunk:
    """What `seq` feeds this step: its next `n` tokens, then its draft; logits for the last token and the draft
    when the step reaches the end of what it has."""
    last = seq.n_kv + n == seq.num_kv_tokens
    return Chunk(seq.slot, seq.kv_tokens(seq.n_kv, seq.n_kv + n) + draft, seq.n_kv, 1 + len(draft) if last else 0)
