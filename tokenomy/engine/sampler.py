"""Per-sequence sampling over one row of logits, in numpy.

Order (as llama.cpp and vLLM apply them): logit bias, repetition penalty (prompt and output),
presence/frequency penalties (output), grammar mask, then temperature, top-k, top-p, min-p, and a draw from the
sequence's own generator (seeded when the request gave a seed). Reported logprobs are those of the model's raw
distribution (log-softmax of the unmodified logits), as OpenAI reports them.
"""

from __future__ import annotations

import numpy as np

from tokenomy.engine.sampling_params import SamplingParams


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class Sampler:
    def __init__(self, params: SamplingParams, prompt: list[int]) -> None:
        self.p = params
        # any integer seeds a generator (OpenAI takes negative ones too): fold it into numpy's unsigned range
        self.rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)
        self.counts: dict[int, int] = {}
        self._prompt_set = np.unique(np.asarray(prompt, dtype=np.int64)) if params.repetition_penalty != 1.0 else None

    def accept(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1

    def _processed(self, raw: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        p = self.p
        x = raw.astype(np.float32, copy=True)
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64)
            x[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32)
        if p.repetition_penalty != 1.0:
            seen = self._prompt_set
            if self.counts:
                seen = np.union1d(seen, np.fromiter(self.counts.keys(), dtype=np.int64))
            v = x[seen]
            x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts.keys(), dtype=np.int64)
            cnt = np.fromiter(self.counts.values(), dtype=np.float32)
            x[ids] -= p.presence_penalty + p.frequency_penalty * cnt
        if mask is not None:
            x[~mask[: x.shape[0]]] = -np.inf
        return x

    def sample(self, raw: np.ndarray, mask: np.ndarray | None = None, draft: int | None = None) -> int:
        """A token from this row. With ``draft`` (a speculated token), the draft itself when it is accepted:
        greedy accepts it when it is the argmax; sampling accepts it with probability p(draft) and otherwise
        draws from p without it, so the result is distributed as p whatever the draft was."""
        p = self.p
        x = self._processed(raw, mask)
        if p.greedy:
            return int(np.argmax(x))
        idx, probs = self._distribution(x)
        if draft is not None:
            hit = np.flatnonzero(idx == draft)
            p_draft = float(probs[hit[0]]) if len(hit) else 0.0
            if p_draft > 0.0 and self.rng.random() < p_draft:
                return int(draft)
            if len(hit) and p_draft < 1.0:
                probs = probs.copy()
                probs[hit[0]] = 0.0
                probs /= probs.sum()
        return int(idx[self.rng.choice(len(idx), p=probs)])

    def _distribution(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) after temperature, top-k, top-p and min-p, most likely first."""
        p = self.p
        x = x / p.temperature
        k = p.top_k if 0 < p.top_k < x.shape[0] else 0
        if k:
            idx = np.argpartition(-x, k - 1)[:k]
        else:
            # Only tokens within ~30 nats of the best can matter after softmax in float32.
            idx = np.flatnonzero(x > x.max() - 30.0)
        vals = x[idx]
        order = np.argsort(-vals)
        idx, vals = idx[order], vals[order]
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            idx, probs = idx[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            idx, probs = idx[keep_mask], probs[keep_mask]
        return idx, probs / probs.sum()


def confidence(raw: np.ndarray, signal: str) -> float:
    """How sure the model is of its next token, from the raw row: `top1` the most likely token's probability,
    `margin` that minus the second's, `entropy` the negated entropy in nats (so for every signal, lower is less
    sure)."""
    x = raw.astype(np.float32, copy=False)
    m = float(x.max())
    e = np.exp(x - m)
    z = float(e.sum())
    if signal == "top1":
        return 1.0 / z
    if signal == "margin":
        top2 = np.partition(e, -2)[-2:]
        return float(top2[1] - top2[0]) / z
    p = e / z
    nz = p[p > 0]
    return float((nz * np.log(nz)).sum())


def token_logprobs(raw: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """Logprob of `token` and the `top` most likely tokens under the raw distribution."""
    lp = log_softmax(raw.astype(np.float32, copy=False))
    tops: list[tuple[int, float]] = []
    if top:
        ids = np.argpartition(-lp, top - 1)[:top]
        ids = ids[np.argsort(-lp[ids])]
        tops = [(int(i), float(lp[i])) for i in ids]
    return float(lp[token]), tops


def chosen_logprob(raw: np.ndarray, token: int) -> float:
    m = float(raw.max())
    return float(raw[token]) - (m + float(np.log(np.exp(raw - m).sum())))
