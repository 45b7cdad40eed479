"""The per-sequence grammar constraint the engine's sampler consults at every decode step.

Protocol for one step (the engine owns the loop)::

    ff = c.forced()                 # tokens the grammar dictates: append them without sampling
    if ff: append(ff); c.advance(ff)
    else:  logits[~c.allowed()] = -inf; t = sample(logits); append([t]); c.advance([t])
    stop when c.is_done() (or EOS was sampled, which c.advance also records)

``allowed()`` lets EOS through exactly when the output so far is a complete document; ``is_complete()`` says
whether stopping now (e.g. at max_tokens) leaves a valid document.
The mask is computed by llguidance in Rust straight into a packed int32 bitmap (one bit per token) and
unpacked with one vectorised ``np.unpackbits``; there is no per-token Python work.

Loop breaker: a small model inside a long schema sometimes repeats one span verbatim until max_tokens (the same
array item, the same words in a string, the same nested object one level deeper). When the output ends with
``LOOP_REPEATS`` back-to-back copies of a span of at most ``LOOP_MAX_PERIOD`` tokens (two copies once the span
is ``LOOP_LONG_PERIOD`` tokens or more; at least ``LOOP_MIN_SPAN`` tokens in all), ``allowed()`` also bans
the one token that would continue the copy, as long as the grammar allows some other token. That only
removes tokens from the grammar's mask, so every answer still conforms to the grammar.

Wrap-up (opt-in, ``soft_limit``): past ``soft_limit`` tokens, the mask keeps only the tokens that end
something, when the grammar allows any: EOS once the document is complete, else a closing quote inside a JSON
string, else ``]`` / ``}`` outside one. The grammar still decides when closing is legal (required keys,
minItems), so a long answer winds down instead of running into max_tokens; again only a subset of the mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenomy.structured.grammar import CompiledGrammar, clean_reason

LOOP_REPEATS = 3  # back-to-back copies of a span that count as a loop
LOOP_MAX_PERIOD = 128  # longest span (tokens) looked for
LOOP_MIN_SPAN = 12  # a loop covers at least this many tokens (so "0000" or "[1, 1, 1]" is left alone)
LOOP_LONG_PERIOD = 16  # a span at least this long counts as a loop after two copies (e.g. a repeated array item)

_first_bytes: dict[int, np.ndarray] = {}  # id(tokenizer) -> first byte of each token (-1: empty)


def first_bytes(tokenizer: Any) -> np.ndarray:
    """First byte of every token's text, as int16 (-1 for tokens with no bytes); cached per tokenizer."""
    key = id(tokenizer)
    if key not in _first_bytes:
        out = np.full(tokenizer.vocab_size, -1, dtype=np.int16)
        for t in range(tokenizer.vocab_size):
            b = tokenizer.decode_bytes([t])
            if b:
                out[t] = b[0]
        _first_bytes[key] = out
    return _first_bytes[key]


def loop_continuation(history: list[int], repeats: int = LOOP_REPEATS, max_period: int = LOOP_MAX_PERIOD,
                      min_span: int = LOOP_MIN_SPAN) -> int | None:
    """The token that would extend a verbatim loop at the end of ``history``, or None.

    A loop of period p: the last ``max(r * p, min_span)`` tokens satisfy ``h[i] == h[i - p]``, with r =
    ``repeats``, or 2 once p >= LOOP_LONG_PERIOD; the token that continues it is ``h[-p]``. The shortest such p
    wins.
    """
    n = len(history)
    if n < min_span:
        return None
    tail = np.asarray(history[-(max_period * repeats + min_span):], dtype=np.int64)
    # Only periods p with tail[-1] == tail[-1 - p] can qualify: one vectorised compare finds them.
    back = tail[-2:-max_period - 2:-1]
    for p in (np.flatnonzero(back == tail[-1]) + 1).tolist():
        span = max((repeats if p < LOOP_LONG_PERIOD else min(repeats, 2)) * p, min_span)
        if span > len(tail):
            continue
        window = tail[-span:]
        if np.array_equal(window[p:], window[:-p]):
            return int(tail[-p])
    return None


class ConstraintError(RuntimeError):
    """The grammar cannot go on: a token outside the mask was appended (a sampler bug), or llguidance hit a
    lexer/parser limit mid-answer (rare: compile probes the usual causes). End the sequence with an error."""


