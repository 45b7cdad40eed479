"""Fit and calibrate the semantic-cache verifier; writes ``tokenomy/cache/verifier.json``.

    python -m tokenomy.tools.cache_calibration.calibrate --data ../shared/data/semantic-cache/qqp-dev.jsonl

Protocol (so that the shipped figures are honest on data the verifier never saw):
1. Split the pairs by a hash of the stored question ``a``: the calibration half (``in_calibration_half``) is
   used here; the other half is left for ``bench/semantic_cache_qqp.py`` to report on.
2. Store every calibration-half ``a``, look up every calibration-half ``b`` and keep the nearest candidate
   (cosine, second-best cosine; exact search, which the cache's ANN index approximates). Its label: right iff
   the pair is a duplicate and the candidate is the pair's own ``a``, the benchmark's definition of a right hit.
3. Gradient-boosted trees (or ``--model logistic``) on ``verify.pair_features``, cross-fitted in 5 folds
   grouped by ``a``; the out-of-fold probabilities form the calibration points (cos, p, wrong) from which
   ``Verifier.operating_point`` maps an error budget to a probability threshold. The shipped model is refitted
   on the whole half.
The run is deterministic (exact search, folds by hash, no subsampling), so rerunning it reproduces the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenomy.cache.hit_verifier import DEFAULT_VERIFIER, FEATURES, features_matrix
from tokenomy.cache.key import normalise
from tokenomy.tools.extras import MissingExtra, require

EMBED_CACHE = Path("/tmp/tokenomy-embeddings")
MIN_GATE = 0.70


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    duplicate: bool


def load_pairs(path: str | Path) -> list[Pair]:
    """QQP jsonl (``{"a","b","duplicate"}`` per line) or GPTCache's JSON array of ``{"origin","similar"}``
    (every ``similar`` a paraphrase of its ``origin``, so all duplicates)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file {p} not found")
    text = p.read_text(encoding="utf-8")
    stripped = text.lstrip()
    pairs: list[Pair] = []
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not valid JSON: {exc}") from exc
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("origin"), str) \
                    or not isinstance(item.get("similar"), str):
                raise ValueError(f"{p}: item {i} is not an object with string 'origin' and 'similar'")
            pairs.append(Pair(item["origin"], item["similar"], True))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}:{n}: not valid JSON: {exc}") from exc
            if not isinstance(row, dict) or not isinstance(row.get("a"), str) or not isinstance(row.get("b"), str) \
                    or not isinstance(row.get("duplicate"), bool):
                raise ValueError(f"{p}:{n}: expected {{'a': str, 'b': str, 'duplicate': bool}}")
            pairs.append(Pair(row["a"], row["b"], row["duplicate"]))
    pairs = [x for x in pairs if x.a.strip() and x.b.strip()]
    if not pairs:
        raise ValueError(f"{p}: no question pairs found")
    return pairs


