"""Per-domain priors: how often each model is right in a prompt's (inferred) domain.

Training rows may carry a group label (the `domain` field, else `benchmark`); live prompts do not, so the
group is inferred from the embedding. For group g with embedding centroid m_g (mean of its unit vectors):

    P(g | x)  = softmax_g( cos(x, m_g) / tau )                   over the groups seen in training
    rate_g(y) = (sum of y over g + a * mean(y)) / (n_g + a)      smoothed toward the overall mean
    prior(x)  = sum_g P(g | x) * rate_g(y)                       for y in OUTCOMES

For training rows each row is left out of its own group's centroid and rates, so the downstream classifier
learns from priors as uninformed about the row's own label as they will be on new prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The outcomes whose per-group rates become features: strong minus weak (-1, 0, 1), "only the strong model
# is right", and each model's accuracy.
OUTCOMES = ("strong_minus_weak", "strong_only", "weak_ok", "strong_ok")
TAU = 0.05  # softmax temperature on cosine similarity; 0.02-0.1 gave the same figures on the dev split
SMOOTHING = 5.0  # pseudo-count pulling small groups' rates toward the overall rate


def outcome_matrix(weak_ok: np.ndarray, strong_ok: np.ndarray) -> np.ndarray:
    """Rows of OUTCOMES per prompt."""
    return np.c_[strong_ok - weak_ok, (1 - weak_ok) * strong_ok, weak_ok, strong_ok]


@dataclass
class GroupPrior:
    groups: list[str]
    centroids: np.ndarray  # (groups, dim), unit length
    rates: np.ndarray  # (groups, len(OUTCOMES))
    tau: float = TAU

    def __post_init__(self) -> None:
        # The router file's layout and precision (see the classifier's __post_init__): a fitted prior
        # computes bit for bit what the same prior loaded from a file computes.
        self.centroids = np.ascontiguousarray(self.centroids, dtype="<f8")
        self.rates = np.ascontiguousarray(self.rates, dtype="<f8")

    @classmethod
    def fit(
        cls, embeddings: np.ndarray, groups: list[str], outcomes: np.ndarray
    ) -> tuple[GroupPrior, np.ndarray]:
        """Fit centroids and rates; also return the leave-one-out priors of the training rows."""
        names = sorted(set(groups))
        index = np.array([names.index(g) for g in groups])
        onehot = np.eye(len(names))[index]
        sums = onehot.T @ embeddings.astype(np.float64)  # (G, dim)
        counts = onehot.sum(0)
        totals = onehot.T @ outcomes  # (G, K)
        overall = outcomes.mean(0)
        rates = (totals + SMOOTHING * overall) / (counts[:, None] + SMOOTHING)
        prior = cls(names, _unit(sums), rates)

        # Leave-one-out: remove row i from its own group's sum (|s - x|^2 = |s|^2 - 2 s.x + 1 for unit x).
        rows = np.arange(len(index))
        dots = embeddings @ sums.T  # (N, G): x . s_g
        norms = np.linalg.norm(sums, axis=1)
        cos = dots / np.maximum(norms, 1e-12)
        own_sum_dot = dots[rows, index]
        own_norm = np.sqrt(np.maximum(norms[index] ** 2 - 2 * own_sum_dot + 1.0, 0.0))
        cos[rows, index] = (own_sum_dot - 1.0) / np.maximum(own_norm, 1e-12)
        alone = counts[index] <= 1  # a group of one has no centroid without its only row
        posterior = _softmax(cos / prior.tau, mask_rows=rows[alone], mask_cols=index[alone])
        loo_rates = np.broadcast_to(rates, (len(index), *rates.shape)).copy()
        loo_rates[rows, index] = (totals[index] - outcomes + SMOOTHING * overall) / (
            counts[index][:, None] - 1 + SMOOTHING
        )
        return prior, np.einsum("ng,ngk->nk", posterior, loo_rates)

    def transform(self, embeddings: np.ndarray) -> np.ndarray:
        """prior(x) for each row: (N, len(OUTCOMES))."""
        return _softmax((embeddings @ self.centroids.T) / self.tau) @ self.rates

    def to_dict(self) -> dict:
        return {"groups": self.groups, "tau": self.tau}


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def _softmax(logits: np.ndarray, mask_rows: np.ndarray | None = None, mask_cols: np.ndarray | None = None):
    logits = np.array(logits, dtype=np.float64)
    if mask_rows is not None and len(mask_rows):
        logits[mask_rows, mask_cols] = -np.inf
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)
