"""Decides what goes into each step: running sequences first (one token each when decoding, a chunk when still
prefilling), then waiting sequences admitted in arrival order while the step's token budget, KV cells and slots
allow. Where a sequence's KV lives is the KV layout's business (kv_layout.py: the unified buffer or one KV stream
per sequence); when a running sequence needs cells the layout cannot free (by evicting cached prefixes), the newest
running sequence is preempted and put back at the front of the queue to be recomputed later (its prefix may still
be cached).

Two lanes: interactive sequences, and batch sequences (SamplingParams.priority "batch") that only fill the gaps.
While any interactive sequence runs or waits, batch sequences sit out the step (they keep their KV) and none is
admitted; otherwise at most `batch_max_running` of them run, with at most `batch_tokens` tokens a step (the engine
sizes it from the measured step cost, `batch_step_ms`), the least recently served first, so an interactive arrival
waits for one short step at most. When cells, slots or running places run out, batch sequences are preempted first
(newest first), and a batch sequence never preempts an interactive one.

The n sequences of one request (n choices of one prompt) share one prefill: the later ones wait until the first
has its prompt's KV; the engine then forks them from it (`fork`: the KV copied or shared by the layout, the first
token sampled from the first sequence's logits), or, where no place or slot is free then, they are admitted as
usual later and share the prompt through the prefix cache."""

from __future__ import annotations

from collections import deque

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.layout import KVLayout, KVOps
from tokenomy.engine.kv.streams import KVStreams
from tokenomy.engine.kv.tier import KVTiers
from tokenomy.engine.kv.unified import UnifiedBuffer
from tokenomy.engine.sequence import Sequence, Status


class QueueFull(RuntimeError):
    pass


