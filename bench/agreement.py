"""How much two answers agree, for benchmarks that score an answer against a reference answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def lcs_f1(a: Sequence[Any], b: Sequence[Any]) -> float:
    """F1 of the longest common subsequence of `a` and `b` (ROUGE-L over whatever units they hold: words, token
    ids); 0 when either is empty."""
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return 2 * prev[-1] / (len(a) + len(b))
