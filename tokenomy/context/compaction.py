"""Compaction of conversation history: keep a long conversation's prompt under a trigger without breaking its
prefix every turn.

A conversation is its leading system messages (the head, never touched) and its turns: a turn starts at a user
message and holds what follows up to the next user message (assistant answers, tool calls and their results), so
cutting between turns never separates a tool call from its result. The last `keep_last_turns` turns are never
touched.

When the prompt passes `trigger_tokens`, the oldest turns are compacted, in blocks of `block_turns`. A boundary
the conversation already used (its summary or note is in the cache, keyed by the hash of the turns it replaces)
is kept as long as the prompt still fits under the trigger; otherwise the new boundary is the smallest multiple
of the block that brings the prompt to LOW_WATER of the trigger, which leaves room for the next turns. So
consecutive turns of a conversation replace the same turns with the same text: the compacted prompt keeps a
stable prefix and the prefix cache still hits (replacing history every turn would throw the prefix cache away;
bench/context.py measures both).

    mask_tool_outputs   first, old tool results become a short note (the call stays)
    drop_middle         the replaced turns become a one-line note in the system prompt
    summarize           they become a summary by `summary_model`, cached by the hash of the turns it replaces
                        and built incrementally (the previous block's summary plus the new block's turns)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

Message = dict[str, Any]
Count = Callable[[list[Message]], int]
# (text to summarize, max summary tokens) -> (summary, USD it cost)
Summarize = Callable[[str, int], Awaitable[tuple[str, float]]]

LOW_WATER = 0.75          # a new cut brings the prompt to this share of the trigger
SUMMARY_HEADER = "Summary of the earlier conversation:"
SUMMARY_PROMPT = ("Summarize the conversation below for the assistant that continues it. Keep names, numbers, "
                  "decisions, open questions and what the user asked for. Be brief.")


@dataclass
class Compacted:
    messages: list[Message]
    action: str = "none"                # none | masked | drop_middle | summarize (joined with + when both)
    turns_replaced: int = 0
    tools_masked: int = 0
    summary_calls: int = 0
    summary_cached: bool = False
    cost_usd: float = 0.0
    notes: list[str] = field(default_factory=list)


def split_turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(head: the leading system messages, turns)."""
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        i += 1
    head, turns = list(messages[:i]), []
    for m in messages[i:]:
        if m.get("role") == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return head, turns


def render(turns: Sequence[Sequence[Message]]) -> str:
    lines = []
    for t in turns:
        for m in t:
            text = str(m.get("content") or "")
            if m.get("tool_calls"):
                text += " [calls " + ", ".join(str(c.get("function", {}).get("name", "?"))
                                                for c in m["tool_calls"]) + "]"
            lines.append(f"{m.get('role')}: {text}")
    return "\n".join(lines)


def turns_key(turns: Sequence[Sequence[Message]], salt: str) -> str:
    data = json.dumps([salt, [list(t) for t in turns]], sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()


def mask(turn: list[Message]) -> tuple[list[Message], int]:
    out, n = [], 0
    for m in turn:
        if m.get("role") == "tool" and len(str(m.get("content") or "")) > 80:
            out.append({**m, "content": f"[tool output omitted: {len(str(m.get('content') or ''))} characters]"})
            n += 1
        else:
            out.append(m)
    return out, n


def with_note(head: list[Message], note: str) -> list[Message]:
    """The head with `note` appended to its first system message (a system message is added when there is none:
    some chat templates refuse a system message anywhere but first)."""
    if head and not isinstance(head[0].get("content") or "", str):     # content parts: a message of its own
        return head + [{"role": "system", "content": note}]
    if head:
        first = head[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{note}".strip()}] + head[1:]
    return [{"role": "system", "content": note}]


class SummaryCache(LRUCache[str, str]):
    """Summaries by the hash of the turns they replace (LRU, bounded)."""

    def __init__(self, max_entries: int = 4096) -> None:
        super().__init__(max_entries)


def _boundaries(movable: int, block: int) -> list[int]:
    """Where history may be cut: whole blocks of turns (all movable turns when there is no whole block)."""
    return list(range(block, movable + 1, block)) or ([movable] if movable > 0 else [])


async def compact(messages: list[Message], s: Any, count: Count, summarize: Summarize | None = None,
                  cache: SummaryCache | None = None, salt: str = "") -> Compacted:
    """Compact `messages` per settings `s` (trigger_tokens, keep_last_turns, strategy, max_summary_tokens,
    mask_tool_outputs, block_turns). `count` gives a message list's prompt tokens; `summarize` is needed for the
    summarize strategy; `salt` (the summary model and its limit) keys the cache."""
    if count(messages) <= s.trigger_tokens:
        return Compacted(messages)
    head, turns = split_turns(messages)
    movable = len(turns) - s.keep_last_turns
    if movable <= 0:
        return Compacted(messages, notes=["under keep_last_turns"])
    block = s.block_turns or max(s.keep_last_turns, 1)
    out = Compacted(messages)
    if s.mask_tool_outputs:
        for k in _boundaries(movable, block):
            masked, n = [], 0
            for t in turns[:k]:
                mt, c = mask(t)
                masked.append(mt)
                n += c
            if n == 0:
                continue
            candidate = head + [m for t in masked + turns[k:] for m in t]
            out = Compacted(candidate, "masked", tools_masked=n)
            if count(candidate) <= s.trigger_tokens:
                return out
        if out.tools_masked:
            _, turns = split_turns(out.messages[len(head):])
    reserve = s.max_summary_tokens + 16 if s.strategy == "summarize" else 16
    cache = cache if cache is not None else SummaryCache()
    salt = f"{s.strategy}:{salt}"
    ks = _boundaries(movable, block)

    def size(k: int) -> int:
        return count(head + [m for t in turns[k:] for m in t]) + reserve

    # A boundary this conversation already used, while it still fits, keeps the prompt's prefix; a new one
    # leaves room (LOW_WATER of the trigger), so that the next turns fit under it too.
    k = next((k for k in reversed(ks) if cache.get(turns_key(turns[:k], salt)) is not None
              and size(k) <= s.trigger_tokens), 0)
    if not k:
        k = next((k for k in ks if size(k) <= LOW_WATER * s.trigger_tokens), ks[-1])
    rest = [m for t in turns[k:] for m in t]
    prefix = "masked+" if out.tools_masked else ""
    key = turns_key(turns[:k], salt)
    if s.strategy == "drop_middle":
        note = f"[{k} earlier turns of this conversation were left out]"
        cache[key] = note
        return Compacted(with_note(head, note) + rest, prefix + "drop_middle", k, out.tools_masked)
    if summarize is None:
        raise ValueError("the summarize strategy needs a summary model")
    summary = cache.get(key)
    res = Compacted(messages, prefix + "summarize", k, out.tools_masked, summary_cached=summary is not None)
    if summary is None:
        # incremental: the longest earlier block already summarized, plus the turns after it
        done = next((j for j in reversed(ks) if j < k and cache.get(turns_key(turns[:j], salt)) is not None), 0)
        text = render(turns[done:k])
        if done:
            text = f"{SUMMARY_HEADER} {cache.get(turns_key(turns[:done], salt))}\n\n{text}"
        summary, usd = await summarize(text, s.max_summary_tokens)
        summary = " ".join(summary.split())
        cache[key] = summary
        res.summary_calls, res.cost_usd = 1, usd
    res.messages = with_note(head, f"{SUMMARY_HEADER} {summary}") + rest
    return res
