"""The offline tools stay off the serving path: no runtime module imports tokenomy.tools (only the CLI does)."""

from __future__ import annotations

from pathlib import Path

from tests.test_layers import imported_modules

PACKAGE = Path(__file__).resolve().parents[2] / "tokenomy"
ENTRY_POINTS = {PACKAGE / "cli.py"}  # the `tokenomy` command registers `tokenomy router ...`


def test_no_runtime_module_imports_the_offline_tools() -> None:
    offline = PACKAGE / "tools"
    runtime = [p for p in PACKAGE.rglob("*.py") if offline not in p.parents and p not in ENTRY_POINTS]
    assert len(runtime) > 50
    found = {str(p.relative_to(PACKAGE.parent)): sorted(n for n in imported_modules(p)
                                                        if n.startswith("tokenomy.tools")) for p in runtime}
    assert {k: v for k, v in found.items() if v} == {}