class Constraint:
    """One sequence's position in a compiled grammar."""

    def __init__(self, grammar: CompiledGrammar, break_loops: bool = True, soft_limit: int | None = None) -> None:
        self.grammar = grammar
        self.break_loops = break_loops
        self.soft_limit = soft_limit  # tokens after which the mask prefers closing tokens (None: never)
        self.wrapups = 0  # masks narrowed by the wrap-up rule
        self._in_string = False  # JSON lexer state of the text so far (for the wrap-up rule)
        self._escape = False
        self.history: list[int] = []  # tokens consumed so far (the loop breaker reads it)
        self.loops_broken = 0
        self.n_vocab = grammar.n_vocab
        self._matcher = grammar.matcher()
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self.steps = 0  # masks computed
        self.forced_tokens = 0  # tokens returned by forced(), i.e. fed without sampling

    def bitmask(self) -> np.ndarray:
        """Packed mask for the next token: int32 words, bit ``t % 32`` of word ``t // 32`` set iff allowed."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self.steps += 1
        return self._bits

    def allowed(self) -> np.ndarray:
        """Bool mask of shape (n_vocab,) for the next token: the grammar's, minus a loop's continuation."""
        packed = self.bitmask().view(np.uint8)
        mask = np.unpackbits(packed, count=self.n_vocab, bitorder="little").view(np.bool_)
        if self.break_loops:
            tok = loop_continuation(self.history)
            if tok is not None and tok < self.n_vocab and mask[tok] and np.count_nonzero(mask) > 1:
                mask[tok] = False
                self.loops_broken += 1
        if self.soft_limit is not None and len(self.history) >= self.soft_limit:
            self._wrap_up(mask)
        return mask

    def _wrap_up(self, mask: np.ndarray) -> None:
        """Narrow ``mask`` in place to closing tokens, when the grammar allows one (see the module docstring)."""
        eos = self.grammar.tokenizer.eos_token
        if eos < self.n_vocab and mask[eos]:
            keep = np.zeros_like(mask)
            keep[eos] = True
        else:
            first = first_bytes(self.grammar.tokenizer)[: self.n_vocab]
            keep = mask & ((first == 0x22) if self._in_string else ((first == 0x5D) | (first == 0x7D)))
        if keep.any():
            mask &= keep
            self.wrapups += 1

    def _track(self, tokens: list[int]) -> None:
        """Follow whether the text so far ends inside a JSON string (quotes and backslash escapes)."""
        for byte in self.grammar.tokenizer.decode_bytes(tokens):
            if self._escape:
                self._escape = False
            elif self._in_string and byte == 0x5C:
                self._escape = True
            elif byte == 0x22:
                self._in_string = not self._in_string

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Set the logits of disallowed tokens to -inf in place (first n_vocab entries); returns ``logits``."""
        logits[: self.n_vocab][~self.allowed()] = -np.inf
        return logits

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (may be empty); the caller appends them and calls ``advance``."""
        if self._matcher.is_stopped():
            return []
        ff = list(self._matcher.compute_ff_tokens())
        self.forced_tokens += len(ff)
        return ff

    def advance(self, tokens: list[int]) -> None:
        """Consume tokens actually appended to the sequence; raises ConstraintError if one is not allowed."""
        if not tokens:
            return
        if not self._matcher.consume_tokens(list(tokens)):
            raise ConstraintError(clean_reason(self._matcher.get_error()) or f"tokens {tokens} rejected")
        self.history.extend(tokens)
        if self.soft_limit is not None:
            self._track(tokens)

    def is_done(self) -> bool:
        """The grammar accepts no further token except EOS: the answer is finished (or the matcher failed)."""
        return self._matcher.is_stopped()

    def is_complete(self) -> bool:
        """The output so far is a complete valid document (stopping here is allowed)."""
        return self._matcher.is_accepting()

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (speculative decoding, preemption)."""
        if n and not self._matcher.rollback(n):
            raise ConstraintError(clean_reason(self._matcher.get_error()) or f"cannot roll back {n} tokens")
        if n:
            del self.history[-n:]
            if self.soft_limit is not None:
                self._in_string = self._escape = False
                self._track(self.history)

    @property
    def error(self) -> str:
        """Why the grammar stopped in error, or empty."""
        return clean_reason(self._matcher.get_error()) if self._matcher.is_error() else ""
