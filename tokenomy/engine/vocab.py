"""A model's vocabulary: token pieces, tokenization, special tokens and GGUF metadata.

`Vocab(path, vocab_only=True)` loads no weights (milliseconds, a few MB): the gateway tokenizes, renders chat
templates, detokenizes and compiles grammars with it while the weights live in the engine process. ModelRunner
is a Vocab over a fully loaded model.

Text with special tokens (a rendered chat) is tokenized piece by piece where that gives llama.cpp's exact tokens
(`Vocab.tokenize`): llama.cpp itself cuts such a text at its special tokens and tokenizes each piece between them
alone, so a piece seen before (a system prompt, an earlier turn, a document) is looked up, not tokenized again.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import threading
from array import array

import llama_cpp  # installs llama-cpp-python's log callback, which logs to its logger below
from cachetools import LRUCache

from tokenomy.engine import tuning

logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)

_backend_ready = False


def gpu_offload() -> bool:
    """Whether this llama-cpp-python build can offload layers to a GPU (built with CUDA, Metal or Vulkan)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def piece_cache() -> LRUCache[str, tuple[int, array]]:
    """Tokens by piece, least recently used out first once the pieces' characters pass PIECE_CACHE_CHARS: an
    entry is (the piece's characters, its tokens)."""
    return LRUCache(tuning.PIECE_CACHE_CHARS, getsizeof=lambda entry: entry[0])


class Vocab:
    def __init__(self, path: str, vocab_only: bool = False, gpu_layers: int = 0, main_gpu: int | None = 0) -> None:
        """The model at `path`: its vocabulary only, or all of it with `gpu_layers` layers on the GPU (-1: all)
        and `main_gpu` holding them (None: split over all visible GPUs)."""
        global _backend_ready
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file not found: {path}")
        self.path = path
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = vocab_only
        if not vocab_only and gpu_offload():     # a CPU build keeps llama.cpp's defaults: it has no device to name
            mparams.n_gpu_layers = gpu_layers
            if gpu_layers != 0 and main_gpu is not None:
                mparams.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
                mparams.main_gpu = main_gpu
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
        self._pieces = [self._piece(t) for t in range(self.n_vocab)]
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}
        self._piece_ids = piece_cache()
        self._piece_lock = threading.Lock()

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
        """llama.cpp's tokens for `text`; with `parse_special` and no `add_special` (a rendered chat), through the
        piece cache where that is exact (see the module's docstring)."""
        if parse_special and not add_special and self._cuts[1] is not None:
            return self._tokenize_pieces(text)
        return self._tokenize(text, add_special, parse_special)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def _tokenize_pieces(self, text: str) -> list[int]:
        specials, splitter = self._cuts
        assert splitter is not None
        out: list[int] = []
        at = 0
        for m in splitter.finditer(text):
            if m.start() > at:
                out.extend(self._piece_tokens(text[at:m.start()]))
            out.append(specials[m.group()])
            at = m.end()
        if at < len(text):
            out.extend(self._piece_tokens(text[at:]))
        return out

    def _piece_tokens(self, piece: str) -> array:
        with self._piece_lock:
            got = self._piece_ids.get(piece)
        if got is not None:
            return got[1]
        ids = array("i", self._tokenize(piece, False, False))
        if len(piece) <= self._piece_ids.maxsize // 4:
            with self._piece_lock:
                self._piece_ids.setdefault(piece, (len(piece), ids))
        return ids

    @functools.cached_property
    def _cuts(self) -> tuple[dict[str, int], re.Pattern[str] | None]:
        """The special tokens llama.cpp cuts a text at (control, user-defined and unknown ones) by their text, and
        a pattern finding them, when cutting there and tokenizing the pieces alone is exactly what llama.cpp does:
        a BPE vocabulary (SentencePiece ones prefix a piece with a space by what precedes it), no special token
        that strips the whitespace beside it, and no two special texts that can overlap (llama.cpp cuts at the
        longest first; the pattern at the leftmost). Otherwise no pattern: the whole text goes to llama.cpp. Found on
        first use, so a process that never tokenizes a chat (the engine's) does not pay for it at start (a pass over
        the vocabulary: 16 ms for SmolLM2's, 86 ms for Gemma's)."""
        kinds = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        kinds |= llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        strips = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        specials: dict[str, int] = {}
        exact = llama_cpp.llama_vocab_type(self.vocab) == llama_cpp.LLAMA_VOCAB_TYPE_BPE
        for t in range(self.n_vocab):
            attr = llama_cpp.llama_vocab_get_attr(self.vocab, t)
            if not attr & kinds:
                continue
            raw = llama_cpp.llama_vocab_get_text(self.vocab, t) or b""
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                exact = False
                continue
            if attr & strips or not text or text in specials:
                exact = False
            specials[text] = t
        if not exact or len(specials) > 512 or _overlapping(list(specials)):
            return specials, None
        alternatives = sorted(specials, key=len, reverse=True)
        return specials, re.compile("|".join(re.escape(t) for t in alternatives)) if specials else None

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


def _overlapping(texts: list[str]) -> bool:
    """Whether one text contains another, or a text's end is another's (or its own) start: where the two may cut a
    text differently (also when there are too many long texts to tell quickly)."""
    if sum(len(t) ** 2 for t in texts) > 1 << 21:
        return True
    whole = set(texts)
    starts = {t[:k] for t in texts for k in range(1, len(t))}
    for a in texts:
        if any(a[i:] in starts for i in range(1, len(a))):
            return True
        if any(a[i:j] in whole for i in range(len(a)) for j in range(i + 1, len(a) + 1) if j - i < len(a)):
            return True
    return False
