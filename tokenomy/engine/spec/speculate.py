"""Speculative decoding from the sequence's own tokens (prompt lookup) or from the output the client predicted,
sized by what a step measurably costs.

Drafts: the last ``n`` tokens (``NGRAM_MAX`` down to ``NGRAM_MIN``, tuning.py) are looked up in the sequence's
earlier tokens, prompt and output; the tokens that followed their latest earlier occurrence are the draft. No
second model is needed, and grounded tasks (summaries, answers from given passages, edits) copy long spans. A
request that sent a predicted output (OpenAI's Predicted Outputs) drafts from that instead (``Prediction``,
prediction.py: the prediction from where the answer so far stands in it, priced by how well the answer has followed it).

Sizing: a step that feeds ``n`` tokens costs ``t(n)`` seconds, measured from the engine's own steps
(``StepCost``, cost.py); a sequence's drafts are accepted at a rate ``a`` tracked per sequence. With ``k`` drafted
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
from typing import TYPE_CHECKING

import numpy as np

from tokenomy.engine import tuning
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.sequence import Sequence
from tokenomy.engine.spec.cost import StepCost, plan

if TYPE_CHECKING:
    from tokenomy.engine.spec.draft import DraftModel



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
