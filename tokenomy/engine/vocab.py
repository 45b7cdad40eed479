"""A model's vocabulary: token pieces, tokenization, special tokens and GGUF metadata.

`Vocab(path, vocab_only=True)` loads no weights (milliseconds, a few MB): the gateway tokenizes, renders chat
templates, detokenizes and compiles grammars with it while the weights live in the engine process. ModelRunner
is a Vocab over a fully loaded model.
"""

from __future__ import annotations

import ctypes
import logging
import os

import llama_cpp
import llama_cpp._logger  # noqa: F401  (installs llama-cpp-python's log callback, which honours the level below)

llama_cpp._logger.logger.setLevel(logging.ERROR)

_backend_ready = False


class Vocab:
    def __init__(self, path: str, vocab_only: bool = False) -> None:
        global _backend_ready
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file not found: {path}")
        self.path = path
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = vocab_only
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
        self._pieces = [self._piece(t) for t in range(self.n_vocab)]
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}

    def _piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def piece(self, token: int) -> bytes:
        """Bytes of a token as text (control tokens render empty)."""
        return self._pieces[token]

    def same_tokens(self, other: Vocab) -> bool:
        """Whether both vocabularies map every token id to the same piece (a draft model must share them)."""
        return self.n_vocab == other.n_vocab and self._pieces == other._pieces

    def special_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", errors="replace")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def meta(self, key: str) -> str | None:
        size = 1 << 16
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, size)
        if n < 0:
            return None
        if n >= size:
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", errors="replace")

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    def close(self) -> None:
        if getattr(self, "model", None):
            llama_cpp.llama_model_free(self.model)
            self.model = None
