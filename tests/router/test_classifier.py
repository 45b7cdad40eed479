"""The route classifier at serving time, on real data and the real MiniLM: predicts, saves, loads bit for bit,
takes a handed-in embedding, refuses bad files. (Training itself: tests/tools/router_training/test_train.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.noise import assert_same_probabilities
from tokenomy.router.classifier import RouteClassifier, RoutePrediction, RouterFileError
from tokenomy.router.features import embed_prompts
from tokenomy.tools.router_training.dataset import RoutingData, load_routing_data
from tokenomy.tools.router_training.train import train_classifier


@pytest.fixture(scope="module")
def held_out(test_file) -> RoutingData:
    return load_routing_data(test_file)


def test_predict_follows_the_threshold(trained: RouteClassifier, held_out: RoutingData) -> None:
    prompt = held_out.prompts[0]
    prediction = trained.predict(prompt)
    assert isinstance(prediction, RoutePrediction) and prediction.threshold == trained.threshold
    assert prediction.model == (trained.weak if prediction.probability >= trained.threshold else trained.strong)
    assert prediction.probability == pytest.approx(trained.p_weak_ok(prompt))
    assert prediction.probability == pytest.approx(
        0.5 + 0.5 * (prediction.p_weak_correct - prediction.p_strong_correct))
    assert f"{prediction.probability:.3f}" in prediction.reason
    share = np.mean([trained.predict(p).model == "strong" for p in held_out.prompts[:80]])
    assert 0.25 < share < 0.75  # train set the threshold for 50% strong on its own rows


def test_a_routes_own_threshold_replaces_the_calibrated_one(trained: RouteClassifier, held_out: RoutingData) -> None:
    prompt = held_out.prompts[0]
    p = trained.p_weak_ok(prompt)
    below, above = trained.predict(prompt, threshold=p / 2), trained.predict(prompt, threshold=(1 + p) / 2)
    assert (below.model, below.threshold) == (trained.weak, p / 2)
    assert (above.model, above.threshold) == (trained.strong, (1 + p) / 2) and "<" in above.reason


def test_save_load_round_trip(trained: RouteClassifier, held_out: RoutingData, tmp_path) -> None:
    path = tmp_path / "router.json"
    trained.save(path)
    header = json.loads(path.read_text())
    assert header["format"] == "tokenomy-router" and header["weak"] == "weak" and header["strong"] == "strong"
    (head,) = header["heads"]  # a one-head file
    assert head["threshold"] == trained.threshold and head["features"]["embedding"] == trained.embedding
    loaded = RouteClassifier.load(path)
    prompts = held_out.prompts[:40]
    # A trained router holds its parameters as the file does (C-ordered float64), so the two run the same BLAS
    # calls on the same arrays; equal up to kernel noise all the same (BLAS may take another path for arrays
    # aligned otherwise), and the same decisions.
    assert_same_probabilities(loaded.class_probabilities(prompts), trained.class_probabilities(prompts))
    for prompt in prompts[:5]:
        got, want = loaded.predict(prompt), trained.predict(prompt)
        assert (got.model, got.threshold) == (want.model, want.threshold)
        assert_same_probabilities(got.probability, want.probability)


def test_contextual_minilm_router_takes_a_handed_in_embedding(train_file, tmp_path) -> None:
    data = load_routing_data(train_file).head(60)
    router = train_classifier(data, embedding="minilm")
    router.save(tmp_path / "ctx.json")
    loaded = RouteClassifier.load(tmp_path / "ctx.json")
    assert loaded.embedding == "minilm"
    prompt = data.prompts[3]
    vector = embed_prompts([prompt], "minilm")[0]  # what the semantic cache computes for the same text
    assert_same_probabilities(loaded.p_weak_ok(prompt, vector), loaded.p_weak_ok(prompt))
    assert loaded.predict(prompt, vector).model == loaded.predict(prompt).model
    static = embed_prompts([prompt], "minilm-static")[0]
    assert float(static @ vector) < 0.99  # the two embeddings really differ


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
    broken["heads"][0]["arrays"]["coef"]["shape"] = [1, -1]
    path.write_text(json.dumps(broken))
    with pytest.raises(RouterFileError, match="damaged"):
        RouteClassifier.load(path)
    del broken["heads"][0]["arrays"]["coef"]
    path.write_text(json.dumps(broken))
    with pytest.raises(RouterFileError, match="damaged"):
        RouteClassifier.load(path)
