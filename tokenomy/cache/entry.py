"""What a response cache stores, and what a hit reports.

An entry keeps the full response payload (the OpenAI response body, plus the stream events when the original
was streamed, so a hit can be replayed with the same event shape) and what generating it cost, so that a hit
can report the tokens and USD it saved: saved_tokens = prompt_tokens + completion_tokens, saved_usd = cost_usd.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass
class CacheEntry:
    response: dict[str, Any]
    chunks: list[dict[str, Any]] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    model: str = ""
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not isinstance(self.response, dict):
            raise TypeError("CacheEntry.response must be a dict (the response body)")
        if self.chunks is not None and not isinstance(self.chunks, list):
            raise TypeError("CacheEntry.chunks must be a list of stream events or None")
        if self.prompt_tokens < 0 or self.completion_tokens < 0 or self.cost_usd < 0:
            raise ValueError("CacheEntry token counts and cost must be non-negative")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CacheEntry:
        """Rebuild an entry from ``to_dict`` output; raises ValueError on anything else."""
        if not isinstance(data, dict) or not isinstance(data.get("response"), dict):
            raise ValueError("not a cache entry")
        try:
            return cls(response=data["response"], chunks=data.get("chunks"),
                       prompt_tokens=int(data.get("prompt_tokens", 0)),
                       completion_tokens=int(data.get("completion_tokens", 0)),
                       cost_usd=float(data.get("cost_usd", 0.0)), model=str(data.get("model", "")),
                       created_at=float(data.get("created_at", 0.0)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a cache entry: {exc}") from exc


@dataclass
class CacheHit:
    """A served hit. For semantic hits ``similarity`` is the cosine and ``score`` the verifier's probability
    that the cached answer is right; ``entry_id`` is what ``SemanticCache.feedback`` takes. As a lookup's
    ``explore`` candidate, ``held_back`` says whether it was a would-be hit sent to the model instead (the cost of
    online error control) or a miss checked against the model's answer at no extra cost."""

    kind: Literal["exact", "semantic"]
    entry: CacheEntry
    key: str
    similarity: float = 1.0
    score: float = 1.0
    entry_id: int | None = None
    held_back: bool = True

    @property
    def saved_tokens(self) -> int:
        return self.entry.prompt_tokens + self.entry.completion_tokens

    @property
    def saved_usd(self) -> float:
        return self.entry.cost_usd


def read_entry(store: Any, key: str) -> CacheEntry | None:
    """The entry stored under `key`, or None when absent; a payload that no longer parses counts as a store
    error (and a miss), never as an exception."""
    raw = store.get(key)
    if raw is None:
        return None
    try:
        return CacheEntry.from_dict(raw)
    except ValueError:
        store.errors += 1
        return None