def fingerprint(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()[:8]


def in_calibration_half(a: str) -> bool:
    """The split: pairs whose stored question hashes even are for calibration, odd ones for reporting."""
    return int(fingerprint(a), 16) % 2 == 0


def embed_cached(texts: list[str], cache_dir: Path = EMBED_CACHE, log: bool = True) -> np.ndarray:
    """MiniLM embeddings of ``texts``, reusing every vector computed before under ``cache_dir`` (one .npz per
    run that had new texts), so reruns and the benchmark embed each text only once."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    known: dict[str, np.ndarray] = {}
    for f in sorted(cache_dir.glob("*.npz")):
        with np.load(f) as z:
            known.update(zip(z["texts"].tolist(), z["vectors"], strict=True))
    missing = sorted({t for t in texts if t not in known})
    if missing:
        from tokenomy.embedding.embedder import default_embedder

        embedder = default_embedder()
        t0 = time.perf_counter()
        out = []
        for i in range(0, len(missing), 256):
            out.append(embedder.embed(missing[i:i + 256]))
            if log:
                print(f"  embedded {min(i + 256, len(missing))}/{len(missing)} texts "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        vecs = np.concatenate(out)
        name = hashlib.sha256("\n".join(missing).encode()).hexdigest()[:16]
        np.savez(cache_dir / f"{name}.npz", texts=np.array(missing), vectors=vecs)
        known.update(zip(missing, vecs, strict=True))
    return np.stack([known[t] for t in texts]) if texts else np.zeros((0, 384), dtype=np.float32)


@dataclass
class Candidates:
    """The nearest stored question for each looked-up pair, and whether serving it would be right."""

    pairs: list[Pair]
    texts: list[str]
    cos: np.ndarray
    second: np.ndarray  # NaN when there is no second candidate
    wrong: np.ndarray
    groups: list[str]

    def features(self) -> np.ndarray:
        return features_matrix([(p.b, t, float(c), None if np.isnan(s) else float(s))
                                for p, t, c, s in zip(self.pairs, self.texts, self.cos, self.second, strict=True)])


def nearest_candidates(stored: list[str], stored_vecs: np.ndarray, pairs: list[Pair], query_vecs: np.ndarray,
                       min_cos: float = MIN_GATE) -> Candidates:
    """Each query's nearest and second-nearest stored question by exact search (what the cache's ANN index
    approximates; exact here so that calibration is reproducible bit for bit). Stored texts must be unique."""
    keep: list[int] = []
    texts, cos, second = [], [], []
    for start in range(0, len(pairs), 1024):
        sims = query_vecs[start:start + 1024] @ stored_vecs.T
        k = min(2, sims.shape[1])
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        for row, cand in enumerate(top):
            cand = cand[np.argsort(-sims[row, cand], kind="stable")]
            i = start + row
            c = float(sims[row, cand[0]])
            # Identical questions are the exact cache's hits, never the verifier's to judge.
            if c < min_cos or normalise(stored[cand[0]]) == normalise(pairs[i].b):
                continue
            keep.append(i)
            texts.append(stored[cand[0]])
            cos.append(c)
            second.append(float(sims[row, cand[1]]) if k > 1 else np.nan)
    kept = [pairs[i] for i in keep]
    wrong = np.array([not (p.duplicate and normalise(t) == normalise(p.a)) for p, t in zip(kept, texts, strict=True)],
                     dtype=bool)
    return Candidates(kept, texts, np.array(cos), np.array(second), wrong, [fingerprint(p.a) for p in kept])


TREE_PARAMS = {"max_iter": 150, "learning_rate": 0.05, "max_leaf_nodes": 8, "min_samples_leaf": 40,
               "l2_regularization": 1.0}


def fit_model(x: np.ndarray, y: np.ndarray, kind: str, c: float = 1.0) -> dict:
    """Fit p(right) on pair features; returns the JSON-able model spec that ``Verifier`` evaluates.

    ``trees``: sklearn's histogram gradient boosting (150 trees of <= 8 leaves, deterministic on this data
    size: no subsampling, no early stopping), exported node by node. ``logistic``: standardised L2 logistic
    regression with inverse strength ``c``.
    """
    if kind == "logistic":
        LogisticRegression = require("sklearn.linear_model", "calibrating the verifier").LogisticRegression

        mean, scale = x.mean(axis=0), x.std(axis=0)
        scale[scale == 0] = 1.0
        model = LogisticRegression(C=c, max_iter=2000).fit((x - mean) / scale, y)
        return {"kind": "logistic", "mean": mean.tolist(), "scale": scale.tolist(),
                "coef": model.coef_[0].tolist(), "intercept": float(model.intercept_[0])}
    if kind != "trees":
        raise ValueError(f"unknown model kind {kind!r}")
    HistGradientBoostingClassifier = require("sklearn.ensemble",
                                             "calibrating the verifier").HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(random_state=0, early_stopping=False, **TREE_PARAMS).fit(x, y)
    trees = []
    depth = 0
    for (predictor,) in model._predictors:
        nodes = predictor.nodes
        depth = max(depth, int(nodes["depth"].max()))
        trees.append({
            "feature": [int(f) if not leaf else -1 for f, leaf in zip(nodes["feature_idx"], nodes["is_leaf"],
                                                                        strict=True)],
            "threshold": [float(t) for t in nodes["num_threshold"]],  # exact: thresholds can equal data values
            "left": [int(v) for v in nodes["left"]], "right": [int(v) for v in nodes["right"]],
            "value": [round(float(v), 7) for v in nodes["value"]],
        })
    return {"kind": "trees", "baseline": float(model._baseline_prediction.ravel()[0]), "depth": depth,
            "trees": trees, "params": TREE_PARAMS}


def predict(spec: dict, x: np.ndarray) -> np.ndarray:
    from tokenomy.cache.hit_verifier import Verifier

    return np.asarray(Verifier({"features": list(FEATURES), "model": spec, "calibration_points": []})
                      .probability(x))


def cross_fit(x: np.ndarray, y: np.ndarray, groups: list[str], kind: str = "trees", c: float = 1.0,
              folds: int = 5) -> np.ndarray:
    """Out-of-fold p(right), folds assigned by a hash of the group so every fold holds whole groups."""
    fold = np.array([int(g, 16) // 2 % folds for g in groups])
    p = np.zeros(len(y))
    for f in range(folds):
        train = fold != f
        p[~train] = predict(fit_model(x[train], y[train], kind, c), x[~train])
    return p


def calibrate(data: Path, out: Path, kind: str = "trees", c: float = 1.0, confidence: float = 0.8) -> dict:
    pairs = load_pairs(data)
    calib = [p for p in pairs if in_calibration_half(p.a)]
    stored = sorted({normalise(p.a): p.a for p in calib}.values())
    print(f"calibration half: {len(calib)} pairs, {len(stored)} stored questions", file=sys.stderr)
    vecs = embed_cached(stored + [p.b for p in calib])
    cands = nearest_candidates(stored, vecs[:len(stored)], calib, vecs[len(stored):])
    x, y = cands.features(), (~cands.wrong).astype(int)
    p_oof = cross_fit(x, y, cands.groups, kind, c)
    spec = {
        "features": list(FEATURES),
        "model": fit_model(x, y, kind, c),
        "confidence": confidence,
        "calibration_points": [[round(float(cc), 4), round(float(pp), 4), int(w)]
                               for cc, pp, w in zip(cands.cos, p_oof, cands.wrong, strict=True)],
        "calibrated_on": "".join(sorted({fingerprint(p.a) for p in calib})),
        "source": {"data": Path(data).name, "pairs": len(calib), "candidates": int(len(y)),
                   "right": int(y.sum()), "model": kind, "C": c, "folds": 5, "min_gate": MIN_GATE},
    }
    out.write_text(json.dumps(spec, separators=(",", ":")) + "\n")
    return spec


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=root.parent / "shared/data/semantic-cache/qqp-dev.jsonl")
    ap.add_argument("--out", type=Path, default=DEFAULT_VERIFIER)
    ap.add_argument("--model", choices=["trees", "logistic"], default="trees", help="verifier model kind")
    ap.add_argument("--C", type=float, default=1.0, help="inverse L2 strength of the logistic regression")
    ap.add_argument("--confidence", type=float, default=0.8, help="confidence of the wrong-share upper bound")
    args = ap.parse_args(argv)
    try:
        spec = calibrate(args.data, args.out, args.model, args.C, args.confidence)
    except (FileNotFoundError, ValueError, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {spec['source']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
