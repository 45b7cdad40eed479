"""Decides what goes into each step: running sequences first (one token each when decoding, a chunk when still
prefilling), then waiting sequences admitted in arrival order while the step's token budget, KV cells and slots
allow. KV is one pool of cells (llama.cpp's unified cache); when a running sequence needs a cell and none is free,
retired prefixes are evicted first (least recently used), then the newest running sequence is preempted and put
back at the front of the queue to be recomputed later (its prefix may still be cached).

Two lanes: interactive sequences, and batch sequences (SamplingParams.priority "batch") that only fill the gaps.
While any interactive sequence runs or waits, batch sequences sit out the step (they keep their KV) and none is
admitted; otherwise at most `batch_max_running` of them run, with at most `batch_tokens` tokens a step (the engine
sizes it from the measured step cost, `batch_step_ms`), the least recently served first, so an interactive arrival
waits for one short step at most. When cells, slots or running places run out, batch sequences
are preempted first (newest first), and a batch sequence never preempts an interactive one.

With `kv_unified: false` each llama.cpp sequence id is a KV stream of its own (llama-server's layout): a decode
row's attention scans only its own stream, and a finished sequence's stream is a cached prefix that costs no step
anything. Cells are then no shared pool: each sequence is capped at its stream's size (the engine's
max_model_len). Two rules follow from how llama.cpp runs such a batch (docs/engine.md, "KV streams"):
- it splits a step into one compute per run of consecutive stream ids, so running sequences are kept on adjacent
  streams: an arrival goes next to the running block, into a gap of it first (in place when an idle stream there
  holds its prefix, else with its prefix copied or restored there), and when a gap opens and nobody waits, the
  highest running sequence is moved into it, a cached prefix in the gap dropped when the tiers hold it, else
  moved first to the one stream kept empty for that;
- a prefix in another stream is shared by copying the stream (runner.copy_stream: the whole stream, or the cells
  in use when it is short), or by restoring a state saved in RAM that holds as much (half the memory traffic of a
  copy), so a prefix is copied only when it has MIN_COPY_TOKENS or more, and what an in-place
  reuse would cut off is copied elsewhere first when it is that long. With every stream holding something, the
  least recently used prefix next to the running block gives way.

A finished sequence's prefix is saved to the KV tiers (kv_tier.py) between steps, once its output is sent
(save_finished), and a cached prefix that gives way (either layout) is saved first if no saved state holds it yet;
it is restored from there when a prompt shares more of it than is resident. With `context_overflow: shift` (KV
streams), a sequence about to outgrow its stream keeps its first tokens and its recent half (`shift`); its KV is
then no reusable prefix."""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv_tier import MIN_TIER_TOKENS, Entry, KVTiers
from tokenomy.engine.prefix_cache import FINGERPRINT_TOKENS, PrefixCache
from tokenomy.engine.sequence import Sequence, Status

MIN_COPY_TOKENS = 8        # KV streams: fewer tokens are recomputed rather than copied (a stream copy costs 2-14
                           # ms here, a prefilled token 4-6 ms: docs/engine.md)
IN_PLACE_TOKENS: int | None = None   # KV streams: a cached prefix this long runs where it lies, even apart from
                                     # the running (None: never; bench/stream_placement.py measures both)
COMPACT_MIN_LEFT = 8       # KV streams: a sequence with fewer tokens left to generate is not moved to close a gap


class QueueFull(RuntimeError):
    pass


