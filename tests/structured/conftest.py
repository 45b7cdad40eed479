"""Real SmolLM2 vocabulary and model, loaded once per session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tokenomy.structured.grammar import GrammarCompiler


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    pytest.importorskip("llama_cpp")
    from tokenomy.structured.token_tables import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def compiler(tokenizer: Any) -> Iterator[GrammarCompiler]:
    c = GrammarCompiler(tokenizer, timeout_s=10.0)
    yield c
    c.close()
