"""The threshold of a `token` route (router/token_routing.py) for a target share of large-model tokens on your prompts.

First guess: the small model answers every prompt alone, reporting its confidence signal before each token; a
threshold at the q-quantile of those signals hands over at about a share q of its steps, and each handover puts
about `tokens_per_handover` large-model tokens in the answer (1 for `segment: token`, about 1.3 for `word`: a
word is 1.3 SmolLM2 tokens on English text). So the first threshold is the quantile at target / that.

Then the real thing: token routing runs on the same prompts with the two models, the realised share of
large-model tokens is measured, and the quantile is moved (`rounds` times) towards the target, since handovers
change what the small model writes next: in proportion to the share's miss (the share grows about linearly with
the quantile), inside the bracket of quantiles already known to be too low and too high, else to its middle.
The result is the threshold whose realised share was closest to the target, with that share and what it cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenomy.config import TokenRouteSettings
from tokenomy.generation import GenRequest, TokenRouting
from tokenomy.router.token_routing import TokenRouter

TOKENS_PER_HANDOVER = {"token": 1.0, "word": 1.3}


class TokenCalibrationError(ValueError):
    """Unreachable target or no usable answers."""


@dataclass
class Trial:
    threshold: float
    large_share: float
    handovers: float            # per answer
    seconds: float              # per answer
    answers: list[str] = field(default_factory=list, repr=False)


@dataclass
class TokenCalibration:
    signal: str
    target: float
    threshold: float
    large_share: float
    trials: list[Trial]

    def snippet(self, route: str, segment: str) -> str:
        return (f"# routes.{route}.token, calibrated for {self.target:.0%} large-model tokens "
                f"(measured {self.large_share:.1%})\ntoken:\n  signal: {self.signal}\n"
                f"  threshold: {self.threshold:.6g}\n  segment: {segment}\n")

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal, "target": self.target, "threshold": self.threshold,
                "large_share": self.large_share,
                "trials": [{k: v for k, v in dataclasses.asdict(t).items() if k != "answers"} for t in self.trials]}


def _request(r: dict[str, Any], max_tokens: int) -> GenRequest:
    return GenRequest(model="", kind="chat", messages=r["messages"],
                      params={"max_tokens": r.get("max_tokens") or max_tokens, "temperature": 0.0})


async def small_signals(small: Any, requests: Sequence[dict[str, Any]], signal: str, max_tokens: int) -> np.ndarray:
    """Every step's confidence signal of the small model answering `requests` alone (greedy)."""
    out: list[float] = []
    for r in requests:
        req = dataclasses.replace(_request(r, max_tokens), model=small.name,
                                  token_routing=TokenRouting(signal=signal))
        async for d in small.stream(req):
            out += d.signals
    if not out:
        raise TokenCalibrationError("the small model wrote no tokens on these prompts")
    return np.asarray(out, dtype=np.float64)


async def trial(small: Any, large: Any, settings: TokenRouteSettings, requests: Sequence[dict[str, Any]],
                max_tokens: int) -> Trial:
    """Token routing at `settings.threshold` on every request: the share of answer tokens the large model wrote."""
    import time

    tallies = []
    answers = []
    router = TokenRouter(small, large, settings, on_done=lambda tally, _: tallies.append(tally))
    t0 = time.perf_counter()
    for r in requests:
        text = ""
        async for d in router.stream(dataclasses.replace(_request(r, max_tokens), model=small.name)):
            text += d.text
        answers.append(text)
    small_t = sum(t.small_tokens for t in tallies)
    large_t = sum(t.large_tokens for t in tallies)
    n = max(len(requests), 1)
    return Trial(settings.threshold, large_t / max(small_t + large_t, 1), sum(t.handovers for t in tallies) / n,
                 (time.perf_counter() - t0) / n, answers)


async def calibrate(small: Any, large: Any, base: TokenRouteSettings, requests: Sequence[dict[str, Any]], target: float,
                    max_tokens: int = 128, rounds: int = 3, progress: Any = None) -> TokenCalibration:
    """The threshold for `target` (a share of answer tokens written by the large model, 0 < target < 1)."""
    if not 0.0 < target < 1.0:
        raise TokenCalibrationError(f"the target share must be between 0 and 1, got {target}")
    sig = await small_signals(small, requests, base.signal, max_tokens)
    per = TOKENS_PER_HANDOVER[base.segment]

    def at(q: float) -> float:
        return float(np.quantile(sig, min(max(q, 0.0), 1.0)))

    lo_q, hi_q = 0.0, 1.0
    q = min(target / per, 1.0)
    trials: list[Trial] = []
    for i in range(max(rounds, 1)):
        t = await trial(small, large, base.model_copy(update={"threshold": at(q)}), requests, max_tokens)
        trials.append(t)
        if progress is not None:
            progress(i + 1, t)
        if t.large_share < target:
            lo_q = q
        else:
            hi_q = q
        # the share grows about in proportion to q: step there, unless that leaves the bracket (then halve it)
        step = q * target / t.large_share if t.large_share > 0 else hi_q
        q = step if lo_q < step < hi_q else (lo_q + hi_q) / 2
    best = min(trials, key=lambda t: abs(t.large_share - target))
    return TokenCalibration(base.signal, target, best.threshold, best.large_share, trials)
