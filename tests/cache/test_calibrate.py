from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenomy.cache.calibrate import (
    cross_fit,
    fingerprint,
    in_calibration_half,
    load_pairs,
    nearest_candidates,
)
from tokenomy.cache.verify import DEFAULT_VERIFIER, FEATURES, Verifier, jeffreys_upper, load_default, pair_features

DATA = Path(__file__).parent / "data"


def test_load_both_formats(tmp_path: Path) -> None:
    g = load_pairs(DATA / "gptcache_tiny.json")
    assert len(g) == 6 and all(p.duplicate for p in g)
    assert g[0].a == "What is the capital of France?" and g[0].b == "What's the capital city of France?"
    q = tmp_path / "q.jsonl"
    q.write_text('{"a": "x?", "b": "y?", "duplicate": false}\n\n{"a": "p?", "b": "q?", "duplicate": true}\n')
    assert [(p.a, p.duplicate) for p in load_pairs(q)] == [("x?", False), ("p?", True)]


@pytest.mark.parametrize("text, message", [
    ('{"a": "x", "b": "y"}\n', "expected"),
    ('{"a": "x", "b": "y", "duplicate": "yes"}\n', "expected"),
    ("not json\n", "not valid JSON"),
    ('[{"origin": "x"}]', "'origin' and 'similar'"),
    ("[1, 2", "not valid JSON"),
    ("\n", "no question pairs"),
])
def test_bad_files_give_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_pairs(f)
    with pytest.raises(FileNotFoundError):
        load_pairs(tmp_path / "missing.jsonl")


def test_split_is_by_hash_of_the_stored_question() -> None:
    qs = [f"question number {i}?" for i in range(400)]
    halves = [in_calibration_half(q) for q in qs]
    assert 150 < sum(halves) < 250
    assert in_calibration_half("Question  number 3?") == in_calibration_half("question number 3?")
    assert fingerprint("A b") == fingerprint(" a  B ")


def test_jeffreys_upper_matches_the_beta_quantile() -> None:
    from scipy.stats import beta

    for wrong, total in [(0, 50), (3, 300), (10, 400), (40, 100)]:
        exact = beta.ppf(0.8, wrong + 0.5, total - wrong + 0.5)
        assert abs(jeffreys_upper(wrong, total, 0.8) - exact) < 2e-3
    assert jeffreys_upper(0, 0, 0.8) == 1.0


def test_cross_fit_probabilities_are_out_of_fold_and_informative() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3))
    y = (x[:, 0] + 0.3 * rng.normal(size=600) > 0).astype(int)
    groups = [f"{i:08x}" for i in rng.integers(0, 2**31, size=600)]
    for kind in ("trees", "logistic"):
        p = cross_fit(x, y, groups, kind)
        assert ((p > 0.5) == y).mean() > 0.85
        assert not np.allclose(p, 0.5)


def test_exported_trees_predict_exactly_like_sklearn() -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    from tokenomy.cache.calibrate import TREE_PARAMS, fit_model, predict

    rng = np.random.default_rng(0)
    x = rng.random((800, 5))
    y = ((x[:, 0] + 0.3 * rng.random(800)) > 0.6).astype(int)
    ref = HistGradientBoostingClassifier(random_state=0, early_stopping=False, **TREE_PARAMS).fit(x, y)
    assert np.abs(predict(fit_model(x, y, "trees"), x) - ref.predict_proba(x)[:, 1]).max() < 1e-5


def test_nearest_candidates_labels_right_and_wrong(tmp_path: Path) -> None:
    from tokenomy.cache.calibrate import Pair

    stored = ["s1", "s2", "s3"]
    sv = np.eye(3, 384, dtype=np.float32)
    pairs = [Pair("s1", "q1", True), Pair("s2", "q2", False), Pair("s3", "q3", True)]
    qv = np.stack([sv[0], sv[1], 0.9 * sv[0] + 0.1 * sv[2]])
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    c = nearest_candidates(stored, sv, pairs, qv)
    assert c.texts == ["s1", "s2", "s1"]
    assert c.wrong.tolist() == [False, True, True]  # non-duplicate, then another entry


def test_shipped_verifier_is_consistent() -> None:
    v = load_default()
    assert v is not None, "tokenomy/cache/verifier.json missing: run python -m tokenomy.cache.calibrate"
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
