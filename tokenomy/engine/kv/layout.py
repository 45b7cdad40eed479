"""Where a sequence's KV cells live: the interface the scheduler places sequences through, with one implementation
per llama.cpp KV layout (as nano-vllm's block manager is to its scheduler):

- layout_unified.py, `kv_unified: true`: one pool of cells; shared prefixes share cells, cached prefixes are
  evicted least recently used first when cells or slots run out (and capped, since every decode row's attention
  scans every cached cell);
- layout_streams.py, `kv_unified: false` (the default): one KV stream per sequence id, each a sequence's own;
  a prefix is shared by copying or restoring it, and running sequences are kept on adjacent streams.

A layout owns the slots (llama.cpp sequence ids), the prefix tree of what each holds (prefix_cache.py) and the
KV tiers' glue (kv_tier_io.py). The scheduler decides who runs and who is preempted; it asks the layout whether
cells are there (`fits`), to place an arrival (`admit`), and tells it what was written, finished or preempted."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.prefix_cache import PrefixCache
from tokenomy.engine.kv.tier import KVTiers
from tokenomy.engine.kv.tier_io import SlotState, TierIO
from tokenomy.engine.sequence import Sequence

Bump = Callable[[int | None], bool]     # preempt a running batch sequence not on the given slot; whether one was


class KVOps(SlotState, Protocol):
    """What a layout needs from the runner: share a prefix, copy a whole KV stream, drop a slot's KV, shift a
    slot's positions, and (SlotState) save a slot's KV and restore it."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None: ...
    def copy_stream(self, src: int, dst: int) -> None: ...
    def remove(self, slot: int, start: int = 0) -> None: ...
    def shift(self, slot: int, keep: int, discard: int) -> None: ...


class KVLayout(ABC):
    #: whether the tree's nodes are bookkeeping of each slot's own cells (streams) rather than shared cells
    separate_cells = False

    def __init__(self, cfg: EngineConfig, kv: KVOps, n_ctx: int, tiers: KVTiers | None = None) -> None:
        """`n_ctx`: the KV cells the runner's context really has (llama.cpp may round cfg.n_ctx). `tiers`: where
        evicted prefixes are saved and restored from (kv_tier.py; none by default)."""
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.kv = kv
        self.prefix = PrefixCache()
        self.tiers = tiers or KVTiers(0)
        self.io = TierIO(self.tiers, kv, self.prefix, self.cut, cfg.prefix_caching, self.separate_cells)
        self.free_slots: list[int] = list(range(cfg.n_seqs - 1, -1, -1))

    # ---- what the scheduler asks --------------------------------------------------------------------------
    @property
    @abstractmethod
    def free_cells(self) -> int:
        """Cells a running sequence may still grow into this step."""

    @abstractmethod
    def used_cells(self, running: list[Sequence]) -> int:
        """Cells holding KV, running sequences and cached prefixes together."""

    @abstractmethod
    def begin_step(self, running: list[Sequence], waiting: bool) -> None:
        """A step's plan starts: nothing is reserved yet; `waiting` says whether anyone waits."""

    @abstractmethod
    def fits(self, n: int) -> bool:
        """Room for `n` more tokens of a running sequence, evicting cached prefixes if need be."""

    @abstractmethod
    def reserve(self, n: int) -> None:
        """`n` tokens of a running sequence are in this step's plan."""

    @abstractmethod
    def admit(self, seq: Sequence, budget: int, running: list[Sequence],
              bump: Bump | None) -> tuple[int, int, int] | None:
        """Place the waiting `seq` on a slot, its longest cached prefix there (shared, copied or restored):
        (slot, cached tokens, tokens to compute this step, at most `budget`), or None when there is no room.
        `running`: the sequences running now. With `bump`, the layout may preempt batch sequences for room."""

    @abstractmethod
    def fork(self, src: int, length: int, tokens: list[int], running: set[int]) -> int | None:
        """A free slot holding a copy of the first `length` tokens of `src`'s KV (`tokens`: those tokens, at least),
        for another sequence of the same prompt (Scheduler.fork); None when no slot can be had. `running`: the
        running sequences' slots."""

    def step_order(self, plan: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """The plan in the order its chunks go into the batch."""
        return plan

    # ---- what the scheduler tells --------------------------------------------------------------------------
    def committed(self, seq: Sequence, tokens: list[int]) -> None:
        """KV for `tokens` was written to the sequence's slot by the last step. After a context shift the KV is
        no prefix anyone else can reuse (its tokens saw a context that is gone), so the tree keeps only what was
        there before."""
        if not seq.dropped:
            self.prefix.extend(seq.slot, tokens)
        seq.n_kv += len(tokens)

    def shift(self, seq: Sequence, sink: int) -> None:
        """Context shift: keep the first `sink` tokens and the recent half (layout_streams.py only)."""
        raise NotImplementedError("context shift needs KV streams (kv_unified false)")

    def retire(self, seq: Sequence, keep_prefix: bool, keep_output: bool) -> bool:
        """The sequence ended: with `keep_prefix` its prompt's KV (and its answer's with `keep_output` or
        cfg.keeps_outputs) stays as a cached prefix, retired as *protected* when the prompt was seen before
        (seq.reused) and pinned for the sequence's pin_s (its answer kept too); else its slot is freed. Whether it
        was kept."""
        if seq.slot is None:
            return False
        if keep_prefix and self.cfg.prefix_caching and self.prefix.resident(seq.slot) > 0:
            if not (keep_output or self.cfg.keeps_outputs or seq.params.pin_s):
                self.cut(seq.slot, len(seq.prompt))
            pin_s = seq.params.pin_s
            self.prefix.retire(seq.slot, protected=seq.reused or pin_s > 0,
                               pin_until=time.monotonic() + pin_s if pin_s else 0.0)
            self.io.finished(seq.slot)
            return True
        self.release(seq.slot)
        return False

    def release(self, slot: int | None) -> None:
        """Drop the slot's KV and free it."""
        if slot is None:
            return
        self.kv.remove(slot)
        self.prefix.release(slot)
        self.free_slots.append(slot)

    def cut(self, slot: int, length: int) -> None:
        """Drop the slot's KV past its first `length` tokens, in llama.cpp and in the prefix tree."""
        if self.prefix.resident(slot) > length:
            self.kv.remove(slot, length)
            self.prefix.truncate(slot, length)

    def clear(self) -> None:
        """Forget every cached prefix, in the KV memory and in the tiers."""
        for slot in list(self.prefix.retired):
            self.release(slot)
        self.tiers.clear()

    # ---- for the implementations ---------------------------------------------------------------------------
    def _evict(self, slot: int) -> None:
        """Drop a cached prefix from the KV memory, saved to the tiers first (TierIO.save)."""
        self.io.save(slot)
        self.release(slot)
