"""Engine techniques against their own "off", same requests, one run: speculative decoding (prompt lookup).

For each prompt set (grounded: summaries and context QA from ../shared/data/grounded/dev.jsonl, where the answer
copies the prompt; chat: the MT-Bench first turns of the same file, the control) and each concurrency, the same
greedy requests run on one in-process engine with speculation

- off:    no drafts (the baseline);
- auto:   the product setting: drafts sized by the measured step cost (engine/spec/speculate.py);
- forced: drafts of up to 8 tokens whatever they cost (the step-cost model is replaced by one where verifying
          is free), to show what the decision avoids or leaves on the table,

and, with `--draft-model`, the same target drafting from that model instead of its prompt

- draft:        drafts from the draft model, sized by the measured cost of both models' steps (engine/spec/draft.py);
- draft-forced: drafts of up to 8 tokens from it whatever either step costs,

rounds alternating the order. A model pair with one vocabulary is not packaged here; `--model smollm2-f16` makes
one by requantizing the packaged SmolLM2-135M Q4_1 to F16 (cached under ~/.cache/tokenomy/bench/), a target that
costs more per step than the Q4_1 draft and agrees with it on most tokens (the same weights at another precision:
it shows the mechanism and its costs, not a quality gain). Every prompt is prefilled once before the timed runs
and stays cached as a prefix, so the runs measure decoding. Output tokens per second, the ratio to off, drafted
and accepted tokens, and the mean accepted length per verified draft.

    .venv/bin/python bench/engine_techniques.py [--concurrency 1,8] [--prompts 8] [--max-tokens 64]
        [--rounds 2] [--threads 2] [--model smollm2-135m-instruct] [--draft-model NAME_OR_PATH] [--json]
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
from tokenomy.engine.spec import cost  # noqa: E402
from tokenomy.engine.spec.draft import DraftModel  # noqa: E402
from tokenomy.models.catalog import cache_dir, resolve_gguf  # noqa: E402

GROUNDED = os.path.join(ROOT, "..", "shared", "data", "grounded", "dev.jsonl")
MODES = ("off", "auto", "forced")


def prompt_sets(path: str, n: int) -> dict[str, list[str]]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    grounded = [r["turns"][0] for r in rows if r["task"] in ("summarize", "context_qa")]
    chat = [r["turns"][0] for r in rows if r["task"].startswith("chat")]
    return {"grounded": grounded[:n], "chat": chat[:n]}


class FreeVerification(cost.StepCost):
    """A step costs the same whatever it feeds: every draft looks worth verifying."""

    def predict(self, n: int) -> float | None:
        return 0.01


class FreeDrafts(cost.StepCost):
    """Drafting costs nothing: every draft the target's cost allows is made."""

    def predict(self, n: int) -> float | None:
        return 0.0


def model_path(name: str) -> str:
    """A packaged model or path; `smollm2-f16` is the packaged SmolLM2-135M Q4_1 requantized to F16 (once)."""
    if name != "smollm2-f16":
        return str(resolve_gguf(name))
    import ctypes

    import llama_cpp

    out = cache_dir() / "bench" / "smollm2-135m-instruct-f16.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_F16, True
        tmp = out.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(resolve_gguf("smollm2-135m-instruct")).encode(), str(tmp).encode(),
                                          ctypes.byref(p)) != 0:
            raise RuntimeError("requantizing SmolLM2 to F16 failed")
        tmp.rename(out)
    return str(out)


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
    ap.add_argument("--model", default="smollm2-135m-instruct", help="target: a packaged model, a path, or "
                    "smollm2-f16")
    ap.add_argument("--draft-model", help="a draft model with the target's vocabulary: adds the draft modes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    # Prompts stay cached as prefixes (warmed once below), so the timed runs measure decoding, not prefill.
    cfg = EngineConfig(n_ctx=65536, max_running=max(levels), max_retired=2 * args.prompts + 2,
                       max_retired_cells=60000, n_threads=args.threads, speculative=True)
    engine = Engine(model_path(args.model), cfg).start()
    measured = engine.step_cost
    drafter = DraftModel(model_path(args.draft_model), cfg, engine.runner) if args.draft_model else None
    modes = MODES + (("draft", "draft-forced") if drafter else ())
    if drafter is not None:
        engine.run_in_loop(drafter.calibrate)       # on the engine's thread, as an engine with draft_model does
    draft_measured = drafter.cost if drafter else None
    sets = {name: [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in ps]
            for name, ps in prompt_sets(args.grounded, args.prompts).items()}
    engine.cfg.speculative = False
    for prompts in sets.values():                                        # prefill every prompt once
        run(engine, prompts, 1, 2)
    results: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for name, prompts in sets.items():
            for c in levels:
                order = modes if r % 2 == 0 else modes[::-1]
                for mode in order:
                    engine.cfg.speculative = mode != "off"
                    forced = mode.endswith("forced")
                    engine.step_cost = FreeVerification() if forced else measured
                    engine.drafter = drafter if mode.startswith("draft") else None
                    if drafter is not None:
                        drafter.cost = FreeDrafts() if forced else draft_measured
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
    engine.drafter = drafter
    if drafter is not None:
        drafter.cost = draft_measured
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
    draft_cost = ({n: round(t * 1e3, 2) for n, t in sorted(draft_measured.seconds.items())} if draft_measured
                  else None)
    if args.json:
        print(json.dumps({"rows": rows, "step_ms_by_tokens": cost, "draft_step_ms_by_tokens": draft_cost,
                          "model": args.model, "draft_model": args.draft_model, "threads": args.threads,
                          "max_tokens": args.max_tokens, "rounds": args.rounds}, indent=1))
        return
    print(f"{'prompts':9} {'c':>3} {'mode':12} {'tok/s':>7} {'vs off':>7} {'drafted':>8} {'accept':>7} {'len':>5}")
    for x in rows:
        print(f"{x['prompts']:9} {x['concurrency']:>3} {x['mode']:12} {x['tok_s']:>7} {x['vs_off']:>7} "
              f"{x['drafted']:>8} {x['acceptance'] if x['acceptance'] is not None else '-':>7} "
              f"{x['mean_accepted_per_draft'] if x['mean_accepted_per_draft'] is not None else '-':>5}")
    print("measured step ms by tokens fed:", cost)
    if draft_cost:
        print("draft model's measured round ms by sequences drafting:", draft_cost)


if __name__ == "__main__":
    main()
