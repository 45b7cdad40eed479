"""KV streams (`kv_unified: false`, llama-server's layout): each llama.cpp sequence id is a KV stream of its own.

A decode row's attention scans only its own stream, and a finished sequence's stream is a cached prefix that costs
no step anything. Cells are then no shared pool: each sequence is capped at its stream's size (the engine's
max_model_len). Two rules follow from how llama.cpp runs such a batch (docs/engine.md, "KV streams"):
- it splits a step into one compute per run of consecutive stream ids, so running sequences are kept on adjacent
  streams: an arrival goes next to the running block, into a gap of it first (in place when an idle stream there
  holds its prefix, else with its prefix copied or restored there), and when a gap opens and nobody waits, the
  highest running sequence is moved into it (`begin_step`), a cached prefix in the gap dropped when the tiers hold
  it, else moved first to the one stream kept empty for that;
- a prefix in another stream is shared by copying the stream (runner.copy_stream: the whole stream, or the cells
  in use when it is short), or by restoring a state saved in RAM that holds as much (half the memory traffic of a
  copy), so a prefix is copied only when it has MIN_COPY_TOKENS or more (tuning.py), and what an in-place reuse
  would cut off is copied elsewhere first when it is that long. With every stream holding something, the least
  recently used prefix next to the running block gives way.

With `context_overflow: shift`, a sequence about to outgrow its stream keeps its first tokens and its recent half
(`shift`); its KV is then no reusable prefix."""

from __future__ import annotations

from tokenomy.engine import tuning
from tokenomy.engine.kv.layout import Bump, KVLayout
from tokenomy.engine.sequence import Sequence