class KVOps(Protocol):
    """What the scheduler needs from the runner: share a prefix, copy a whole KV stream, drop a slot's KV, save a
    slot's KV and restore it (for the KV tiers)."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None: ...
    def copy_stream(self, src: int, dst: int) -> None: ...
    def remove(self, slot: int, start: int = 0) -> None: ...
    def save(self, slot: int) -> bytes | bytearray | None: ...
    def restore(self, slot: int, blob: bytes | bytearray) -> bool: ...
    def shift(self, slot: int, keep: int, discard: int) -> None: ...


class Scheduler:
    def __init__(self, cfg: EngineConfig, kv: KVOps, n_ctx: int, tiers: KVTiers | None = None) -> None:
        """`n_ctx`: the KV cells the runner's context really has (llama.cpp may round cfg.n_ctx). `tiers`: where
        evicted prefixes are saved and restored from (kv_tier.py; none by default).
        Cells held only by retired prefixes are capped at cfg.max_retired_cells (default a quarter of n_ctx):
        every query row's attention scans the whole used range of the unified KV buffer, so cached cells slow every
        decode step; too few, and prompts sharing long prefixes (several tenants' system prompts) evict each other
        and recompute them."""
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.streams = not cfg.kv_unified
        self.retired_cap = cfg.max_retired_cells if cfg.max_retired_cells is not None else n_ctx // 4
        self.protected_cap = max(self.retired_cap, n_ctx // 2)
        self.kv = kv
        self.prefix = PrefixCache()
        self.tiers = tiers or KVTiers(0)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots: list[int] = list(range(cfg.n_seqs - 1, -1, -1))
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.batch_tokens = cfg.batch_step_tokens     # batch tokens a step; the engine resizes it by measured cost
        self._steps = 0
        self._reserved = 0
        self._finished: list[int] = []     # slots retired by the last step, to save to the tiers (save_finished)

    @property
    def free_cells(self) -> int:
        """Cells of the unified buffer nobody holds or has reserved this step; with KV streams, each sequence's
        own stream has room for it (its length is capped at the stream's size), so this is n_ctx."""
        if self.streams:
            return self.n_ctx
        return self.n_ctx - self.prefix.used_cells - self._reserved

    @property
    def used_cells(self) -> int:
        """Cells holding KV: shared cells once in the unified buffer, each stream's own with KV streams."""
        if self.streams:
            shifted = sum(s.n_kv - self.prefix.resident(s.slot) for s in self.running if s.dropped)
            return sum(self.prefix.resident(slot) for slot in self.prefix.paths) + shifted
        return self.prefix.used_cells

    # ---- the plan for one step ---------------------------------------------------------------------------
    def schedule(self) -> list[tuple[Sequence, int]]:
        budget, batch_budget = self.cfg.max_batch_tokens, min(self.batch_tokens, self.cfg.batch_step_tokens)
        self._reserved = 0
        self._steps += 1
        plan: list[tuple[Sequence, int]] = []
        if self.streams:
            self._compact()
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
            self._reserved += n
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
        if self.streams:        # llama.cpp computes a run of consecutive stream ids at once, in batch order
            plan.sort(key=lambda p: p[0].slot)
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
        if self.streams:
            return self._admit_stream(seq, budget)
        tokens = seq.kv_tokens()
        length, holder = (0, None)
        if self.cfg.prefix_caching:
            length, holder = self.prefix.match(tokens[:-1])   # the last token is always computed: we need logits
        bump = not seq.batch        # an interactive admission may preempt batch sequences for room
        tier_len, entry = self._tier_match(tokens[:-1], length)
        if entry is not None and (n := self._admit_restored(seq, entry, tier_len, budget, holder, bump)):
            return n
        n = min(len(tokens) - length, budget)
        if not self._room(n, holder, bump):
            return 0
        slot = self.free_slots.pop()
        if length and holder is not None:
            self.kv.copy_prefix(holder, slot, length)
            self.prefix.attach(slot, tokens, length)
            self.prefix.touch(holder)
        self._start(seq, slot, length)
        self._reserved += n
        return n

    def _room(self, cells: int, holder: int | None, bump: bool) -> bool:
        """Unified buffer: `cells` free cells and a free slot, evicting retired prefixes (not `holder`) and, with
        `bump`, preempting batch sequences to get them."""
        if not self._evict_until(lambda: self.free_cells >= cells, keep=holder, bump_batch=bump):
            return False
        return bool(self.free_slots) or self._evict_until(lambda: bool(self.free_slots), keep=holder,
                                                            bump_batch=bump)

    def _admit_restored(self, seq: Sequence, entry: Entry, length: int, budget: int, holder: int | None,
                        bump: bool) -> int:
        """Unified buffer: start `seq` on a free slot with `entry` restored (its whole state first, then cut to
        `length`); tokens scheduled, or 0 when there is no room or the restore fails."""
        n = min(seq.num_kv_tokens - length, budget)
        if not self._room(len(entry.tokens) + n, holder, bump):
            return 0
        slot = self.free_slots.pop()
        if not self._restore(slot, entry, length):
            self.free_slots.append(slot)
            return 0
        self._start(seq, slot, length)
        self._reserved += n
        return n

    def _start(self, seq: Sequence, slot: int, length: int) -> None:
        seq.slot, seq.n_kv, seq.status = slot, length, Status.RUNNING
        if seq.preemptions == 0:
            seq.cached_tokens = length
            seq.reused = length >= FINGERPRINT_TOKENS or self.prefix.evicted_recently(seq.tokens)
        self.prefix_hit_tokens += length
        self.running.append(seq)

    # ---- KV streams -------------------------------------------------------------------------------------
    def _admit_stream(self, seq: Sequence, budget: int) -> int:
        """Start `seq` on a KV stream: in place on an idle stream holding its longest cached prefix when that
        stream is next to the running ones; else on a fresh stream next to them (_place), with the prefix copied
        in from a stream holding it. A copy costs once (2-14 ms for a 4,096-cell stream, by the cells in use), a
        stream apart one more ubatch every step until _compact closes the gap (with more copies)."""
        tokens = seq.kv_tokens()
        length, holders = (0, set())
        if self.cfg.prefix_caching:
            length, holders = self.prefix.match_slots(tokens[:-1])   # the last token is always computed
        if length < MIN_COPY_TOKENS:
            length, holders = 0, set()
        tier_len, entry = self._tier_match(tokens[:-1], length)
        running = {s.slot for s in self.running}
        idle = sorted(h for h in holders if h not in running)
        here = sorted((h for h in idle if _adjacent(h, running)), key=lambda h: (_runs(running | {h}), h))
        if not here and IN_PLACE_TOKENS is not None and length >= IN_PLACE_TOKENS:
            here = idle
        if not here and not self.free_slots and set(self.prefix.retired) <= holders:
            here = idle                       # every idle stream holds the prefix: take one as it is
        if entry is not None:
            here = []                         # a saved state holds more of the prompt than any stream
        elif not here and length and self.tiers.enabled:
            # a state saved in RAM holding as much is restored rather than copied from its stream: a restore writes
            # the cells once, a stream copy reads them out to a buffer first (about half the time, docs/engine.md)
            tier_len, entry = self.tiers.match(tokens[:-1], length - 1)
            if entry is not None and entry.tier != "ram":
                tier_len, entry = 0, None
        if here:
            slot = here[0]
            if self.prefix.resident(slot) - length >= MIN_COPY_TOKENS and not self._duplicate(slot, keep=None):
                self._save(slot)                     # what it would cut off stays cached elsewhere, or saved
            self.prefix.unretire(slot)
            self.cut(slot, length)
        else:
            src = min(holders) if holders else None      # the one holder a copy would read; the others may go
            slot = self._place(running, keep={src} if src is not None else set())
            if entry is not None and self._restore(slot, entry, tier_len):
                length = tier_len
            elif src is not None and src in self.prefix.paths:
                self.kv.copy_stream(src, slot)
                self.prefix.clone(src, slot)
                self.cut(slot, length)
                self.prefix.touch(src)
            else:
                length = 0                               # _place had to drop the holder too: recompute
        self._start(seq, slot, length)
        return min(len(tokens) - length, budget)

    # ---- KV tiers ---------------------------------------------------------------------------------------
    def _tier_match(self, tokens: list[int], resident: int) -> tuple[int, Entry | None]:
        """A saved state holding at least MIN_COPY_TOKENS more of `tokens` than the `resident` ones, when
        restoring it is estimated to be faster than prefilling the difference: (its length, it), else (0, None)."""
        if not self.tiers.enabled or not self.cfg.prefix_caching:
            return 0, None
        length, entry = self.tiers.match(tokens, resident + MIN_COPY_TOKENS - 1)
        if entry is None or not self.tiers.worth(entry, length - resident):
            return 0, None
        return length, entry

    def _restore(self, slot: int, entry: Entry, length: int) -> bool:
        """Load `entry` into the empty `slot` and keep its first `length` tokens; False if that failed (the slot
        stays empty)."""
        tier = entry.tier
        t0 = time.perf_counter()
        blob = self.tiers.load(entry)
        if blob is None or not self.kv.restore(slot, blob):
            return False
        saved = entry.tokens.tolist()
        shared = self.prefix.match(saved)[0] if self.streams else 0   # in streams the tree is only bookkeeping
        if shared:
            self.prefix.attach(slot, saved, shared)
        self.prefix.extend(slot, saved[shared:])
        self.cut(slot, length)
        self.tiers.restored(entry, length, time.perf_counter() - t0, tier)
        return True

    def _evict(self, slot: int) -> None:
        """Drop a cached prefix from the KV memory, saved to the tiers first (_save)."""
        self._save(slot)
        self._drop_slot(slot)

    def _save(self, slot: int, even_if_resident: bool = False) -> None:
        """Keep the slot's state in the tiers when it is long enough and held nowhere else: no saved state and
        (unless `even_if_resident`) no other slot; before its KV is dropped or cut."""
        if self.tiers.enabled and self.prefix.resident(slot) >= MIN_TIER_TOKENS:
            tokens = self.prefix.tokens(slot)
            if not even_if_resident:
                length, holders = self.prefix.match_slots(tokens)
                if length == len(tokens) and holders - {slot}:
                    return
            if not self.tiers.covers(tokens) and (blob := self.kv.save(slot)) is not None:
                self.tiers.put(tokens, blob)

    def save_finished(self) -> None:
        """Save the prefixes retired since the last call to the tiers, each unless a saved state already holds
        it. The engine calls this after a step's output is sent, so the save that evicting the prefix would
        otherwise make falls between two steps, not in the step of the arrival that needs its stream (a save
        writes fresh memory: 2-4 ms per MiB of state under load on these machines, docs/engine.md)."""
        done, self._finished = self._finished, []
        for slot in done:
            if slot in self.prefix.retired:
                self._save(slot, even_if_resident=True)

    def _place(self, running: set[int], keep: set[int]) -> int:
        """A fresh stream next to the running ones, one in a gap of the block first (it joins two runs): an empty
        one (unless it is the last, kept spare for _compact) or, in a gap, one whose cached prefix a saved state
        holds (dropped), else the one whose cached prefix was used least recently among those next to the running
        (not one of `keep`): a stream apart from the block costs every step it runs in (0.85x for two runs of
        streams, 0.62x for alternate ones), for the rest of the sequence. Where no stream next to the block can
        be had, any empty one, the least recently used cached prefix dropped first when fewer than two streams are
        empty (one of `keep` when nothing else is cached: the caller checks whether its holder survived)."""
        empty = sorted(self.free_slots)
        near = [s for s in empty if _adjacent(s, running)] if len(empty) > 1 else []
        gaps = [s for s in self.prefix.retired if s not in keep and s - 1 in running and s + 1 in running]
        near += [s for s in gaps if self._saved(s)]
        if near:
            slot = min(near, key=lambda s: (_runs(running | {s}), s in self.prefix.paths, s))
            if slot in self.prefix.paths:
                self._drop_slot(slot)
        elif (lru := self._lru_cached(exclude=keep, near=running)) is not None:
            self._evict(lru)
            slot = lru
        else:
            if len(empty) <= 1 and (lru := self._lru_cached(exclude=keep)) is not None:
                self._evict(lru)
            if not self.free_slots and (lru := self._lru_cached(exclude=set())) is not None:
                self._evict(lru)         # every stream not running is one of `keep`: one of them goes after all
            empty = sorted(self.free_slots)
            slot = next((s for s in empty if _adjacent(s, running)), empty[0])
        self.free_slots.remove(slot)
        return slot

    def _lru_cached(self, exclude: set[int | None], near: set[int] | None = None) -> int | None:
        """The stream whose cached prefix was used least recently, outside `exclude` and, given `near`, next to
        those streams (protection aside: with KV streams a cached prefix slows nothing, so only its last use
        counts)."""
        return min((s for s in self.prefix.retired if s not in exclude and (near is None or _adjacent(s, near))),
                   key=lambda s: self.prefix.retired[s], default=None)

    def _duplicate(self, slot: int, keep: int | None, spare: bool = False) -> bool:
        """Copy the cached prefix in `slot` to an empty stream (a high one, away from the running; the spare one
        only with `spare`), else over the least recently used cached prefix (never `keep`'s) when that one was
        used less recently; whether it was copied."""
        empty = [s for s in self.free_slots if s != slot]
        target = max(empty) if len(empty) > (0 if spare else 1) else None
        if target is None and spare:
            return False
        if target is None:
            last_use = self.prefix.retired.get(slot, float("inf"))
            lru = self._lru_cached(exclude={slot, keep})
            if lru is None or self.prefix.retired[lru] >= last_use:
                return False
            self._evict(lru)
            target = lru
        self.free_slots.remove(target)
        self.kv.copy_stream(slot, target)
        self.prefix.clone(slot, target)
        self.prefix.retire(target, protected=slot in self.prefix.protected)
        self.prefix.retired[target] = self.prefix.retired.get(slot, self.prefix.retired[target])
        return True

    def _compact(self) -> None:
        """Close a gap between running streams when nobody waits to fill it: the sequence on the highest stream
        moves (a stream copy) to the stream where the running ones form the fewest runs, then the shortest span,
        when that is fewer or shorter than now (a gap inside the block, not a stream below it, which would only
        shift the gap down a stream a step); its old stream empties. A cached prefix there is dropped when a saved
        state holds it, else moved out first to the spare empty stream; with neither, it stays where it is."""
        if self.waiting or len(self.running) < 2:
            return
        slots = {s.slot for s in self.running}
        if _runs(slots) == 1:
            return
        top = max(self.running, key=lambda s: s.slot)
        if top.params.max_tokens - len(top.output) < COMPACT_MIN_LEFT or top.dropped:
            return       # a shifted sequence is not moved: a pending shift and a stream copy, in which order?
        others = slots - {top.slot}
        holes = [h for h in range(self.cfg.n_seqs) if h not in slots]
        hole = min(holes, key=lambda h: (_shape(others | {h}), h in self.prefix.paths, h), default=None)
        if hole is None or _shape(others | {hole}) >= _shape(slots):
            return
        if hole in self.prefix.paths:
            if self._saved(hole):
                self._drop_slot(hole)
            elif self._duplicate(hole, keep=top.slot, spare=True):
                self._drop_slot(hole)
            else:
                return
        self.free_slots.remove(hole)
        old = top.slot
        self.kv.copy_stream(old, hole)
        self.prefix.clone(old, hole)
        top.slot = hole
        self._drop_slot(old)

    def _saved(self, slot: int) -> bool:
        """Whether a saved state in the tiers holds all of the cached prefix in `slot` (dropping it loses nothing
        a restore cannot bring back)."""
        return self.tiers.enabled and self.tiers.covers(self.prefix.tokens(slot))

    def _evict_until(self, ok, keep: int | None = None, bump_batch: bool = False,  # noqa: ANN001
                     protected: bool | None = None) -> bool:
        """Evict retired prefixes (unprotected before protected, least recently used first; only those of
        `protected`'s kind when it is set) until `ok()`; with `bump_batch`, then preempt running batch sequences
        (newest first)."""
        while not ok():
            slot = self.prefix.lru_retired(exclude=keep, protected=protected)
            if slot is not None:
                self._evict(slot)
                continue
            victim = self._newest_batch() if bump_batch else None
            if victim is None or victim.slot == keep:
                return False
            self.preempt(victim)
        return True

    def _make_room(self, n: int, protect: Sequence) -> bool:
        """Free cells for `n` more tokens of `protect`: evict retired prefixes, then preempt the newest running
        batch sequence, then (for an interactive `protect` only) the newest interactive one. With KV streams its
        own stream has room."""
        if self.streams:
            return True
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
        """KV for `tokens` was written to the sequence's slot by the last step. After a context shift the KV is
        no prefix anyone else can reuse (its tokens saw a context that is gone), so the tree keeps only what was
        there before."""
        if not seq.dropped:
            self.prefix.extend(seq.slot, tokens)
        seq.n_kv += len(tokens)

    def shift(self, seq: Sequence, sink: int) -> None:
        """Context shift (KV streams): keep the KV of the first `sink` tokens (attention sinks, StreamingLLM) and
        the most recent half of the rest, drop the middle, and move the kept recent positions down."""
        keep = seq.sink if seq.dropped else min(sink, seq.n_kv)
        discard = (seq.n_kv - keep) // 2
        if discard <= 0:
            return
        assert seq.slot is not None
        self.kv.shift(seq.slot, keep, discard)
        if self.prefix.resident(seq.slot) > keep:
            self.prefix.truncate(seq.slot, keep)
        seq.sink, seq.dropped, seq.n_kv = keep, seq.dropped + discard, seq.n_kv - discard

    def finish(self, seq: Sequence, keep_prefix: bool = True, keep_output: bool = False) -> None:
        """End the sequence. With `keep_prefix` its prompt's KV stays as a retired prefix (and its answer's too with
        `keep_output` or cfg.retire_outputs). A prompt seen before (its KV came from the cache, or its fingerprint
        is among recently evicted prefixes) is retired as *protected*: it counts against the larger
        protected cap rather than retired_cap, so prompts that come back in a cycle longer than retired_cap holds
        are not each evicted just before their next use. With KV streams neither cap applies: a cached prefix
        holds a stream until an arrival needs one (_place), least recently used first."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None and seq.dropped:
            self.kv.remove(seq.slot, self.prefix.resident(seq.slot))   # the shifted KV: only its sinks stay
        if seq.slot is not None:
            if keep_prefix and self.cfg.prefix_caching and self.prefix.resident(seq.slot) > 0:
                keep = keep_output or self.cfg.retire_outputs
                if not keep:
                    self.cut(seq.slot, len(seq.prompt))
                self.prefix.retire(seq.slot, protected=seq.reused)
                if self.tiers.enabled and seq.slot not in self._finished:
                    self._finished.append(seq.slot)
                if not self.streams:       # in its own stream a cached prefix slows no step: streams cap it
                    self._evict_until(lambda: self.retired_cells(protected=False) <= self.retired_cap,
                                      protected=False)
                    self._evict_until(lambda: self.retired_cells() <= self.protected_cap)
            else:
                self._drop_slot(seq.slot)
        seq.slot = None
        seq.status = Status.FINISHED

    def cut(self, slot: int, length: int) -> None:
        """Drop the slot's KV past its first `length` tokens, in llama.cpp and in the prefix tree."""
        if self.prefix.resident(slot) > length:
            self.kv.remove(slot, length)
            self.prefix.truncate(slot, length)

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
        """Forget every cached prefix, in the KV memory and in the tiers."""
        for slot in list(self.prefix.retired):
            self._drop_slot(slot)
        self.tiers.clear()


def _runs(slots: set[int]) -> int:
    """Runs of consecutive stream ids in `slots`: llama.cpp computes a step in one pass per run."""
    return sum(1 for s in slots if s - 1 not in slots)


def _shape(slots: set[int]) -> tuple[int, int]:
    """(runs, span) of running streams: fewer runs is a cheaper step; a shorter span, a gap closer to closing."""
    return _runs(slots), max(slots) - min(slots) + 1


def _adjacent(slot: int, running: set[int]) -> bool:
    """Whether running `slot` too keeps the running streams in as few runs (nothing runs, or a neighbour does)."""
    return not running or slot - 1 in running or slot + 1 in running
