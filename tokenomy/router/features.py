"""What the router sees of a prompt: a MiniLM embedding and a handful of cheap text features.

Two embeddings: "minilm", the contextual sentence embedding of tokenomy.embedding.embedder (what the semantic cache
uses), and "minilm-static", the mean of the same model's input token vectors (no transformer pass, so it
fits the routing latency budget on a small CPU).

The text features are counts that track how much work a prompt asks for (length, sentences, how many
numbers and what kind) and its shape (multiple choice or free answer); each count x enters as log(1 + x) so
that a long legal passage does not swamp everything else. They cost microseconds.
"""

from __future__ import annotations

import hashlib
import re
import threading

import numpy as np
from cachetools import LRUCache

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.?!](?:\s|$)")
_FRACTION = re.compile(r"\d+/\d+")
_DECIMAL = re.compile(r"\d+\.\d+")
_QUANTITY_WORDS = re.compile(r"\b(?:twice|half|times|double|triple|each|every|per)\b")
_OPTIONS = re.compile(r"^\s*[A-D][.)]\s", re.MULTILINE)

TEXT_FEATURES = (
    "chars", "words", "numbers", "distinct_numbers", "sentences", "percents", "fractions", "decimals",
    "money", "big_numbers", "digits", "quantity_words", "question_chars", "multiple_choice",
)


def text_features(prompt: str) -> np.ndarray:
    """The TEXT_FEATURES of one prompt, in that order: log(1 + count) for each count, 0/1 for multiple_choice."""
    lower = prompt.lower()
    numbers = _NUMBER.findall(prompt)
    questions = prompt.split("?")
    counts = [
        len(prompt),
        len(prompt.split()),
        len(numbers),
        len(set(numbers)),
        len(_SENTENCE_END.findall(prompt)),
        prompt.count("%") + lower.count("percent"),
        len(_FRACTION.findall(prompt)),
        len(_DECIMAL.findall(prompt)),
        prompt.count("$"),
        sum(1 for n in numbers if len(n.replace(",", "").split(".")[0]) >= 4),
        sum(c.isdigit() for c in prompt),
        len(_QUANTITY_WORDS.findall(lower)),
        len(questions[-2]) if len(questions) > 1 else 0,  # the last question asked, where the task is
    ]
    multiple_choice = float(len(_OPTIONS.findall(prompt)) >= 2)
    return np.array([*np.log1p(counts), multiple_choice], dtype=np.float64)


def text_feature_matrix(prompts: list[str]) -> np.ndarray:
    return np.array([text_features(p) for p in prompts], dtype=np.float64).reshape(len(prompts), len(TEXT_FEATURES))


_UNITS = re.compile(r"\b(?:hours?|minutes?|seconds?|days?|weeks?|months?|years?|miles?|km|kilometers?|meters?|feet|"
                    r"foot|inch(?:es)?|pounds?|ounces?|kg|grams?|liters?|gallons?|cups?|dollars?|cents?)\b")
_RATES = re.compile(r"\b(?:per|each|every|an hour|a day|a week|rate|speed)\b")
_OPERATIONS = re.compile(r"\b(?:more than|less than|fewer|twice|half|times|double|triple|total|remaining|left|rest|"
                         r"difference|sum|average|profit|discount|percent|ratio|fraction|split|share|equally)\b")
_NUMBER_WORDS = re.compile(r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|"
                           r"fifty|hundred|thousand|dozen|half|third|quarter)\b")

WORD_PROBLEM_FEATURES = (
    "chars", "words", "numbers", "distinct_numbers", "sentences", "percents", "fractions", "decimals", "money",
    "max_magnitude", "median_magnitude", "units", "distinct_units", "rates", "operations", "number_words",
    "question_chars", "quantities", "commas", "non_integers",
)


