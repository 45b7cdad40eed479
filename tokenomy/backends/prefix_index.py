"""Which replica served which prompt prefixes recently: a bounded table of chained block hashes.

A prompt is rendered to text and cut into fixed-size character blocks; block i's hash covers blocks 0..i (each
hash chains the previous one), so equal hashes mean equal prefixes, as in vLLM's and SGLang's prefix caches. The
table maps a block hash to the replicas that served a prompt containing that prefix, least recently used first,
and forgets the oldest blocks beyond `max_blocks`. A replica's own cache evicts too, so the table is a guess at
what each replica still holds, which is all a router needs.
"""

from __future__ import annotations

from typing import Any

from cachetools import Cache, LRUCache


def render(kind: str, messages: list[dict[str, Any]] | None, prompt: str | None) -> str:
    """The prompt as one string, in the order an engine would see it (role markers keep turns apart)."""
    if kind != "chat":
        return prompt or ""
    parts = []
    for m in messages or []:
        content = m.get("content")
        if isinstance(content, list):      # content parts: the text ones, in order
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"\x1e{m.get('role', '')}\x1f{content or ''}")
    return "".join(parts)


class PrefixIndex:
    def __init__(self, block_chars: int = 256, max_blocks: int = 200_000) -> None:
        self.block_chars, self.max_blocks = block_chars, max_blocks
        self._table: LRUCache[int, set[str]] = LRUCache(max_blocks)

    def __len__(self) -> int:
        return len(self._table)

    def blocks(self, text: str) -> list[int]:
        """Chained hashes of the text's whole blocks (a trailing partial block is not a shareable prefix)."""
        out, h, n = [], 0, self.block_chars
        for i in range(0, len(text) - n + 1, n):
            h = hash((h, text[i:i + n]))
            out.append(h)
        return out

    def match(self, hashes: list[int]) -> dict[str, int]:
        """For each replica that holds the first block: how many leading blocks it holds."""
        runs: dict[str, int] = {}
        for i, h in enumerate(hashes):
            holders = _peek(self._table, h)
            if not holders:
                break
            grew = False
            for r in holders:
                if runs.get(r, 0) == i:
                    runs[r] = i + 1
                    grew = True
            if not grew:
                break
        return runs

    def insert(self, hashes: list[int], replica: str) -> None:
        """Remember that `replica` now holds these blocks (it just served them)."""
        for h in hashes:
            self._table.setdefault(h, set()).add(replica)

    def forget(self, replica: str) -> None:
        """A replica that restarted holds nothing: drop it everywhere."""
        for h in list(self._table):
            holders = _peek(self._table, h)
            holders.discard(replica)
            if not holders:
                del self._table[h]


def _peek(table: LRUCache[int, set[str]], h: int) -> set[str] | None:
    """The holders of block `h` without counting a use: Cache's own lookup, which LRUCache's wraps to record one
    (cachetools has no peek). Reading the table to route or to forget a replica leaves its order as it was."""
    return Cache.__getitem__(table, h) if h in table else None
