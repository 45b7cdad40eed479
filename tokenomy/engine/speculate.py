"""Speculative decoding from the sequence's own tokens (prompt lookup) or from the output the client predicted,
sized by what a step measurably costs.

Drafts: the last ``n`` tokens (``NGRAM_MAX`` down to ``NGRAM_MIN``, tuning.py) are looked up in the sequence's
earlier tokens, prompt and output; the tokens that followed their latest earlier occurrence are the draft. No
second model is needed, and grounded tasks (summaries, answers from given passages, edits) copy long spans. A
request that sent a predicted output (OpenAI's Predicted Outputs) drafts from that instead (``Prediction``: the
prediction from where the answer so far stands in it, priced by how well the answer has followed it).

Sizing: a step that feeds ``n`` tokens costs ``t(n)`` seconds, measured from the engine's own steps
(``StepCost``); a sequence's drafts are accepted at a rate ``a`` tracked per sequence. With ``k`` drafted
tokens a sequence expects ``(1 - a^(k+1)) / (1 - a)`` tokens from the step instead of one. ``plan`` grows the
drafts, each time by the sequence and number of tokens that raise the batch's expected tokens per second
``sum(E_i) / t`` most, and stops when nothing does (with KV streams ``t`` counts a sequence's drafts as a ubatch
of their own, as llama.cpp runs them): on a compute-bound CPU, where verifying k tokens costs nearly k steps, it
drafts only behind long accepted runs, and as the batch fills, the step's extra cost outweighs any one
sequence's gain, so it drafts less. Drafting nothing is always a candidate, so speculation never plans a slower
step than plain decoding by its own measurements.

Verification (in ``SequenceOutput.after_logits``) keeps the target distribution: a greedy request accepts a
draft token when it is the argmax; a sampled one accepts draft token d with probability p(d) and otherwise
samples from p with d removed, which is rejection sampling for a draft that puts all its mass on d.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.sequence import Sequence

if TYPE_CHECKING:
    from tokenomy.engine.draft import DraftModel



def propose(tokens: list[int], k: int, ngram_max: int = tuning.NGRAM_MAX,
            ngram_min: int = tuning.NGRAM_MIN) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix of ``tokens`` (of
    ``ngram_max`` down to ``ngram_min`` tokens) found; [] when none occurs or ``k`` is 0."""
    if k <= 0 or len(tokens) < ngram_min + 1:
        return []
    arr = np.asarray(tokens[-tuning.SEARCH_WINDOW:], dtype=np.int64)
    n_all = len(arr)
    for n in range(min(ngram_max, n_all - 1), ngram_min - 1, -1):
        suffix = arr[-n:]
        # windows starting at i cover arr[i:i+n]; the last window (the suffix itself) is left out
        hits = np.flatnonzero(arr[: n_all - n] == suffix[0])
        for i in hits[::-1]:
            if np.array_equal(arr[i:i + n], suffix):
                follow = arr[i + n: i + n + k]
                if len(follow):
                    return follow.tolist()
    return []


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


@dataclass
class StepCost:
    """Measured seconds of a step by the number of tokens it fed, as decaying averages per count."""

    seconds: dict[int, float] = field(default_factory=dict)

    def observe(self, n_tokens: int, dt: float) -> None:
        if n_tokens <= 0 or dt <= 0:
            return
        old = self.seconds.get(n_tokens)
        self.seconds[n_tokens] = dt if old is None else tuning.COST_DECAY * old + (1 - tuning.COST_DECAY) * dt

    def predict(self, n: int) -> float | None:
        """Seconds for a step of ``n`` tokens: the measured average, else linear between the nearest measured
        counts on either side, else the line through the two nearest below (or None without two)."""
        s = self.seconds
        if n in s:
            return s[n]
        below = sorted(m for m in s if m < n)
        above = sorted(m for m in s if m > n)
        if below and above:
            lo, hi = below[-1], above[0]
            return s[lo] + (s[hi] - s[lo]) * (n - lo) / (hi - lo)
        pts = below[-2:] if len(below) >= 2 else above[:2] if len(above) >= 2 else []
        if len(pts) < 2:
            return None
        (a, b) = pts
        slope = max((s[b] - s[a]) / (b - a), 0.0)
        return max(s[b] + slope * (n - b), 1e-9)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a step yields for one sequence with ``k`` drafts accepted independently at ``acceptance``."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1 - a ** (k + 1)) / (1 - a)


