"""The client's predicted output (OpenAI's Predicted Outputs) as one sequence's source of drafts (speculate.py)."""

from __future__ import annotations

import numpy as np

from tokenomy.engine import tuning


class Prediction:
    """The client's predicted output (OpenAI's Predicted Outputs) as one sequence's source of drafts.

    `cursor` is where the answer so far stands in the predicted tokens: the one expected next. Each output token is
    compared with it: a match moves it on; a miss re-aligns it behind the first occurrence of the answer's last
    NGRAM_MAX..NGRAM_MIN tokens in the prediction that ends where the cursor stood or later (else the latest before),
    or loses it (None) until the answer meets the prediction again. The draft is the prediction from the cursor on.
    `agreement`, the share of recent output tokens the prediction foresaw (a decaying average over every token,
    drafted or not), is the acceptance rate `plan` prices the drafts by: a wrong prediction soon drafts nothing, and
    one the answer rejoins after an edit drafts again once the answer has followed it for a few tokens."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.cursor: int | None = 0
        self.mark = 0                    # where the cursor last stood (re-alignment looks forward from here first)
        self.seen = 0                    # output tokens compared so far
        self.agreement = tuning.PRIOR_ACCEPTANCE

    def propose(self, output: list[int], k: int) -> list[int]:
        """Up to `k` predicted tokens to follow `output` (the answer so far); [] when the answer is nowhere in the
        prediction or has passed its end."""
        self.follow(output)
        if self.cursor is None or k <= 0:
            return []
        return self.tokens[self.cursor:self.cursor + k].tolist()

    def follow(self, output: list[int]) -> None:
        """Compare the output tokens not compared yet with the prediction, moving or re-aligning the cursor."""
        decay = tuning.ACCEPTANCE_DECAY
        for i in range(self.seen, len(output)):
            c = self.cursor
            hit = c is not None and c < len(self.tokens) and int(self.tokens[c]) == output[i]
            self.agreement = decay * self.agreement + (1 - decay) * float(hit)
            recent = output[max(0, i + 1 - tuning.NGRAM_MAX):i + 1]
            self.cursor = c + 1 if c is not None and hit else self._align(recent)
            if self.cursor is not None:
                self.mark = self.cursor
        self.seen = len(output)

    def _align(self, recent: list[int]) -> int | None:
        """The position after the first occurrence of the longest suffix of `recent` in the prediction that ends at
        `mark` or later, else after its latest occurrence; None when no suffix of NGRAM_MIN tokens or more occurs."""
        pred = self.tokens
        for n in range(min(tuning.NGRAM_MAX, len(recent)), tuning.NGRAM_MIN - 1, -1):
            if len(pred) < n:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(pred, n)
            ends = np.flatnonzero((windows == np.asarray(recent[-n:])).all(axis=1)) + n
            if len(ends):
                ahead = ends[ends >= self.mark]
                return int(ahead[0] if len(ahead) else ends[-1])
        return None
