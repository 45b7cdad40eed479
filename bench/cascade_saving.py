"""Cascade saving on the embedded pair, default floors vs floors calibrated on other prompts, side by side.

SmolLM2-135M answers first; Gemma-3-270M answers when the cascade's signals fail. The 48 prompts are short
factual questions with a known answer, split in two interleaved halves: floors are calibrated on one half
(`tokenomy.tools.router_training.floors`, the code behind `tokenomy router calibrate --cascade`) and every policy is
measured on the other. Each model answers each measured prompt once (greedy); each cascade policy is then
replayed through `cascade.judge`, the function the route stage calls, so an escalated request costs the cheap
answer plus the capable model's real answer, as the ledger bills it. Prices are the packaged models' notional
ones (USD per 1M tokens), so the saving is a share, not a bill. Quality proxy: the share of final answers that
contain the known answer (a regular expression per prompt).

Truncation: both models get the same max_tokens and Gemma-3-270M (a base model) runs to max_tokens on every
prompt, so escalating a truncated answer buys nothing here; the calibrated policies run with
`escalate_on_truncated: false` and the default floors are shown both ways.

    .venv/bin/python bench/cascade_saving.py [--max-tokens 32] [--share 0.25] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tokenomy.config import CascadeSettings, EmbeddedModelSpec  # noqa: E402
from tokenomy.ledger.pricing import cost  # noqa: E402
from tokenomy.router.cascade import judge  # noqa: E402
from tokenomy.tools.router_training.floors import FirstAnswer, choose_floors, sample_answers  # noqa: E402

QUESTIONS = [
    ("What is the capital of France?", r"\bparis\b"),
    ("Name three primary colors.", r"\bred\b"),
    ("What is 12 times 12?", r"\b144\b"),
    ("Who wrote Romeo and Juliet?", r"shakespeare"),
    ("Translate 'thank you' to Spanish.", r"gracias"),
    ("What is the boiling point of water?", r"\b(100|212)\b"),
    ("Give a synonym for happy.", r"joyful|cheerful|\bglad\b|content|delighted|merry|joyous|elated|pleased"),
    ("How many days are in a week?", r"\b(7|seven)\b"),
    ("What planet is closest to the sun?", r"mercury"),
    ("Name a mammal that can fly.", r"\bbats?\b"),
    ("What is the largest ocean?", r"pacific"),
    ("Spell the word 'necessary'.", r"n[\s,.-]+e[\s,.-]+c[\s,.-]+e[\s,.-]+s"),
    ("What gas do plants absorb?", r"carbon dioxide|\bco2\b"),
    ("What is the square root of 81?", r"\b(9|nine)\b"),
    ("Name a programming language.", r"python|java|c\+\+|rust|ruby|kotlin|swift|perl|php|haskell|\bgo\b"),
    ("What is the opposite of cold?", r"\bhot\b|\bwarm|\bheat\b"),
    ("Explain gravity in one sentence.", r"force|attract|mass"),
    ("What color is a ripe banana?", r"yellow"),
    ("How many legs does a spider have?", r"\b(8|eight)\b"),
    ("What is H2O?", r"water"),
    ("Name the first month of the year.", r"january"),
    ("What is the freezing point of water in Celsius?", r"\b0\b|zero"),
    ("Who painted the Mona Lisa?", r"leonardo|da vinci"),
    ("What is the chemical symbol for gold?", r"\bau\b"),
    ("What is the capital of Japan?", r"tokyo"),
    ("How many continents are there?", r"\b(7|seven)\b"),
    ("What is 7 plus 5?", r"\b12\b|twelve"),
    ("Who was the first president of the United States?", r"washington"),
    ("What is the largest planet in our solar system?", r"jupiter"),
    ("What language is spoken in Brazil?", r"portuguese"),
    ("How many hours are in a day?", r"\b24\b|twenty-four"),
    ("What is the tallest animal?", r"giraffe"),
    ("What do bees make?", r"honey"),
    ("What is the capital of Italy?", r"\brome\b"),
    ("How many sides does a triangle have?", r"\b(3|three)\b"),
    ("What is the main ingredient in guacamole?", r"avocado"),
    ("Which animal is known as the king of the jungle?", r"\blions?\b"),
    ("What is frozen water called?", r"\bice\b"),
    ("What is the currency of the United Kingdom?", r"pound|sterling"),
    ("How many minutes are in an hour?", r"\b60\b|sixty"),
    ("What color is the sky on a clear day?", r"\bblue\b"),
    ("Who discovered penicillin?", r"fleming"),
    ("What is the smallest prime number?", r"\b(2|two)\b"),
    ("What organ pumps blood through the body?", r"\bheart\b"),
    ("What is the capital of Germany?", r"berlin"),
    ("How many wheels does a bicycle have?", r"\b(2|two)\b"),
    ("What is the hardest natural substance?", r"diamond"),
    ("Which planet is known as the Red Planet?", r"\bmars\b"),
]


async def answer(spec: EmbeddedModelSpec, prompts: list[str], max_tokens: int,
                 threads: int) -> list[FirstAnswer]:
    from tokenomy.backends.embedded import EmbeddedBackend
    from tokenomy.engine.config import EngineConfig
    from tokenomy.models.catalog import resolve_gguf

    assert spec.gguf is not None
    backend = EmbeddedBackend(spec.name, str(resolve_gguf(spec.gguf)), EngineConfig(
        n_ctx=4096, max_running=4, max_retired=8, n_threads=threads))
    try:
        return await sample_answers(backend, [{"messages": [{"role": "user", "content": p}]} for p in prompts],
                                    max_tokens)
    finally:
        await backend.close()


def replay(settings: CascadeSettings | None, small: list[FirstAnswer], big: list[FirstAnswer], answers: list[str],
           small_spec: EmbeddedModelSpec, big_spec: EmbeddedModelSpec) -> dict:
    """One policy on the measured half: None = always big; a CascadeSettings whose floors never fire and with no
    other signal = always small."""
    usd, esc, right, tokens = 0.0, 0, 0, 0
    for s, b, pattern in zip(small, big, answers, strict=True):
        final = b
        if settings is not None:
            usd += cost(small_spec.price, s.prompt_tokens, 0, s.completion_tokens).total_usd
            tokens += s.prompt_tokens + s.completion_tokens
            escalate = judge(s.text, s.logprobs, s.finish_reason, None, settings).escalate
            esc += escalate
            final = b if escalate else s
        if final is b:
            usd += cost(big_spec.price, b.prompt_tokens, 0, b.completion_tokens).total_usd
            tokens += b.prompt_tokens + b.completion_tokens
        right += bool(re.search(pattern, final.text, re.I | re.S))
    return {"usd": usd, "escalated": esc, "quality": right / len(small), "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--share", type=float, default=0.25, help="escalation-share target of one calibrated policy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--swap", action="store_true", help="calibrate on the odd half, measure on the even one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    small_spec = EmbeddedModelSpec(name="small", gguf="smollm2-135m-instruct")
    big_spec = EmbeddedModelSpec(name="big", gguf="gemma3-270m")
    cal_idx, test_idx = list(range(0, len(QUESTIONS), 2)), list(range(1, len(QUESTIONS), 2))
    if args.swap:
        cal_idx, test_idx = test_idx, cal_idx
    prompts = [q for q, _ in QUESTIONS]
    small_all = asyncio.run(answer(small_spec, [prompts[i] for i in cal_idx + test_idx], args.max_tokens,
                                   args.threads))
    cal, small = small_all[:len(cal_idx)], small_all[len(cal_idx):]
    big = asyncio.run(answer(big_spec, [prompts[i] for i in test_idx], args.max_tokens, args.threads))
    patterns = [QUESTIONS[i][1] for i in test_idx]

    stock = CascadeSettings()
    no_trunc = CascadeSettings(escalate_on_truncated=False)
    assert small_spec.price is not None and big_spec.price is not None
    calibrated = {
        "calibrated, break-even": choose_floors(cal, no_trunc, small_spec.price, big_spec.price, min_saving=0.0),
        f"calibrated, share {args.share:g}": choose_floors(cal, no_trunc, small_spec.price, big_spec.price,
                                                           escalation_share=args.share),
    }
    never = CascadeSettings(min_mean_logprob=-1e9, min_token_logprob=-1e9, escalate_on_truncated=False,
                            escalate_on_refusal=False, escalate_on_empty=False)
    policies: dict[str, CascadeSettings | None] = {
        "always small": never, "always big": None,
        "default floors (truncation escalates)": stock, "default floors": no_trunc,
        **{k: c.settings for k, c in calibrated.items()},
    }
    rows = {k: replay(s, small, big, patterns, small_spec, big_spec) for k, s in policies.items()}
    base = rows["always big"]["usd"]
    for k, r in rows.items():
        r["cost_vs_always_big"] = r["usd"] / base if base else float("nan")
        s = policies[k]
        if s is not None:
            r["floors"] = {"min_mean_logprob": s.min_mean_logprob, "min_token_logprob": s.min_token_logprob}
        if k in calibrated:
            c = calibrated[k]
            r["on_calibration_half"] = {"escalation_share": c.escalation_share, "cost_ratio": c.cost_ratio}
    res = {"calibration_prompts": len(cal), "measured_prompts": len(small), "max_tokens": args.max_tokens,
           "prices": "notional", "policies": rows}
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)


def print_table(res: dict) -> None:
    n, rows = res["measured_prompts"], res["policies"]
    t = Table(title=f"Cascade SmolLM2-135M -> Gemma-3-270M: floors calibrated on {res['calibration_prompts']} "
                    f"prompts, measured on {n} others (max_tokens {res['max_tokens']}, notional prices)")
    for col in ("policy", "mean floor", "token floor", "escalated", "USD", "vs always big", "quality proxy",
                "calibration half: esc / cost"):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for k, r in rows.items():
        f = r.get("floors")
        cal_half = r.get("on_calibration_half")
        t.add_row(k, f"{f['min_mean_logprob']:g}" if f and f["min_mean_logprob"] > -1e8 else "-",
                  f"{f['min_token_logprob']:g}" if f and f["min_token_logprob"] > -1e8 else "-",
                  f"{r['escalated']}/{n}" if f else "-", f"{r['usd']:.8f}", f"{r['cost_vs_always_big']:.1%}",
                  f"{r['quality']:.1%}",
                  f"{cal_half['escalation_share']:.0%} / {cal_half['cost_ratio']:.0%}" if cal_half else "")
    Console(width=max(Console().width, 130)).print(t)

if __name__ == "__main__":
    main()
