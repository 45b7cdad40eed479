"""Learned router on RouteLLM's MMLU + GSM8K responses: cross-validated APGR and CPT against random and oracle.

    python bench/routing.py [--data ../shared/data/routing/routellm-dev.jsonl] [--folds 5] [--json]

Protocol: rows are split into k folds by a hash of the prompt; for each fold a router is trained on the other
folds (everything it learns, C included, comes from them) and scores the held-out fold. The held-out scores of
all folds together are evaluated with RouteLLM's metrics (tokenomy/tools/router_training/evaluate.py), on MMLU and GSM8K
separately and together, next to a random router (mean of 20 draws) and the oracle. Per-fold APGR spread shows
the noise. Variants, side by side: the default router (minilm-static embedding); the same with the contextual
MiniLM embedding; without the per-domain prior (text + embedding only); the prior alone. Calibration transfer:
a threshold set on the training folds for a 30% strong share, or for 95% of the strong model's quality,
applied to the held-out fold. Latency: `RouteClassifier.predict` on single prompts not embedded before,
embedding included, for both embeddings; and with the embedding handed in. Contextual embeddings of the data file are
cached under /tmp/tokenomy-bench-cache (keyed by the file's SHA-256) so reruns skip the slow part.
GSM8K-only study (`--salts N`, 0 skips it): a router trained on GSM8K rows alone with word-problem features and
the contextual embedding, cross-validated over N fold assignments to show the spread (see gsm8k_study).
Head study (`--head-salts N`, 0 skips it): the two heads `tokenomy router train` fits (train_router), static and
contextual, cross-validated over N fold assignments; APGR and CPT(50%) per benchmark as mean ± sd over them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenomy.router.classifier import CLASSES, DEFAULT_EMBEDDING  # noqa: E402
from tokenomy.router.features import EMBEDDINGS, embed_prompts, word_problem_matrix  # noqa: E402
from tokenomy.tools.router_training.dataset import RoutingData, RoutingDataError, load_routing_data  # noqa: E402
from tokenomy.tools.router_training.evaluate import evaluate_scores  # noqa: E402
from tokenomy.tools.router_training.report import score_slices  # noqa: E402
from tokenomy.tools.router_training.threshold import (  # noqa: E402
    operating_point,
    threshold_for_quality_floor,
    threshold_for_strong_share,
)
from tokenomy.tools.router_training.train import HEADS, choose_c, logistic, train_classifier, train_router  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "routing" / "routellm-dev.jsonl"
CACHE = Path("/tmp/tokenomy-bench-cache")
TARGETS = {"apgr": 0.65, "cpt50": 0.30}
VARIANTS = ("learned", f"learned, {'minilm' if DEFAULT_EMBEDDING != 'minilm' else 'minilm-static'}", "no prior",
            "prior only")
ROUTELLM_BEST = {"mmlu": {"apgr": 0.603, "cpt50": 0.354}, "gsm8k": {"apgr": 0.622, "cpt50": 0.336}}


def fold_of(prompt: str, folds: int) -> int:
    """The prompt's fold. Salted: the dev split itself was cut by an unsalted SHA-256 of the prompt (every
    dev prompt has int(sha256) % 5 == 0), and folds must not line up with how the split was made."""
    return int(hashlib.sha256(b"fold:" + prompt.encode("utf-8")).hexdigest(), 16) % folds


def cached_embeddings(path: Path, data: RoutingData, kind: str) -> np.ndarray:
    """Embeddings of every prompt; the contextual ones are cached on disk (minutes to compute on 2 cores)."""
    if kind != "minilm":
        return embed_prompts(data.prompts, kind)
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    file = CACHE / f"routing-{key}-minilm.npy"
    if file.exists():
        vectors = np.load(file)
        if vectors.shape == (len(data), 384):
            return vectors
    started = time.perf_counter()
    vectors = embed_prompts(data.prompts, kind)
    print(f"embedded {len(data)} prompts in {time.perf_counter() - started:.0f}s (cached at {file})", file=sys.stderr)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(file, vectors)
    return vectors


def without_prior(data: RoutingData) -> RoutingData:
    """The same rows with no group labels, so train_classifier fits no per-domain prior."""
    blank = [""] * len(data)
    return RoutingData(data.weak, data.strong, data.prompts, data.weak_ok, data.strong_ok, blank, blank)


def cross_validate(data: RoutingData, x: dict[str, np.ndarray], folds: int) -> dict:
    """Out-of-fold p_weak_ok for every variant; per-fold APGR and calibration transfer of the default router."""
    assignment = np.array([fold_of(p, folds) for p in data.prompts])
    main = DEFAULT_EMBEDDING
    variants = {name: np.zeros(len(data)) for name in VARIANTS}
    transfer: dict[str, list[dict]] = {"strong_share_0.3": [], "quality_floor_0.95": []}
    per_fold: dict[str, list[float]] = {}
    chosen_c = []
    for k in range(folds):
        train, test = assignment != k, assignment == k
        train_rows, test_rows = data.subset(train), data.subset(test)
        router = train_classifier(train_rows, x[main][train], embedding=main)
        chosen_c.append(router.meta["C"])
        p_ok = router.p_weak_ok_many(test_rows.prompts, x[main][test])
        variants["learned"][test] = p_ok
        other = "minilm" if main != "minilm" else "minilm-static"
        variants[f"learned, {other}"][test] = train_classifier(train_rows, x[other][train], embedding=other) \
            .p_weak_ok_many(test_rows.prompts, x[other][test])
        variants["no prior"][test] = train_classifier(without_prior(train_rows), x[main][train], embedding=main) \
            .p_weak_ok_many(test_rows.prompts, x[main][test])
        # The prior alone: its per-domain mean of (strong - weak), mapped like p_weak_ok = (1 - gain) / 2.
        variants["prior only"][test] = (
            (1 - router.prior.transform(x[main][test])[:, 0]) / 2 if router.prior is not None else np.nan)

        slices = [("all", np.ones(test.sum(), bool))] + [
            (b, np.array([v == b for v in test_rows.benchmarks])) for b in sorted(set(data.benchmarks))]
        for name, mask in slices:
            weak_ok, strong_ok = test_rows.weak_ok[mask], test_rows.strong_ok[mask]
            if mask.sum() >= 2 and weak_ok.mean() != strong_ok.mean():
                r = evaluate_scores("learned", 1 - p_ok[mask], weak_ok, strong_ok)
                per_fold.setdefault(name, []).append(r.apgr)

        # Calibration transfer: thresholds set on the training folds' own (in-sample) values.
        train_p = router.p_weak_ok_many(train_rows.prompts, x[main][train])
        share = threshold_for_strong_share(train_p, 0.3)
        floor = threshold_for_quality_floor(train_p, train_rows.weak_ok, train_rows.strong_ok, 0.95)
        for key, cal in (("strong_share_0.3", share), ("quality_floor_0.95", floor)):
            s, q = operating_point(p_ok, cal.threshold, test_rows.weak_ok, test_rows.strong_ok)
            transfer[key].append({"strong_share": s, "quality_over_strong": q / test_rows.strong_ok.mean()})

    return {
        "variants": {name: score_slices(p, data, None) for name, p in variants.items() if not np.isnan(p).any()},
        "per_fold_apgr": {n: {"mean": statistics.mean(v), "sd": statistics.pstdev(v), "folds": v}
                          for n, v in per_fold.items()},
        "calibration_transfer": {
            key: {m: statistics.mean(f[m] for f in runs) for m in ("strong_share", "quality_over_strong")}
            for key, runs in transfer.items()
        },
        "chosen_C": chosen_c,
    }


def gsm8k_study(data: RoutingData, contextual: np.ndarray, folds: int, salts: int) -> dict:
    """A GSM8K-only router: word-problem features (features.word_problem_features) and the contextual MiniLM
    embedding's first 16 principal components, a 4-class logistic regression as in RouteClassifier with C chosen
    by inner 5-fold log loss; p_weak_ok as in RouteClassifier. Everything (scaling, PCA, C) is fit on the training
    folds.
    Repeated over `salts` fold assignments (salt 0 = the main table's folds) to show the spread."""
    from sklearn.decomposition import PCA

    mask = np.array([b == "gsm8k" for b in data.benchmarks])
    if mask.sum() < 20:
        return {}
    rows, x = data.subset(mask), contextual[mask]
    dense = word_problem_matrix(rows.prompts)
    labels = (2 * rows.weak_ok + rows.strong_ok).astype(int)
    runs = []
    for salt in range(salts):
        assignment = salted_folds(rows.prompts, folds, salt)
        p_ok = np.zeros(len(rows))
        for k in range(folds):
            train, test = assignment != k, assignment == k
            mean, scale = dense[train].mean(0), dense[train].std(0) + 1e-12
            pca = PCA(16, random_state=0).fit(x[train])
            spread = pca.transform(x[train]).std(0) + 1e-12

            def feats(m: np.ndarray, mean=mean, scale=scale, pca=pca, spread=spread) -> np.ndarray:
                return np.c_[(dense[m] - mean) / scale, pca.transform(x[m]) / spread]

            c = choose_c(feats(train), labels[train])
            model = logistic(c).fit(feats(train), labels[train])
            proba = np.zeros((test.sum(), len(CLASSES)))
            proba[:, model.classes_] = model.predict_proba(feats(test))
            p_ok[test] = proba[:, 2] + 0.5 * (proba[:, 0] + proba[:, 3])
        r = evaluate_scores("gsm8k-only", 1 - p_ok, rows.weak_ok, rows.strong_ok)
        runs.append({"salt": salt, "apgr": r.apgr, "cpt50": r.cpt50, "cpt80": r.cpt80})
    return {"rows": len(rows), "runs": runs,
            **{f"{m}_mean": statistics.mean(r[m] for r in runs) for m in ("apgr", "cpt50", "cpt80")},
            **{f"{m}_sd": statistics.pstdev(r[m] for r in runs) for m in ("apgr", "cpt50", "cpt80")}}


def salted_folds(prompts: list[str], folds: int, salt: int) -> np.ndarray:
    """Fold of each prompt under fold assignment `salt` (salt 0 is fold_of's)."""
    tag = b"" if salt == 0 else f"{salt}:".encode()
    return np.array([int(hashlib.sha256(b"fold:" + tag + p.encode("utf-8")).hexdigest(), 16) % folds for p in prompts])


def head_study(data: RoutingData, x: dict[str, np.ndarray], folds: int, salts: int) -> dict:
    """Both heads of train_router (the router `tokenomy router train` writes), each scoring every prompt from
    the folds it was not trained on, under `salts` fold assignments: per head and benchmark, APGR and CPT(50%)
    of the pooled held-out scores, as mean and sd over the assignments."""
    runs: dict[str, list[dict]] = {head: [] for head in HEADS}
    slices = [("all", np.ones(len(data), bool))] + [
        (b, np.array([v == b for v in data.benchmarks])) for b in sorted(set(data.benchmarks))]
    for salt in range(salts):
        assignment = salted_folds(data.prompts, folds, salt)
        p_ok = {head: np.zeros(len(data)) for head in HEADS}
        for k in range(folds):
            train, test = assignment != k, assignment == k
            router = train_router(data.subset(train), {h: x[h][train] for h in HEADS})
            for head in router.heads:
                p_ok[head.embedding][test] = head.p_weak_ok_many(data.subset(test).prompts, x[head.embedding][test])
        for head in HEADS:
            entry = {"salt": salt}
            for name, mask in slices:
                weak_ok, strong_ok = data.weak_ok[mask], data.strong_ok[mask]
                if weak_ok.mean() != strong_ok.mean():
                    r = evaluate_scores(head, 1 - p_ok[head][mask], weak_ok, strong_ok)
                    entry[name] = {"apgr": r.apgr, "cpt50": r.cpt50}
            runs[head].append(entry)
    summary: dict[str, dict] = {}
    for head, entries in runs.items():
        for name, _ in slices:
            if name in entries[0]:
                summary.setdefault(head, {})[name] = {
                    f"{m}_{stat}": fn([e[name][m] for e in entries])
                    for m in ("apgr", "cpt50") for stat, fn in (("mean", statistics.mean), ("sd", statistics.pstdev))}
    return {"salts": salts, "summary": summary, "runs": runs}


def decision_latency(data: RoutingData, x: np.ndarray, kind: str, n: int) -> dict:
    """RouteClassifier.predict on single prompts not yet embedded in this process, embedding included.

    Wall time is what a request waits; CPU time (all threads of the process) is the compute, which stays
    meaningful when other work shares the cores. A second pass over the same prompts, with their embeddings
    handed in (as the semantic cache's vector could be), times the router's own work."""
    router = train_classifier(data, x, embedding=kind)
    prompts = list(dict.fromkeys(data.prompts))
    rng = np.random.default_rng(0)
    sample = [prompts[i] for i in rng.choice(len(prompts), size=min(n, len(prompts)), replace=False)]
    router.predict("warm up the embedder")
    wall, cpu, own = [], [], []
    for prompt in sample:
        w, c = time.perf_counter(), time.process_time()
        router.predict(prompt)
        wall.append((time.perf_counter() - w) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    vectors = router.embed(sample)
    for prompt, vector in zip(sample, vectors, strict=True):
        w = time.perf_counter()
        router.predict(prompt, vector)
        own.append((time.perf_counter() - w) * 1000)

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    from tokenomy.embedding.embedder import default_embedder

    return {
        "embedding": kind, "n": len(sample),
        "encoder": f"{default_embedder().backend}, 1 thread" if kind == "minilm" else "table lookup",
        "p50_ms": pct(wall, 0.5), "p95_ms": pct(wall, 0.95), "cpu_p50_ms": pct(cpu, 0.5),
        "cpu_p95_ms": pct(cpu, 0.95), "router_only_p50_ms": pct(own, 0.5),
        "median_prompt_chars": statistics.median(len(p) for p in sample),
    }


def print_tables(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 100))
    table = Table(title=f"Routing, {out['folds']}-fold cross-validation by prompt hash ({out['rows']} prompts); "
                        "target: APGR >= 0.65 and CPT(50%) <= 30%")
    for column in ("slice", "rows", "router", "APGR", "CPT(50%)", "CPT(80%)", "fold APGR", "target"):
        table.add_column(column, justify="left" if column in ("slice", "router", "target") else "right")
    learned = out["cv"]["variants"]["learned"]
    for i, entry in enumerate(learned):
        name = entry["name"]
        rows = [("learned", entry["routers"]["learned"])]
        for variant in VARIANTS[1:]:
            if variant in out["cv"]["variants"]:
                rows.append((variant, out["cv"]["variants"][variant][i]["routers"]["learned"]))
        rows += [("random", entry["routers"]["random"]), ("oracle", entry["routers"]["oracle"])]
        best = ROUTELLM_BEST.get(name)
        for j, (router, r) in enumerate(rows):
            spread = out["cv"]["per_fold_apgr"].get(name) if router == "learned" else None
            verdict = ""
            if router == "learned":
                ok = r["apgr"] >= TARGETS["apgr"] and r["cpt50"] <= TARGETS["cpt50"]
                verdict = "met" if ok else "missed"
            table.add_row(
                name if j == 0 else "", str(entry["rows"]) if j == 0 else "", router, f"{r['apgr']:.3f}",
                f"{r['cpt50']:.1%}", f"{r['cpt80']:.1%}",
                f"{spread['mean']:.3f}±{spread['sd']:.3f}" if spread else "", verdict,
            )
        if best:
            table.add_row("", "", "RouteLLM best", f"{best['apgr']:.3f}", f"{best['cpt50']:.1%}",
                          "", "", "")
        table.add_section()
    console.print(table)
    transfer = out["cv"]["calibration_transfer"]
    console.print(
        "calibration transfer (threshold from training folds, measured on held-out fold): "
        f"target 30% strong -> {transfer['strong_share_0.3']['strong_share']:.1%} strong; "
        f"target 95% of strong quality -> {transfer['quality_floor_0.95']['quality_over_strong']:.1%} of strong "
        f"quality at {transfer['quality_floor_0.95']['strong_share']:.1%} strong"
    )
    for lat in out["latency"]:
        console.print(
            f"decision latency, {lat['embedding']} embedding included ({lat['n']} unseen prompts, "
            f"{lat['encoder']}): wall p50 {lat['p50_ms']:.1f} ms p95 {lat['p95_ms']:.1f} ms; "
            f"CPU p50 {lat['cpu_p50_ms']:.1f} ms p95 {lat['cpu_p95_ms']:.1f} ms; with the embedding handed in "
            f"p50 {lat['router_only_p50_ms']:.2f} ms"
        )
    study = out.get("gsm8k_study")
    if study:
        per_run = ", ".join(f"{r['apgr']:.3f}" for r in study["runs"])
        console.print(
            f"GSM8K-only router (word-problem features + contextual MiniLM, {study['rows']} prompts, "
            f"{len(study['runs'])} fold assignments): APGR {study['apgr_mean']:.3f}±{study['apgr_sd']:.3f}, "
            f"CPT(50%) {study['cpt50_mean']:.1%}±{study['cpt50_sd']:.1%}, CPT(80%) {study['cpt80_mean']:.1%}; "
            f"per assignment APGR {per_run}"
        )
    heads = out.get("head_study")
    if heads:
        for head, slices in heads["summary"].items():
            console.print(f"{head} head ({heads['salts']} fold assignments, mean±sd): " + "; ".join(
                f"{name} APGR {v['apgr_mean']:.3f}±{v['apgr_sd']:.3f} "
                f"CPT(50%) {v['cpt50_mean']:.1%}±{v['cpt50_sd']:.1%}" for name, v in slices.items()))
    console.print(f"chosen C per fold: {out['cv']['chosen_C']}; total {out['seconds']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="routing JSONL (default: %(default)s)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--latency-samples", type=int, default=200, help="0 to skip the latency measurement")
    parser.add_argument("--salts", type=int, default=5, help="fold assignments of the GSM8K-only study (0: skip)")
    parser.add_argument("--head-salts", type=int, default=3, help="fold assignments of the head study (0: skip)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    if args.folds < 2:
        parser.error("--folds must be at least 2")
    try:
        data = load_routing_data(args.data)
    except RoutingDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    x = {kind: cached_embeddings(args.data, data, kind) for kind in EMBEDDINGS}
    out = {
        "data": str(args.data),
        "rows": len(data),
        "folds": args.folds,
        "default_embedding": DEFAULT_EMBEDDING,
        "cv": cross_validate(data, x, args.folds),
        "gsm8k_study": gsm8k_study(data, x["minilm"], args.folds, args.salts) if args.salts > 0 else {},
        "head_study": head_study(data, x, args.folds, args.head_salts) if args.head_salts > 0 else {},
        "latency": [decision_latency(data, x[kind], kind, args.latency_samples) for kind in EMBEDDINGS]
        if args.latency_samples > 0 else [],
        "targets": TARGETS,
        "routellm_best": ROUTELLM_BEST,
    }
    out["seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_tables(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
