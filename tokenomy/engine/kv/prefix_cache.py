"""Automatic prefix caching: a radix tree over the token runs whose KV is resident in llama.cpp's unified cache.

Each node is one physical run of KV cells (a span of positions holding those tokens). A llama.cpp sequence slot
owns a root-to-node path; `llama_memory_seq_cp(src, dst, 0, L)` makes `dst` share the cells of `src`'s first L
positions without copying, so two slots share exactly the nodes on their common path. A node's cells are freed
when no slot's path passes through it, which is when llama.cpp frees the cells too. Hence

    used_cells = sum(len(node.tokens) for every live node)

Slots that finished but still hold their KV are *retired*: they stay matchable until evicted, least recently used
first, when cells or slot ids are needed. A retired slot is *protected* when its prompt was seen before; the
fingerprints (first FINGERPRINT_TOKENS tokens, tuning.py) of recently evicted prefixes are remembered so that a prompt
coming back after its eviction counts as seen. A retired slot is *pinned* until a deadline its sequence asked for
(SamplingParams.pin_s): pinned slots are evicted after every unpinned one, so a pin never refuses live work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cachetools import LRUCache

from tokenomy.engine import tuning


@dataclass(eq=False)
class Node:
    tokens: list[int]
    parent: Node | None
    start: int                                   # position of tokens[0]
    children: list[Node] = field(default_factory=list)
    slots: set[int] = field(default_factory=set)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def common_length(a: list[int], b: list[int], b_off: int = 0) -> int:
    """How many leading tokens of `a` equal those of `b` from `b_off` on."""
    n = min(len(a), len(b) - b_off)
    i = 0
    while i < n and a[i] == b[b_off + i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self) -> None:
        self.root = Node(tokens=[], parent=None, start=0)
        self.paths: dict[int, list[Node]] = {}   # slot -> nodes root..leaf (root excluded)
        self.retired: dict[int, float] = {}      # slot -> last use, for LRU eviction
        self.protected: set[int] = set()          # retired slots whose prompt was seen before
        self.pins: dict[int, float] = {}          # retired slot -> monotonic time its pin ends
        self.ghosts: LRUCache[int, None] = LRUCache(tuning.GHOSTS)   # fingerprints of evicted retired prefixes
        self.used_cells = 0

    # ---- lookup -------------------------------------------------------------------------------------
    def match(self, tokens: list[int]) -> tuple[int, int | None]:
        """Longest resident prefix of `tokens`: (length, a slot holding it) or (0, None)."""
        length, holders = self.match_slots(tokens)
        return length, min(holders) if holders else None

    def match_slots(self, tokens: list[int]) -> tuple[int, set[int]]:
        """Longest resident prefix of `tokens`: (length, every slot holding it) or (0, empty set)."""
        node, depth, holders = self.root, 0, set()
        while True:
            best, best_len = None, 0
            for child in node.children:
                n = common_length(child.tokens, tokens, depth)
                if n > best_len:
                    best, best_len = child, n
            if best is None:
                return depth, holders
            holders = set(best.slots)
            depth += best_len
            if best_len < len(best.tokens):
                return depth, holders
            node = best

    # ---- slot lifecycle ------------------------------------------------------------------------------
    def attach(self, slot: int, tokens: list[int], length: int) -> None:
        """Record that `slot` now shares the first `length` resident tokens of `tokens` (after seq_cp)."""
        assert slot not in self.paths
        path: list[Node] = []
        node, depth = self.root, 0
        while depth < length:
            child = max(node.children, key=lambda c: common_length(c.tokens, tokens, depth))
            n = min(common_length(child.tokens, tokens, depth), length - depth)
            assert n > 0, "attach beyond the resident prefix"
            if n < len(child.tokens):
                child = self._split(child, n)
            path.append(child)
            depth += n
            node = child
        for n in path:
            n.slots.add(slot)
        self.paths[slot] = path

    def extend(self, slot: int, new_tokens: list[int]) -> None:
        """Record KV written for `new_tokens` appended to `slot`'s sequence."""
        if not new_tokens:
            return
        path = self.paths.setdefault(slot, [])
        leaf = path[-1] if path else self.root
        self.used_cells += len(new_tokens)
        if path and leaf.slots == {slot} and not leaf.children:
            leaf.tokens.extend(new_tokens)
            return
        node = Node(tokens=list(new_tokens), parent=leaf, start=leaf.end, slots={slot})
        leaf.children.append(node)
        path.append(node)

    def release(self, slot: int) -> None:
        """The slot's KV was removed (llama_memory_seq_rm): free the cells no other slot shares."""
        if self.retired.pop(slot, None) is not None:
            self.protected.discard(slot)
            self.pins.pop(slot, None)
            held: list[int] = []
            for node in self.paths.get(slot, []):
                held += node.tokens[:tuning.FINGERPRINT_TOKENS - len(held)]
                if len(held) >= tuning.FINGERPRINT_TOKENS:
                    break
            fp = _fingerprint(held)
            self.ghosts[fp] = None
        for node in reversed(self.paths.pop(slot, [])):
            node.slots.discard(slot)
            if not node.slots:
                self.used_cells -= len(node.tokens)
                assert node.parent is not None
                node.parent.children.remove(node)

    def truncate(self, slot: int, length: int) -> None:
        """The slot's KV past position `length` was removed (llama_memory_seq_rm(slot, length, -1))."""
        path = self.paths.get(slot, [])
        straddling = next((n for n in path if n.start < length < n.end), None)
        if straddling is not None:
            self._split(straddling, length - straddling.start)
            path = self.paths[slot]
        keep = [n for n in path if n.end <= length]
        for node in reversed(path[len(keep):]):
            node.slots.discard(slot)
            if not node.slots:
                self.used_cells -= len(node.tokens)
                assert node.parent is not None
                node.parent.children.remove(node)
        self.paths[slot] = keep

    def clone(self, src: int, dst: int) -> None:
        """`dst` now holds a copy of `src`'s KV (a copy between KV streams)."""
        assert dst not in self.paths
        path = list(self.paths.get(src, []))
        for node in path:
            node.slots.add(dst)
        self.paths[dst] = path

    def unretire(self, slot: int) -> None:
        """A retired slot runs again (a sequence continues from its prefix in place)."""
        self.retired.pop(slot, None)
        self.protected.discard(slot)
        self.pins.pop(slot, None)

    def retire(self, slot: int, protected: bool = False, pin_until: float = 0.0) -> None:
        """The slot's sequence ended and its KV stays cached; `pin_until` (time.monotonic()) pins it till then."""
        self.retired[slot] = time.monotonic()
        if protected:
            self.protected.add(slot)
        if pin_until > self.retired[slot]:
            self.pins[slot] = pin_until

    def pinned(self, slot: int) -> bool:
        """Whether the retired slot's pin still holds."""
        return self.pins.get(slot, 0.0) > time.monotonic()

    def evicted_recently(self, tokens: list[int]) -> bool:
        """Whether a prefix starting like `tokens` was retired here and evicted since (among the last GHOSTS)."""
        return _fingerprint(tokens[:tuning.FINGERPRINT_TOKENS]) in self.ghosts

    def touch(self, slot: int) -> None:
        if slot in self.retired:
            self.retired[slot] = time.monotonic()

    def lru_retired(self, exclude: int | None = None, protected: bool | None = None) -> int | None:
        """The least recently used retired slot other than `exclude`, unpinned then unprotected ones first (only
        those of `protected`'s kind when it is set), or None."""
        candidates = [s for s in self.retired if s != exclude
                      and (protected is None or (s in self.protected) == protected)]
        return min(candidates, key=lambda s: (self.pinned(s), s in self.protected, self.retired[s]),
                   default=None)

    def exclusive_cells(self, slot: int) -> int:
        """Cells freed if this slot were released now."""
        return sum(len(n.tokens) for n in self.paths.get(slot, []) if n.slots == {slot})

    def retired_exclusive_cells(self, protected: bool | None = None) -> int:
        """Cells on paths that only retired slots use (only protected or only unprotected ones when `protected`
        is set)."""
        kind = self.retired.keys() if protected is None else {
            s for s in self.retired if (s in self.protected) == protected}
        seen: set[int] = set()
        total = 0
        for slot in kind:
            for node in self.paths.get(slot, []):
                if id(node) not in seen and node.slots <= kind:
                    seen.add(id(node))
                    total += len(node.tokens)
        return total

    def tokens(self, slot: int) -> list[int]:
        """The tokens whose KV the slot holds, in order."""
        return [t for node in self.paths.get(slot, []) for t in node.tokens]

    def resident(self, slot: int) -> int:
        path = self.paths.get(slot)
        return path[-1].end if path else 0

    # ---- internals -----------------------------------------------------------------------------------
    def _split(self, node: Node, n: int) -> Node:
        """Split `node` after its first n tokens; return the new upper part, which takes node's place."""
        upper = Node(tokens=node.tokens[:n], parent=node.parent, start=node.start, slots=set(node.slots))
        assert node.parent is not None
        siblings = node.parent.children
        siblings[siblings.index(node)] = upper
        node.tokens = node.tokens[n:]
        node.start += n
        node.parent = upper
        upper.children.append(node)
        for s in node.slots:
            p = self.paths[s]
            p.insert(p.index(node), upper)
        return upper


def _fingerprint(tokens: list[int]) -> int:
    return hash(tuple(tokens))
