"""Import a script under bench/ as a module, so tests can call its functions and its main()."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_bench(filename: str) -> ModuleType:
    """Scripts import their helpers beside them (bench/servers.py, bench/agreement.py), as `python bench/x.py`
    lets them: bench/ goes on sys.path as it does for a script."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(Path(filename).stem, ROOT / "bench" / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module
