"""Training a route classifier: labelled prompts in, a RouteClassifier (tokenomy/router/classifier.py) out.

The model is described in classifier.py. Here: the group priors (prior.GroupPrior, fitted with each row left out
of its own group), the text and word-problem features and the embedding's first 16 principal components are
standardised (the contextual head also gets the next 16 components, zero for multiple-choice prompts:
FREE_ANSWER_COMPONENTS), and a multinomial logistic regression is fitted on the four joint outcomes. Its
regularisation strength C is chosen by 5-fold log loss inside the training data only. The threshold is then set
on the training rows for a share of strong calls (recalibrate it on held-out prompts with calibrate.py).
train_router fits one such head per embedding (by default both, static and contextual) into one TrainedRouter.
"""

from __future__ import annotations

import time

import numpy as np

from tokenomy.router.classifier import (
    DEFAULT_EMBEDDING,
    RouteClassifier,
    TrainedRouter,
    dense_features,
    gate_free_answer,
)
from tokenomy.router.features import EMBEDDINGS, embed_prompts
from tokenomy.router.prior import GroupPrior, outcome_matrix
from tokenomy.tools.extras import require
from tokenomy.tools.router_training.dataset import RoutingData

PCA_COMPONENTS = 16
# Principal components after the first PCA_COMPONENTS that count only for free-answer prompts, per embedding.
# With the contextual embedding they lift GSM8K in cross-validation and leave MMLU as it was; with the static
# one they lower GSM8K (docs/routing.md).
FREE_ANSWER_COMPONENTS = {"minilm": 16, "minilm-static": 0}
C_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
MIN_ROWS = 20
HEADS = ("minilm-static", "minilm")  # what `tokenomy router train` fits by default


class RouterTrainingError(ValueError):
    """The data cannot train a router (too few rows, no variation in outcomes)."""


def train_classifier(
    data: RoutingData, embeddings: np.ndarray | None = None, strong_share: float = 0.5,
    embedding: str = DEFAULT_EMBEDDING, word_problem: bool = True, free_answer_components: int | None = None,
) -> RouteClassifier:
    """Fit on `data` (with `embeddings` of its prompts, if already computed, of kind `embedding`); the
    threshold is set so that `strong_share` of the training prompts go strong. `word_problem` adds the
    word-problem features (classifier.dense_features; in cross-validation they lift GSM8K on either embedding
    and leave MMLU as it was, docs/routing.md). `free_answer_components`: how many principal components after
    the first PCA_COMPONENTS count for free-answer prompts only (None: FREE_ANSWER_COMPONENTS[embedding])."""
    PCA = require("sklearn.decomposition", "training a router").PCA

    if embedding not in EMBEDDINGS:
        raise RouterTrainingError(f"unknown embedding {embedding!r}; known: {', '.join(EMBEDDINGS)}")
    if len(data) < MIN_ROWS:
        raise RouterTrainingError(f"need at least {MIN_ROWS} rows to train a router, got {len(data)}")
    labels = (2 * data.weak_ok + data.strong_ok).astype(int)
    if len(set(labels.tolist())) < 2:
        raise RouterTrainingError("every row has the same outcome for both models: nothing to learn")
    x = embed_prompts(data.prompts, embedding) if embeddings is None else np.asarray(embeddings, np.float32)
    groups = [d or b for d, b in zip(data.domains, data.benchmarks, strict=True)]
    from threadpoolctl import threadpool_limits

    # Small dense problems: one BLAS thread is faster than two fighting over shared cores (6x on PCA here).
    with threadpool_limits(1):
        prior, prior_train = None, np.zeros((len(data), 0))
        if len(set(groups)) >= 2 and all(groups):
            prior, prior_train = GroupPrior.fit(x, groups, outcome_matrix(data.weak_ok, data.strong_ok))
        dense = np.c_[prior_train, dense_features(data.prompts, word_problem)]
        scaler_mean, scaler_scale = dense.mean(0), _safe_scale(dense.std(0))
        gated = FREE_ANSWER_COMPONENTS[embedding] if free_answer_components is None else free_answer_components
        n_components = min(PCA_COMPONENTS + gated, len(data) - 1, x.shape[1])
        gated = max(0, min(gated, n_components - PCA_COMPONENTS))
        pca = PCA(n_components=n_components, random_state=0).fit(x)
        # Scaled after gating: a gated component's unit variance is over all rows, as the others'.
        projected = gate_free_answer(pca.transform(x), dense[:, prior_train.shape[1]:], gated)
        pca_scale = _safe_scale(projected.std(0))
        features = np.c_[(dense - scaler_mean) / scaler_scale, projected / pca_scale]

        c = choose_c(features, labels)
        model = logistic(c).fit(features, labels)
    # RouteClassifier stores every array as its file does (C-ordered float64), whatever scikit-learn returned.
    classifier = RouteClassifier(
        weak=data.weak, strong=data.strong, threshold=0.0,
        scaler_mean=scaler_mean, scaler_scale=scaler_scale,
        pca_mean=pca.mean_, pca_components=pca.components_,
        pca_scale=pca_scale, coef=np.atleast_2d(model.coef_), intercept=np.atleast_1d(model.intercept_),
        classes=[int(k) for k in model.classes_], prior=prior, embedding=embedding, word_problem=word_problem,
        free_answer_components=gated,
        meta={
            "C": c,
            "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rows": len(data),
            "weak_quality": float(data.weak_ok.mean()),
            "strong_quality": float(data.strong_ok.mean()),
        },
    )
    from tokenomy.tools.router_training.threshold import threshold_for_strong_share

    calibration = threshold_for_strong_share(classifier.p_weak_ok_many(data.prompts, x), strong_share)
    classifier.threshold = calibration.threshold
    classifier.meta["target"] = {"strong_share": strong_share, "set_by": "train (on its own training rows)"}
    return classifier


