"""The learned router on real data and the real MiniLM: trains, routes, saves, loads, refuses bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenomy.router.classifier import Prediction, RouteClassifier, RouterFileError, RouterTrainingError
from tokenomy.router.dataset import RoutingData, load_routing_data
from tokenomy.router.evaluate import evaluate_scores
from tokenomy.router.features import embed_prompts
from tokenomy.router.report import calibration_summary, weak_no_worse


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


def test_predict_follows_the_threshold(trained: RouteClassifier, held_out: RoutingData) -> None:
    prompt = held_out.prompts[0]
    prediction = trained.predict(prompt)
    assert isinstance(prediction, Prediction) and prediction.threshold == trained.threshold
    assert prediction.model == (trained.weak if prediction.probability >= trained.threshold else trained.strong)
    assert prediction.probability == pytest.approx(trained.p_weak_ok(prompt))
    assert prediction.probability == pytest.approx(
        0.5 + 0.5 * (prediction.p_weak_correct - prediction.p_strong_correct))
    assert f"{prediction.probability:.3f}" in prediction.reason
    share = np.mean([trained.predict(p).model == "strong" for p in held_out.prompts[:80]])
    assert 0.25 < share < 0.75  # train set the threshold for 50% strong on its own rows


def test_save_load_round_trip(trained: RouteClassifier, held_out: RoutingData, tmp_path) -> None:
    path = tmp_path / "router.json"
    trained.save(path)
    header = json.loads(path.read_text())
    assert header["format"] == "tokenomy-router" and header["weak"] == "weak" and header["strong"] == "strong"
    assert header["threshold"] == trained.threshold and header["features"]["embedding"] == trained.embedding
    loaded = RouteClassifier.load(path)
    prompts = held_out.prompts[:40]
    # Bit for bit on every CPU: a trained router holds its parameters as the file does (C-ordered float64), so
    # the two run the same BLAS calls on the same arrays. (Before, the trained one held scikit-learn's float32 and
    # Fortran-ordered arrays and differed in the last bits on an AVX-512 Xeon.)
    assert np.array_equal(loaded.class_probabilities(prompts), trained.class_probabilities(prompts))
    for prompt in prompts[:5]:
        assert loaded.predict(prompt) == trained.predict(prompt)


def test_contextual_minilm_router_takes_a_handed_in_embedding(train_file, tmp_path) -> None:
    data = load_routing_data(train_file).head(60)
    router = RouteClassifier.train(data, embedding="minilm")
    router.save(tmp_path / "ctx.json")
    loaded = RouteClassifier.load(tmp_path / "ctx.json")
    assert loaded.embedding == "minilm"
    prompt = data.prompts[3]
    vector = embed_prompts([prompt], "minilm")[0]  # what the semantic cache computes for the same text
    assert loaded.p_weak_ok(prompt, vector) == pytest.approx(loaded.p_weak_ok(prompt))
    assert loaded.predict(prompt, vector).model == loaded.predict(prompt).model
    static = embed_prompts([prompt], "minilm-static")[0]
    assert float(static @ vector) < 0.99  # the two embeddings really differ


def test_router_without_group_labels(dev_rows, tmp_path) -> None:
    rows = [{k: r[k] for k in ("prompt", "weak_correct", "strong_correct")} for r in dev_rows[0::10]]
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    router = RouteClassifier.train(load_routing_data(path))
    assert router.prior is None
    router.save(tmp_path / "r.json")
    assert RouteClassifier.load(tmp_path / "r.json").p_weak_ok(rows[1]["prompt"]) == pytest.approx(
        router.p_weak_ok(rows[1]["prompt"]))


def test_damaged_files_are_refused(trained: RouteClassifier, tmp_path) -> None:
    path = tmp_path / "router.json"
    trained.save(path)
    good = json.loads(path.read_text())
    with pytest.raises(RouterFileError, match="no such router file"):
        RouteClassifier.load(tmp_path / "absent.json")
    path.write_text(path.read_text()[:500])
    with pytest.raises(RouterFileError, match="not a tokenomy router file"):
        RouteClassifier.load(path)
    path.write_text(json.dumps({**good, "version": 99}))
    with pytest.raises(RouterFileError, match="version 99"):
        RouteClassifier.load(path)
    broken = json.loads(json.dumps(good))
    broken["arrays"]["coef"]["shape"] = [1, -1]
    path.write_text(json.dumps(broken))
    with pytest.raises(RouterFileError, match="damaged"):
        RouteClassifier.load(path)
    del broken["arrays"]["coef"]
    path.write_text(json.dumps(broken))
    with pytest.raises(RouterFileError, match="damaged"):
        RouteClassifier.load(path)


def test_training_refuses_data_it_cannot_learn_from(train_file) -> None:
    data = load_routing_data(train_file)
    with pytest.raises(RouterTrainingError, match="at least"):
        RouteClassifier.train(data.head(5))
    same = RoutingData("weak", "strong", data.prompts[:40], np.ones(40), np.ones(40), [""] * 40, [""] * 40)
    with pytest.raises(RouterTrainingError, match="same outcome"):
        RouteClassifier.train(same)
    with pytest.raises(RouterTrainingError, match="unknown embedding"):
        RouteClassifier.train(data, embedding="word2vec")
