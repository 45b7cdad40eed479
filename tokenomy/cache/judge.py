"""Is a cached answer the answer the model gives now? The comparison behind a semantic-cache explore.

``same_answer`` is the default judge: equal after normalisation. JSON answers (structured output, tool-call
arguments) are compared parsed, so key order and spacing do not matter; any other text after collapsing
whitespace, case kept. For deterministic and structured answers that is exact. For free text it is strict: a
fresh answer worded differently counts as a wrong hit, so online control errs towards serving less, never more.
A judge model for free text plugs in through ``Judge`` (the cache stage's ``judge`` argument).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

# (question, cached response {"text", "tool_calls", ...}, fresh text, fresh tool calls) -> the same answer?
Judge = Callable[[str, Mapping[str, Any], str, list[dict[str, Any]] | None], bool]


def _norm(text: str) -> Any:
    s = text.strip()
    if s[:1] in ("{", "["):
        try:
            return json.loads(s)
        except ValueError:
            pass
    return " ".join(s.split())


def _calls(calls: list[dict[str, Any]] | None) -> list[tuple[Any, Any]]:
    out = []
    for c in calls or []:
        fn = c.get("function", c)
        args = fn.get("arguments")
        out.append((fn.get("name"), _norm(args) if isinstance(args, str) else args))
    return out


def same_answer(question: str, cached: Mapping[str, Any], text: str,
                tool_calls: list[dict[str, Any]] | None = None) -> bool:
    """True when the fresh answer (``text``, ``tool_calls``) equals the cached one after normalisation."""
    return _norm(cached.get("text") or "") == _norm(text or "") and \
        _calls(cached.get("tool_calls")) == _calls(tool_calls)
