"""RouteLLM's metrics: APGR and CPT on hand-checkable curves, and the random and oracle baselines on real labels."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.tools.router_training.evaluate import (
    apgr,
    cpt,
    evaluate_baselines,
    evaluate_scores,
    oracle_scores,
    quality_cost_curve,
    random_scores,
)


def labels(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r["weak_correct"] for r in rows], dtype=float),
            np.array([r["strong_correct"] for r in rows], dtype=float))


def test_curve_ends_at_the_weak_and_strong_models() -> None:
    rng = np.random.default_rng(1)
    weak, strong = rng.random(500) < 0.6, rng.random(500) < 0.8
    curve = quality_cost_curve(rng.random(500), weak, strong)
    assert len(curve) == 11
    assert curve[0].strong_share == 0.0 and curve[0].quality == pytest.approx(weak.mean())
    assert curve[-1].strong_share == 1.0 and curve[-1].quality == pytest.approx(strong.mean())
    assert [p.strong_share for p in curve] == sorted(p.strong_share for p in curve)


def test_apgr_and_cpt_of_a_perfect_ranking_by_hand() -> None:
    # 10 prompts: the weak model fails the first 4, the strong model gets all right. Sending the 4 failures
    # first recovers the whole gap at 40% strong calls; the integral is the triangle 0.4/2 plus 0.6 flat.
    weak = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1], dtype=float)
    strong = np.ones(10)
    report = evaluate_scores("perfect", -np.arange(10, dtype=float) + (weak == 0) * 100, weak, strong)
    assert report.apgr == pytest.approx(0.2 + 0.6)
    assert report.cpt50 == pytest.approx(0.2)
    assert report.cpt80 == pytest.approx(0.32)


def test_cpt_interpolates_on_the_crossing_segment_and_caps_at_one() -> None:
    from tokenomy.tools.router_training.evaluate import CurvePoint

    curve = [CurvePoint(0, 0.0, 0.5), CurvePoint(0, 0.5, 0.6), CurvePoint(0, 1.0, 0.7)]
    assert cpt(curve, 0.5, 0.7, 0.5) == pytest.approx(0.5)
    assert cpt(curve, 0.5, 0.7, 0.75) == pytest.approx(0.75)
    assert cpt(curve, 0.5, 0.7, 1.2) == 1.0
    assert apgr(curve, 0.5, 0.7) == pytest.approx(0.5)


def test_random_router_recovers_half_the_gap(dev_rows) -> None:
    weak, strong = labels(dev_rows)
    draws = [evaluate_scores("random", random_scores(len(weak), seed), weak, strong) for seed in range(30)]
    assert np.mean([d.apgr for d in draws]) == pytest.approx(0.5, abs=0.02)
    assert np.mean([d.cpt50 for d in draws]) == pytest.approx(0.5, abs=0.03)
    assert np.std([d.apgr for d in draws]) > 0.005  # the draws really differ


def test_oracle_recovers_the_gap_early_and_beats_random(dev_rows) -> None:
    weak, strong = labels(dev_rows)
    random, oracle = evaluate_baselines(weak, strong, seeds=10)
    # The oracle first sends the prompts only the strong model gets right (19% of them, more than the first
    # 10% bin), each adding 1/n to quality, so x of the gap is recovered at a strong share of x * gap. APGR
    # exceeds 1 because routing can beat the strong model itself.
    gap = strong.mean() - weak.mean()
    assert ((1 - weak) * strong).mean() > 0.1
    assert oracle.apgr > 1.0 > 0.55 > random.apgr
    assert oracle.cpt50 == pytest.approx(0.5 * gap, abs=0.005)
    assert oracle.cpt80 == pytest.approx(0.8 * gap, abs=0.01)
    assert max(p.quality for p in oracle.curve) == pytest.approx(np.maximum(weak, strong).mean(), abs=0.01)
    assert oracle_scores(weak, strong).argmax() in np.flatnonzero((1 - weak) * strong)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="same length|one length"):
        evaluate_scores("x", np.zeros(3), np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="no gap"):
        evaluate_scores("x", np.arange(4.0), np.ones(4), np.ones(4))
