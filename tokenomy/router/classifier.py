"""The learned route classifier: prompt -> calibrated chance that the weak model's answer is good enough -> weak or
strong. (It advises; the route stage, pipeline/route.py, routes.)

Model. Features are [group priors (4), text features (14), optionally word-problem features (20, zero for a
multiple-choice prompt; dense_features)] standardised, plus the prompt embedding projected on its first 16
principal components (each scaled to unit variance); a head may add further components that count only for
free-answer prompts (`free_answer_components`, zero for a multiple-choice prompt; the contextual head's next 16,
see docs/routing.md). A multinomial logistic regression
predicts the joint outcome (weak right?, strong right?) in four classes; from them

    p_weak_ok        = P(weak only right) + 1/2 P(both or neither right)
                     = (1 - (P(strong right) - P(weak right))) / 2
    p_weak_correct   = P(weak right),  p_strong_correct = P(strong right)

p_weak_ok is the weak model's win rate against the strong one with ties split evenly (RouteLLM routes on the
strong model's win rate, 1 - p_weak_ok): "good enough" means "no worse than the strong answer". It ranks by
the expected accuracy the strong model would add, P(strong right) - P(weak right). Ranking by P(weak right)
alone is worse (dev split, MMLU APGR 0.58 vs 0.65): many prompts the weak model fails, the strong one fails too.

RoutePrediction: the weak model when p_weak_ok >= threshold, else the strong one. Training and calibration are
offline (tokenomy/tools/router_training/train.py, calibrate.py); this module holds the classifier, applies it, and
reads and writes its file.

Heads. A router file (TrainedRouter) holds one or two such classifiers ("heads"), each on its own embedding with its
own threshold: "minilm-static" (about 1 ms) and "minilm" (the contextual vector, better but 8-50 ms unless the
semantic cache computed it already). TrainedRouter.head_for picks the contextual head when the prompt's contextual
vector is at hand and the static head otherwise; a file with one head always uses it.

File. One JSON document: a readable header (format, version, models, the decision rule) and per head its
threshold and the target it came from, feature configuration, training summary and arrays as base64 float64.
Version 3 adds `features.free_answer_components`; version 2 (the same without it: none) lists the heads under
"heads"; version 1 (one head, its fields at the top level) still loads. Loading
never executes code, unlike a pickle, and does not depend on the scikit-learn version that trained it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenomy.router.features import (
    EMBEDDINGS,
    TEXT_FEATURES,
    WORD_PROBLEM_FEATURES,
    embed_prompts,
    text_feature_matrix,
    word_problem_matrix,
)
from tokenomy.router.prior import OUTCOMES, GroupPrior

FORMAT = "tokenomy-router"
VERSION = 3  # the version save() writes
READABLE_VERSIONS = (1, 2, 3)  # 1: a single head, its fields at the top level; 2: no free-answer components
DEFAULT_EMBEDDING = "minilm-static"  # fits the 15 ms decision budget on a 2-core CPU; see features.py
CONTEXTUAL, STATIC = "minilm", "minilm-static"
CLASSES = ("neither", "strong_only", "weak_only", "both")  # index = 2 * weak_ok + strong_ok
# The parameter arrays a router file stores (besides the prior's), in the file's order.
_ARRAYS = ("scaler_mean", "scaler_scale", "pca_mean", "pca_components", "pca_scale", "coef", "intercept")


class RouterFileError(ValueError):
    """A router file is missing, unreadable or not a tokenomy router."""


@dataclass(frozen=True)
class RoutePrediction:
    """The classifier's choice for one prompt, with the numbers behind it (for the ledger and x-tokenomy-route)."""

    model: str
    probability: float  # p_weak_ok
    threshold: float  # weak when probability >= threshold
    reason: str
    p_weak_correct: float
    p_strong_correct: float


