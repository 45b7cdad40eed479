"""Prompt-layout lint: what breaks prefix reuse between requests of one tenant and route.

A prefix cache (the engine's radix cache, an upstream's prompt caching) reuses the longest common prefix of a new
prompt with earlier ones. Whatever differs early in a prompt throws away everything after it. For each request
the tracker finds the longest common prefix (LCP) with the recent prompts of the same tenant and route and says
where it ends; when it ends inside content meant to be shared (the system prompt, the tools, few-shot examples),
it names the reason and the offending span:

    volatile            a date, time, id or counter differs inside the system prompt or the tools
    per_request         other per-request content (a user name, ...) sits before shared content of the system prompt
    tools_reordered     the same tools, in another order
    examples_reordered  the same earlier messages (few-shot examples), in another order

A break in the conversation itself (a new user turn, another conversation's history) is the normal case and is
not reported. `potential` is the LCP the prompt would have had if the advice were followed (the offending span
moved to the end, tools in a fixed order), computed the same way.

Prompts are compared as layout units (words and punctuation, `UNIT`), the same for every backend, so a span can
be shown as text; shares are unit shares, which track token shares closely for prose. Memory is bounded: at most
`max_keys` (tenant, route) pairs, least recently used first out, `history` prompts each, `max_units` units each.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

UNIT = re.compile(r"\w+|[^\w\s]")
# What changes from request to request by nature: dates, times, weekdays, months, uuids, hex ids, long numbers.
DATE = (r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2})?)?|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b|\b\d{1,2}:\d{2}"
        r"(?::\d{2})?\b|\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|"
        r"oct|nov|dec)[a-z]*\.? \d{1,2}\b")
DATE_RE = re.compile(DATE, re.IGNORECASE)
VOLATILE_RE = re.compile(DATE + r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b(?=[a-z_]*\d)"
                         r"[0-9a-z_]{8,}\b|\b\d+\b", re.IGNORECASE)
REASONS = ("volatile", "per_request", "tools_reordered", "examples_reordered")


@dataclass(frozen=True)
class Segment:
    kind: str            # system | tools | message
    label: str           # system[0], tools, messages[3]
    text: str


@dataclass
class Layout:
    """A prompt as segments (system first, then tools, then the conversation) and the units they split into."""

    segments: list[Segment]
    units: list[str]
    seg_of: list[int]                # segment index of each unit
    start: list[int]                 # char offset of each unit in its segment's text
    end: list[int]
    total: int                       # units in the whole prompt (the stored lists may be cut at max_units)


@dataclass
class Break:
    reason: str
    segment: str
    at: int                          # units of shared prefix before the break
    span: str                        # the offending text (this request's side)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "segment": self.segment, "at": self.at, "span": self.span}


@dataclass
class Finding:
    units: int                       # prompt units
    prefix: int                      # longest common prefix with a recent prompt of this tenant and route
    potential: int                   # the same, had the advice been followed
    breaks: list[Break]

    @property
    def first(self) -> Break | None:
        return self.breaks[0] if self.breaks else None


def segments(messages: Sequence[dict[str, Any]] | None, tools: Sequence[dict[str, Any]] | None = None,
             prompt: str | None = None) -> list[Segment]:
    if messages is None:
        return [Segment("message", "prompt", prompt or "")]
    out = [Segment("system", f"system[{i}]", str(m.get("content") or ""))
           for i, m in enumerate(messages) if m.get("role") in ("system", "developer")]
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        out.append(Segment("tools", f"tool {fn.get('name', '?')}", json.dumps(t, sort_keys=True)))
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "developer"):
            text = str(m.get("content") or "") + (json.dumps(m["tool_calls"]) if m.get("tool_calls") else "")
            out.append(Segment("message", f"messages[{i}]", f"{m.get('role')}: {text}"))
    return out


def layout(segs: list[Segment], max_units: int = 4096) -> Layout:
    units: list[str] = []
    seg_of: list[int] = []
    start: list[int] = []
    end: list[int] = []
    total = 0
    for i, s in enumerate(segs):
        total += 1
        if len(units) < max_units:       # a boundary unit, so segments never merge across their borders
            units.append(f"<{s.kind}>")
            seg_of.append(i)
            start.append(0)
            end.append(0)
        for m in UNIT.finditer(s.text):
            total += 1
            if len(units) < max_units:
                units.append(m.group())
                seg_of.append(i)
                start.append(m.start())
                end.append(m.end())
    return Layout(segs, units, seg_of, start, end, total)


def lcp(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _span_end(cur: Layout, prev: Layout, i: int) -> tuple[int, int, int]:
    """The differing run starting at unit i inside its segment: (end in cur, end in prev, units of the segment
    shared after it)."""
    s_cur, s_prev = cur.seg_of[i], prev.seg_of[i] if i < len(prev.units) else -1
    ce = next((k for k in range(i, len(cur.units)) if cur.seg_of[k] != s_cur), len(cur.units))
    pe = next((k for k in range(i, len(prev.units)) if prev.seg_of[k] != s_prev), len(prev.units))
    suffix = 0
    while ce - suffix > i and pe - suffix > i and cur.units[ce - suffix - 1] == prev.units[pe - suffix - 1]:
        suffix += 1
    return ce - suffix, pe - suffix, suffix


def _text(cur: Layout, i: int, j: int, limit: int = 80) -> str:
    seg = cur.segments[cur.seg_of[i]]
    s, e = cur.start[i], cur.end[max(j - 1, i)]
    for m in VOLATILE_RE.finditer(seg.text):      # show the whole date or id, not only the units that differ
        if m.start() < e and m.end() > s:
            s, e = min(s, m.start()), max(e, m.end())
    text = seg.text[s:e]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _sorted_tools(lay: Layout) -> Layout:
    tools = sorted((s for s in lay.segments if s.kind == "tools"), key=lambda s: s.text)
    segs = [s for s in lay.segments if s.kind == "system"] + tools + [s for s in lay.segments if s.kind == "message"]
    return layout(segs, len(lay.units) + 1)


def _without(lay: Layout, i: int, j: int) -> Layout:
    """The layout with units [i, j) moved to the end of the prompt (what the advice asks for)."""
    keep = list(range(i)) + list(range(j, len(lay.units)))
    moved = list(range(i, j))
    order = keep + moved
    return Layout(lay.segments, [lay.units[k] for k in keep] + ["<moved>"] + [lay.units[k] for k in moved],
                  [lay.seg_of[k] for k in order[:len(keep)]] + [-1] + [lay.seg_of[k] for k in moved],
                  [lay.start[k] for k in keep] + [0] + [lay.start[k] for k in moved],
                  [lay.end[k] for k in keep] + [0] + [lay.end[k] for k in moved], lay.total)


def diagnose(cur: Layout, prev: Layout, max_breaks: int = 4) -> tuple[int, int, list[Break]]:
    """(prefix, potential, breaks) of `cur` against one earlier prompt."""
    prefix = lcp(cur.units, prev.units)
    breaks: list[Break] = []
    a, b, at = cur, prev, prefix
    for _ in range(max_breaks):
        if at >= len(a.units) or at >= len(b.units) or a.seg_of[at] < 0:
            break
        seg = a.segments[a.seg_of[at]]
        if seg.kind == "tools":
            names_a = sorted(s.text for s in a.segments if s.kind == "tools")
            names_b = sorted(s.text for s in b.segments if s.kind == "tools")
            if names_a != names_b:
                break
            breaks.append(Break("tools_reordered", seg.label, at, seg.label))
            a, b = _sorted_tools(a), _sorted_tools(b)
        elif seg.kind == "system":
            j_a, j_b, shared_after = _span_end(a, b, at)
            span = _text(a, at, j_a)
            if VOLATILE_RE.search(span):
                reason = "volatile"
            elif shared_after > 0:
                reason = "per_request"
            else:
                break                     # another system prompt altogether: another application, not a break
            breaks.append(Break(reason, seg.label, at, span))
            a, b = _without(a, at, max(j_a, at + 1)), _without(b, at, max(j_b, at + 1))
        else:
            msgs_a = [s.text for s in a.segments if s.kind == "message"][:-1]
            msgs_b = [s.text for s in b.segments if s.kind == "message"][:-1]
            if len(msgs_a) < 2 or sorted(msgs_a) != sorted(msgs_b) or msgs_a == msgs_b:
                break
            breaks.append(Break("examples_reordered", seg.label, at, _text(a, at, min(at + 12, len(a.units)))))
            break
        at = lcp(a.units, b.units)
    return prefix, max(prefix, at), breaks


class PrefixTracker:
    """Recent prompt layouts per (tenant, route): LRU over keys, a short history per key."""

    def __init__(self, history: int = 8, max_keys: int = 1024, max_units: int = 4096) -> None:
        self.history, self.max_keys, self.max_units = history, max_keys, max_units
        self._recent: LRUCache[tuple[str, str], deque[Layout]] = LRUCache(max_keys)

    def __len__(self) -> int:
        return len(self._recent)

    def observe(self, tenant: str, route: str, segs: list[Segment]) -> Finding:
        """Compare the prompt with the recent ones of its tenant and route, then remember it."""
        cur = layout(segs, self.max_units)
        key = (tenant, route)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = deque(maxlen=self.history)
        best = Finding(cur.total, 0, 0, [])
        for prev in recent:
            prefix, potential, breaks = diagnose(cur, prev)
            if (prefix, potential) > (best.prefix, best.potential):
                best = Finding(cur.total, prefix, potential, breaks)
        recent.append(cur)
        return best


def header(f: Finding) -> str:
    """The x-tokenomy-lint response header: prefix and potential shares, and the first break (ASCII only)."""
    out = f"prefix={f.prefix}/{f.units}; potential={f.potential}/{f.units}"
    b = f.first
    if b is not None:
        span = b.span.encode("ascii", "replace").decode().replace('"', "'")
        out += f'; break={b.reason}; at={b.segment}; span="{span}"'
    return out


def volatile_lines(text: str, max_len: int = 200) -> tuple[str, list[str]]:
    """The safe rewrite: lines of a system prompt that state a date or time (and nothing long), taken out.
    Returns (the text without them, the lines)."""
    keep, moved = [], []
    for line in text.split("\n"):
        if line.strip() and len(line) <= max_len and DATE_RE.search(line):
            moved.append(line.strip())
        else:
            keep.append(line)
    return "\n".join(keep).rstrip(), moved
