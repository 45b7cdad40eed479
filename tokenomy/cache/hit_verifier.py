"""Verification of semantic-cache candidates: is the cached answer right for the new question?

A cosine threshold alone cannot hold wrong hits to a budget on real traffic: on QQP's hard negatives, MiniLM
puts 31% wrong hits above 0.9 and 26% above 0.95. The verifier looks at what cosine blurs: numbers, names,
negations, question words and the content words that one question has and the other lacks, plus the margin
between the best and second-best candidate. A small model over these pair features (gradient-boosted trees
by default, or a logistic regression) gives p(right | pair); it is fitted and calibrated by
``tokenomy.tools.cache_calibration.calibrate`` (cross-fitted, see there) and shipped as ``verifier.json``.

Operating point. For an error budget e (tolerated share of served hits that are wrong) and a cosine gate t, the
shipped calibration points are out-of-fold candidates (cos, p, wrong). The operating point is the lowest p*
such that an upper confidence bound on the wrong share of {cos >= t, p >= p*} is <= e (Jeffreys upper bound
at ``confidence``), so a budget maps to a point through calibration data the model did not train on. When no
p* qualifies the operating point is 1.01: the cache serves no paraphrase rather than break the budget.

What the shipped calibration can certify (QQP dev, calibration half): no region of 50+ candidates is under 6%
wrong (8% at the 80% upper bound), so budgets of 2% and 5% serve no paraphrase on QQP-calibrated terms.
QQP's labels put a floor there: among candidates with identical content words, no number/negation/name/
question-word difference and cos >= 0.98, 8% are labelled non-duplicates, about half of them plainly the same
question ("Which laptop should I buy?" / "Which laptop I should buy?"). On paraphrase-only traffic (every
query has its answer stored) the same operating points give far fewer wrong hits than the budget
(see bench/semantic_cache_qqp.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_VERIFIER = Path(__file__).with_name("verifier.json")

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")

STOPWORDS = frozenset("""
a an the and or but if then else of at by for with about against between into through during before after
above below to from up down in out on off over under again further once here there all any both each few more
most other some such only own same so than too very s t can will just should now i me my myself we our ours
ourselves you your yours yourself yourselves he him his himself she her hers herself it its itself they them
their theirs themselves what which who whom whose this that these those am is are was were be been being have
has had having do does did doing would could might must shall may get got as until while also ever much many
one way best good really like someone something anyone anything people thing things know want make use
""".split())

QUESTION_WORDS = ("what", "why", "how", "which", "who", "whom", "whose", "when", "where")
NEGATIONS = frozenset({"not", "no", "never", "none", "nothing", "nobody", "nor", "neither", "without",
                       "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent",
                       "wont", "shouldnt", "wouldnt", "couldnt"})
# Small words that flip what is asked: "arguments for" vs "against", "import from India to Canada".
DIRECTIONAL = frozenset({"for", "against", "from", "to", "into", "with", "without", "before", "after", "more",
                         "less", "than", "above", "below", "over", "under", "up", "down", "in", "out", "on", "off",
                         "between", "vs", "versus", "or", "and", "not", "only", "all", "any", "some", "each"})
PERSONS = {"i": "1", "me": "1", "my": "1", "mine": "1", "myself": "1", "we": "1p", "us": "1p", "our": "1p",
           "you": "2", "your": "2", "yours": "2", "yourself": "2", "he": "3", "she": "3", "him": "3", "her": "3",
           "his": "3", "they": "3p", "them": "3p", "their": "3p"}
COMPARATIVES = frozenset({"best", "worst", "better", "worse", "most", "least", "more", "less", "first", "last",
                          "top", "biggest", "largest", "smallest", "cheapest", "easiest", "hardest", "fastest"})

FEATURES = (
    "cos", "margin", "jaccard", "content_jaccard", "q_only", "c_only", "only_max", "char_ratio",
    "bigram_jaccard", "len_gap", "number_mismatch", "capital_mismatch", "negation_mismatch",
    "qword_mismatch", "first_word_same", "comparative_mismatch", "cos_x_content_jaccard", "short",
    "order_discordance", "directional_mismatch", "person_mismatch", "longest",
)


def _stem(word: str) -> str:
    """A deliberately crude suffix stripper: enough to match plural/verb forms within one language."""
    for suffix, repl, min_len in (("ies", "y", 5), ("sses", "ss", 5), ("ing", "", 6), ("ed", "", 5),
                                  ("es", "", 5), ("s", "", 4), ("ly", "", 5)):
        if len(word) >= min_len and word.endswith(suffix) and not word.endswith("ss" if suffix == "s" else "\0"):
            return word[: len(word) - len(suffix)] + repl
    return word


@dataclass(frozen=True)
class _Parsed:
    words: tuple[str, ...]
    sequence: tuple[str, ...]  # stemmed content words in order
    directional: frozenset[str]
    persons: frozenset[str]
    content: frozenset[str]
    numbers: frozenset[str]
    capitals: frozenset[str]
    negated: bool
    qwords: frozenset[str]
    comparatives: frozenset[str]
    lower: str


@lru_cache(maxsize=65_536)
def _parse(text: str) -> _Parsed:
    norm = text.replace("’", "'")
    lower = norm.lower()
    words = tuple(_WORD.findall(lower))
    squashed = {w.replace("'", "") for w in words}
    raw = _WORD.findall(norm)
    # Capitalised words after the first one, and all-caps acronyms: mostly names of things.
    capitals = frozenset(w.lower() for i, w in enumerate(raw)
                         if (i > 0 and w[0].isupper() and w.lower() not in STOPWORDS) or (len(w) > 1 and w.isupper()))
    sequence = tuple(_stem(w.replace("'", "")) for w in words if w.replace("'", "") not in STOPWORDS)
    content = frozenset(sequence)
    negated = bool(squashed & NEGATIONS) or any(w.endswith("n't") for w in words)
    return _Parsed(words=words, sequence=sequence, directional=frozenset(squashed & DIRECTIONAL),
                   persons=frozenset(PERSONS[w] for w in squashed if w in PERSONS), content=content,
                   numbers=frozenset(_NUMBER.findall(norm)), capitals=capitals,
                   negated=negated, qwords=frozenset(w for w in words if w in QUESTION_WORDS),
                   comparatives=frozenset(squashed & COMPARATIVES), lower=" ".join(words))


def _jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _discordance(a: Sequence[str], b: Sequence[str]) -> float:
    """Share of pairs of shared words that appear in opposite order ("Apple better than Samsung")."""
    pos_b: dict[str, int] = {}
    for i, w in enumerate(b):
        pos_b.setdefault(w, i)
    seen: set[str] = set()
    shared = []
    for w in a:
        if w in pos_b and w not in seen:
            seen.add(w)
            shared.append(pos_b[w])
    n = len(shared)
    if n < 2:
        return 0.0
    flips = sum(shared[i] > shared[j] for i in range(n) for j in range(i + 1, n))
    return flips / (n * (n - 1) / 2)


def pair_features(query: str, candidate: str, cos: float, second_cos: float | None) -> np.ndarray:
    """Feature vector (in ``FEATURES`` order) for serving ``candidate``'s answer to ``query``.

    ``second_cos`` is the cosine of the next-best candidate with different text in the same context; None when
    there is none (the margin is then taken as 0.2, the cap applied to every margin).
    """
    q, c = _parse(query), _parse(candidate)
    q_only, c_only = len(q.content - c.content), len(c.content - q.content)
    content_j = _jaccard(q.content, c.content)
    qb = set(zip(q.words, q.words[1:], strict=False))
    cb = set(zip(c.words, c.words[1:], strict=False))
    margin = 0.2 if second_cos is None else min(max(cos - second_cos, 0.0), 0.2)
    longest = max(len(q.words), len(c.words), 1)
    return np.array([
        cos,
        margin,
        _jaccard(set(q.words), set(c.words)),
        content_j,
        min(q_only, 6),
        min(c_only, 6),
        min(max(q_only, c_only), 6),
        SequenceMatcher(None, q.lower, c.lower, autojunk=False).ratio(),
        _jaccard(qb, cb),
        abs(len(q.words) - len(c.words)) / longest,
        float(q.numbers != c.numbers),
        min(len(q.capitals ^ c.capitals), 4),
        float(q.negated != c.negated),
        float(q.qwords != c.qwords),
        float(bool(q.words) and bool(c.words) and q.words[0] == c.words[0]),
        float(q.comparatives != c.comparatives),
        cos * content_j,
        float(min(len(q.words), len(c.words)) <= 4),
        _discordance(q.sequence, c.sequence),
        min(len(q.directional ^ c.directional), 3),
        float(q.persons != c.persons),
        min(longest, 30) / 30,
    ], dtype=np.float64)


def beta_cdf(x: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The regularised incomplete beta function I_x(a, b) (Beta(a, b)'s CDF at x, 0 < x < 1) for arrays of a and
    b: the continued fraction of Numerical Recipes' betacf, by the modified Lentz method, on the side of the
    mean where it converges fast (I_x(a, b) = 1 - I_1-x(b, a)); to 1e-15 relative, as scipy.special.betainc."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    flip = x >= (a + 1) / (a + b + 2)
    p, q, z = np.where(flip, b, a), np.where(flip, a, b), np.where(flip, 1.0 - x, x)
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    front = np.exp(lgamma(p + q) - lgamma(p) - lgamma(q) + p * np.log(z) + q * np.log1p(-z)) / p
    tiny = 1e-300
    c = np.ones_like(p)
    d = 1.0 - (p + q) * z / (p + 1)
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    f = d.copy()
    done = np.zeros(p.shape, dtype=bool)
    for m in range(1, 10_000):
        for num in (m * (q - m) * z / ((p + 2 * m - 1) * (p + 2 * m)),
                    -(p + m) * (p + q + m) * z / ((p + 2 * m) * (p + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + num / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            step = c * d
            f = np.where(done, f, f * step)
            done |= np.abs(step - 1.0) < 1e-16
        if done.all():
            break
    cdf = front * f
    return np.where(flip, 1.0 - cdf, cdf)


def jeffreys_upper(wrong: int, total: int, confidence: float) -> float:
    """Upper bound of a binomial proportion: the ``confidence`` quantile of Beta(wrong + 1/2, right + 1/2)
    (bisection on beta_cdf to float precision)."""
    if total <= 0:
        return 1.0
    a, b = np.array([wrong + 0.5]), np.array([total - wrong + 0.5])
    lo, hi = 0.0, 1.0
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return hi
        if beta_cdf(mid, a, b)[0] >= confidence:
            hi = mid
        else:
            lo = mid


def jeffreys_within(wrong: np.ndarray, total: np.ndarray, confidence: float, bound: float) -> np.ndarray:
    """``jeffreys_upper(wrong, total, confidence) <= bound`` for arrays of counts (total >= 1), without the
    inversion: the quantile lies at or below `bound` exactly when the CDF there reaches `confidence`."""
    wrong, total = np.asarray(wrong, dtype=np.float64), np.asarray(total, dtype=np.float64)
    if bound >= 1:
        return np.ones(wrong.shape, dtype=bool)
    return beta_cdf(bound, wrong + 0.5, total - wrong + 0.5) >= confidence


class Verifier:
    """The shipped pair classifier and its calibration: ``probability`` and ``operating_point``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec.get("features") != list(FEATURES):
            raise ValueError("verifier spec was fitted on a different feature set; "
                             "rerun tokenomy.tools.cache_calibration.calibrate")
        self.spec = spec
        model = spec["model"]
        self.kind = model["kind"]
        if self.kind == "logistic":
            self.mean = np.asarray(model["mean"], dtype=np.float64)
            self.scale = np.asarray(model["scale"], dtype=np.float64)
            self.coef = np.asarray(model["coef"], dtype=np.float64)
            self.intercept = float(model["intercept"])
        elif self.kind == "trees":
            # Trees padded to one node count, so all are walked at once: node <- left/right per tree per step.
            trees = model["trees"]
            width = max(len(t["feature"]) for t in trees)

            def pad(key: str, fill: float) -> np.ndarray:
                return np.array([t[key] + [fill] * (width - len(t[key])) for t in trees])

            self.feature = pad("feature", -1).astype(np.int64)
            self.threshold = pad("threshold", 0.0).astype(np.float64)
            self.left = pad("left", 0).astype(np.int64)
            self.right = pad("right", 0).astype(np.int64)
            self.value = pad("value", 0.0).astype(np.float64)
            self.depth = int(model["depth"])
            self.baseline = float(model["baseline"])
        else:
            raise ValueError(f"unknown verifier model kind {self.kind!r}")
        self.confidence = float(spec.get("confidence", 0.8))
        # Out-of-fold calibration candidates: (cosine, p(right), 1 if serving it would have been wrong).
        points = np.asarray(spec["calibration_points"], dtype=np.float64).reshape(-1, 3)
        self._cos, self._p, self._wrong = points[:, 0], points[:, 1], points[:, 2].astype(int)
        self.min_gate = float(self._cos.min()) if len(self._cos) else 1.0
        self._points: dict[tuple[float, float], float] = {}

    @classmethod
    def load(cls, path: str | Path = DEFAULT_VERIFIER) -> Verifier:
        try:
            spec = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"verifier file {path} not found; build it with "
                                    "`python -m tokenomy.tools.cache_calibration.calibrate`") from exc
        return cls(spec)

    def probability(self, features: np.ndarray) -> float | np.ndarray:
        """p(right) = sigmoid(z): z = w . (x - mean) / scale + b (logistic) or baseline + sum of the trees'
        leaf values (gradient-boosted trees, x <= threshold goes left). One vector gives a float, a matrix an
        array."""
        x = np.asarray(features, dtype=np.float64)
        single = x.ndim == 1
        x = np.atleast_2d(x)
        if self.kind == "logistic":
            z = ((x - self.mean) / self.scale) @ self.coef + self.intercept
        else:
            rows = np.arange(len(self.feature))
            z = np.empty(len(x))
            for i, xi in enumerate(x):
                node = np.zeros(len(rows), dtype=np.int64)
                for _ in range(self.depth):
                    f = self.feature[rows, node]
                    go_left = xi[np.maximum(f, 0)] <= self.threshold[rows, node]
                    node = np.where(f < 0, node, np.where(go_left, self.left[rows, node], self.right[rows, node]))
                z[i] = self.baseline + self.value[rows, node].sum()
        p = 1.0 / (1.0 + np.exp(-z))
        return float(p[0]) if single else p

    def operating_point(self, error_budget: float, threshold: float) -> float:
        """Lowest p* whose calibration hits {cos >= threshold, p >= p*} have an upper-bound wrong share
        <= error_budget; 1.01 (serve nothing) when no p* qualifies or the calibration has no such candidates."""
        if not 0 < error_budget < 1:
            raise ValueError(f"error_budget must be in (0, 1), got {error_budget!r}")
        key = (error_budget, threshold)
        if key not in self._points:
            # Below the lowest calibrated cosine nothing is known: calibrate from the lowest gate upward only.
            gate = self._cos >= max(threshold, self.min_gate)
            order = np.argsort(-self._p[gate], kind="stable")
            ps, wrong = self._p[gate][order], self._wrong[gate][order]
            n_wrong = np.cumsum(wrong)
            # the last of each run of ties (ties are served together) whose upper bound is within the budget
            ends = np.flatnonzero(np.append(ps[1:] != ps[:-1], True)) if len(ps) else np.zeros(0, dtype=int)
            ok = ends[jeffreys_within(n_wrong[ends], ends + 1, self.confidence, error_budget)]
            self._points[key] = float(ps[ok[-1]]) if len(ok) else 1.01
        return self._points[key]

    def served_points(self, error_budget: float, threshold: float) -> np.ndarray:
        """(n, 2) rows of (p, wrong) of the calibration candidates the operating point serves: the prior of
        online error control (error_control.py)."""
        gate = (self._cos >= max(threshold, self.min_gate)) & (self._p >= self.operating_point(error_budget, threshold))
        return np.stack([self._p[gate], self._wrong[gate].astype(np.float64)], axis=1)


def load_default() -> Verifier | None:
    """The packaged verifier, or None when it has not been built."""
    return Verifier.load() if DEFAULT_VERIFIER.exists() else None


def features_matrix(rows: Sequence[tuple[str, str, float, float | None]]) -> np.ndarray:
    """Stack ``pair_features`` for many (query, candidate, cos, second_cos) rows."""
    return np.stack([pair_features(*r) for r in rows]) if rows else np.zeros((0, len(FEATURES)))


