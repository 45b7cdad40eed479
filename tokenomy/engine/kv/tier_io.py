"""Moving a slot's KV between llama.cpp and the KV tiers (kv_tier.py), for a KV layout (kv_layout.py).

A finished sequence's prefix is saved between steps, once its output is sent (`finished`, then `save_finished`),
and a cached prefix that gives way is saved first if no saved state holds it yet (`save`); a prompt that shares
more of a saved state than is resident has it restored into an empty slot (`match`, then `restore`) when the tier's
measured restore time beats prefilling the difference."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tokenomy.engine import tuning
from tokenomy.engine.kv.prefix_cache import PrefixCache
from tokenomy.engine.kv.tier import Entry, KVTiers


class SlotState(Protocol):
    """What the tiers need from the runner: a slot's KV as a state, and that state loaded into an empty slot."""

    def save(self, slot: int) -> bytes | bytearray | None: ...
    def restore(self, slot: int, blob: bytes | bytearray) -> bool: ...


@dataclass
class TierIO:
    """`cut(slot, length)` drops a slot's KV past `length` tokens (the layout's). With `attach_shared` a restored
    prefix joins the tree nodes other slots hold for its tokens (KV streams, where the tree is bookkeeping of each
    stream's own cells); without, its cells are new ones (the unified buffer, where a node is physical cells that
    slots share)."""

    tiers: KVTiers
    kv: SlotState
    prefix: PrefixCache
    cut: Callable[[int, int], None]
    prefix_caching: bool
    attach_shared: bool
    _finished: list[int] = field(default_factory=list, init=False)   # retired since the last save_finished

    def match(self, tokens: list[int], resident: int) -> tuple[int, Entry | None]:
        """A saved state holding at least MIN_COPY_TOKENS more of `tokens` than the `resident` ones, when
        restoring it is estimated to be faster than prefilling the difference: (its length, it), else (0, None)."""
        if not self.tiers.enabled or not self.prefix_caching:
            return 0, None
        length, entry = self.tiers.match(tokens, resident + tuning.MIN_COPY_TOKENS - 1)
        if entry is None or not self.tiers.worth(entry, length - resident):
            return 0, None
        return length, entry

    def in_ram(self, tokens: list[int], length: int) -> tuple[int, Entry | None]:
        """A state saved in RAM holding at least `length` of `tokens`: (its length, it), else (0, None)."""
        if not self.tiers.enabled:
            return 0, None
        got, entry = self.tiers.match(tokens, length - 1)
        return (got, entry) if entry is not None and entry.tier == "ram" else (0, None)

    def restore(self, slot: int, entry: Entry, length: int) -> bool:
        """Load `entry` into the empty `slot` and keep its first `length` tokens; False if that failed (the slot
        stays empty)."""
        tier = entry.tier
        t0 = time.perf_counter()
        blob = self.tiers.load(entry)
        if blob is None or not self.kv.restore(slot, blob):
            return False
        saved = entry.tokens.tolist()
        shared = self.prefix.match(saved)[0] if self.attach_shared else 0
        if shared:
            self.prefix.attach(slot, saved, shared)
        self.prefix.extend(slot, saved[shared:])
        self.cut(slot, length)
        self.tiers.restored(entry, length, time.perf_counter() - t0, tier)
        return True

    def save(self, slot: int, even_if_resident: bool = False) -> None:
        """Keep the slot's state in the tiers when it is long enough and held nowhere else: no saved state and
        (unless `even_if_resident`) no other slot; before its KV is dropped or cut."""
        if self.tiers.enabled and self.prefix.resident(slot) >= tuning.MIN_TIER_TOKENS:
            tokens = self.prefix.tokens(slot)
            if not even_if_resident:
                length, holders = self.prefix.match_slots(tokens)
                if length == len(tokens) and holders - {slot}:
                    return
            if not self.tiers.covers(tokens) and (blob := self.kv.save(slot)) is not None:
                self.tiers.put(tokens, blob)

    def holds(self, slot: int) -> bool:
        """Whether a saved state holds all of the cached prefix in `slot` (dropping it loses nothing a restore
        cannot bring back)."""
        return self.tiers.enabled and self.tiers.covers(self.prefix.tokens(slot))

    def finished(self, slot: int) -> None:
        """`slot` was retired as a cached prefix: save it at the next save_finished."""
        if self.tiers.enabled and slot not in self._finished:
            self._finished.append(slot)

    def save_finished(self) -> None:
        """Save the prefixes retired since the last call, each unless a saved state already holds it. The engine
        calls this after a step's output is sent, so the save that evicting the prefix would otherwise make falls
        between two steps, not in the step of the arrival that needs its stream (a save writes fresh memory: 2-4 ms
        per MiB of state under load on these machines, docs/engine.md)."""
        done, self._finished = self._finished, []
        for slot in done:
            if slot in self.prefix.retired:
                self.save(slot, even_if_resident=True)
