"""Decides what goes into each step: running sequences first (one token each when decoding, a chunk when still
prefilling), then waiting sequences admitted in arrival order while the step's token budget, KV cells and slots
allow. KV is one pool of cells (llama.cpp's unified cache); when a running sequence needs a cell and none is free,
retired prefixes are evicted first (least recently used), then the newest running sequence is preempted and put
back at the front of the queue to be recomputed later (its prefix may still be cached).

Two lanes: interactive sequences, and batch sequences (SamplingParams.priority "batch") that only fill the gaps.
While any interactive sequence runs or waits, batch sequences sit out the step (they keep their KV) and none is
admitted; otherwise at most `batch_max_running` of them run, with at most `batch_step_tokens` tokens a step, so an
interactive arrival waits for one short step at most. When cells, slots or running places run out, batch sequences
are preempted first (newest first), and a batch sequence never preempts an interactive one."""

from __future__ import annotations

from collections import deque
from typing import Protocol

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.prefix_cache import FINGERPRINT_TOKENS, PrefixCache
from tokenomy.engine.sequence import Sequence, Status


class QueueFull(RuntimeError):
    pass


class KVOps(Protocol):
    """What the scheduler needs from the runner: share a prefix, drop a slot's KV."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None: ...
    def remove(self, slot: int, start: int = 0) -> None: ...


class Scheduler:
    def __init__(self, cfg: EngineConfig, kv: KVOps, n_ctx: int) -> None:
        """`n_ctx`: the KV cells the runner's context really has (llama.cpp may round cfg.n_ctx).
        Cells held only by retired prefixes are capped at cfg.max_retired_cells (default a quarter of n_ctx):
        every query row's attention scans the whole used range of the unified KV buffer, so cached cells slow every
        decode step; too few, and prompts sharing long prefixes (several tenants' system prompts) evict each other
        and recompute them."""
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.retired_cap = cfg.max_retired_cells if cfg.max_retired_cells is not None else n_ctx // 4
        self.protected_cap = max(self.retired_cap, n_ctx // 2)
        self.kv = kv
        self.prefix = PrefixCache()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(cfg.n_seqs - 1, -1, -1))
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self._reserved = 0

    @property
    def free_cells(self) -> int:
        return self.n_ctx - self.prefix.used_cells - self._reserved

    # ---- the plan for one step ---------------------------------------------------------------------------
    def schedule(self) -> list[tuple[Sequence, int]]:
        budget, batch_budget = self.cfg.max_batch_tokens, self.cfg.batch_step_tokens
        self._reserved = 0
        plan: list[tuple[Sequence, int]] = []
        interactive = self.interactive_pending()
        lanes = [s for s in self.running if not s.batch] + ([] if interactive else [s for s in self.running if s.batch])
        for seq in lanes:
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:
                continue                      # preempted earlier in this loop
            n = min(seq.pending, budget, batch_budget if seq.batch else budget)
            if n == 0 or not self._make_room(n, protect=seq):
                continue
            self._reserved += n
            plan.append((seq, n))
            budget -= n
            if seq.batch:
                batch_budget -= n
        while budget > 0 and (seq := self._next_waiting(interactive, batch_budget)) is not None:
            admitted = self._admit(seq, min(budget, batch_budget) if seq.batch else budget)
            if admitted == 0:
                break
            self.waiting.remove(seq)
            plan.append((seq, admitted))
            budget -= admitted
            if seq.batch:
                batch_budget -= admitted
        return plan

    def interactive_pending(self) -> bool:
        return any(not s.batch for s in self.running) or any(not s.batch for s in self.waiting)

    def _next_waiting(self, interactive: bool, batch_budget: int) -> Sequence | None:
        """The next sequence to admit: the oldest interactive one (making a running place by preempting a batch
        sequence if need be), else, when no interactive work is about, the oldest batch one if the lane has room."""
        first = next((s for s in self.waiting if not s.batch), None)
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
        return self.waiting[0]

    def _newest_batch(self, exclude: Sequence | None = None) -> Sequence | None:
        return next((s for s in reversed(self.running) if s.batch and s is not exclude), None)

    def _admit(self, seq: Sequence, budget: int) -> int:
        tokens = seq.tokens
        length, holder = (0, None)
        if self.cfg.prefix_caching:
            length, holder = self.prefix.match(tokens[:-1])   # the last token is always computed: we need logits
        n = min(len(tokens) - length, budget)
        bump = not seq.batch        # an interactive admission may preempt batch sequences for room
        if not self._evict_until(lambda: self.free_cells >= n, keep=holder, bump_batch=bump):
            return 0
        if not self.free_slots and not self._evict_until(lambda: bool(self.free_slots), keep=holder,
                                                         bump_batch=bump):
            return 0
        slot = self.free_slots.pop()
        if length and holder is not None:
            self.kv.copy_prefix(holder, slot, length)
            self.prefix.attach(slot, tokens, length)
            self.prefix.touch(holder)
        seq.slot, seq.n_kv, seq.status = slot, length, Status.RUNNING
        if seq.preemptions == 0:
            seq.cached_tokens = length
            seq.reused = length >= FINGERPRINT_TOKENS or self.prefix.evicted_recently(tokens)
        self.prefix_hit_tokens += length
        self.running.append(seq)
        self._reserved += n
        return n

    def _evict_until(self, ok, keep: int | None = None, bump_batch: bool = False,  # noqa: ANN001
                     protected: bool | None = None) -> bool:
        """Evict retired prefixes (unprotected before protected, least recently used first; only those of
        `protected`'s kind when it is set) until `ok()`; with `bump_batch`, then preempt running batch sequences
        (newest first)."""
        while not ok():
            slot = self.prefix.lru_retired(exclude=keep, protected=protected)
            if slot is not None:
                self._drop_slot(slot)
                continue
            victim = self._newest_batch() if bump_batch else None
            if victim is None or victim.slot == keep:
                return False
            self.preempt(victim)
        return True

    def _make_room(self, n: int, protect: Sequence) -> bool:
        """Free cells for `n` more tokens of `protect`: evict retired prefixes, then preempt the newest running
        batch sequence, then (for an interactive `protect` only) the newest interactive one."""
        if self._evict_until(lambda: self.free_cells >= n):
            return True
        while self.free_cells < n:
            victim = self._newest_batch(exclude=protect)
            if victim is None and not protect.batch:
                victim = next((s for s in reversed(self.running) if s is not protect), None)
            if victim is None:
                self.preempt(protect)
                return False
            self.preempt(victim)
        return True

    # ---- sequence lifecycle --------------------------------------------------------------------------------
    def preempt(self, seq: Sequence) -> None:
        """Drop the sequence's KV and requeue it first; it is recomputed (prompt + output so far) later."""
        self.running.remove(seq)
        self._drop_slot(seq.slot)
        seq.slot, seq.n_kv, seq.status = None, 0, Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def committed(self, seq: Sequence, tokens: list[int]) -> None:
        """KV for `tokens` was written to the sequence's slot by the last step."""
        self.prefix.extend(seq.slot, tokens)
        seq.n_kv += len(tokens)

    def finish(self, seq: Sequence, keep_prefix: bool = True, keep_output: bool = False) -> None:
        """End the sequence. With `keep_prefix` its prompt's KV stays as a retired prefix (and its answer's too with
        `keep_output` or cfg.retire_outputs). A prompt seen before (its KV came from the cache, or its fingerprint
        is among recently evicted prefixes) is retired as *protected*: it counts against the larger
        protected cap rather than retired_cap, so prompts that come back in a cycle longer than retired_cap holds
        are not each evicted just before their next use."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None:
            if keep_prefix and self.cfg.prefix_caching and self.prefix.resident(seq.slot) > 0:
                keep = keep_output or self.cfg.retire_outputs
                if not keep and self.prefix.resident(seq.slot) > len(seq.prompt):
                    self.kv.remove(seq.slot, len(seq.prompt))
                    self.prefix.truncate(seq.slot, len(seq.prompt))
                self.prefix.retire(seq.slot, protected=seq.reused)
                self._evict_until(lambda: self.retired_cells(protected=False) <= self.retired_cap,
                                  protected=False)
                self._evict_until(lambda: self.retired_cells() <= self.protected_cap)
            else:
                self._drop_slot(seq.slot)
        seq.slot = None
        seq.status = Status.FINISHED

    def retired_cells(self, protected: bool | None = None) -> int:
        """Cells that only retired prefixes hold (freed if every retired slot were evicted); `protected` True or
        False counts only the protected or only the unprotected ones."""
        return self.prefix.retired_exclusive_cells(protected)

    def _drop_slot(self, slot: int | None) -> None:
        if slot is None:
            return
        self.kv.remove(slot)
        self.prefix.release(slot)
        self.free_slots.append(slot)

    def clear_cache(self) -> None:
        for slot in list(self.prefix.retired):
            self._drop_slot(slot)
