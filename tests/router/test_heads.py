"""Router files with two heads (static and contextual embedding): they round-trip, a version-1 file still loads
and predicts what it did, bad files are refused, and head_for picks the contextual head only when its vector is
at hand. Tiny synthetic data (tests/helpers/routing_fixtures.synthetic_rows), the real MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.noise import assert_same_probabilities
from tests.helpers.routing_fixtures import synthetic_rows
from tokenomy.router.classifier import VERSION, RouteClassifier, RouterFileError, TrainedRouter
from tokenomy.tools.router_training.dataset import RoutingData, load_routing_data
from tokenomy.tools.router_training.train import RouterTrainingError, train_router

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> RoutingData:
    path = tmp_path_factory.mktemp("tiny") / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(48)))
    return load_routing_data(path)


@pytest.fixture(scope="module")
def two_heads(tiny) -> TrainedRouter:
    return train_router(tiny)


def test_train_router_fits_a_head_per_embedding(two_heads: TrainedRouter, tiny: RoutingData) -> None:
    assert two_heads.embeddings == ["minilm-static", "minilm"]
    static, contextual = two_heads.heads
    assert (two_heads.weak, two_heads.strong) == ("weak", "strong")
    assert contextual.word_problem and static.word_problem  # both heads get the word-problem features
    for head in two_heads.heads:  # each thresholded for half strong on the training rows
        assert (head.p_weak_ok_many(tiny.prompts) < head.threshold).mean() == pytest.approx(0.5, abs=0.03)
    # the heads really are different models: their probabilities differ
    assert not np.allclose(static.p_weak_ok_many(tiny.prompts), contextual.p_weak_ok_many(tiny.prompts))
    single = train_router(tiny, heads=("minilm-static",))
    assert single.embeddings == ["minilm-static"]
    assert_same_probabilities(single.heads[0].p_weak_ok_many(tiny.prompts), static.p_weak_ok_many(tiny.prompts))
    with pytest.raises(RouterTrainingError, match="once"):
        train_router(tiny, heads=("minilm", "minilm"))


def test_two_head_file_round_trips(two_heads: TrainedRouter, tiny: RoutingData, tmp_path) -> None:
    path = tmp_path / "router.json"
    two_heads.save(path)
    document = json.loads(path.read_text())
    assert document["version"] == VERSION == 3
    assert [h["features"]["embedding"] for h in document["heads"]] == ["minilm-static", "minilm"]
    loaded = TrainedRouter.load(path)
    assert loaded.embeddings == two_heads.embeddings
    prompts = [r["prompt"] for r in synthetic_rows(10, seed=5)]
    for saved, read in zip(two_heads.heads, loaded.heads, strict=True):
        assert read.threshold == saved.threshold and read.meta == saved.meta
        assert read.word_problem == saved.word_problem
        assert read.free_answer_components == saved.free_answer_components
        assert_same_probabilities(read.class_probabilities(prompts), saved.class_probabilities(prompts))
    with pytest.raises(RouterFileError, match="2 heads"):
        RouteClassifier.load(path)  # a one-head reader must not silently drop a head


def test_a_version_1_file_still_loads_and_predicts_what_it_did() -> None:
    """router-v1.json was written by the version-1 code (single head, its fields at the top level), with the
    probabilities it computed for a few prompts, on another CPU: equal up to its kernels' noise, same decisions."""
    expected = json.loads((DATA / "router-v1-expected.json").read_text())
    assert json.loads((DATA / "router-v1.json").read_text())["version"] == 1
    router = TrainedRouter.load(DATA / "router-v1.json")
    assert router.embeddings == ["minilm-static"] and router.head_for(True) is router.heads[0]
    assert not router.heads[0].word_problem
    head = RouteClassifier.load(DATA / "router-v1.json")
    assert head.threshold == expected["threshold"]
    p = head.p_weak_ok_many(expected["prompts"])
    assert_same_probabilities(p, expected["p_weak_ok"])
    assert list(p >= head.threshold) == [q >= expected["threshold"] for q in expected["p_weak_ok"]]


def test_a_one_head_file_written_now_reads_as_before(two_heads: TrainedRouter, tmp_path) -> None:
    static = two_heads.head("minilm-static")
    static.save(tmp_path / "one.json")
    assert json.loads((tmp_path / "one.json").read_text())["version"] == 3
    assert_same_probabilities(RouteClassifier.load(tmp_path / "one.json").p_weak_ok("Tom has 3 apples."),
                              static.p_weak_ok("Tom has 3 apples."))


def test_bad_two_head_files_are_refused(two_heads: TrainedRouter, tmp_path) -> None:
    path = tmp_path / "router.json"
    two_heads.save(path)
    good = json.loads(path.read_text())
    for change, message in (({"version": 4}, "version 4, this reads 1, 2, 3"), ({"heads": []}, "at least one head"),
                            ({"heads": [good["heads"][0]] * 2}, "share an embedding"), ({"heads": None}, "damaged")):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(RouterFileError, match=message):
            TrainedRouter.load(path)
    broken = json.loads(json.dumps(good))
    broken["heads"][1]["arrays"]["coef"]["shape"] = [1, -1]
    path.write_text(json.dumps(broken))
    with pytest.raises(RouterFileError, match="damaged"):
        TrainedRouter.load(path)


def test_head_for_prefers_the_contextual_head_only_when_its_vector_is_at_hand(two_heads: TrainedRouter) -> None:
    static, contextual = two_heads.head("minilm-static"), two_heads.head("minilm")
    assert two_heads.head_for(True) is contextual and two_heads.head_for(False) is static
    alone = TrainedRouter([contextual])  # a lone contextual head decides anyway (and embeds the prompt itself)
    assert alone.head_for(False) is contextual and alone.head_for(True) is contextual
    assert TrainedRouter([static]).head_for(True) is static


def test_the_contextual_heads_free_answer_components_move_only_free_answer_prompts(
        two_heads: TrainedRouter, tmp_path) -> None:
    """The contextual head's components after the first 16 count for free-answer prompts only: zeroing their
    weights changes a word problem's probability and leaves a multiple-choice prompt's exactly as it was. A
    version-2 file (written before them) loads with none."""
    static, contextual = two_heads.head("minilm-static"), two_heads.head("minilm")
    assert static.free_answer_components == 0
    assert contextual.free_answer_components == 16 and contextual.pca_components.shape[0] == 32
    free = "Tom has 3 apples and buys 4 bags of 6 apples each. How many apples does he have now?"
    choice = "Which gas do plants take in?\nA. oxygen\nB. carbon dioxide\nC. helium\nD. neon\nAnswer:"
    before = contextual.p_weak_ok_many([free, choice])
    coef = contextual.coef.copy()
    contextual.coef[:, -16:] = 0.0
    try:
        after = contextual.p_weak_ok_many([free, choice])
    finally:
        contextual.coef = coef
    assert after[1] == before[1] and after[0] != before[0]

    path = tmp_path / "router.json"
    TrainedRouter([static]).save(path)
    document = json.loads(path.read_text())
    document["version"] = 2
    del document["heads"][0]["features"]["free_answer_components"]
    path.write_text(json.dumps(document))
    old = TrainedRouter.load(path).heads[0]
    assert old.free_answer_components == 0
    assert_same_probabilities(old.p_weak_ok_many([free, choice]), static.p_weak_ok_many([free, choice]))