def plan(base_tokens: int, base_yield: int, candidates: list[tuple[float, int]], cost: StepCost,
         budget: int, draft_s: Callable[[int], float | None] | None = None,
         fixed_s: list[float] | None = None, apart: list[int] | None = None) -> list[int]:
    """Draft lengths for ``candidates`` (acceptance rate, tokens available to draft) in a step that already
    feeds ``base_tokens`` and yields ``base_yield`` tokens (one per sequence that samples, candidates included),
    with at most ``budget`` extra tokens: grown where that raises the step's expected tokens per second, by the
    number of tokens (one or more) that raises it most each time, so a first draft token too dear alone can
    still come with the ones after it. When drafts cost time to make (a draft model), ``draft_s(k)`` is the
    seconds to make drafts whose longest is k tokens and ``fixed_s[i]`` what candidate i adds to the step by
    drafting at all (its share of a one-time cost, such as the draft model catching up on its prompt).

    ``apart``: with one KV stream per sequence, the chunk lengths of the step's other sequences. llama.cpp's
    equal split then feeds every sequence's first token in one ubatch and a sequence's tokens past that in
    further ubatches, each reading all the weights again, so a step is costed as one of a token per sequence
    plus, for each sequence feeding more (a prompt chunk, or k drafts), a step of its extra tokens (an upper
    bound: neighbouring streams feeding alike share a ubatch); a sequence alone in its step is one ubatch.
    Without it the step is one of ``base_tokens`` plus all drafts (the unified buffer). All zeros when the cost
    of a larger step (or of drafting) is not measured yet."""
    n = len(candidates)
    ks = [0] * n
    fixed = fixed_s or [0.0] * n
    split = apart is not None and len(apart) + n > 1
    if split:
        assert apart is not None
        parts = [cost.predict(len(apart) + n)] + [cost.predict(x - 1) for x in apart if x > 1]
        base_t = None if None in parts else sum(p for p in parts if p is not None)
    else:
        base_t = cost.predict(base_tokens)
    if base_t is None or not candidates:
        return ks
    own = [0.0] * n                  # split: each drafting candidate's own ubatch
    ub = [cost.predict(k) if k else 0.0 for k in range(tuning.MAX_DRAFT + 1)] if split else []
    paid = 0.0
    yields = [1.0] * n
    total, extra = float(max(base_yield, n)), 0
    rate = total / base_t
    while extra < budget:
        best, best_d, best_rate = -1, 0, rate
        longest = max(ks)
        # the predictions this round needs, once each (not per candidate): a step's, and drafting's, by size
        step = ([None] + [cost.predict(base_tokens + extra + d) for d in range(1, tuning.MAX_DRAFT + 1)]
                if not split else [])
        made: list[float | None] = [0.0] * (tuning.MAX_DRAFT + 1)
        if draft_s is not None:
            made = [None] + [draft_s(max(longest, k)) for k in range(1, tuning.MAX_DRAFT + 1)]
        for i, (acc, avail) in enumerate(candidates):
            for d in range(1, min(avail, tuning.MAX_DRAFT) - ks[i] + 1):
                if extra + d > budget:
                    break
                k = ks[i] + d
                if split:
                    mine = ub[k]
                    t = None if mine is None else base_t + sum(own) - own[i] + mine
                else:
                    t = step[d]
                if t is None:
                    break
                t_i = t + paid + (fixed[i] if ks[i] == 0 else 0.0)
                if draft_s is not None:
                    if made[k] is None:
                        return [0] * n
                    t_i += made[k] or 0.0
                r = (total + expected_tokens(acc, k) - yields[i]) / t_i
                if r > best_rate:
                    best, best_d, best_rate = i, d, r
        if best < 0:
            break
        if ks[best] == 0:
            paid += fixed[best]
        ks[best] += best_d
        if split:
            own[best] = ub[ks[best]] or 0.0
        new_yield = expected_tokens(candidates[best][0], ks[best])
        total += new_yield - yields[best]
        yields[best] = new_yield
        extra += best_d
        rate = best_rate
    return ks


