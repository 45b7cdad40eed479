"""Fitting the semantic cache's verifier offline: pair files, the calibration split, cross-fitting, exported trees,
nearest candidates. (The shipped verifier itself: tests/cache/test_verify.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tokenomy.tools.cache_calibration.calibrate import (
    cross_fit,
    fingerprint,
    in_calibration_half,
    load_pairs,
    nearest_candidates,
)

DATA = Path(__file__).resolve().parents[2] / "cache" / "data"  # tests/cache/data, shared with the cache bench test


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

    from tokenomy.tools.cache_calibration.calibrate import TREE_PARAMS, fit_model, predict

    rng = np.random.default_rng(0)
    x = rng.random((800, 5))
    y = ((x[:, 0] + 0.3 * rng.random(800)) > 0.6).astype(int)
    ref = HistGradientBoostingClassifier(random_state=0, early_stopping=False, **TREE_PARAMS).fit(x, y)
    assert np.abs(predict(fit_model(x, y, "trees"), x) - ref.predict_proba(x)[:, 1]).max() < 1e-5


def test_nearest_candidates_labels_right_and_wrong(tmp_path: Path) -> None:
    from tokenomy.tools.cache_calibration.calibrate import Pair

    stored = ["s1", "s2", "s3"]
    sv = np.eye(3, 384, dtype=np.float32)
    pairs = [Pair("s1", "q1", True), Pair("s2", "q2", False), Pair("s3", "q3", True)]
    qv = np.stack([sv[0], sv[1], 0.9 * sv[0] + 0.1 * sv[2]])
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    c = nearest_candidates(stored, sv, pairs, qv)
    assert c.texts == ["s1", "s2", "s1"]
    assert c.wrong.tolist() == [False, True, True]  # non-duplicate, then another entry
