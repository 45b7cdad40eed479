"""What a speculative step costs and yields, and the plan that sizes the drafts by it (speculate.py's "Sizing")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenomy.engine import tuning


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
