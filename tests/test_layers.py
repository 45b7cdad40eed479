"""Layers one way: tokenomy's parts import downward only. A part is a subpackage (api, engine, meter ...) or a
top-level module (gateway, config, generation ...); every import counts, those inside functions too."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tokenomy"

# part -> parts it must never import (directly or inside a function)
NEVER = {
    "generation": {"*"},                          # the internal request: below everything
    "engine": {"api", "batch", "pipeline", "router", "backends", "meter", "gateway", "cache", "context",
               "dialect"},
    "meter": {"backends", "pipeline", "api", "batch", "gateway", "dialect"},
    "batch": {"api"},
    "dialect": {"api", "batch", "gateway"},
    "backends": {"pipeline", "api", "batch", "gateway", "dialect"},
    "context": {"pipeline", "api", "batch", "gateway", "backends"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports by absolute name, inside functions too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def graph() -> dict[str, dict[str, list[str]]]:
    """part -> {imported part: [files that import it]}, tokenomy's own parts only."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent)
        part = _part(".".join(rel.with_suffix("").parts))
        for name in imported_modules(path):
            if name.split(".")[0] == "tokenomy" and "." in name and _part(name) != part:
                edges[part][_part(name)].append(str(rel))
    return edges


def test_the_graph_sees_the_package() -> None:
    g = graph()
    assert {"api", "batch", "engine", "meter", "pipeline", "backends"} <= set(g)
    assert "gateway" in g["api"] and "pipeline" in g["batch"]      # an import the rules allow is seen


def test_no_part_imports_what_lies_above_it() -> None:
    g = graph()
    found = {f"{part} -> {other}": files for part, never in NEVER.items() for other, files in g.get(part, {}).items()
             if "*" in never or other in never}
    assert found == {}


def test_only_the_cli_imports_the_http_app() -> None:
    g = graph()
    assert {part for part, to in g.items() if "api" in to} == {"cli"}


def test_no_import_cycle_between_parts() -> None:
    g = graph()

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in g.get(todo.pop(), {}):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = {f"{a} -> {b}": files for a in g for b, files in g[a].items() if a in reaches(b)}
    assert cycles == {}


def test_every_prometheus_metric_is_defined_in_meter_metrics() -> None:
    """tokenomy's families in meter/metrics.py; the engines' families in vLLM's names beside it, which metrics.py
    registers (meter/vllm_metrics.py)."""
    users = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                   if any(n.split(".")[0] == "prometheus_client" for n in imported_modules(p)))
    assert users == ["tokenomy/meter/metrics.py", "tokenomy/meter/vllm_metrics.py"]
