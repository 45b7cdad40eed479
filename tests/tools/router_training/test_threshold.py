"""Thresholds from targets: the strong share comes out as asked, the quality floor is met at least cost."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.tools.router_training.threshold import (
    CalibrationError,
    operating_point,
    threshold_for_quality_floor,
    threshold_for_strong_share,
)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3, 0.5, 0.97, 1.0])
def test_strong_share_is_hit(share: float) -> None:
    scores = np.random.default_rng(3).random(1000)
    result = threshold_for_strong_share(scores, share)
    assert result.strong_share == pytest.approx(share, abs=0.001)
    assert (scores < result.threshold).mean() == pytest.approx(result.strong_share)


def test_ties_give_the_closest_reachable_share() -> None:
    scores = np.array([0.0] * 50 + [1.0] * 50)
    result = threshold_for_strong_share(scores, 0.3)  # 0% or 50% are the only choices; 50% is closer
    assert result.strong_share == 0.5
    assert (scores < result.threshold).sum() == 50


def test_quality_floor_is_the_cheapest_threshold_that_meets_it() -> None:
    rng = np.random.default_rng(4)
    weak, strong = (rng.random(400) < 0.6).astype(float), (rng.random(400) < 0.85).astype(float)
    scores = (weak - strong) + rng.normal(scale=0.8, size=400)  # like p_weak_ok: informative but noisy
    result = threshold_for_quality_floor(scores, weak, strong, 0.95)
    share, quality = operating_point(scores, result.threshold, weak, strong)
    assert quality >= 0.95 * strong.mean() and quality == pytest.approx(result.quality)
    assert share == result.strong_share and 0 < share < 1
    # Brute force: no threshold with fewer strong calls reaches the floor.
    for t in np.sort(scores):
        s, q = operating_point(scores, t, weak, strong)
        if s < share:
            assert q < 0.95 * strong.mean()


def test_bad_targets_are_refused() -> None:
    scores, ok = np.linspace(0, 1, 10), np.ones(10)
    with pytest.raises(CalibrationError, match="between 0 and 1"):
        threshold_for_strong_share(scores, 1.5)
    with pytest.raises(CalibrationError, match="out of reach"):
        threshold_for_quality_floor(scores, np.zeros(10), ok * 0.5 + 0.5 * (np.arange(10) % 2), 1.2)


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    """A two-head router (static and contextual MiniLM) trained on a few dozen synthetic rows, and 40 others."""
    import json

    from tests.helpers.routing_fixtures import synthetic_rows
    from tokenomy.tools.router_training.dataset import load_routing_data
    from tokenomy.tools.router_training.train import train_router

    folder = tmp_path_factory.mktemp("heads")
    for name, seed in (("train", 0), ("held", 7)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(48, seed)))
    return train_router(load_routing_data(folder / "train.jsonl")), load_routing_data(folder / "held.jsonl")


def test_calibrate_router_sets_every_head_to_the_same_target(two_heads) -> None:
    from tokenomy.tools.router_training.threshold import calibrate_router

    router, held = two_heads
    before = [h.threshold for h in router.heads]
    results = calibrate_router(router, held, strong_share=0.25, source="held.jsonl")
    assert set(results) == {"minilm-static", "minilm"}
    for head in router.heads:
        share = (head.p_weak_ok_many(held.prompts) < head.threshold).mean()
        assert share == pytest.approx(0.25, abs=0.03) and share == results[head.embedding].strong_share
        assert head.threshold == results[head.embedding].threshold
        assert head.meta["target"] == {"strong_share": 0.25, "set_by": "calibrate on held.jsonl (48 prompts)"}
    assert [h.threshold for h in router.heads] != before

    results = calibrate_router(router, held, quality_floor=0.9)
    for head in router.heads:
        share, quality = operating_point(head.p_weak_ok_many(held.prompts), head.threshold, held.weak_ok,
                                         held.strong_ok)
        assert quality >= 0.9 * held.strong_ok.mean() and share == results[head.embedding].strong_share
        assert head.meta["target"]["quality_floor"] == 0.9


def test_calibrate_router_changes_nothing_when_a_target_is_out_of_reach(two_heads) -> None:
    from tokenomy.tools.router_training.threshold import calibrate_router

    router, held = two_heads
    before = [(h.threshold, dict(h.meta)) for h in router.heads]
    with pytest.raises(CalibrationError, match="out of reach"):
        calibrate_router(router, held, quality_floor=1.5)
    with pytest.raises(CalibrationError, match="exactly one"):
        calibrate_router(router, held, strong_share=0.3, quality_floor=0.9)
    assert [(h.threshold, h.meta) for h in router.heads] == before
