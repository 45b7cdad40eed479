"""RouteLLM's router metrics: the quality-cost curve, APGR and CPT(x%), plus random and oracle baselines.

A router gives every prompt a score, higher meaning "more in need of the strong model". Following RouteLLM
(lm-sys/RouteLLM, routellm/evals/benchmarks.py and evaluate.py), the curve is traced at `num_points + 1`
thresholds, the quantiles of the scores at 0, 1/n, ..., 1: at each threshold but the last, the prompts with
score >= threshold go to the strong model; at the last, those with score > threshold (so nothing). Each
threshold yields a point (strong-call share c, accuracy of the chosen answers a(c)).

    PGR(c)  = (a(c) - a_weak) / (a_strong - a_weak)             performance gap recovered
    APGR    = trapezoid integral of PGR over c in [0, 1]        (the points sorted by c)
    CPT(x)  = min c with PGR(c) >= x on the piecewise-linear curve   (RouteLLM: np.interp on the same curve)

A random router has APGR 0.5 and CPT(x) = x in expectation. APGR is not capped at 1: a router can beat the
strong model (send only the prompts the weak model gets wrong), so an oracle scores above 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


class NoGapError(ValueError):
    """The weak and strong models are equally accurate on the data, so no gap exists to recover."""



@dataclass(frozen=True)
class CurvePoint:
    threshold: float
    strong_share: float
    quality: float


@dataclass(frozen=True)
class RouterReport:
    """One router's figures on one data set."""

    name: str
    apgr: float
    cpt50: float
    cpt80: float
    weak_quality: float
    strong_quality: float
    curve: list[CurvePoint]

    def to_dict(self) -> dict:
        return asdict(self)


def quality_cost_curve(
    scores: np.ndarray, weak_ok: np.ndarray, strong_ok: np.ndarray, num_points: int = 10
) -> list[CurvePoint]:
    """RouteLLM's curve: one point per score quantile, sorted by strong-call share (see module docstring)."""
    scores, weak_ok, strong_ok = _check(scores, weak_ok, strong_ok)
    if num_points < 1:
        raise ValueError("num_points must be at least 1")
    thresholds = np.quantile(scores, np.linspace(0.0, 1.0, num_points + 1))
    points = []
    for i, threshold in enumerate(thresholds):
        strong = scores >= threshold if i < num_points else scores > threshold
        quality = float(np.where(strong, strong_ok, weak_ok).mean())
        points.append(CurvePoint(float(threshold), float(strong.mean()), quality))
    return sorted(points, key=lambda p: (p.strong_share, p.quality))


def apgr(curve: list[CurvePoint], weak_quality: float, strong_quality: float) -> float:
    """Area under PGR(c) for c from 0 to 1 (trapezoid rule over the curve's points)."""
    gap = _gap(weak_quality, strong_quality)
    share = np.array([p.strong_share for p in curve])
    pgr = (np.array([p.quality for p in curve]) - weak_quality) / gap
    return float(np.trapezoid(pgr, share))


def cpt(curve: list[CurvePoint], weak_quality: float, strong_quality: float, level: float) -> float:
    """The least strong-call share at which the linearly interpolated curve recovers `level` of the gap.

    Returns 1.0 when the curve never gets there (it always does at share 1, where quality is the strong
    model's, unless ties in the scores keep the curve from reaching share 1)."""
    target = weak_quality + level * (strong_quality - weak_quality)
    previous = None
    for point in curve:
        if point.quality >= target:
            if previous is None or previous.quality >= target:
                return point.strong_share
            # Interpolate on the segment that crosses the target, as np.interp does on a rising curve.
            step = (target - previous.quality) / (point.quality - previous.quality)
            return previous.strong_share + step * (point.strong_share - previous.strong_share)
        previous = point
    return 1.0


def evaluate_scores(
    name: str, scores: np.ndarray, weak_ok: np.ndarray, strong_ok: np.ndarray, num_points: int = 10
) -> RouterReport:
    """All of RouteLLM's figures for one router's scores (higher score = send to the strong model)."""
    scores, weak_ok, strong_ok = _check(scores, weak_ok, strong_ok)
    weak_quality, strong_quality = float(weak_ok.mean()), float(strong_ok.mean())
    curve = quality_cost_curve(scores, weak_ok, strong_ok, num_points)
    return RouterReport(
        name=name,
        apgr=apgr(curve, weak_quality, strong_quality),
        cpt50=cpt(curve, weak_quality, strong_quality, 0.5),
        cpt80=cpt(curve, weak_quality, strong_quality, 0.8),
        weak_quality=weak_quality,
        strong_quality=strong_quality,
        curve=curve,
    )


def random_scores(n: int, seed: int = 0) -> np.ndarray:
    """A random router: uniform scores, so each prompt goes to the strong model with the same chance."""
    return np.random.default_rng(seed).random(n)


def oracle_scores(weak_ok: np.ndarray, strong_ok: np.ndarray, seed: int = 0) -> np.ndarray:
    """The best possible ranking: first the prompts only the strong model gets right, then those where both
    agree, last those only the weak model gets right (ties broken at random so the quantiles are distinct)."""
    gain = np.asarray(strong_ok, dtype=float) - np.asarray(weak_ok, dtype=float)
    return gain + 1e-3 * np.random.default_rng(seed).random(len(gain))


def evaluate_baselines(
    weak_ok: np.ndarray, strong_ok: np.ndarray, seeds: int = 20, num_points: int = 10
) -> tuple[RouterReport, RouterReport]:
    """Random (APGR and CPT averaged over `seeds` draws; curve of the first) and oracle reports."""
    weak_ok, strong_ok = np.asarray(weak_ok, dtype=float), np.asarray(strong_ok, dtype=float)
    draws = [evaluate_scores("random", random_scores(len(weak_ok), s), weak_ok, strong_ok, num_points)
             for s in range(max(1, seeds))]
    random_report = RouterReport(
        name="random",
        apgr=float(np.mean([d.apgr for d in draws])),
        cpt50=float(np.mean([d.cpt50 for d in draws])),
        cpt80=float(np.mean([d.cpt80 for d in draws])),
        weak_quality=draws[0].weak_quality,
        strong_quality=draws[0].strong_quality,
        curve=draws[0].curve,
    )
    oracle = evaluate_scores("oracle", oracle_scores(weak_ok, strong_ok), weak_ok, strong_ok, num_points)
    return random_report, oracle


def _gap(weak_quality: float, strong_quality: float) -> float:
    gap = strong_quality - weak_quality
    if abs(gap) < 1e-12:
        raise NoGapError(
            f"the weak and strong models are equally accurate here ({weak_quality:.3f}): no gap to recover, "
            "so APGR and CPT are undefined"
        )
    return gap


def _check(scores: np.ndarray, weak_ok: np.ndarray, strong_ok: np.ndarray) -> tuple[np.ndarray, ...]:
    scores = np.asarray(scores, dtype=float)
    weak_ok = np.asarray(weak_ok, dtype=float)
    strong_ok = np.asarray(strong_ok, dtype=float)
    if not (scores.shape == weak_ok.shape == strong_ok.shape) or scores.ndim != 1 or len(scores) == 0:
        raise ValueError("scores, weak_ok and strong_ok must be non-empty 1-d arrays of one length")
    return scores, weak_ok, strong_ok
