"""The ONNX encoder computes the same embeddings as sentence-transformers, fast enough for a cache lookup."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.embedder import Embedder, default_embedder, onnx_export_path, packaged_model_path

TEXTS = [
    "How do I learn Python quickly?",
    "What is the fastest way to learn Python?",
    "Why is the sky blue?",
    "",
    "word " * 400,  # longer than the model's 256 tokens: truncated the same way
]


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    return Embedder(backend="torch")


def test_default_is_onnx_and_exported_once() -> None:
    e = default_embedder()
    assert e.backend == "onnx"
    assert onnx_export_path(packaged_model_path()).exists()


def test_onnx_matches_sentence_transformers(torch_embedder: Embedder) -> None:
    onnx = default_embedder()
    a, b = onnx.embed(TEXTS), torch_embedder.embed(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    assert (a * b).sum(1).min() > 0.9999


def test_batching_does_not_change_vectors() -> None:
    e = default_embedder()
    batch = e.embed(TEXTS, batch_size=2)  # mixed lengths: padded within a batch
    one_by_one = np.stack([e.embed_one(t) for t in TEXTS])
    assert (batch * one_by_one).sum(1).min() > 0.99999
    # Paraphrases are closer than unrelated questions: the vectors mean something.
    assert float(batch[0] @ batch[1]) > float(batch[0] @ batch[2]) + 0.3


def test_empty_list() -> None:
    assert default_embedder().embed([]).shape == (0, 384)


def test_unwritable_cache_falls_back_to_torch(tmp_path, monkeypatch) -> None:
    # A read-only cache dir (no ONNX export possible) must not stop the server: auto uses the torch encoder.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TOKENOMY_CACHE_DIR", str(blocker / "sub"))
    e = Embedder(backend="auto")
    assert e.backend == "torch" and e.embed_one("hello").shape == (384,)
    with pytest.raises(OSError):
        Embedder(backend="onnx")  # asked for explicitly: the error is the caller's to see


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_token_ids_embed_as_their_text_does(backend: str, torch_embedder: Embedder) -> None:
    from tests.noise import assert_same_vectors

    e = default_embedder() if backend == "onnx" else torch_embedder
    texts = TEXTS[:3]
    rows = e.tokenize(texts)
    assert all(r[0] == e.tokenizer.token_to_id("[CLS]") and r[-1] == e.tokenizer.token_to_id("[SEP]") for r in rows)
    assert_same_vectors(e.embed_ids(rows), e.embed(texts))
    assert_same_vectors(e.embed_ids(rows, batch_size=1), e.embed(texts))


def test_tokenize_does_not_truncate_and_embed_ids_refuses_what_embed_would_cut() -> None:
    e = default_embedder()
    long = e.tokenize([TEXTS[-1]])[0]
    assert len(long) == 402 > e.max_tokens == 256
    with pytest.raises(ValueError, match="256"):
        e.embed_ids([long])
    assert e.embed_ids([]).shape == (0, 384)
