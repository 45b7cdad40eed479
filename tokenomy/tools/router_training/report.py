"""A router's evaluation on labelled data: figures per benchmark, printed as tables or drawn as a plot.

Slices: all rows, then each `benchmark` value when the data has more than one. In each slice the learned
router, a random router (mean of several draws) and the oracle are scored with evaluate.py's RouteLLM
metrics, and the router's own operating point (its threshold) is reported. Calibration of p_weak_ok (against
its event, ties counted half), p_weak_correct and p_strong_correct is summarised by the Brier score and the
expected calibration error (10 equal-width bins). A router file with two heads is evaluated head by head
(evaluate_heads): each head on the same rows, with its own threshold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenomy.router.classifier import RouteClassifier, TrainedRouter
from tokenomy.tools.router_training.dataset import RoutingData
from tokenomy.tools.router_training.evaluate import evaluate_baselines, evaluate_scores
from tokenomy.tools.router_training.threshold import operating_point


def evaluate_router(
    router: RouteClassifier, data: RoutingData, points: int = 10, seeds: int = 20, embeddings: np.ndarray | None = None
) -> dict:
    """Everything `tokenomy router eval` shows, as plain JSON-ready data."""
    from tokenomy.router.classifier import weak_ok_probability

    p = router.class_probabilities(data.prompts, embeddings)
    p_weak, p_strong, p_ok = p[:, 2] + p[:, 3], p[:, 1] + p[:, 3], weak_ok_probability(p)
    return {
        "weak": router.weak,
        "strong": router.strong,
        "rows": len(data),
        "threshold": router.threshold,
        "target": router.meta.get("target"),
        "embedding": router.embedding,
        "slices": score_slices(p_ok, data, router.threshold, points, seeds),
        "calibration": {
            "p_weak_ok": calibration_summary(p_ok, weak_no_worse(data)),
            "p_weak_correct": calibration_summary(p_weak, data.weak_ok),
            "p_strong_correct": calibration_summary(p_strong, data.strong_ok),
        },
    }


def evaluate_heads(router: TrainedRouter, data: RoutingData, points: int = 10, seeds: int = 20) -> dict:
    """`tokenomy router eval`'s report: the models, the row count and evaluate_router's figures for every head
    (static head first), under "heads"."""
    return {
        "weak": router.weak,
        "strong": router.strong,
        "rows": len(data),
        "heads": [evaluate_router(head, data, points, seeds) for head in router.heads],
    }


def weak_no_worse(data: RoutingData) -> np.ndarray:
    """The event p_weak_ok predicts, with ties counted half: 1 weak only right, 0 strong only, 0.5 otherwise."""
    return 0.5 + 0.5 * (data.weak_ok - data.strong_ok)


def score_slices(
    p_weak_ok: np.ndarray, data: RoutingData, threshold: float | None = None, points: int = 10, seeds: int = 20
) -> list[dict]:
    """Learned vs random vs oracle on all rows and on each benchmark (when there are several); the learned
    router's score for "send to strong" is 1 - p_weak_ok. A benchmark on which both models are equally
    accurate is left out (its metrics are undefined); on all rows that raises NoGapError."""
    scores = 1.0 - np.asarray(p_weak_ok, dtype=float)
    benchmarks = sorted(set(data.benchmarks))
    slices = [("all", np.ones(len(data), dtype=bool))]
    if len(benchmarks) > 1:
        slices += [(b or "(none)", np.array([x == b for x in data.benchmarks])) for b in benchmarks]
    out = []
    for name, mask in slices:
        weak_ok, strong_ok = data.weak_ok[mask], data.strong_ok[mask]
        if name != "all" and weak_ok.mean() == strong_ok.mean():
            continue
        learned = evaluate_scores("learned", scores[mask], weak_ok, strong_ok, points)
        random, oracle = evaluate_baselines(weak_ok, strong_ok, seeds, points)
        entry = {
            "name": name,
            "rows": int(mask.sum()),
            "weak_quality": learned.weak_quality,
            "strong_quality": learned.strong_quality,
            "routers": {r.name: r.to_dict() for r in (learned, random, oracle)},
        }
        if threshold is not None:
            share, quality = operating_point(p_weak_ok[mask], threshold, weak_ok, strong_ok)
            gap = learned.strong_quality - learned.weak_quality
            entry["operating_point"] = {
                "strong_share": share,
                "quality": quality,
                "pgr": (quality - learned.weak_quality) / gap if gap else None,
            }
        out.append(entry)
    return out


def calibration_summary(probability: np.ndarray, outcome: np.ndarray, bins: int = 10) -> dict:
    """Brier = mean (p - y)^2; ECE = sum over bins of (bin share) * |mean p - mean y|."""
    probability, outcome = np.asarray(probability, dtype=float), np.asarray(outcome, dtype=float)
    which = np.minimum((probability * bins).astype(int), bins - 1)
    ece = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            ece += in_bin.mean() * abs(probability[in_bin].mean() - outcome[in_bin].mean())
    return {"brier": float(np.mean((probability - outcome) ** 2)), "ece": float(ece)}


def print_report(report: dict) -> None:
    """Tables of evaluate_heads' report: per head its RouteLLM metrics, its curve and its calibration."""
    from rich.console import Console

    console = Console(width=max(Console().width, 110))
    for head in report["heads"]:
        _print_head(console, head)