def update_acceptance(old: float, drafted: int, accepted: int) -> float:
    """A sequence's acceptance rate after a step that verified ``drafted`` tokens and accepted ``accepted``."""
    if drafted <= 0:
        return old
    return tuning.ACCEPTANCE_DECAY * old + (1 - tuning.ACCEPTANCE_DECAY) * (accepted / drafted)


def acceptance(seq: Sequence) -> float:
    """The rate a sequence's drafts are expected to be accepted at: its prediction's agreement with the answer when
    it drafts from a predicted output, else its own recent record."""
    return seq.prediction.agreement if seq.prediction is not None else seq.spec_acceptance


class Speculator:
    """The drafts of one engine's steps: which of a step's sequences draft, the tokens proposed (from the request's
    predicted output when it sent one, else by prompt lookup, or by the draft model when one is configured) and how
    many of them are worth verifying (plan)."""

    def __init__(self, cfg: EngineConfig, max_model_len: int, drafter: DraftModel | None = None) -> None:
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.drafter = drafter

    def drafts(self, step: list[tuple[Sequence, int]], free_cells: int, cost: StepCost) -> dict[Sequence, list[int]]:
        """Drafts for the decoding sequences of `step` (the scheduler's plan), as many tokens each as `plan` finds
        worth by `cost` (the engine's measured steps; often none), within the step's token budget and
        `free_cells`."""
        if not self.cfg.speculative:
            return {}
        base = sum(n for _, n in step)
        found: list[tuple[Sequence, int]] = []          # sequences that may draft, and how many tokens at most
        for seq, n in step:
            if (n != 1 or seq.pending != 1 or seq.constraint is not None or not seq.params.may_speculate
                    or seq.dropped):
                continue
            room = min(tuning.MAX_DRAFT, seq.params.max_tokens - len(seq.output) - 1,
                       self.max_model_len - seq.num_kv_tokens - 1)
            if room > 0:
                found.append((seq, room))
        if not found:
            return {}
        # a sequence with a predicted output drafts from it, and only from it (its drafts are its prediction's)
        proposals = {seq: seq.prediction.propose(seq.output, room) for seq, room in found
                     if seq.prediction is not None}
        found = [(seq, len(proposals[seq])) if seq in proposals else (seq, room) for seq, room in found
                 if seq not in proposals or proposals[seq]]
        draft_s, fixed_s = None, None
        if self.drafter is None:
            proposals.update({seq: p for seq, room in found if seq not in proposals
                              and (p := propose(seq.tokens, room))})
            found = [(seq, len(proposals[seq])) for seq, _ in found if seq in proposals]
            if not found:
                return {}
        elif any(seq not in proposals for seq, _ in found):
            # the plan charges the draft model's rounds to every candidate (an over-estimate for predicted ones)
            draft_s = functools.partial(self.drafter.seconds, width=len(found))
            # a sequence new to the draft model pays its prompt there once: spread over the tokens it has left
            fixed_s = [0.0 if seq in proposals else self.drafter.catch_up_seconds(seq.seq_id, seq.tokens)
                       / max(1, min(tuning.CATCH_UP_HORIZON, seq.params.max_tokens - len(seq.output)))
                       for seq, _ in found]
        budget = min(self.cfg.max_batch_tokens - base, free_cells)
        sampling = sum(seq.n_kv + n == seq.num_kv_tokens for seq, n in step)
        drafting = {seq for seq, _ in found}
        others = None if self.cfg.kv_unified else [n for seq, n in step if seq not in drafting]
        ks = plan(base, sampling, [(acceptance(seq), room) for seq, room in found], cost, budget, draft_s,
                  fixed_s, apart=others)
        if self.drafter is not None:
            made = self.drafter.propose([(seq.seq_id, seq.tokens, k) for (seq, _), k in zip(found, ks, strict=True)
                                         if k and seq not in proposals])
            proposals.update({seq: made.get(seq.seq_id, []) for seq, _ in found if seq not in proposals})
        return {seq: proposals[seq][:k] for (seq, _), k in zip(found, ks, strict=True) if k and proposals[seq]}
