"""Semantic cache under drift: does the error budget hold on a live stream whose traffic changes?

    python bench/semantic_cache_drift.py [--budget 0.1] [--explore 0.02] [--json]

In-process, for speed: two ``SemanticCache``s (no HTTP, no gateway) in front of a simulated model, fed the same
stream of requests, one at a time, each question asked once: (a) today's fixed calibration (explore 0) and (b)
online error control (explore on). Both use the shipped QQP-calibrated verifier and the same gates. For every
request: a served hit is right when the stored answer is what the model would have answered; an explored
would-be hit gets the model's fresh answer and the comparison is fed back (``SemanticCache.observe``); a miss or
an explore stores the fresh answer, as the gateway's cache stage does.

The model: every answer names the question it was made for, and the second question of a duplicate pair gets
its first question's answer, so right and wrong are known exactly, and an explore compares answers by exact text.

The stream (from ../shared/data/semantic-cache/qqp-dev.jsonl): each pair's first question, then its second.
First half: pairs of the half the verifier was calibrated on, as they come (38% duplicates). Second half, the
drift: pairs of the held-out half with duplicates thinned to ``--drift-duplicates`` (default 15%): traffic where
near-matches are mostly hard negatives (a new topic whose questions look alike), which a calibration fitted at
38% cannot foresee. ``--second FILE`` takes the second half from a GPTCache-style file instead.

Per window of ``--window`` requests: hits (paraphrases served; identical questions are the exact cache's and are
counted apart), wrong share of hits, duplicates served right among the window's duplicate questions, and the
explore share of requests (each explore is a would-be hit that the fixed calibration or online control would have
served, so it is what the guarantee costs; candidates under the calibrated point are checked too, as the misses
they are, and counted apart).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenomy.cache.entry import CacheEntry  # noqa: E402
from tokenomy.cache.hit_verifier import DEFAULT_VERIFIER, Verifier  # noqa: E402
from tokenomy.cache.key import question_key  # noqa: E402
from tokenomy.cache.semantic import SemanticCache  # noqa: E402
from tokenomy.tools.cache_calibration.calibrate import Pair, embed_cached, in_calibration_half, load_pairs  # noqa: E402

CTX = "drift-context"


@dataclass
class Window:
    requests: int = 0
    hits: int = 0
    wrong: int = 0
    same_text: int = 0
    duplicates: int = 0
    duplicates_served: int = 0
    explored: int = 0
    checked: int = 0      # candidates under the calibrated point checked against the model: misses, no cost

    def row(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "wrong_hits": self.wrong,
                "wrong_share": self.wrong / self.hits if self.hits else 0.0,
                "duplicate_hit_rate": self.duplicates_served / self.duplicates if self.duplicates else 0.0,
                "explore_share": self.explored / self.requests if self.requests else 0.0,
                "checked": self.checked, "same_text": self.same_text}


@dataclass
class Arm:
    name: str
    cache: SemanticCache
    windows: list[Window] = field(default_factory=list)


def stream(pairs: list[Pair], second: list[Pair] | None, n_pairs: int, drift_dup: float,
           seed: int) -> tuple[list[tuple[str, str, bool]], int]:
    """(question, the model's answer, is the second question of a duplicate pair) per request; and where the
    second half starts."""
    rng = random.Random(seed)
    first = [p for p in pairs if in_calibration_half(p.a)]
    rng.shuffle(first)
    if second is None:
        held = [p for p in pairs if not in_calibration_half(p.a)]
        dups, others = [p for p in held if p.duplicate], [p for p in held if not p.duplicate]
        n_dup = int(round(len(others) * drift_dup / (1 - drift_dup)))
        second = others + rng.sample(dups, min(n_dup, len(dups)))
        rng.shuffle(second)
    half = n_pairs // 2
    out: list[tuple[str, str, bool]] = []
    for p in first[:half] + second[:n_pairs - half]:
        out.append((p.a, question_key(p.a), False))
        out.append((p.b, question_key(p.a) if p.duplicate else question_key(p.b), p.duplicate))
    return out, 2 * len(first[:half])


def run(args: argparse.Namespace) -> dict:
    pairs = load_pairs(args.data)
    second = load_pairs(args.second) if args.second else None
    requests, drift_at = stream(pairs, second, args.pairs, args.drift_duplicates, args.seed)
    vecs = embed_cached(sorted({q for q, _, _ in requests}), log=False)
    index = {q: i for i, q in enumerate(sorted({q for q, _, _ in requests}))}
    verifier = Verifier.load(args.verifier)
    common = dict(threshold=args.threshold, error_budget=args.budget, verifier=verifier, ttl_s=None,
                  max_entries=len(requests) + 1, min_margin=args.margin, flush_every=10 * len(requests))
    arms = [Arm("fixed calibration", SemanticCache(None, **common)),
            Arm("online control", SemanticCache(None, explore=args.explore, explore_window=args.explore_window,
                                                rng=random.Random(args.seed), **common))]
    if args.evidence is not None:
        arms[1].cache.control.evidence = args.evidence
    for n, (question, answer, duplicate) in enumerate(requests):
        vec = vecs[index[question]]
        for arm in arms:
            if n % args.window == 0:
                arm.windows.append(Window())
            w = arm.windows[-1]
            w.requests += 1
            w.duplicates += duplicate
            d = arm.cache.decide(CTX, question, vec[None, :])
            if d.hit is not None:
                if d.reason == "exact-text":
                    w.same_text += 1
                    continue
                w.hits += 1
                right = d.hit.entry.response["text"] == answer
                w.wrong += not right
                w.duplicates_served += right and duplicate
                continue
            if d.explore is not None:
                w.explored += d.explore.held_back
                w.checked += not d.explore.held_back
                arm.cache.observe(d.explore.entry_id, d.explore.score, d.explore.entry.response["text"] == answer)
            arm.cache.add_text(CTX, question, CacheEntry(response={"text": answer}), vec)
    out = {"budget": args.budget, "explore": args.explore, "threshold": args.threshold, "margin": args.margin,
           "requests": len(requests), "drift_at_request": drift_at, "window": args.window, "arms": {}}
    for arm in arms:
        rows = [w.row() for w in arm.windows]
        after_first = rows[1:] or rows
        total = Window(**{k: sum(getattr(w, k) for w in arm.windows) for k in Window.__dataclass_fields__})
        out["arms"][arm.name] = {"windows": rows, "worst_wrong_share": max(r["wrong_share"] for r in after_first),
                                 "total": total.row(),
                                 "tau": arm.cache.control.state()[0] if arm.cache.control else None}
    return out


def print_report(out: dict) -> None:
    print(f"budget {out['budget']:.0%}, explore floor {out['explore']}, threshold {out['threshold']}, margin "
          f"{out['margin']}: {out['requests']} requests, drift from request {out['drift_at_request']}; "
          f"per window of {out['window']}:")
    names = list(out["arms"])
    print("window | " + " | ".join(f"{n}: hits, wrong share, dup hit rate, explored" for n in names))
    for i in range(len(out["arms"][names[0]]["windows"])):
        cells = []
        for n in names:
            r = out["arms"][n]["windows"][i]
            cells.append(f"{r['hits']:4d} {r['wrong_share']:6.1%} {r['duplicate_hit_rate']:6.1%} "
                         f"{r['explore_share']:6.1%}")
        print(f"{i + 1:6d} | " + " | ".join(cells))
    for n in names:
        a = out["arms"][n]
        t = a["total"]
        print(f"{n}: worst window after the first {a['worst_wrong_share']:.1%} wrong; overall {t['hits']} hits, "
              f"{t['wrong_share']:.1%} wrong, duplicates served {t['duplicate_hit_rate']:.1%}, explored "
              f"{t['explore_share']:.1%} of requests (and checked {t['checked']} misses at no cost)"
              + (f", tau at the end {a['tau']:.3f}" if a["tau"] else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Semantic cache error budget under drift: fixed vs online control.")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/semantic-cache/qqp-dev.jsonl")
    ap.add_argument("--second", type=Path, default=None,
                    help="take the stream's second half from this file (QQP jsonl or GPTCache JSON)")
    ap.add_argument("--pairs", type=int, default=6000, help="pairs in the stream (two requests each)")
    ap.add_argument("--drift-duplicates", type=float, default=0.15,
                    help="share of duplicate pairs in the second half (QQP held-out half thinned)")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--explore", type=float, default=0.02, help="explore floor of the online arm")
    ap.add_argument("--explore-window", type=int, default=100,
                    help="memory of explore outcomes: weight e^(-age / window)")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--evidence", type=float, default=None,
                    help="online arm: live outcomes above tau before serving, explore rate evidence / n above it "
                    "(default error_control.EVIDENCE)")
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verifier", type=Path, default=DEFAULT_VERIFIER)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not 0 < args.budget < 1 or not 0 < args.explore <= 1 or not 0 < args.drift_duplicates < 1:
        ap.error("--budget and --drift-duplicates must be in (0, 1), --explore in (0, 1]")
    try:
        out = run(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1)) if args.json else print_report(out)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
