"""The shipped semantic-cache verifier and its error bound (fitted offline by
tokenomy/tools/cache_calibration/calibrate.py)."""

from __future__ import annotations

import json

import pytest

from tokenomy.cache.hit_verifier import (
    DEFAULT_VERIFIER,
    FEATURES,
    Verifier,
    jeffreys_upper,
    load_default,
    pair_features,
)


def test_jeffreys_upper_matches_the_beta_quantile() -> None:
    from scipy.stats import beta

    for wrong, total in [(0, 50), (3, 300), (10, 400), (40, 100)]:
        exact = beta.ppf(0.8, wrong + 0.5, total - wrong + 0.5)
        assert abs(jeffreys_upper(wrong, total, 0.8) - exact) < 2e-3
    assert jeffreys_upper(0, 0, 0.8) == 1.0


def test_shipped_verifier_is_consistent() -> None:
    v = load_default()
    assert v is not None, ("tokenomy/cache/verifier.json missing: "
                           "run python -m tokenomy.tools.cache_calibration.calibrate")
    assert v.spec["features"] == list(FEATURES)
    # A larger budget never demands a higher p; a stricter gate never needs a lower-quality point to exist.
    for t in (0.8, 0.9):
        assert v.operating_point(0.2, t) <= v.operating_point(0.15, t) <= v.operating_point(0.1, t)
        assert v.operating_point(0.2, t) < 1  # a loose enough budget is certified somewhere
    # The same question reworded scores higher than the same words with the meaning flipped.
    same = v.probability(pair_features("How can I learn French fast?", "How do I learn French quickly?", 0.93, 0.7))
    flipped = v.probability(pair_features("How can I learn French fast?", "How can I learn German fast?", 0.9, 0.7))
    assert same > flipped
    with pytest.raises(ValueError, match="error_budget"):
        v.operating_point(0.0, 0.9)
    bad = dict(v.spec, features=["cos"])
    with pytest.raises(ValueError, match="feature set"):
        Verifier(bad)
    assert json.loads(DEFAULT_VERIFIER.read_text())["source"]["pairs"] > 0
