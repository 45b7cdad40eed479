"""Word-problem features: counts that proxy how many steps a maths word problem takes."""

from __future__ import annotations

import numpy as np

from tokenomy.router.features import WORD_PROBLEM_FEATURES, word_problem_features, word_problem_matrix


def feature(prompt: str, name: str) -> float:
    return float(word_problem_features(prompt)[WORD_PROBLEM_FEATURES.index(name)])


def test_word_problem_features_count_quantities_units_and_operations() -> None:
    short = "Tom has 3 apples. How many apples does he have?"
    long = ("A train travels 120 miles in 2 hours, then twice as fast for half an hour. Each ticket costs $4.50 "
            "and 15% of the 1,200 riders get a discount. What is the total fare, and how many miles remain?")
    assert feature(long, "numbers") > feature(short, "numbers")
    assert feature(long, "units") > 0 == feature(short, "units")
    assert feature(long, "operations") > feature(short, "operations") == 0
    assert feature(long, "percents") > 0 and feature(long, "decimals") > 0 and feature(long, "money") > 0
    assert feature(long, "max_magnitude") == np.log1p(1200.0)
    assert feature(long, "non_integers") > 0 == feature(short, "non_integers")
    matrix = word_problem_matrix([short, long, ""])
    assert matrix.shape == (3, len(WORD_PROBLEM_FEATURES)) and np.isfinite(matrix).all()
    assert not matrix[2].any()          # an empty prompt has nothing to count


def test_the_static_embedder_is_the_mean_of_minilms_word_embeddings() -> None:
    from pathlib import Path

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from tokenomy.embedding.embedder import packaged_model_path
    from tokenomy.router.features import StaticEmbedder

    root = Path(packaged_model_path())
    table = load_file(root / "model.safetensors")["embeddings.word_embeddings.weight"]
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    tokenizer.no_padding()
    ids = tokenizer.encode("two apples and three pears", add_special_tokens=False).ids
    want = table[ids].mean(axis=0)
    got = StaticEmbedder().embed(["two apples and three pears", ""])
    assert table.shape == (30522, 384) and table.dtype == np.float32
    np.testing.assert_allclose(got[0], want / np.linalg.norm(want), rtol=1e-5, atol=1e-6)
    assert not got[1].any()                           # no tokens: no direction
