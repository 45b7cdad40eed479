"""Predicted Outputs (OpenAI's `prediction`) as speculative drafts: the same greedy requests without a prediction,
with the right one and with a wrong one, on one in-process engine, in one run.

Prompts: the grounded ones (summaries and context QA) of ../shared/data/grounded/dev.jsonl. Each is first
answered once, greedy and alone (its prompt then stays cached as a prefix, so the timed runs measure decoding);
that answer's text is its *right* prediction, as a client regenerating an answer it already has would send it. The
*wrong* prediction is another prompt's answer: text of the same kind that this answer does not follow. Then, for
each concurrency and round (the order of the modes alternating between rounds), every prompt is asked greedily

- none:  without a prediction (the engine's own prompt-lookup drafts, as the product runs);
- right: with its own earlier answer as the prediction;
- wrong: with the unrelated text as the prediction;

and the bench prints output tokens per second with the ratio to none, the prediction tokens drafted and the share
accepted, and how many answers are identical to those without a prediction in the same round (greedy decoding
with verified drafts gives the same tokens, up to the kernel noise of verifying several tokens in one step).
Each prediction is tokenized once, as the embedded backend does (no special tokens).

    .venv/bin/python bench/predicted_outputs.py [--concurrency 1,8] [--prompts 8] [--max-tokens 64] [--rounds 2]
        [--threads 2] [--grounded PATH] [--json]
    .venv/bin/python bench/predicted_outputs.py --quick        # 2 prompts, 16 tokens, c=1,2, one round: a check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models.catalog import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
MODES = ("none", "right", "wrong")


def grounded_prompts(path: str, n: int) -> list[str]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return [r["turns"][0] for r in rows if r["task"] in ("summarize", "context_qa")][:n]


class Run:
    """One mode's run: output tokens and seconds, prediction tokens drafted and accepted, each prompt's answer.
    (A plain class: tests load this script without registering it as a module, which a dataclass needs.)"""

    def __init__(self, n: int) -> None:
        self.tokens, self.seconds, self.drafted, self.accepted = 0, 0.0, 0, 0
        self.answers: list[list[int]] = [[] for _ in range(n)]


def run(engine: Engine, prompts: list[list[int]], predictions: list[list[int] | None], concurrency: int,
        max_tokens: int) -> Run:
    """Greedy answers to all prompts (prompt i with prediction i), `concurrency` in flight at once."""
    out = Run(len(prompts))
    pending = list(range(len(prompts)))
    lock = threading.Lock()
    done = threading.Event()
    state = {"in_flight": 0}

    def submit_next() -> None:
        i = pending.pop(0)
        state["in_flight"] += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, prediction=predictions[i])
        engine.submit(prompts[i], params, lambda ev: on_event(i, ev))

    def on_event(i: int, ev: Any) -> None:
        with lock:
            out.answers[i] += ev.token_ids
            out.tokens += len(ev.token_ids)
            if ev.finish_reason:
                if predictions[i] is not None:
                    out.drafted += ev.draft_tokens
                    out.accepted += ev.draft_accepted
                state["in_flight"] -= 1
                if pending:
                    submit_next()
                elif state["in_flight"] == 0:
                    done.set()

    t0 = time.perf_counter()
    with lock:
        for _ in range(min(concurrency, len(pending))):
            submit_next()
    if not done.wait(3600):
        raise RuntimeError("the engine did not finish")
    out.seconds = time.perf_counter() - t0
    return out


def answer_texts(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """Each prompt's greedy answer alone, as the text a client received (this also caches every prompt)."""
    texts: list[str] = []
    for ids in prompts:
        parts: list[str] = []
        done = threading.Event()

        def on(ev: Any, parts: list[str] = parts, done: threading.Event = done) -> None:
            parts.append(ev.text)
            if ev.finish_reason:
                done.set()

        engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True), on)
        if not done.wait(3600):
            raise RuntimeError("the engine did not finish")
        texts.append("".join(parts))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grounded", default=GROUNDED)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, concurrency 1,2, one round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.concurrency, args.rounds = 2, 16, "1,2", 1
    levels = [int(x) for x in args.concurrency.split(",")]
    texts = grounded_prompts(args.grounded, args.prompts)
    if len(texts) < 2:
        raise SystemExit("need at least 2 grounded prompts (one's answer is another's wrong prediction)")
    # a KV stream per sequence id, each of 4,096 cells: every prompt stays cached in a stream of its own
    cfg = EngineConfig(max_model_len=4096, max_running=max(levels), max_retired=len(texts) + 2,
                       n_threads=args.threads)
    engine = Engine(str(resolve_gguf(args.model)), cfg).start()
    try:
        prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
        answers = answer_texts(engine, prompts, args.max_tokens)
        encode = lambda text: engine.tokenizer.encode(text, add_special=False)  # noqa: E731  (as the backend does)
        predictions: dict[str, list[list[int] | None]] = {
            "none": [None] * len(prompts),
            "right": [encode(a) for a in answers],
            "wrong": [encode(answers[(i + 1) % len(answers)]) for i in range(len(answers))],
        }
        results: dict[tuple[int, str], list[Run]] = {}
        identical: dict[tuple[int, str], list[int]] = {}
        for r in range(args.rounds):
            for c in levels:
                order = MODES if r % 2 == 0 else MODES[::-1]
                runs = {mode: run(engine, prompts, predictions[mode], c, args.max_tokens) for mode in order}
                for mode, x in runs.items():
                    results.setdefault((c, mode), []).append(x)
                    same = sum(a == b for a, b in zip(x.answers, runs["none"].answers, strict=True))
                    identical.setdefault((c, mode), []).append(same)
                    print(f"round {r + 1} c={c} {mode}: {x.tokens / x.seconds:.1f} tok/s, drafted {x.drafted}, "
                          f"accepted {x.accepted}, identical to none {same}/{len(prompts)}", file=sys.stderr)
        cost = {n: round(t * 1e3, 2) for n, t in sorted(engine.step_cost.seconds.items()) if n <= 16}
    finally:
        engine.stop()
    rows = []
    for (c, mode), runs in results.items():
        tok_s = statistics.median(x.tokens / x.seconds for x in runs)
        base = statistics.median(x.tokens / x.seconds for x in results[(c, "none")])
        drafted, accepted = sum(x.drafted for x in runs), sum(x.accepted for x in runs)
        rows.append({"concurrency": c, "mode": mode, "tok_s": round(tok_s, 1), "vs_none": round(tok_s / base, 3),
                     "drafted": drafted, "acceptance": round(accepted / drafted, 3) if drafted else None,
                     "identical": sum(identical[(c, mode)]), "answers": len(prompts) * len(runs)})
    if args.json:
        print(json.dumps({"rows": rows, "step_ms_by_tokens": cost, "model": args.model, "threads": args.threads,
                          "prompts": len(prompts), "max_tokens": args.max_tokens, "rounds": args.rounds}, indent=1))
        return
    print(f"{'c':>3} {'mode':6} {'tok/s':>7} {'vs none':>8} {'drafted':>8} {'accept':>7} {'identical':>10}")
    for x in rows:
        acc = x["acceptance"] if x["acceptance"] is not None else "-"
        print(f"{x['concurrency']:>3} {x['mode']:6} {x['tok_s']:>7} {x['vs_none']:>8} {x['drafted']:>8} {acc:>7} "
              f"{str(x['identical']) + '/' + str(x['answers']):>10}")
    print("measured step ms by tokens fed:", cost)


if __name__ == "__main__":
    main()
