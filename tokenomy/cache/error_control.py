"""Online error control of semantic hits: keep the error budget on the live stream, not only on calibration data.

A fixed calibration (the verifier's operating point) holds on the traffic it was fitted on; a user's traffic
drifts. Following vCache, a share of would-be hits is *explored*: sent to the model as if missed, the fresh
answer returned, and the cached answer compared with it. Each comparison is an observation (verifier score,
wrong?) of exactly the hits the cache would serve, labelled by the model itself.

Decision for a candidate at score s (one that passed the threshold, margin and entry-bar gates). The
calibration's operating point is the prior here, not a gate: a candidate under it would be a miss anyway, so
checking it against the model's answer costs nothing, and its outcome tells where on this traffic hits stop
being right. So online control tightens the calibration where the live stream is harder and loosens it where
the live stream shows it may (GPTCache's paraphrases: bench/semantic_cache_server.py):

    tau  = lowest score whose observations {score >= tau} have a Jeffreys upper bound on their wrong share
           (at ``confidence``) within the budget; observations = the explore outcomes, each weighted
           e^(-age / window) (age: outcomes observed since), plus the calibration candidates above the operating
           point (``prior_weight`` in all)
    n    = weighted live observations with score >= tau (the evidence behind serving)
    s < tau or n < EVIDENCE      -> explore (the cache has not shown it may serve here: a new cache, or a
                                    region where recent hits went wrong); costs nothing over a miss, and
                                    under the operating point it is reported as the miss it is
    otherwise                    -> explore with probability max(floor, EVIDENCE / n), else serve

So a new cache serves no paraphrase until EVIDENCE explored hits above tau came back right; a wrong answer found
by exploring counts against every score at or below it at once (and raises that entry's own bar, see
``SemanticCache.feedback``); and with many recent observations the explore rate decays to ``floor``. Explore
outcomes live in memory: a restarted gateway starts again from the calibration prior and needs fresh evidence.
"""

from __future__ import annotations

import random
import threading
from collections import deque

import numpy as np

EVIDENCE = 5   # live right answers above tau before anything is served; explore rate EVIDENCE / n above it
# The bound's confidence. Live outcomes are few and the promise is per stretch of traffic, not on average: at the
# calibration's 80% the served share ran at the budget and over it in one window in four (QQP, GPTCache streams
# through the server, bench/semantic_cache_server.py); at 95% it stays under it.
CONFIDENCE = 0.95


class ErrorControl:
    """Explore observations and the conservative serve-or-explore decision (see the module docstring);
    thread-safe."""

    def __init__(self, budget: float, floor: float, *, window: int = 100, confidence: float = CONFIDENCE,
                 prior: np.ndarray | None = None, prior_weight: float = 20.0,
                 rng: random.Random | None = None, evidence: float = EVIDENCE) -> None:
        """``prior``: (n, 2) rows of (score, wrong) from calibration, together worth ``prior_weight``
        observations. ``floor``: the explore rate once a region has plenty of evidence, in (0, 1]."""
        if not 0 < budget < 1:
            raise ValueError(f"error budget must be in (0, 1), got {budget!r}")
        if not 0 < floor <= 1:
            raise ValueError(f"explore floor must be in (0, 1], got {floor!r}")
        if window < EVIDENCE:
            raise ValueError(f"explore window must hold at least {EVIDENCE} observations, got {window!r}")
        self.budget, self.floor, self.confidence, self.evidence = budget, floor, confidence, evidence
        self.window = window
        self._live: deque[tuple[float, int]] = deque(maxlen=8 * window)     # older ones weigh < e^-8
        p = np.zeros((0, 2)) if prior is None else np.asarray(prior, dtype=np.float64).reshape(-1, 2)
        self._prior_s, self._prior_w = p[:, 0], p[:, 1]
        self._prior_weight = prior_weight / len(p) if len(p) else 0.0
        self.rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._tau: tuple[float, float] | None = None     # (tau, live evidence above it), None: recompute
        self.explored = self.served = 0

    def observe(self, score: float, wrong: bool) -> None:
        """One explore outcome: the cached answer was (not) what the model answered now."""
        with self._lock:
            self._live.append((float(score), int(bool(wrong))))
            self._tau = None

    def state(self) -> tuple[float, float]:
        """(tau, live observations at or above it); tau > 1 means nothing may be served."""
        with self._lock:
            if self._tau is None:
                self._tau = self._compute()
            return self._tau

    def _compute(self) -> tuple[float, float]:
        from scipy.special import betaincinv

        live = np.asarray(self._live, dtype=np.float64).reshape(-1, 2)
        scores = np.concatenate([live[:, 0], self._prior_s])
        wrong = np.concatenate([live[:, 1], self._prior_w])
        decay = np.exp(-np.arange(len(live))[::-1] / self.window)
        weight = np.concatenate([decay, np.full(len(self._prior_s), self._prior_weight)])
        is_live = np.concatenate([decay, np.zeros(len(self._prior_s))])
        if not len(scores):
            return 2.0, 0
        order = np.argsort(-scores, kind="stable")
        s, n = scores[order], np.cumsum(weight[order])
        w, k = np.cumsum((wrong * weight)[order]), np.cumsum(is_live[order])
        upper = betaincinv(w + 0.5, n - w + 0.5, self.confidence)
        ok = upper <= self.budget
        ok[:-1] &= s[1:] != s[:-1]                   # equal scores are served together: judge at the last tie
        if not ok.any():
            return 2.0, 0
        i = int(np.flatnonzero(ok)[-1])
        return float(s[i]), float(k[i])

    def allows(self, score: float) -> bool:
        """True when the live evidence would let a hit at ``score`` be served (were it not drawn to explore)."""
        tau, n = self.state()
        return score >= tau and n >= self.evidence

    def serve(self, score: float) -> bool:
        """True: serve this would-be hit; False: explore it (send it to the model and ``observe`` the outcome)."""
        tau, n = self.state()
        if score < tau or n < self.evidence or self.rng.random() < max(self.floor, self.evidence / n):
            self.explored += 1
            return False
        self.served += 1
        return True
