"""Engine techniques against their own "off", same requests, one run: speculative decoding (prompt lookup).

For each prompt set (grounded: summaries and context QA from ../shared/data/grounded/dev.jsonl, where the answer
copies the prompt; chat: the MT-Bench first turns of the same file, the control) and each concurrency, the same
greedy requests run on one in-process engine with speculation

- off:    no drafts (the baseline);
- auto:   the product setting: drafts sized by the measured step cost (engine/speculate.py);
- forced: drafts of up to 8 tokens whatever they cost (the step-cost model is replaced by one where verifying
          is free), to show what the decision avoids or leaves on the table,

rounds alternating the order. Every prompt is prefilled once before the timed runs and stays cached as a prefix,
so the runs measure decoding. Output tokens per second, the ratio to off, drafted and accepted tokens, and the
mean accepted length per verified draft.

    .venv/bin/python bench/engine_techniques.py [--concurrency 1,8] [--prompts 8] [--max-tokens 64]
        [--rounds 2] [--threads 2] [--json]
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

from tokenomy.engine import speculate  # noqa: E402
from tokenomy.engine.config import EngineConfig  # noqa: E402
from tokenomy.engine.engine import Engine  # noqa: E402
from tokenomy.engine.sampling_params import SamplingParams  # noqa: E402
from tokenomy.models import resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
MODES = ("off", "auto", "forced")


def prompt_sets(path: str, n: int) -> dict[str, list[str]]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    grounded = [r["turns"][0] for r in rows if r["task"] in ("summarize", "context_qa")]
    chat = [r["turns"][0] for r in rows if r["task"].startswith("chat")]
    return {"grounded": grounded[:n], "chat": chat[:n]}


class FreeVerification(speculate.StepCost):
    """A step costs the same whatever it feeds: every draft looks worth verifying."""

    def predict(self, n: int) -> float | None:
        return 0.01


def run(engine: Engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> tuple[int, float]:
    """Greedy answers to all prompts, `concurrency` in flight at once; (output tokens, seconds)."""
    pending = list(prompts)
    lock = threading.Lock()
    done = threading.Event()
    state = {"in_flight": 0, "tokens": 0}

    def submit_next() -> None:
        ids = pending.pop(0)
        state["in_flight"] += 1
        engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True), on_event)

    def on_event(ev: Any) -> None:
        with lock:
            state["tokens"] += len(ev.token_ids)
            if ev.finish_reason:
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
    return state["tokens"], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grounded", default=GROUNDED)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    # Prompts stay cached as prefixes (warmed once below), so the timed runs measure decoding, not prefill.
    cfg = EngineConfig(n_ctx=65536, max_running=max(levels), max_retired=2 * args.prompts + 2,
                       max_retired_cells=60000, n_threads=args.threads, speculative=True)
    engine = Engine(str(resolve_gguf("smollm2-135m-instruct")), cfg).start()
    measured = engine.step_cost
    sets = {name: [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in ps]
            for name, ps in prompt_sets(args.grounded, args.prompts).items()}
    engine.cfg.speculative = False
    for prompts in sets.values():                                        # prefill every prompt once
        run(engine, prompts, 1, 2)
    results: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for name, prompts in sets.items():
            for c in levels:
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    engine.cfg.speculative = mode != "off"
                    engine.step_cost = FreeVerification() if mode == "forced" else measured
                    st = engine.stats
                    before = (st.spec_drafts, st.spec_draft_tokens, st.spec_accepted_tokens)
                    tokens, secs = run(engine, prompts, c, args.max_tokens)
                    d, dt, acc = (st.spec_drafts - before[0], st.spec_draft_tokens - before[1],
                                  st.spec_accepted_tokens - before[2])
                    results.setdefault((name, c, mode), []).append(
                        {"tok_s": tokens / secs, "drafts": d, "drafted": dt, "accepted": acc})
                    print(f"round {r + 1} {name} c={c} {mode}: {tokens / secs:.1f} tok/s, drafted {dt}, "
                          f"accepted {acc}", file=sys.stderr)
    engine.step_cost = measured
    engine.stop()
    rows = []
    for (name, c, mode), runs in results.items():
        base = statistics.median(x["tok_s"] for x in results[(name, c, "off")])
        tok_s = statistics.median(x["tok_s"] for x in runs)
        drafted = sum(x["drafted"] for x in runs)
        accepted = sum(x["accepted"] for x in runs)
        drafts = sum(x["drafts"] for x in runs)
        rows.append({"prompts": name, "concurrency": c, "mode": mode, "tok_s": round(tok_s, 1),
                     "vs_off": round(tok_s / base, 3), "drafted": drafted,
                     "acceptance": round(accepted / drafted, 3) if drafted else None,
                     "mean_accepted_per_draft": round(accepted / drafts, 2) if drafts else None})
    cost = {n: round(t * 1e3, 2) for n, t in sorted(measured.seconds.items()) if n <= 16}
    if args.json:
        print(json.dumps({"rows": rows, "step_ms_by_tokens": cost, "threads": args.threads,
                          "max_tokens": args.max_tokens, "rounds": args.rounds}, indent=1))
        return
    print(f"{'prompts':9} {'c':>3} {'mode':7} {'tok/s':>7} {'vs off':>7} {'drafted':>8} {'accept':>7} {'len':>5}")
    for x in rows:
        print(f"{x['prompts']:9} {x['concurrency']:>3} {x['mode']:7} {x['tok_s']:>7} {x['vs_off']:>7} "
              f"{x['drafted']:>8} {x['acceptance'] if x['acceptance'] is not None else '-':>7} "
              f"{x['mean_accepted_per_draft'] if x['mean_accepted_per_draft'] is not None else '-':>5}")
    print("measured step ms by tokens fed:", cost)


if __name__ == "__main__":
    main()
