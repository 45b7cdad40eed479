"""Routing data: JSONL rows of `{"prompt": ..., "<model>_correct": true|false, ...}`, one per prompt.

The format of ../shared/data/routing/routellm-dev.jsonl (`weak_correct`, `strong_correct`, plus optional
`benchmark` and `domain` strings). Any two models can be compared by naming their columns' prefixes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class RoutingDataError(ValueError):
    """The data file is missing, unreadable or not in the expected format; the message says where."""


@dataclass(frozen=True)
class RoutingData:
    weak: str
    strong: str
    prompts: list[str]
    weak_ok: np.ndarray  # float 0/1 per prompt
    strong_ok: np.ndarray
    benchmarks: list[str]  # "" where the row has none
    domains: list[str]

    @property
    def labelled(self) -> bool:
        """Whether every row says which model was right (only unlabelled with require_labels=False)."""
        return not (np.isnan(self.weak_ok).any() or np.isnan(self.strong_ok).any())

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, mask: np.ndarray) -> RoutingData:
        idx = np.flatnonzero(mask)
        return RoutingData(
            self.weak, self.strong, [self.prompts[i] for i in idx], self.weak_ok[idx], self.strong_ok[idx],
            [self.benchmarks[i] for i in idx], [self.domains[i] for i in idx],
        )

    def head(self, n: int) -> RoutingData:
        return self.subset(np.arange(len(self)) < n)


def load_routing_data(
    path: str | Path, weak: str = "weak", strong: str = "strong", require_labels: bool = True
) -> RoutingData:
    """Read and validate a routing JSONL file; raise RoutingDataError with the line number on bad input.

    With require_labels=False the `_correct` columns may be absent (calibrating a strong-call share needs
    only prompts); rows without them get NaN."""
    path = Path(path)
    if not path.is_file():
        raise RoutingDataError(f"{path}: no such file")
    if weak == strong:
        raise RoutingDataError(f"the weak and strong model must differ (both are {weak!r})")
    weak_col, strong_col = f"{weak}_correct", f"{strong}_correct"
    prompts, weak_ok, strong_ok, benchmarks, domains = [], [], [], [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RoutingDataError(f"{path}: cannot read: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RoutingDataError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise RoutingDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        needed = ("prompt", weak_col, strong_col) if require_labels else ("prompt",)
        missing = [c for c in needed if c not in row]
        if missing:
            raise RoutingDataError(f"{where}: missing {', '.join(missing)}{_column_hint(row, weak, strong)}")
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise RoutingDataError(f"{where}: 'prompt' must be a non-empty string")
        prompts.append(prompt)
        weak_ok.append(_correct(row[weak_col], where, weak_col) if weak_col in row else np.nan)
        strong_ok.append(_correct(row[strong_col], where, strong_col) if strong_col in row else np.nan)
        benchmarks.append(str(row.get("benchmark") or ""))
        domains.append(str(row.get("domain") or ""))
    if not prompts:
        raise RoutingDataError(f"{path}: no rows")
    return RoutingData(weak, strong, prompts, np.array(weak_ok), np.array(strong_ok), benchmarks, domains)


def _correct(value: object, where: str, column: str) -> float:
    # bool is a subclass of int; accept true/false and 0/1, nothing fuzzier.
    if isinstance(value, bool) or (isinstance(value, int | float) and value in (0, 1)):
        return float(value)
    raise RoutingDataError(f"{where}: {column!r} must be true/false (or 0/1), got {value!r}")


def _column_hint(row: dict, weak: str, strong: str) -> str:
    found = sorted(k for k in row if k.endswith("_correct"))
    if not found:
        return ""
    names = ", ".join(k.removesuffix("_correct") for k in found)
    return f" (looked for models {weak!r} and {strong!r}; this row has {names}: pass --weak and --strong)"
