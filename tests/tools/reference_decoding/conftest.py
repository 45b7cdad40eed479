"""The reference greedy runner on the real SmolLM2 model, loaded once per session; the vocabulary and grammar
compiler come from tests/structured/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.structured.conftest import compiler, tokenizer  # noqa: F401


@pytest.fixture(scope="session")
def runner() -> Iterator[Any]:
    pytest.importorskip("llama_cpp")
    from tokenomy.tools.reference_decoding.greedy import GreedyRunner

    r = GreedyRunner(n_ctx=2048, n_threads=2)
    yield r
    r.close()
