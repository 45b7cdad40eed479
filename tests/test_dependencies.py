"""tokenomy uses its dependencies' public interfaces only (issue 48): no module of tokenomy imports a private
module or name of a third-party package (`from x._y import ...`, `import x._y`, `from x import _y`) or reads a
private attribute of one it imported (`x._y`, `x.y._z`). A minor release of a dependency may change those
without notice. The standard library is left out. What this cannot see is a private attribute of an object a
dependency returns (`client._transport`); backends/transport.py's docstring lists the ones it still has."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top != "tokenomy" and top not in sys.stdlib_module_names


def private_uses(source: str) -> list[str]:
    """Each private name of a third-party package the source imports or reads off a module it imported."""
    tree = ast.parse(source)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name):
                    modules.add(alias.asname or alias.name.split(".")[0])
                    if _private(alias.name):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _third_party(node.module):
            for alias in node.names:
                if _private(node.module) or _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                elif alias.name[:1].islower():      # a submodule perhaps: reading its private names counts too
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base: ast.expr = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_sees_each_kind_of_private_use() -> None:
    source = ("import httpx\nimport llama_cpp._logger\nfrom httpx._client import X\n"
              "from opentelemetry.sdk import _logs\nfrom re import _parser\nimport os\n"
              "httpx._config.X\nhttpx.Client\nos._exit\nself._pool\n")
    assert [u.split(": ")[1] for u in private_uses(source)] == [
        "import llama_cpp._logger", "from httpx._client import X", "from opentelemetry.sdk import _logs",
        "httpx._config"]


def test_tokenomy_uses_no_private_name_of_a_dependency() -> None:
    found = {str(path.relative_to(ROOT)): uses for path in sorted((ROOT / "tokenomy").rglob("*.py"))
             if (uses := private_uses(path.read_text(encoding="utf-8")))}
    assert found == {}
