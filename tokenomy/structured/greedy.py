"""Reference constrained decoding: one sequence, greedy, on llama.cpp's low-level API.

This is the semantics the engine's sampler reproduces per sequence (see constraint.py), small enough to read in
one screen; tests and ``bench/structured.py`` use it to measure compliance and TPOT with and without a
grammar. Fast-forward: tokens the grammar forces are fed in one ``llama_decode`` without sampling, so a
constrained answer takes fewer decode calls than it has tokens.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass

import numpy as np

from tokenomy.structured.constraint import Constraint
from tokenomy.structured.tokenizer import packaged_model_path


@dataclass
class Generation:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or grammar finished) | "length"
    decode_calls: int  # llama_decode calls after the prompt
    forced: int  # tokens fed by fast-forward
    seconds: float  # from the first sampled token to the end (TPOT numerator)
    mask_seconds: float  # time inside Constraint.allowed()
    prompt_tokens: int
    first_tokens: int  # tokens emitted by the first step (more than one when it was fast-forwarded)

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first step, in ms (NaN when nothing followed it)."""
        n = len(self.tokens) - self.first_tokens
        return self.seconds * 1000 / n if n > 0 else float("nan")


class GreedyRunner:
    """A llama.cpp model and one context for single-sequence greedy generation."""

    def __init__(self, model_path: str | None = None, n_ctx: int = 4096, n_threads: int = 0) -> None:
        """Load the model (default: packaged SmolLM2); pair it with ``load_tokenizer(same path)``."""
        import llama_cpp

        from tokenomy.structured.tokenizer import _quiet_llama

        _quiet_llama()
        self._ll = llama_cpp
        llama_cpp.llama_backend_init()
        path = model_path or packaged_model_path()
        mparams = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        cparams = llama_cpp.llama_context_default_params()
        threads = n_threads or os.cpu_count() or 1
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx = n_ctx
        self.eog = {t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)}
        self._buf = ctypes.create_string_buffer(256)

    def chat_prompt(self, system: str, user: str) -> str:
        """A system + user turn, ready for the assistant's answer."""
        return self.render([{"role": "system", "content": system}, {"role": "user", "content": user}])

    @staticmethod
    def render(messages: list[dict[str, str]]) -> str:
        """ChatML, the template SmolLM2-Instruct was trained with, ending with an open assistant turn."""
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        cap = len(data) + 8
        arr = (self._ll.llama_token * cap)()
        n = self._ll.llama_tokenize(self.vocab, data, len(data), arr, cap, False, True)
        if n < 0:
            raise ValueError("tokenization failed")
        return list(arr[:n])

    def piece(self, token: int) -> bytes:
        n = self._ll.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, False)
        return self._buf.raw[: max(n, 0)]

    def _decode(self, tokens: list[int]) -> np.ndarray:
        arr = (self._ll.llama_token * len(tokens))(*tokens)
        rc = self._ll.llama_decode(self.ctx, self._ll.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
        ptr = self._ll.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def generate(self, prompt: str, constraint: Constraint | None = None, max_tokens: int = 128) -> Generation:
        """Greedy continuation of ``prompt``; with a constraint, masked and fast-forwarded."""
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self.ctx), True)
        prompt_ids = self.tokenize(prompt)
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + {max_tokens} exceeds n_ctx {self.n_ctx}")
        logits = self._decode(prompt_ids)
        out: list[int] = []
        calls = forced = 0
        mask_s = 0.0
        t_first: float | None = None
        first = 0
        finish = "length"
        while len(out) < max_tokens:
            step: list[int] = constraint.forced()[: max_tokens - len(out)] if constraint else []
            if step:
                forced += len(step)
            else:
                if constraint is not None:
                    t0 = time.perf_counter()
                    logits[~constraint.allowed()] = -np.inf
                    mask_s += time.perf_counter() - t0
                tok = int(np.argmax(logits))
                if tok in self.eog:
                    finish = "stop"
                    break
                step = [tok]
            out.extend(step)
            if t_first is None:
                t_first, first = time.perf_counter(), len(out)
            if constraint is not None:
                constraint.advance(step)
                if constraint.is_done():
                    finish = "stop"
                    break
            if len(out) >= max_tokens:
                break
            logits = self._decode(step)
            calls += 1
        seconds = time.perf_counter() - t_first if t_first is not None else 0.0
        text = b"".join(self.piece(t) for t in out).decode("utf-8", errors="replace")
        return Generation(text, out, finish, calls, forced, seconds, mask_s, len(prompt_ids), first)

    def close(self) -> None:
        if self.ctx:
            self._ll.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self._ll.llama_model_free(self.model)
            self.model = None
