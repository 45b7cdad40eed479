"""One sequence's output side: from a row of logits to the tokens, text and logprobs the client is sent.

A SequenceOutput owns everything that happens after a step for one sequence: sampling (with the grammar mask),
logprobs, the grammar's forced tokens, detokenising, the length and end-of-generation checks, and stop strings
(held back while they might still match, cut where they do: engine/stops.py). The engine calls `after_logits`
once per step that gave the sequence a logits row and gets back an `Emitted`; it never touches the sequence's
text itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenomy.engine.sampler import Sampler, chosen_logprob, confidence, token_logprobs
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.stops import StopScan
from tokenomy.engine.tokenizer import IncrementalDetokenizer
from tokenomy.engine.vocab import Vocab


@dataclass
class TokenLogprob:
    """One emitted token's logprob under the model's raw distribution, and the most likely alternatives
    (`top`, (token id, logprob), most likely first; empty unless the request asked for top_logprobs)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Emitted:
    """What one step produced for one sequence."""

    text: str                       # releasable now (a possible stop-string start is held back)
    tokens: list[int]               # appended to the output this step
    token_logprobs: list[float]     # one per token in `tokens`
    logprobs: list[TokenLogprob]    # one per token in `tokens` when the request asked for logprobs
    finish_reason: str | None       # stop | length | handover, or None while the sequence goes on
    accepted: int = 0               # draft tokens accepted (the first `accepted` of `tokens`)
    signals: list[float] = field(default_factory=list)   # the confidence before each token, when asked (params.signal)


class SequenceOutput:
    def __init__(self, params: SamplingParams, prompt: list[int], tokens: list[int], vocab: Vocab,
                 max_model_len: int) -> None:
        """`tokens` is the sequence's output list: sampled tokens are appended to it."""
        self.params = params
        self.vocab = vocab
        self.max_model_len = max_model_len
        self.n_prompt = len(prompt)
        self.sampler = Sampler(params, prompt)
        self.detok = IncrementalDetokenizer(vocab)
        self.tokens = tokens
        self.stops = StopScan(params.stop)   # the text so far, cut at a stop string once one matched
        self.sum_logprob = 0.0
        self.min_logprob = 0.0

    @property
    def text(self) -> str:
        return self.stops.text

    @property
    def mean_logprob(self) -> float:
        return self.sum_logprob / max(len(self.tokens), 1)

    def after_logits(self, raw: np.ndarray, constraint: Any = None, draft: list[int] | None = None) -> Emitted:
        """Sample from `raw` (one row of logits), advance the constraint and return what to emit. With a
        `draft` (speculated tokens fed after the sequence's last token), `raw` holds one row per fed token:
        each draft token is verified against its row (Sampler.sample), and the first one rejected is replaced
        by the row's own sample; when all are accepted, the last row adds one more token."""
        p, eog = self.params, self.vocab.eog
        draft = draft or []
        rows = raw.reshape(-1, raw.shape[-1])
        new: list[int] = []
        chosen: list[float] = []
        lps: list[TokenLogprob] = []
        signals: list[float] = []
        for i in range(len(draft) + 1):
            row = rows[i]
            d = draft[i] if i < len(draft) else None
            if p.signal is not None:
                c = confidence(row, p.signal)
                if (p.handover_below is not None and c < p.handover_below and constraint is None
                        and len(self.tokens) >= p.handover_after):
                    return self._handover(signals)
                signals.append(c)
            token = self.sampler.sample(row, constraint.allowed() if constraint is not None else None, draft=d)
            self.sampler.accept(token)
            new.append(token)
            if p.logprobs:
                lp, tops = token_logprobs(row, token, p.top_logprobs)
                lps.append(TokenLogprob(token, lp, tops))
            else:
                lp = chosen_logprob(row, token)
            self.sum_logprob += lp
            self.min_logprob = min(self.min_logprob, lp)
            chosen.append(lp)
            if token != d or token in eog:
                break
        accepted = len(new) - 1
        if constraint is not None:
            constraint.advance(new)
            forced = constraint.forced()
            if forced and new[-1] not in eog:
                constraint.advance(forced)
                for t in forced:
                    self.sampler.accept(t)
                new += forced
                chosen += [0.0] * len(forced)          # forced tokens have probability 1 under the grammar
                if p.logprobs:
                    lps += [TokenLogprob(t, 0.0) for t in forced]

        finish: str | None = None
        text = ""
        emitted: list[int] = []
        for t in new:
            if t in eog and not p.ignore_eos:
                finish = "stop"
                break
            self.tokens.append(t)
            emitted.append(t)
            text += self.detok.add(t)
            if len(self.tokens) >= p.max_tokens or self.n_prompt + len(self.tokens) >= self.max_model_len:
                finish = "length"
                break
        if constraint is not None and finish is None and constraint.is_done():
            finish = "stop"
        if finish:
            text += self.detok.flush()
        out, stop_hit = self.stops.feed(text, final=finish is not None)
        return Emitted(text=out, tokens=emitted, token_logprobs=chosen[:len(emitted)], logprobs=lps[:len(emitted)],
                       finish_reason="stop" if stop_hit else finish, accepted=min(accepted, len(emitted)),
                       signals=signals[:len(emitted)])

    def _handover(self, signals: list[float]) -> Emitted:
        """The model is unsure of its next token: end here without sampling it, releasing all text so far (a
        held-back stop-string start included: whoever continues sees the whole text)."""
        out = self.stops.release_all(self.detok.flush())
        return Emitted(text=out, tokens=[], token_logprobs=[], logprobs=[], finish_reason="handover",
                       signals=signals)