def word_problem_features(prompt: str) -> np.ndarray:
    """WORD_PROBLEM_FEATURES of a maths word problem (GSM8K-like), each log(1 + count) except the magnitudes,
    which are log(1 + largest / median number). They proxy the steps a solution takes: how many quantities
    (digits and number words), units and rates to relate, and operation words ("twice", "remaining", "per")."""
    lower = prompt.lower()
    numbers = _NUMBER.findall(prompt)
    values = [float(v) for v in (n.replace(",", "") for n in numbers) if v.replace(".", "", 1).isdigit()]
    units = _UNITS.findall(lower)
    number_words = len(_NUMBER_WORDS.findall(lower))
    questions = prompt.split("?")
    counts = [
        len(prompt), len(prompt.split()), len(numbers), len(set(numbers)),
        len([s for s in re.split(r"[.?!]\s", prompt) if s.strip()]), prompt.count("%") + lower.count("percent"),
        len(_FRACTION.findall(prompt)), len(_DECIMAL.findall(prompt)), prompt.count("$"),
    ]
    magnitudes = [np.log1p(max(values)) if values else 0.0, np.log1p(float(np.median(values))) if values else 0.0]
    more = [
        len(units), len({u.rstrip("s") for u in units}), len(_RATES.findall(lower)), len(_OPERATIONS.findall(lower)),
        number_words, len(questions[-2]) if len(questions) > 1 else len(prompt.split(".")[-1]),
        len(numbers) + number_words, prompt.count(","), sum(1 for v in values if v != int(v)),
    ]
    return np.array([*np.log1p(counts), *magnitudes, *np.log1p(more)], dtype=np.float64)


def word_problem_matrix(prompts: list[str]) -> np.ndarray:
    return np.array([word_problem_features(p) for p in prompts], dtype=np.float64).reshape(
        len(prompts), len(WORD_PROBLEM_FEATURES))


class EmbeddingMemo:
    """Contextual MiniLM embeddings of prompts, remembered by the prompt's SHA-256 (bounded, least recently
    used first out). Routing sees the same prompts again (retries, eval after train) and a vector is 1.5 KB,
    so a few thousand cost little; the shared embedder itself is not touched."""

    def __init__(self, capacity: int = 20_000) -> None:
        self._vectors: LRUCache[bytes, np.ndarray] = LRUCache(capacity)
        self._lock = threading.Lock()   # routers embed from several threads

    @property
    def capacity(self) -> int:
        return self._vectors.maxsize

    def embed(self, prompts: list[str]) -> np.ndarray:
        """Unit-length float32 rows, one per prompt, computed only for prompts not seen recently."""
        from tokenomy.embedding.embedder import default_embedder

        if not prompts:
            return np.zeros((0, DIM), dtype=np.float32)
        keys = [hashlib.sha256(p.encode("utf-8")).digest() for p in prompts]
        with self._lock:
            found = {k: v for k in keys if (v := self._vectors.get(k)) is not None}
        todo = list(dict.fromkeys(k for k in keys if k not in found))
        if todo:
            text_of = dict(zip(keys, prompts, strict=True))
            vectors = default_embedder().embed([text_of[k] for k in todo])
            found.update(zip(todo, vectors, strict=True))
            with self._lock:
                self._vectors.update(zip(todo, vectors, strict=True))
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)


class StaticEmbedder:
    """MiniLM without its transformer: the mean of the prompt's input token vectors (the model's own word
    embedding table, special tokens left out), unit length. Nothing is contextualised, so it costs a table
    lookup per token instead of a transformer pass (timings and routing quality: docs/routing.md)."""

    max_tokens = 1024  # a longer prompt is judged on its start; tokenising megabytes would cost more than routing

    def __init__(self) -> None:
        from pathlib import Path

        from safetensors import safe_open
        from tokenizers import Tokenizer

        from tokenomy.embedding.embedder import packaged_model_path

        root = Path(packaged_model_path())
        self._tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        with safe_open(str(root / "model.safetensors"), framework="np") as weights:   # that one tensor alone
            self._table = weights.get_tensor("embeddings.word_embeddings.weight").astype(np.float32)

    def embed(self, prompts: list[str]) -> np.ndarray:
        out = np.zeros((len(prompts), DIM), dtype=np.float32)
        for i, encoding in enumerate(self._tokenizer.encode_batch(list(prompts), add_special_tokens=False)):
            ids = encoding.ids[: self.max_tokens]
            if ids:
                vector = self._table[ids].mean(axis=0)
                out[i] = vector / max(float(np.linalg.norm(vector)), 1e-12)
        return out


DIM = 384
EMBEDDINGS = ("minilm", "minilm-static")
_memo = EmbeddingMemo()
_static: StaticEmbedder | None = None
_static_lock = threading.Lock()


def embed_prompts(prompts: list[str], kind: str = "minilm") -> np.ndarray:
    """Unit-length 384-d embeddings of `kind`: "minilm" (contextual, tokenomy.embedding.embedder, memoised) or
    "minilm-static" (StaticEmbedder)."""
    global _static
    if kind == "minilm":
        return _memo.embed(list(prompts))
    if kind == "minilm-static":
        with _static_lock:
            if _static is None:
                _static = StaticEmbedder()
        return _static.embed(list(prompts))
    raise ValueError(f"unknown embedding {kind!r}; known: {', '.join(EMBEDDINGS)}")