class Scheduler:
    def __init__(self, cfg: EngineConfig, kv: KVOps, n_ctx: int, tiers: KVTiers | None = None) -> None:
        """`kv`, `n_ctx` and `tiers` are the layout's (kv_layout.py): the runner's memory operations, the KV cells
        its context really has, and where evicted prefixes are saved (none by default)."""
        self.cfg = cfg
        self.layout: KVLayout = (UnifiedBuffer if cfg.kv_unified else KVStreams)(cfg, kv, n_ctx, tiers)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.prefix_hit_tokens = 0      # tokens admissions found in the prefix cache ...
        self.prefix_query_tokens = 0    # ... of the tokens they looked up (vLLM's prefix cache hits / queries)
        self.batch_tokens = cfg.batch_step_tokens     # batch tokens a step; the engine resizes it by measured cost
        self._steps = 0

    @property
    def free_cells(self) -> int:
        """Cells a running sequence may still grow into this step."""
        return self.layout.free_cells

    @property
    def used_cells(self) -> int:
        """Cells holding KV, running sequences and cached prefixes together."""
        return self.layout.used_cells(self.running)

    # ---- the plan for one step ---------------------------------------------------------------------------
    def schedule(self) -> list[tuple[Sequence, int]]:
        budget, batch_budget = self.cfg.max_batch_tokens, min(self.batch_tokens, self.cfg.batch_step_tokens)
        self._steps += 1
        plan: list[tuple[Sequence, int]] = []
        self.layout.begin_step(self.running, waiting=bool(self.waiting))
        interactive = self.interactive_pending()
        batch = [] if interactive else sorted((s for s in self.running if s.batch), key=lambda s: s.served)
        lanes = [s for s in self.running if not s.batch] + batch       # batch: the least recently served first
        for seq in lanes:
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:
                continue                      # preempted earlier in this loop
            n = min(seq.pending, budget, batch_budget if seq.batch else budget)
            if n == 0 or not self._make_room(n, protect=seq):
                continue
            self.layout.reserve(n)
            plan.append((seq, n))
            seq.served = self._steps
            budget -= n
            if seq.batch:
                batch_budget -= n
        while budget > 0 and (seq := self._next_waiting(interactive, batch_budget)) is not None:
            admitted = self._admit(seq, min(budget, batch_budget) if seq.batch else budget)
            if admitted == 0:
                break
            self.waiting.remove(seq)
            plan.append((seq, admitted))
            seq.served = self._steps
            budget -= admitted
            if seq.batch:
                batch_budget -= admitted
        return self.layout.step_order(plan)

    def interactive_pending(self) -> bool:
        return any(not s.batch for s in self.running) or any(not s.batch for s in self.waiting)

    def _next_waiting(self, interactive: bool, batch_budget: int) -> Sequence | None:
        """The next sequence to admit: the oldest interactive one (making a running place by preempting a batch
        sequence if need be), else, when no interactive work is about, the oldest batch one if the lane has room."""
        first = next((s for s in self.waiting if not s.batch and self._may_start(s)), None)
        if first is not None:
            if len(self.running) >= self.cfg.max_running:
                victim = self._newest_batch()
                if victim is None:
                    return None
                self.preempt(victim)
            return first
        if interactive or not self.waiting or batch_budget <= 0 or len(self.running) >= self.cfg.max_running:
            return None
        if sum(s.batch for s in self.running) >= self.cfg.batch_max_running:
            return None
        return next((s for s in self.waiting if self._may_start(s)), None)

    @staticmethod
    def _may_start(seq: Sequence) -> bool:
        """A forked sequence (n > 1) waits while the first of its request has no KV of their prompt yet."""
        first = seq.fork_of
        return (first is None or first.status is Status.FINISHED
                or (first.status is Status.RUNNING and first.n_kv >= len(first.prompt)))

    def _newest_batch(self, exclude: Sequence | None = None) -> Sequence | None:
        return next((s for s in reversed(self.running) if s.batch and s is not exclude), None)

    def _bump_batch(self, keep: int | None) -> bool:
        """Preempt the newest running batch sequence for room, unless it holds slot `keep`; whether one was."""
        victim = self._newest_batch()
        if victim is None or victim.slot == keep:
            return False
        self.preempt(victim)
        return True

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Start `seq` where the layout places it (an interactive admission may preempt batch sequences for
        room); tokens scheduled, or 0 when there is no room."""
        placed = self.layout.admit(seq, budget, self.running, None if seq.batch else self._bump_batch)
        if placed is None:
            return 0
        slot, length, n = placed
        seq.slot, seq.n_kv, seq.status = slot, length, Status.RUNNING
        if seq.preemptions == 0:
            seq.cached_tokens = length
            seq.reused = length >= tuning.FINGERPRINT_TOKENS or self.layout.prefix.evicted_recently(seq.tokens)
        self.prefix_hit_tokens += length
        self.prefix_query_tokens += seq.num_kv_tokens
        self.running.append(seq)
        return n

    def _make_room(self, n: int, protect: Sequence) -> bool:
        """Cells for `n` more tokens of `protect`: the layout evicts cached prefixes, then the newest running
        batch sequence is preempted, then (for an interactive `protect` only) the newest interactive one."""
        while not self.layout.fits(n):
            victim = self._newest_batch(exclude=protect)
            if victim is None and not protect.batch:
                victim = next((s for s in reversed(self.running) if s is not protect), None)
            if victim is None:
                self.preempt(protect)
                return False
            self.preempt(victim)
        return True

    def fork(self, first: Sequence, seq: Sequence) -> bool:
        """Start the waiting `seq` (another choice of `first`'s request) on a slot holding a copy of `first`'s prompt
        KV, just computed (KVLayout.fork): none of its prompt is computed again. False when there is no running place
        or slot for it (it then waits, and is admitted as usual)."""
        if seq not in self.waiting or len(self.running) >= self.cfg.max_running or first.slot is None:
            return False
        if seq.batch and sum(s.batch for s in self.running) >= self.cfg.batch_max_running:
            return False
        slot = self.layout.fork(first.slot, len(first.prompt), seq.kv_tokens(), {s.slot for s in self.running})
        if slot is None:
            return False
        self.waiting.remove(seq)
        seq.slot, seq.n_kv, seq.status = slot, len(seq.prompt), Status.RUNNING
        seq.cached_tokens, seq.served = len(seq.prompt), self._steps
        self.running.append(seq)
        return True

    # ---- sequence lifecycle --------------------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Drop the sequence's KV and requeue it first; it is recomputed (prompt + output so far) later."""
        self.running.remove(seq)
        self.layout.release(seq.slot)
        seq.slot, seq.n_kv, seq.status = None, 0, Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def committed(self, seq: Sequence, tokens: list[int]) -> None:
        """KV for `tokens` was written to the sequence's slot by the last step."""
        self.layout.committed(seq, tokens)

    def shift(self, seq: Sequence, sink: int) -> None:
        """Context shift (KV streams): see KVStreams.shift."""
        self.layout.shift(seq, sink)

    def cut(self, slot: int, length: int) -> None:
        """Drop the slot's KV past its first `length` tokens (rejected draft tokens)."""
        self.layout.cut(slot, length)

    def finish(self, seq: Sequence, keep_prefix: bool = True, keep_output: bool = False) -> None:
        """End the sequence. With `keep_prefix` its prompt's KV stays as a cached prefix (and its answer's too
        with `keep_output` or cfg.keeps_outputs): KVLayout.retire."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.layout.retire(seq, keep_prefix, keep_output)
        seq.slot = None
        seq.status = Status.FINISHED

    def save_finished(self) -> None:
        """Save the prefixes retired since the last call to the KV tiers (TierIO.save_finished); the engine calls
        this between steps."""
        self.layout.io.save_finished()

    def clear_cache(self) -> None:
        """Forget every cached prefix, in the KV memory and in the tiers."""
        self.layout.clear()
