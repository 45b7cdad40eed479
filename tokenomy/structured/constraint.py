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
"""

from __future__ import annotations

import numpy as np

from tokenomy.structured.grammar import CompiledGrammar, clean_reason


class ConstraintError(RuntimeError):
    """The grammar cannot go on: a token outside the mask was appended (a sampler bug), or llguidance hit a
    lexer/parser limit mid-answer (rare: compile probes the usual causes). End the sequence with an error."""


class Constraint:
    """One sequence's position in a compiled grammar."""

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
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
        """Bool mask of shape (n_vocab,) for the next token."""
        packed = self.bitmask().view(np.uint8)
        return np.unpackbits(packed, count=self.n_vocab, bitorder="little").view(np.bool_)

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

    @property
    def error(self) -> str:
        """Why the grammar stopped in error, or empty."""
        return clean_reason(self._matcher.get_error()) if self._matcher.is_error() else ""