def train_router(
    data: RoutingData, embeddings: dict[str, np.ndarray] | None = None, strong_share: float = 0.5,
    heads: tuple[str, ...] | list[str] = HEADS,
) -> TrainedRouter:
    """One head per embedding kind in `heads`, each fitted by train_classifier on all of `data` (with the
    embeddings of its prompts from `embeddings`, where given) and thresholded for `strong_share` on it."""
    if not heads or len(set(heads)) != len(heads):
        raise RouterTrainingError(f"name each embedding once, got {list(heads)}")
    vectors = embeddings or {}
    return TrainedRouter([train_classifier(data, vectors.get(kind), strong_share, kind) for kind in heads])


def logistic(c: float):
    """The multinomial logistic regression the classifier is, at inverse regularisation strength `c`."""
    LogisticRegression = require("sklearn.linear_model", "training a router").LogisticRegression
    return LogisticRegression(C=c, max_iter=5000)


def choose_c(features: np.ndarray, labels: np.ndarray) -> float:
    """The C in C_GRID with the least 5-fold cross-validated log loss on the training rows."""
    from sklearn.metrics import log_loss
    from sklearn.model_selection import KFold

    if len(labels) < 100:
        return 0.03
    present = np.unique(labels)
    folds = list(KFold(5, shuffle=True, random_state=0).split(features))
    losses = []
    for c in C_GRID:
        total = 0.0
        for train, test in folds:
            if len(np.unique(labels[train])) < 2:
                continue
            model = logistic(c).fit(features[train], labels[train])
            proba = np.full((len(test), len(present)), 1e-6)
            proba[:, np.searchsorted(present, model.classes_)] = model.predict_proba(features[test])
            total += log_loss(labels[test], proba / proba.sum(1, keepdims=True), labels=present) * len(test)
        losses.append(total)
    return float(C_GRID[int(np.argmin(losses))])


def _safe_scale(std: np.ndarray) -> np.ndarray:
    return np.where(std > 1e-12, std, 1.0)
