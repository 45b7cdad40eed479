"""Training a route classifier on real data and the real MiniLM: it learns a ranking better than random, its
probabilities are calibrated, it trains without group labels and refuses data it cannot learn from."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.noise import assert_same_probabilities
from tokenomy.router.classifier import RouteClassifier
from tokenomy.tools.router_training.dataset import RoutingData, load_routing_data
from tokenomy.tools.router_training.evaluate import evaluate_scores
from tokenomy.tools.router_training.report import calibration_summary, weak_no_worse
from tokenomy.tools.router_training.train import RouterTrainingError, train_classifier


@pytest.fixture(scope="module")
def held_out(test_file) -> RoutingData:
    return load_routing_data(test_file)


def test_learns_a_better_than_random_ranking(trained: RouteClassifier, held_out: RoutingData) -> None:
    p_ok = trained.p_weak_ok_many(held_out.prompts)
    report = evaluate_scores("learned", 1 - p_ok, held_out.weak_ok, held_out.strong_ok)
    assert report.apgr > 0.55 and report.cpt50 < 0.45  # random: 0.5 and 50%
    assert trained.prior is not None and len(trained.prior.groups) > 50  # MMLU domains + GSM8K's "math"


def test_probabilities_are_calibrated_on_held_out_prompts(trained: RouteClassifier, held_out: RoutingData) -> None:
    classes = trained.class_probabilities(held_out.prompts)
    assert np.allclose(classes.sum(axis=1), 1.0) and (classes >= 0).all()
    p_weak, p_strong = classes[:, 2] + classes[:, 3], classes[:, 1] + classes[:, 3]
    assert p_weak.mean() == pytest.approx(held_out.weak_ok.mean(), abs=0.05)
    assert p_strong.mean() == pytest.approx(held_out.strong_ok.mean(), abs=0.05)
    # p_weak_ok predicts "the weak answer is no worse", ties counted half.
    p_ok, event = trained.p_weak_ok_many(held_out.prompts), weak_no_worse(held_out)
    assert p_ok == pytest.approx(0.5 + 0.5 * (p_weak - p_strong))
    assert p_ok.mean() == pytest.approx(event.mean(), abs=0.03)
    summary = calibration_summary(p_ok, event)
    base = 0.5 + 0.5 * (trained.meta["weak_quality"] - trained.meta["strong_quality"])
    assert summary["brier"] < np.mean((base - event) ** 2) and summary["ece"] < 0.1  # beats the base rate


def test_router_without_group_labels(dev_rows, tmp_path) -> None:
    rows = [{k: r[k] for k in ("prompt", "weak_correct", "strong_correct")} for r in dev_rows[0::10]]
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    router = train_classifier(load_routing_data(path))
    assert router.prior is None
    router.save(tmp_path / "r.json")
    # the file holds what was trained without a prior too (up to kernel noise: tests/helpers/noise.py)
    assert_same_probabilities(RouteClassifier.load(tmp_path / "r.json").p_weak_ok(rows[1]["prompt"]),
                              router.p_weak_ok(rows[1]["prompt"]))


def test_training_refuses_data_it_cannot_learn_from(train_file) -> None:
    data = load_routing_data(train_file)
    with pytest.raises(RouterTrainingError, match="at least"):
        train_classifier(data.head(5))
    same = RoutingData("weak", "strong", data.prompts[:40], np.ones(40), np.ones(40), [""] * 40, [""] * 40)
    with pytest.raises(RouterTrainingError, match="same outcome"):
        train_classifier(same)
    with pytest.raises(RouterTrainingError, match="unknown embedding"):
        train_classifier(data, embedding="word2vec")
