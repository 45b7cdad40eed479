"""Choosing the router's threshold from a target: a share of strong-model calls, or a quality floor.

The router sends a prompt to the strong model when p_weak_ok < t, so on a data set with values p_i:

    share(t)   = mean(p_i < t)
    quality(t) = mean(strong_ok_i if p_i < t else weak_ok_i)

Strong share s:  the t whose share(t) is closest to s (ties in p can make s itself unreachable).
Quality floor f: the t with the least share(t) such that quality(t) >= f * mean(strong_ok), i.e. the
                 cheapest setting that keeps f of the always-strong quality (RouteLLM's "95% of GPT-4").
Only thresholds between distinct values of p are considered, so every candidate is realisable; each lies in
[0, 1] when the p_i do (the all-strong threshold is just above the largest p, at most 1).

A router with two heads (static and contextual embedding) is calibrated head by head to the same target
(calibrate_router): whichever head decides a request, the router aims at the same strong share or floor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenomy.router.classifier import TrainedRouter
    from tokenomy.tools.router_training.dataset import RoutingData


class CalibrationError(ValueError):
    """The target is invalid or cannot be reached on the given data."""


@dataclass(frozen=True)
class Calibration:
    threshold: float
    strong_share: float  # achieved on the calibration data
    quality: float | None  # achieved accuracy (None when not computed)
    target: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _candidates(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds between distinct values, from low (nothing strong) to high (everything strong), and for
    each the number of prompts below it."""
    values = np.unique(p)  # ascending
    if len(values) == 0:
        raise CalibrationError("no prompts to calibrate on")
    thresholds = np.r_[values[0], (values[:-1] + values[1:]) / 2, np.nextafter(values[-1], np.inf)]
    counts = np.searchsorted(np.sort(p), thresholds, side="left")  # how many p < t
    return thresholds, counts


def threshold_for_strong_share(p_weak_ok: np.ndarray, share: float) -> Calibration:
    """The threshold whose strong-call share on `p_weak_ok` is closest to `share` (the lower share on a tie)."""
    if not 0.0 <= share <= 1.0:
        raise CalibrationError(f"strong share must be between 0 and 1, got {share}")
    p = np.asarray(p_weak_ok, dtype=float)
    thresholds, counts = _candidates(p)
    best = int(np.argmin(np.abs(counts / len(p) - share)))
    return Calibration(float(thresholds[best]), float(counts[best] / len(p)), None, {"strong_share": share})


def threshold_for_quality_floor(
    p_weak_ok: np.ndarray, weak_ok: np.ndarray, strong_ok: np.ndarray, floor: float
) -> Calibration:
    """The cheapest threshold whose routed quality is at least `floor` times the strong model's quality."""
    if not 0.0 < floor <= 2.0:
        raise CalibrationError(f"quality floor is a fraction of the strong model's quality (e.g. 0.95), got {floor}")
    p = np.asarray(p_weak_ok, dtype=float)
    weak_ok, strong_ok = np.asarray(weak_ok, dtype=float), np.asarray(strong_ok, dtype=float)
    thresholds, counts = _candidates(p)
    order = np.argsort(p, kind="stable")
    # Quality after sending the k lowest p to the strong model = (sum(weak) + their sum of (strong - weak)) / n.
    lift = np.r_[0.0, np.cumsum((strong_ok - weak_ok)[order])]
    quality = (weak_ok.sum() + lift[counts]) / len(p)
    goal = floor * strong_ok.mean()
    reachable = np.flatnonzero(quality >= goal - 1e-12)
    target = {"quality_floor": floor, "quality_goal": float(goal)}
    if len(reachable) == 0:
        best = int(np.argmax(quality))
        raise CalibrationError(
            f"quality floor {floor:g} x strong quality {strong_ok.mean():.3f} = {goal:.3f} is out of reach on this "
            f"data: the best routed quality is {quality[best]:.3f} at a strong share of "
            f"{counts[best] / len(p):.1%}"
        )
    best = int(reachable[np.argmin(counts[reachable])])
    return Calibration(float(thresholds[best]), float(counts[best] / len(p)), float(quality[best]), target)


def operating_point(
    p_weak_ok: np.ndarray, threshold: float, weak_ok: np.ndarray, strong_ok: np.ndarray
) -> tuple[float, float]:
    """(strong share, quality) of routing at `threshold`: strong where p_weak_ok < threshold."""
    strong = np.asarray(p_weak_ok) < threshold
    return float(strong.mean()), float(np.where(strong, strong_ok, weak_ok).mean())


def calibrate_router(
    router: TrainedRouter, data: RoutingData, strong_share: float | None = None, quality_floor: float | None = None,
    source: str = "",
) -> dict[str, Calibration]:
    """Set every head's threshold from the same target (exactly one of `strong_share` and `quality_floor`) on
    `data`, record the target in each head's meta (with `source`, where the data came from), and return each
    head's Calibration by embedding. Raises CalibrationError (and changes nothing) if any head cannot reach it."""
    if (strong_share is None) == (quality_floor is None):
        raise CalibrationError("give exactly one of a strong share and a quality floor")
    results = {}
    for head in router.heads:
        p_ok = head.p_weak_ok_many(data.prompts)
        if strong_share is not None:
            results[head.embedding] = threshold_for_strong_share(p_ok, strong_share)
        else:
            results[head.embedding] = threshold_for_quality_floor(p_ok, data.weak_ok, data.strong_ok, quality_floor)
    for head in router.heads:
        result = results[head.embedding]
        head.threshold = result.threshold
        head.meta["target"] = {**result.target, "set_by": f"calibrate on {source} ({len(data)} prompts)"}
    return results
