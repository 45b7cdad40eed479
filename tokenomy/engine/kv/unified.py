"""The unified KV buffer (`kv_unified: true`, llama.cpp's unified cache): one pool of cells for every sequence.

A prompt sharing a cached prefix shares its cells (llama_memory_seq_cp of the first L positions copies nothing).
When a sequence needs cells and none are free, cached prefixes are evicted first, least recently used (saved to the
KV tiers first when no saved state holds them); the scheduler then preempts. Cells held only by cached prefixes
are capped at cfg.max_retired_cells (default a quarter of n_ctx): every query row's attention scans the whole
used range of the buffer, so cached cells slow every decode step; too few, and prompts sharing long prefixes
(several tenants' system prompts) evict each other and recompute them. A prompt seen before is retired as
*protected*: it counts against a larger cap (half of n_ctx), so prompts that come back in a cycle longer than
the first cap holds are not each evicted just before their next use."""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.engine.config import EngineConfig
from tokenomy.engine.kv.layout import Bump, KVLayout, KVOps
from tokenomy.engine.kv.tier import Entry, KVTiers
from tokenomy.engine.sequence import Sequence


class UnifiedBuffer(KVLayout):
    def __init__(self, cfg: EngineConfig, kv: KVOps, n_ctx: int, tiers: KVTiers | None = None) -> None:
        super().__init__(cfg, kv, n_ctx, tiers)
        self.retired_cap = cfg.max_retired_cells if cfg.max_retired_cells is not None else n_ctx // 4
        self.protected_cap = max(self.retired_cap, n_ctx // 2)
        self._reserved = 0

    @property
    def free_cells(self) -> int:
        """Cells nobody holds or has reserved this step."""
        return self.n_ctx - self.prefix.used_cells - self._reserved

    def used_cells(self, running: list[Sequence]) -> int:
        """Shared cells count once."""
        return self.prefix.used_cells

    def begin_step(self, running: list[Sequence], waiting: bool) -> None:
        self._reserved = 0

    def fits(self, n: int) -> bool:
        return self._evict_until(lambda: self.free_cells >= n)

    def reserve(self, n: int) -> None:
        self._reserved += n

    def admit(self, seq: Sequence, budget: int, running: list[Sequence],
              bump: Bump | None) -> tuple[int, int, int] | None:
        tokens = seq.kv_tokens()
        length, holder = (0, None)
        if self.cfg.prefix_caching:
            length, holder = self.prefix.match(tokens[:-1])   # the last token is always computed: we need logits
        tier_len, entry = self.io.match(tokens[:-1], length)
        if entry is not None and (placed := self._admit_restored(seq, entry, tier_len, budget, holder, bump)):
            return placed
        n = min(len(tokens) - length, budget)
        if not self._room(n, holder, bump):
            return None
        slot = self.free_slots.pop()
        if length and holder is not None:
            self.kv.copy_prefix(holder, slot, length)
            self.prefix.attach(slot, tokens, length)
            self.prefix.touch(holder)
        self._reserved += n
        return slot, length, n

    def fork(self, src: int, length: int, tokens: list[int], running: set[int]) -> int | None:
        """The copy shares `src`'s cells: a slot is all it takes (a cached prefix evicted for one if need be)."""
        if not self._evict_until(lambda: bool(self.free_slots), keep=src):
            return None
        slot = self.free_slots.pop()
        self.kv.copy_prefix(src, slot, length)
        self.prefix.attach(slot, tokens, length)
        return slot

    def _admit_restored(self, seq: Sequence, entry: Entry, length: int, budget: int, holder: int | None,
                        bump: Bump | None) -> tuple[int, int, int] | None:
        """Start `seq` on a free slot with `entry` restored (its whole state first, then cut to `length`); None
        when there is no room or the restore fails."""
        n = min(seq.num_kv_tokens - length, budget)
        if not self._room(len(entry.tokens) + n, holder, bump):
            return None
        slot = self.free_slots.pop()
        if not self.io.restore(slot, entry, length):
            self.free_slots.append(slot)
            return None
        self._reserved += n
        return slot, length, n

    def _room(self, cells: int, holder: int | None, bump: Bump | None) -> bool:
        """`cells` free cells and a free slot, evicting cached prefixes (not `holder`) and, with `bump`,
        preempting batch sequences to get them."""
        if not self._evict_until(lambda: self.free_cells >= cells, keep=holder, bump=bump):
            return False
        return bool(self.free_slots) or self._evict_until(lambda: bool(self.free_slots), keep=holder, bump=bump)

    def retire(self, seq: Sequence, keep_prefix: bool, keep_output: bool) -> bool:
        """As KVLayout.retire, then the cached prefixes are evicted down to their caps (unprotected first)."""
        if not super().retire(seq, keep_prefix, keep_output):
            return False
        self._evict_until(lambda: self.retired_cells(protected=False) <= self.retired_cap, protected=False)
        self._evict_until(lambda: self.retired_cells() <= self.protected_cap)
        return True

    def retired_cells(self, protected: bool | None = None) -> int:
        """Cells that only cached prefixes hold (freed if every one were evicted); `protected` True or False
        counts only the protected or only the unprotected ones."""
        return self.prefix.retired_exclusive_cells(protected)

    def _evict_until(self, ok: Callable[[], bool], keep: int | None = None, bump: Bump | None = None,
                     protected: bool | None = None) -> bool:
        """Evict cached prefixes (unprotected before protected, least recently used first; only those of
        `protected`'s kind when it is set; never `keep`) until `ok()`; then, with `bump`, preempt running batch
        sequences."""
        while not ok():
            slot = self.prefix.lru_retired(exclude=keep, protected=protected)
            if slot is not None:
                self._evict(slot)
                continue
            if bump is None or not bump(keep):
                return False
        return True
