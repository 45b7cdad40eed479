"""Short example strings for a schema's ``pattern`` regexes, for steering a string to a valid end.

JSON Schema patterns are unanchored (``"/api/\\d+"`` matches anywhere in the string), so once a model has written
anything at all inside such a string, appending one match of the pattern completes it. A byte-by-byte search
cannot find that match (every byte stays valid until the literal is complete), so the constraint tries these
examples first (``constraint.closing_path``).
"""

from __future__ import annotations

import json
import re
from typing import Any

try:  # Python 3.11+
    import re._constants as _c  # type: ignore[import-not-found]
    import re._parser as _p  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

_PRINTABLE = [chr(c) for c in range(0x21, 0x7F)] + [" "]
_CATEGORY = {_c.CATEGORY_DIGIT: "0", _c.CATEGORY_WORD: "a", _c.CATEGORY_SPACE: " ",
             _c.CATEGORY_NOT_DIGIT: "a", _c.CATEGORY_NOT_WORD: "-", _c.CATEGORY_NOT_SPACE: "a"}
MAX_EXAMPLE = 256  # longer examples are not worth steering toward


class _Unsupported(Exception):
    pass


def shortest_match(pattern: str) -> str | None:
    """A short string that ``re.search(pattern, s)`` matches (the shortest repeat counts and branches), or None
    when the pattern does not parse or uses what this does not model (back-references, lookarounds)."""
    try:
        out = _emit(_p.parse(pattern))
    except (_Unsupported, re.error, RecursionError, OverflowError, ValueError, TypeError):
        return None
    if len(out) > MAX_EXAMPLE:
        return None
    try:
        return out if re.search(pattern, out) else None
    except re.error:
        return None


def _emit(items: Any) -> str:
    return "".join(_one(op, av) for op, av in items)


def _one(op: Any, av: Any) -> str:
    if op is _c.LITERAL:
        return chr(av)
    if op is _c.NOT_LITERAL:
        return next(ch for ch in _PRINTABLE if ord(ch) != av)
    if op is _c.ANY:
        return "a"
    if op is _c.IN:
        return _in_class(av)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
        lo, _hi, sub = av
        return _emit(sub) * lo
    if op is _c.SUBPATTERN:
        return _emit(av[-1])
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _emit(av)
    if op is _c.BRANCH:
        return min((_emit(b) for b in av[1]), key=len)
    if op is _c.AT:
        return ""
    if op is _c.CATEGORY:
        return _CATEGORY.get(av, "a")
    raise _Unsupported(op)


def _in_class(items: list[tuple[Any, Any]]) -> str:
    negate = bool(items) and items[0][0] is _c.NEGATE
    if not negate:
        op, av = items[0]
        if op is _c.LITERAL:
            return chr(av)
        if op is _c.RANGE:
            return chr(av[0])
        if op is _c.CATEGORY:
            return _CATEGORY.get(av, "a")
        raise _Unsupported(op)
    rx = re.compile("[^" + "".join(_class_text(op, av) for op, av in items[1:]) + "]")
    return next((ch for ch in _PRINTABLE if rx.fullmatch(ch)), "a")


def _class_text(op: Any, av: Any) -> str:
    if op is _c.LITERAL:
        return re.escape(chr(av))
    if op is _c.RANGE:
        return re.escape(chr(av[0])) + "-" + re.escape(chr(av[1]))
    if op is _c.CATEGORY:
        return {_c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_WORD: r"\w", _c.CATEGORY_SPACE: r"\s",
                _c.CATEGORY_NOT_DIGIT: r"\D", _c.CATEGORY_NOT_WORD: r"\W", _c.CATEGORY_NOT_SPACE: r"\S"}[av]
    raise _Unsupported(op)


def pattern_examples(schema: Any) -> list[bytes]:
    """The JSON-string-body bytes (escaped as they appear between the quotes) of an example for every distinct
    ``pattern`` in ``schema``, shortest first."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "pattern" and isinstance(v, str):
                    found.add(v)
                elif k not in ("enum", "const", "default", "examples"):
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    out = {json.dumps(ex)[1:-1].encode() for p in found if (ex := shortest_match(p))}
    return sorted(out, key=len)