class KVStreams(KVLayout):
    separate_cells = True

    @property
    def free_cells(self) -> int:
        """Each sequence's own stream has room for it (its length is capped at the stream's size): n_ctx."""
        return self.n_ctx

    def used_cells(self, running: list[Sequence]) -> int:
        """Each stream's own cells, a shifted sequence's past its prefix included."""
        shifted = sum(s.n_kv - self.prefix.resident(s.slot) for s in running if s.dropped)
        return sum(self.prefix.resident(slot) for slot in self.prefix.paths) + shifted

    def begin_step(self, running: list[Sequence], waiting: bool) -> None:
        """A gap between running streams closes when nobody waits to fill it (_compact)."""
        if not waiting:
            self._compact(running)

    def fits(self, n: int) -> bool:
        """A sequence's own stream holds its whole length."""
        return True

    def reserve(self, n: int) -> None:
        """Nothing to reserve: no sequence grows into another's cells."""

    def step_order(self, plan: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """By stream id: llama.cpp computes a run of consecutive stream ids at once, in batch order."""
        return sorted(plan, key=lambda p: p[0].slot)

    # ---- admission ---------------------------------------------------------------------------------------
    def admit(self, seq: Sequence, budget: int, running: list[Sequence],
              bump: Bump | None) -> tuple[int, int, int] | None:
        """In place on an idle stream holding its longest cached prefix when that stream is next to the running
        ones; else on a fresh stream next to them (_place), with the prefix copied in from a stream holding it.
        A copy costs once (2-14 ms for a 4,096-cell stream, by the cells in use), a stream apart one more ubatch
        every step until begin_step closes the gap (with more copies). A stream is always found."""
        tokens = seq.kv_tokens()
        length, holders = (0, set())
        if self.cfg.prefix_caching:
            length, holders = self.prefix.match_slots(tokens[:-1])   # the last token is always computed
        if length < tuning.MIN_COPY_TOKENS:
            length, holders = 0, set()
        tier_len, entry = self.io.match(tokens[:-1], length)
        slots = {s.slot for s in running}
        # a pinned stream runs in place only for its own conversation going on (little of it cut off)
        idle = sorted(h for h in holders if h not in slots and not (
            self.prefix.pinned(h) and self.prefix.resident(h) - length >= tuning.MIN_COPY_TOKENS))
        here = sorted((h for h in idle if _adjacent(h, slots)), key=lambda h: (_runs(slots | {h}), h))
        in_place = self.cfg.in_place_tokens
        if not here and in_place is not None and length >= in_place:
            here = idle
        if not here and not self.free_slots and set(self.prefix.retired) <= holders:
            here = idle                       # every idle stream holds the prefix: take one as it is
        if entry is not None:
            here = []                         # a saved state holds more of the prompt than any stream
        elif not here and length:
            # a state saved in RAM holding as much is restored rather than copied from its stream: a restore writes
            # the cells once, a stream copy reads them out to a buffer first (about half the time, docs/engine.md)
            tier_len, entry = self.io.in_ram(tokens[:-1], length)
        if here:
            slot = here[0]
            if self.prefix.resident(slot) - length >= tuning.MIN_COPY_TOKENS and not self._duplicate(slot, None):
                self.io.save(slot)                   # what it would cut off stays cached elsewhere, or saved
            self.prefix.unretire(slot)
            self.cut(slot, length)
        else:
            src = min(holders) if holders else None      # the one holder a copy would read; the others may go
            slot = self._place(slots, keep={src} if src is not None else set())
            if entry is not None and self.io.restore(slot, entry, tier_len):
                length = tier_len
            elif src is not None and src in self.prefix.paths:
                self.kv.copy_stream(src, slot)
                self.prefix.clone(src, slot)
                self.cut(slot, length)
                self.prefix.touch(src)
            else:
                length = 0                               # _place had to drop the holder too: recompute
        return slot, length, min(len(tokens) - length, budget)

    def fork(self, src: int, length: int, tokens: list[int], running: set[int]) -> int | None:
        """A stream next to the running ones (_place), with `src`'s stream copied into it and cut to `length`."""
        slot = self._place(running, keep={src})
        self.kv.copy_stream(src, slot)
        self.prefix.clone(src, slot)
        self.cut(slot, length)
        return slot

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
        near += [s for s in gaps if self.io.holds(s)]
        if near:
            slot = min(near, key=lambda s: (_runs(running | {s}), s in self.prefix.paths, s))
            if slot in self.prefix.paths:
                self.release(slot)
        elif (lru := self._lru_cached(exclude=keep | self._pinned(), near=running)) is not None:
            self._evict(lru)
            slot = lru
        else:
            if len(empty) <= 1 and (lru := self._lru_cached(exclude=keep | self._pinned())) is not None:
                self._evict(lru)
            if not self.free_slots and (lru := self._lru_cached(exclude=set())) is not None:
                self._evict(lru)         # every stream not running is one of `keep`: one of them goes after all
            empty = sorted(self.free_slots)
            slot = next((s for s in empty if _adjacent(s, running)), empty[0])
        self.free_slots.remove(slot)
        return slot

    def _lru_cached(self, exclude: set[int | None], near: set[int] | None = None) -> int | None:
        """The stream whose cached prefix was used least recently, outside `exclude` and, given `near`, next to
        those streams, unpinned ones first (protection aside: with KV streams a cached prefix slows nothing, so
        only its pin and its last use count)."""
        return min((s for s in self.prefix.retired if s not in exclude and (near is None or _adjacent(s, near))),
                   key=lambda s: (self.prefix.pinned(s), self.prefix.retired[s]), default=None)

    def _pinned(self) -> set[int | None]:
        """The streams whose cached prefix is pinned now."""
        return {s for s in self.prefix.pins if self.prefix.pinned(s)}

    def _duplicate(self, slot: int, keep: int | None, spare: bool = False) -> bool:
        """Copy the cached prefix in `slot` to an empty stream (a high one, away from the running; the spare one
        only with `spare`), else over the least recently used unpinned cached prefix (never `keep`'s) when that
        one was used less recently; whether it was copied."""
        empty = [s for s in self.free_slots if s != slot]
        target = max(empty) if len(empty) > (0 if spare else 1) else None
        if target is None and spare:
            return False
        if target is None:
            last_use = self.prefix.retired.get(slot, float("inf"))
            lru = self._lru_cached(exclude={slot, keep} | self._pinned())
            if lru is None or self.prefix.retired[lru] >= last_use:
                return False
            self._evict(lru)
            target = lru
        self.free_slots.remove(target)
        self.kv.copy_stream(slot, target)
        self.prefix.clone(slot, target)
        self.prefix.retire(target, protected=slot in self.prefix.protected, pin_until=self.prefix.pins.get(slot, 0.0))
        self.prefix.retired[target] = self.prefix.retired.get(slot, self.prefix.retired[target])
        return True

    # ---- keeping the running side by side ----------------------------------------------------------------
    def _compact(self, running: list[Sequence]) -> None:
        """Close a gap between running streams (nobody waits to fill it): the sequence on the highest stream
        moves (a stream copy) to the stream where the running ones form the fewest runs, then the shortest span,
        when that is fewer or shorter than now (a gap inside the block, not a stream below it, which would only
        shift the gap down a stream a step); its old stream empties. A cached prefix there is dropped when a saved
        state holds it, else moved out first to the spare empty stream; with neither, it stays where it is."""
        if len(running) < 2:
            return
        slots = {s.slot for s in running}
        if _runs(slots) == 1:
            return
        top = max(running, key=lambda s: s.slot)
        if top.params.max_tokens - len(top.output) < tuning.COMPACT_MIN_LEFT or top.dropped:
            return       # a shifted sequence is not moved: a pending shift and a stream copy, in which order?
        others = slots - {top.slot}
        holes = [h for h in range(self.cfg.n_seqs) if h not in slots]
        hole = min(holes, key=lambda h: (_shape(others | {h}), h in self.prefix.paths, h), default=None)
        if hole is None or _shape(others | {hole}) >= _shape(slots):
            return
        if hole in self.prefix.paths:
            if (self.io.holds(hole) and not self.prefix.pinned(hole)) or self._duplicate(hole, keep=top.slot,
                                                                                         spare=True):
                self.release(hole)
            else:
                return
        self.free_slots.remove(hole)
        old = top.slot
        self.kv.copy_stream(old, hole)
        self.prefix.clone(old, hole)
        top.slot = hole
        self.release(old)

    # ---- context shift and the end ---------------------------------------------------------------------------
    def shift(self, seq: Sequence, sink: int) -> None:
        """Keep the KV of the first `sink` tokens (attention sinks, StreamingLLM) and the most recent half of the
        rest, drop the middle, and move the kept recent positions down."""
        keep = seq.sink if seq.dropped else min(sink, seq.n_kv)
        discard = (seq.n_kv - keep) // 2
        if discard <= 0:
            return
        assert seq.slot is not None
        self.kv.shift(seq.slot, keep, discard)
        if self.prefix.resident(seq.slot) > keep:
            self.prefix.truncate(seq.slot, keep)
        seq.sink, seq.dropped, seq.n_kv = keep, seq.dropped + discard, seq.n_kv - discard

    def retire(self, seq: Sequence, keep_prefix: bool, keep_output: bool) -> bool:
        """As KVLayout.retire, a shifted sequence's KV cut to its sinks first. No cap applies: in its own stream a
        cached prefix slows no step; it holds the stream until an arrival needs one (_place)."""
        if seq.slot is not None and seq.dropped:
            self.kv.remove(seq.slot, self.prefix.resident(seq.slot))   # the shifted KV: only its sinks stay
        return super().retire(seq, keep_prefix, keep_output)


def _runs(slots: set[int]) -> int:
    """Runs of consecutive stream ids in `slots`: llama.cpp computes a step in one pass per run."""
    return sum(1 for s in slots if s - 1 not in slots)


def _shape(slots: set[int]) -> tuple[int, int]:
    """(runs, span) of running streams: fewer runs is a cheaper step; a shorter span, a gap closer to closing."""
    return _runs(slots), max(slots) - min(slots) + 1


def _adjacent(slot: int, running: set[int]) -> bool:
    """Whether running `slot` too keeps the running streams in as few runs (nothing runs, or a neighbour does)."""
    return not running or slot - 1 in running or slot + 1 in running