@dataclass
class RouteClassifier:
    """The classifier behind a route's `classifier` strategy: p_weak_ok for a prompt, and the model it picks."""

    weak: str
    strong: str
    threshold: float
    scaler_mean: np.ndarray
    scaler_scale: np.ndarray
    pca_mean: np.ndarray
    pca_components: np.ndarray
    pca_scale: np.ndarray
    coef: np.ndarray  # (classes present, features)
    intercept: np.ndarray
    classes: list[int]  # indices into CLASSES, in coef's row order
    prior: GroupPrior | None = None
    embedding: str = DEFAULT_EMBEDDING
    meta: dict = field(default_factory=dict)
    word_problem: bool = False  # dense features also hold WORD_PROBLEM_FEATURES (see dense_features)
    # The last this many principal components count only for free-answer prompts (multiplied by 0 for a
    # multiple-choice one): GSM8K-like prompts get finer embedding directions without MMLU's fit paying for them.
    free_answer_components: int = 0

    def __post_init__(self) -> None:
        # Hold every parameter exactly as save() writes it and load() reads it back: C-ordered float64. Fitted
        # arrays come out of scikit-learn as float32 or as Fortran-ordered views, and BLAS sums those in another
        # order than the same numbers in the file's layout; converting here makes a loaded router compute bit for
        # bit what the router that was saved computes, on any CPU.
        for name in _ARRAYS:
            setattr(self, name, _canonical(getattr(self, name)))

    # ---- inference ---------------------------------------------------------------------------------------

    def embed(self, prompts: list[str]) -> np.ndarray:
        """The embedding this router was trained on, for prompts."""
        return embed_prompts(prompts, self.embedding)

    def features(self, prompts: list[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        x = self.embed(prompts) if embeddings is None else np.asarray(embeddings, dtype=np.float32).reshape(
            len(prompts), -1)
        prior = self.prior.transform(x) if self.prior is not None else np.zeros((len(prompts), 0))
        dense = np.c_[prior, dense_features(prompts, self.word_problem)]
        projected = gate_free_answer(
            (x - self.pca_mean) @ self.pca_components.T, dense[:, prior.shape[1]:], self.free_answer_components)
        return np.c_[(dense - self.scaler_mean) / self.scaler_scale, projected / self.pca_scale]

    def class_probabilities(self, prompts: list[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        """(N, 4) probabilities of CLASSES (classes never seen in training get 0)."""
        logits = self.features(prompts, embeddings) @ self.coef.T + self.intercept
        if len(self.classes) == 2:  # scikit-learn fits one logit for a binary problem
            p1 = 1.0 / (1.0 + np.exp(-logits[:, 0]))
            present = np.c_[1.0 - p1, p1]
        else:
            logits -= logits.max(axis=1, keepdims=True)
            present = np.exp(logits)
            present /= present.sum(axis=1, keepdims=True)
        out = np.zeros((len(prompts), len(CLASSES)))
        out[:, self.classes] = present
        return out

    def p_weak_ok_many(self, prompts: list[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        """p_weak_ok for many prompts at once (see module docstring)."""
        return weak_ok_probability(self.class_probabilities(prompts, embeddings))

    def p_weak_ok(self, prompt: str, embedding: np.ndarray | None = None) -> float:
        """Calibrated probability that the weak model's answer is no worse than the strong one's (ties half).

        `embedding`: this prompt's vector of the router's embedding kind, when the caller has it already."""
        return float(self.p_weak_ok_many([prompt], embedding)[0])

    def predict(self, prompt: str, embedding: np.ndarray | None = None, threshold: float | None = None
                ) -> RoutePrediction:
        """The weak model when p_weak_ok >= threshold, else the strong one, with the numbers behind it.

        `threshold`: a route's own (config `classifier.threshold`) instead of this head's calibrated one."""
        threshold = self.threshold if threshold is None else float(threshold)
        p = self.class_probabilities([prompt], embedding)[0]
        p_ok = float(weak_ok_probability(p[None, :])[0])
        weak_right, strong_right = float(p[2] + p[3]), float(p[1] + p[3])
        if p_ok >= threshold:
            model, reason = self.weak, f"p_weak_ok {p_ok:.3f} >= threshold {threshold:.3f}"
        else:
            model, reason = self.strong, f"p_weak_ok {p_ok:.3f} < threshold {threshold:.3f}"
        return RoutePrediction(model, p_ok, threshold, reason, weak_right, strong_right)

    # ---- file --------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write this classifier as a router file with one head (TrainedRouter.save)."""
        TrainedRouter([self]).save(path)

    @classmethod
    def load(cls, path: str | Path) -> RouteClassifier:
        """The head of a one-head router file; RouterFileError for a bad file or one with several heads
        (read those with TrainedRouter.load)."""
        router = TrainedRouter.load(path)
        if len(router.heads) != 1:
            raise RouterFileError(f"{path}: holds {len(router.heads)} heads "
                                  f"({', '.join(router.embeddings)}); read it with TrainedRouter.load")
        return router.heads[0]

    def to_document(self) -> dict:
        """This head's part of a router file: threshold, features, model, meta and arrays (JSON-ready)."""
        arrays = {name: getattr(self, name) for name in _ARRAYS}
        if self.prior is not None:
            arrays |= {"prior_centroids": self.prior.centroids, "prior_rates": self.prior.rates}
        return {
            "threshold": self.threshold,
            "features": {
                "embedding": self.embedding,
                "pca_components": int(self.pca_components.shape[0]),
                "free_answer_components": self.free_answer_components,
                "text": list(TEXT_FEATURES),
                "word_problem": list(WORD_PROBLEM_FEATURES) if self.word_problem else None,
                "prior": None if self.prior is None else {**self.prior.to_dict(), "outcomes": list(OUTCOMES)},
            },
            "model": {"kind": "multinomial logistic regression", "classes": [CLASSES[k] for k in self.classes]},
            "meta": self.meta,
            "arrays": {name: _encode(a) for name, a in arrays.items()},
        }

    @classmethod
    def from_document(cls, document: dict, weak: str, strong: str, path: Path) -> RouteClassifier:
        """A head from its part of a router file (to_document's output, or a version-1 file's top level)."""
        try:
            arrays = {name: _decode(a) for name, a in document["arrays"].items()}
            classes = [CLASSES.index(c) for c in document["model"]["classes"]]
            prior_doc = document["features"]["prior"]
            prior = None
            if prior_doc is not None:
                prior = GroupPrior(
                    list(prior_doc["groups"]), arrays["prior_centroids"], arrays["prior_rates"],
                    float(prior_doc["tau"]),
                )
            router = cls(
                weak=weak, strong=strong, threshold=float(document["threshold"]),
                scaler_mean=arrays["scaler_mean"], scaler_scale=arrays["scaler_scale"],
                pca_mean=arrays["pca_mean"], pca_components=arrays["pca_components"],
                pca_scale=arrays["pca_scale"], coef=arrays["coef"], intercept=arrays["intercept"],
                classes=classes, prior=prior, embedding=str(document["features"]["embedding"]),
                meta=dict(document.get("meta") or {}),
                word_problem=bool(document["features"].get("word_problem")),
                free_answer_components=int(document["features"].get("free_answer_components") or 0),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RouterFileError(f"{path}: damaged router file ({exc!r})") from exc
        if router.embedding not in EMBEDDINGS:
            raise RouterFileError(f"{path}: unknown embedding {router.embedding!r}; this reads {', '.join(EMBEDDINGS)}")
        router._check_shapes(path)
        return router

    def _check_shapes(self, path: Path) -> None:
        n_dense = len(self.scaler_mean)
        n_prior = 0 if self.prior is None else self.prior.rates.shape[1]
        ok = (
            n_dense == len(self.scaler_scale) == n_prior + len(TEXT_FEATURES) + (
                len(WORD_PROBLEM_FEATURES) if self.word_problem else 0)
            and self.pca_components.ndim == 2
            and self.pca_components.shape[1] == len(self.pca_mean)
            and len(self.pca_scale) == self.pca_components.shape[0]
            and 0 <= self.free_answer_components <= self.pca_components.shape[0]
            and self.coef.shape == (1 if len(self.classes) == 2 else len(self.classes),
                                    n_dense + self.pca_components.shape[0])
            and len(self.intercept) == self.coef.shape[0]
            and (self.prior is None or self.prior.centroids.shape == (len(self.prior.groups), len(self.pca_mean)))
        )
        if not ok:
            raise RouterFileError(f"{path}: damaged router file (array shapes do not fit together)")


@dataclass
class TrainedRouter:
    """What a router file holds: one head, or two on different embeddings, for the same weak and strong models.

    Invariants (checked on construction): at least one head, all heads name the same weak and strong models, and
    no two heads share an embedding. Heads are kept static first."""

    heads: list[RouteClassifier]

    def __post_init__(self) -> None:
        if not self.heads:
            raise ValueError("a router needs at least one head")
        if len({(h.weak, h.strong) for h in self.heads}) != 1:
            raise ValueError("every head of a router must route between the same weak and strong models")
        if len({h.embedding for h in self.heads}) != len(self.heads):
            raise ValueError("two heads of a router share an embedding")
        self.heads = sorted(self.heads, key=lambda h: h.embedding != STATIC)

    @property
    def weak(self) -> str:
        return self.heads[0].weak

    @property
    def strong(self) -> str:
        return self.heads[0].strong

    @property
    def embeddings(self) -> list[str]:
        return [h.embedding for h in self.heads]

    def head(self, embedding: str) -> RouteClassifier | None:
        """The head on `embedding`, or None."""
        return next((h for h in self.heads if h.embedding == embedding), None)

    def head_for(self, contextual_vector_at_hand: bool) -> RouteClassifier:
        """The head that decides a prompt: the contextual ("minilm") head when the prompt's contextual vector is
        already computed (its cost paid, e.g. by the semantic cache's lookup), else the static head; a router
        with one head always uses it (a lone contextual head embeds the prompt itself)."""
        contextual, static = self.head(CONTEXTUAL), self.head(STATIC)
        if contextual is not None and (contextual_vector_at_hand or static is None):
            return contextual
        return static if static is not None else self.heads[0]

    def save(self, path: str | Path) -> None:
        """Write the router as one JSON file (version VERSION, see module docstring); replaces it atomically."""
        document = {
            "format": FORMAT,
            "version": VERSION,
            "weak": self.weak,
            "strong": self.strong,
            "decision": "weak if p_weak_ok >= threshold else strong; with two heads, the minilm head decides when "
                        "the prompt's contextual vector is already computed, else the minilm-static head",
            "heads": [h.to_document() for h in self.heads],
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(document, indent=1), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> TrainedRouter:
        """Read a router file of any version in READABLE_VERSIONS; RouterFileError says what is wrong with a bad
        one."""
        path = Path(path)
        if not path.is_file():
            raise RouterFileError(f"{path}: no such router file")
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RouterFileError(f"{path}: not a tokenomy router file ({exc})") from exc
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise RouterFileError(f"{path}: not a tokenomy router file (format is not {FORMAT!r})")
        version = document.get("version")
        if version not in READABLE_VERSIONS:
            raise RouterFileError(f"{path}: router file version {version!r}, this reads "
                                  f"{', '.join(map(str, READABLE_VERSIONS))}")
        try:
            weak, strong = str(document["weak"]), str(document["strong"])
            parts = [document] if version == 1 else list(document["heads"])
        except (KeyError, TypeError) as exc:
            raise RouterFileError(f"{path}: damaged router file ({exc!r})") from exc
        heads = [RouteClassifier.from_document(part, weak, strong, path) for part in parts]
        try:
            return cls(heads)
        except ValueError as exc:
            raise RouterFileError(f"{path}: damaged router file ({exc})") from exc


def dense_features(prompts: list[str], word_problem: bool = False) -> np.ndarray:
    """TEXT_FEATURES of each prompt, then with `word_problem` its WORD_PROBLEM_FEATURES, set to zero for a
    multiple-choice prompt (they describe free-answer word problems)."""
    text = text_feature_matrix(prompts)
    if not word_problem:
        return text
    free = 1.0 - text[:, TEXT_FEATURES.index("multiple_choice")]
    return np.c_[text, word_problem_matrix(prompts) * free[:, None]]


def gate_free_answer(projected: np.ndarray, text_and_more: np.ndarray, components: int) -> np.ndarray:
    """`projected` with its last `components` columns zeroed on multiple-choice rows; `text_and_more` are the
    rows' dense features without the prior (dense_features: TEXT_FEATURES first)."""
    if components:
        free = 1.0 - text_and_more[:, TEXT_FEATURES.index("multiple_choice")]
        projected = projected.copy()
        projected[:, -components:] *= free[:, None]
    return projected


def weak_ok_probability(class_probabilities: np.ndarray) -> np.ndarray:
    """P(weak only) + 1/2 P(neither or both), rows of CLASSES probabilities in."""
    p = np.asarray(class_probabilities)
    return p[:, 2] + 0.5 * (p[:, 0] + p[:, 3])


def _canonical(array: np.ndarray) -> np.ndarray:
    """The layout and precision of a router file's arrays (what _decode returns)."""
    return np.ascontiguousarray(array, dtype="<f8")


def _encode(array: np.ndarray) -> dict:
    array = _canonical(array)
    return {"shape": list(array.shape), "float64": base64.b64encode(array.tobytes()).decode("ascii")}


def _decode(blob: dict) -> np.ndarray:
    data = base64.b64decode(blob["float64"], validate=True)
    return np.frombuffer(data, dtype="<f8").reshape(blob["shape"]).copy()