def _print_head(console, report: dict) -> None:
    from rich.table import Table

    target = report.get("target") or {}
    goal = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in target.items()
                     if k in ("strong_share", "quality_floor"))
    console.print(
        f"[bold]{report['weak']}[/] vs [bold]{report['strong']}[/] on {report['rows']} prompts; "
        f"{report['embedding']} head; threshold {report['threshold']:.4f} on p_weak_ok"
        + (f" (target {goal}, set by {target.get('set_by', '?')})" if goal else "")
    )
    summary = Table(title=f"{report['embedding']} head: RouteLLM metrics (APGR: higher is better; CPT: strong-call "
                          "share, lower is better)")
    for column in ("slice", "rows", "weak", "strong", "router", "APGR", "CPT(50%)", "CPT(80%)",
                   "threshold: strong -> quality"):
        summary.add_column(column, justify="left" if column in ("slice", "router") else "right")
    for entry in report["slices"]:
        point = entry.get("operating_point")
        at = f"{point['strong_share']:.0%} -> {point['quality']:.1%}" if point else ""
        for name, r in entry["routers"].items():
            first = name == "learned"
            summary.add_row(
                entry["name"] if first else "", str(entry["rows"]) if first else "",
                f"{entry['weak_quality']:.1%}" if first else "", f"{entry['strong_quality']:.1%}" if first else "",
                name, f"{r['apgr']:.3f}", f"{r['cpt50']:.1%}", f"{r['cpt80']:.1%}", at if first else "",
            )
    console.print(summary)

    entry = report["slices"][0]
    curve = Table(title=f"quality-cost curve ({entry['name']}, {report['embedding']} head)")
    for column in ("strong calls", "quality", "PGR", "random quality"):
        curve.add_column(column, justify="right")
    gap = entry["strong_quality"] - entry["weak_quality"]
    for point in entry["routers"]["learned"]["curve"]:
        share, quality = point["strong_share"], point["quality"]
        curve.add_row(
            f"{share:.1%}", f"{quality:.1%}", f"{(quality - entry['weak_quality']) / gap:.3f}",
            f"{entry['weak_quality'] + share * gap:.1%}",
        )
    console.print(curve)
    cal = report.get("calibration")
    if cal:
        console.print("calibration: " + "; ".join(
            f"{name} Brier {c['brier']:.3f} ECE {c['ece']:.3f}" for name, c in cal.items()))


def write_plot(report: dict, path: Path) -> None:
    """Quality against strong-call share, one panel per slice, one learned curve per head (random and oracle
    once): .png (matplotlib) or .html (plotly, offline). `report`: evaluate_heads' output."""
    heads = report["heads"]
    slices = heads[0]["slices"]

    def curves(i: int) -> list[tuple[str, dict]]:
        out = [(f"learned, {h['embedding']}", h["slices"][i]["routers"]["learned"]) for h in heads]
        return out + [(n, r) for n, r in slices[i]["routers"].items() if n != "learned"]

    if path.suffix.lower() == ".html":
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        figure = make_subplots(rows=1, cols=len(slices), subplot_titles=[s["name"] for s in slices])
        for col, _entry in enumerate(slices, start=1):
            for name, r in curves(col - 1):
                figure.add_trace(go.Scatter(
                    x=[p["strong_share"] * 100 for p in r["curve"]], y=[p["quality"] * 100 for p in r["curve"]],
                    mode="lines+markers", name=f"{name} (APGR {r['apgr']:.3f})", legendgroup=name,
                    showlegend=col == 1,
                ), row=1, col=col)
            figure.update_xaxes(title_text="strong-model calls (%)", row=1, col=col)
        figure.update_yaxes(title_text="quality (%)", row=1, col=1)
        figure.write_html(str(path), include_plotlyjs=True)
        return

    from tokenomy.tools.extras import require

    require("matplotlib", "a .png plot").use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(slices), figsize=(5.5 * len(slices), 4.5), squeeze=False)
    for i, (axis, entry) in enumerate(zip(axes[0], slices, strict=True)):
        for name, r in curves(i):
            axis.plot([p["strong_share"] * 100 for p in r["curve"]], [p["quality"] * 100 for p in r["curve"]],
                      marker=".", label=f"{name} (APGR {r['apgr']:.3f})")
        axis.axhline(entry["weak_quality"] * 100, color="grey", linestyle="--", label=report["weak"])
        axis.axhline(entry["strong_quality"] * 100, color="red", linestyle="--", label=report["strong"])
        axis.set(title=f"{entry['name']} ({entry['rows']} prompts)", xlabel="strong-model calls (%)",
                 ylabel="quality (%)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
