"""Import a script under bench/ as a module, so tests can call its functions and its main()."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_bench(filename: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(filename).stem, ROOT / "bench" / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
