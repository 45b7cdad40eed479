"""The context levers, each next to its baseline, from one run: compression, compaction, prompt-layout lint.

Compression (grounded set, `../shared/data/grounded/dev.jsonl`, summarize and context_qa prompts): SmolLM2 answers
each prompt greedily, uncompressed and compressed at --ratio (tokenomy/context/compress.py, protect system,
question, code). Figures: input tokens saved; agreement (ROUGE-L F1) of the compressed answer with the
uncompressed one, against the uncompressed answer's own agreement with the reference (target: >= 90%);
compressor seconds per 1k tokens read; end-to-end seconds per request with the compressor included; the cost per
answer for a priced upstream (input $0.20, output $0.60 per 1M, the compressor at SmolLM2's notional input price;
target <= 0.6x); and for the embedded engine the pay-for-itself switch (`decide`, from the rates measured in this
run): "auto" is what the context stage would do, and its end-to-end time must never exceed uncompressed.

Compaction (synthetic conversations of --turns turns from real text: the MT-Bench user turns of the grounded set
as user messages, its reference answers as assistant messages): prompt tokens per turn and prefix-cache hit share
(the longest common token prefix with the previous turn's prompt, SmolLM2's chat template and tokenizer) for no
compaction, summary compaction with cached summaries (tokenomy's), and a summary recomputed every turn (keep the
last turns, summarize all before). Summaries here are extractive (the first sentence of each replaced message, cut
to max_summary_tokens) unless --summarizer model, so that the run stays short; the prefix figures depend on when
a summary changes, not on its words.

Lint (a trace of --requests requests from four tenants with planted breaks: a timestamp at the start of the system
prompt, tools in a random order, the user's name first, and a clean control; system prompts are passages of the
grounded set, questions MT-Bench turns): the share of planted breaks found (by reason), false alarms on the
control, and the prefix-hit share (tokens, LCP with the tenant's recent prompts) before and after the lint's advice
is followed (the span moved to the end of the prompt, tools in a fixed order).

    .venv/bin/python bench/context.py [--prompts 6] [--ratio 2.0] [--turns 32] [--requests 40] [--threads 1]
                                      [--summarizer extractive|model] [--only compress,compaction,lint] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agreement import lcs_f1  # noqa: E402  (bench/agreement.py, beside this script)

from tokenomy.config import CompactionSettings  # noqa: E402
from tokenomy.context.compaction import SummaryCache, compact, render, split_turns  # noqa: E402
from tokenomy.context.compress import Costs, Scorer, compress_messages, decide  # noqa: E402
from tokenomy.context.lint import PrefixTracker, lcp, segments  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "../shared/data/grounded/dev.jsonl"
PRICE_IN, PRICE_CACHED, PRICE_OUT = 0.20e-6, 0.05e-6, 0.60e-6   # a priced upstream, USD/token (DESIGN.md's "large")


def rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def rouge_l(a: str, b: str) -> float:
    return lcs_f1(a.lower().split(), b.lower().split())


# ---- compression ---------------------------------------------------------------------------------------------
def bench_compress(args: argparse.Namespace) -> dict[str, Any]:
    from tokenomy.models.catalog import PACKAGED
    from tokenomy.tools.reference_decoding.greedy import GreedyRunner

    data = [r for r in rows() if r["task"] in ("summarize", "context_qa") and r["reference"]]
    data = sorted(data, key=lambda r: r["id"])[:: max(1, len(data) // args.prompts)][: args.prompts]
    gen = GreedyRunner(n_ctx=2048, n_threads=args.threads)
    scorer = Scorer("smollm2-135m-instruct", n_threads=args.threads)
    comp_price = PACKAGED["smollm2-135m-instruct"].price_input / 1e6
    out = []
    for r in data:
        msgs = [{"role": "user", "content": r["turns"][0]}]
        t0 = time.perf_counter()
        plain = gen.generate(gen.render(msgs), max_tokens=args.max_tokens)
        t_plain = time.perf_counter() - t0
        prefill_s = t_plain - plain.seconds          # the prompt's prefill and the first step
        c = compress_messages(msgs, scorer, args.ratio, ["system", "question", "code"], 64)
        t1 = time.perf_counter()
        short = gen.generate(gen.render(c.messages), max_tokens=args.max_tokens)
        t_short = time.perf_counter() - t1
        out.append({"id": r["id"], "prompt": plain.prompt_tokens, "compressed": short.prompt_tokens,
                    "read": c.tokens_read, "compress_s": c.seconds, "plain_s": t_plain, "short_s": t_short,
                    "prefill_s_per_token": prefill_s / plain.prompt_tokens,
                    "agree_ref": rouge_l(plain.text, r["reference"]),
                    "short_ref": rouge_l(short.text, r["reference"]), "agree_plain": rouge_l(short.text, plain.text),
                    "out_plain": len(plain.tokens), "out_short": len(short.tokens)})
    gen.close()
    scorer.close()
    n = len(out)
    comp_rate = sum(o["compress_s"] for o in out) / max(sum(o["read"] for o in out), 1)
    prefill_rate = sum(o["prefill_s_per_token"] for o in out) / n
    auto_s, runs = 0.0, 0
    for o in out:
        d = decide(o["read"], args.ratio, Costs(compressor_s_per_token=comp_rate,
                                                 target_prefill_s_per_token=prefill_rate))
        runs += d.run
        auto_s += (o["compress_s"] + o["short_s"]) if d.run else o["plain_s"]
    cost_plain = sum(o["prompt"] * PRICE_IN + o["out_plain"] * PRICE_OUT for o in out)
    cost_short = sum(o["compressed"] * PRICE_IN + o["out_short"] * PRICE_OUT + o["read"] * comp_price for o in out)
    ref = sum(o["agree_ref"] for o in out) / n
    agree = sum(o["agree_plain"] for o in out) / n
    return {
        "prompts": n, "ratio_asked": args.ratio,
        "input_tokens": sum(o["prompt"] for o in out), "input_tokens_compressed": sum(o["compressed"] for o in out),
        "agreement_with_uncompressed": agree, "uncompressed_vs_reference": ref,
        "compressed_vs_reference": sum(o["short_ref"] for o in out) / n,
        "agreement_share_of_target": agree / ref if ref else None,
        "compressor_s_per_1k": 1000 * comp_rate, "prefill_s_per_1k": 1000 * prefill_rate,
        "e2e_s_uncompressed": sum(o["plain_s"] for o in out) / n,
        "e2e_s_always_compress": sum(o["compress_s"] + o["short_s"] for o in out) / n,
        "e2e_s_auto": auto_s / n, "auto_compressed": runs,
        "priced_cost_ratio": cost_short / cost_plain,
        "priced_decision_on": decide(1000, args.ratio, Costs(comp_rate, target_usd_per_token=PRICE_IN,
                                                             compressor_usd_per_token=comp_price)).run,
        "rows": out,
    }


# ---- compaction ----------------------------------------------------------------------------------------------
def conversation(n: int) -> list[dict[str, Any]]:
    data = rows()
    users = [t for r in data if r["task"].startswith("chat:") for t in r["turns"]]
    answers = [r["reference"] for r in data if r["reference"]]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(n):
        msgs += [{"role": "user", "content": users[i % len(users)]},
                 {"role": "assistant", "content": answers[i % len(answers)]}]
    return msgs


def extractive(text: str, n: int) -> str:
    out = []
    for line in text.split("\n"):
        role, _, body = line.partition(": ")
        first = re.split(r"(?<=[.?!])\s", body.strip(), maxsplit=1)[0]
        out.append(f"{role}: {first}")
    words = " ".join(out).split()
    return " ".join(words[: int(n * 0.7)])


def bench_compaction(args: argparse.Namespace) -> dict[str, Any]:
    from tokenomy.engine.tokenizer import Tokenizer
    from tokenomy.engine.vocab import Vocab
    from tokenomy.structured.token_tables import packaged_model_path

    tok = Tokenizer(Vocab(packaged_model_path(), vocab_only=True))

    def ids(msgs: list[dict[str, Any]]) -> list[int]:
        return tok.encode_chat(msgs)

    def count(msgs: list[dict[str, Any]]) -> int:
        return len(ids(msgs))

    calls = {"cached": 0, "every_turn": 0}
    gen = None
    if args.summarizer == "model":
        from tokenomy.tools.reference_decoding.greedy import GreedyRunner

        gen = GreedyRunner(n_ctx=2048, n_threads=args.threads)

    def summarizer(policy: str) -> Any:
        async def summarize(text: str, n: int) -> tuple[str, float]:
            calls[policy] += 1
            if gen is None:
                return extractive(text, n), 0.0
            from tokenomy.context.compaction import SUMMARY_PROMPT

            g = gen.generate(gen.render([{"role": "system", "content": SUMMARY_PROMPT},
                                         {"role": "user", "content": text[-4000:]}]), max_tokens=n)
            return g.text, 0.0
        return summarize

    s = CompactionSettings(trigger_tokens=args.trigger, keep_last_turns=4, strategy="summarize", summary_model="m",
                           max_summary_tokens=128)
    full = conversation(args.turns)
    head, turns = split_turns(full)
    cache = SummaryCache()
    result: dict[str, dict[str, float]] = {}
    prev: dict[str, list[int]] = {}
    sums: dict[str, list[int]] = {p: [0, 0] for p in ("none", "cached", "every_turn")}
    for t in range(1, len(turns) + 1):
        msgs = head + [m for tr in turns[:t] for m in tr][:-1]      # up to turn t's user message
        prompts = {"none": msgs,
                   "cached": asyncio.run(compact(msgs, s, count, summarizer("cached"), cache)).messages}
        h, tt = split_turns(msgs)
        if count(msgs) > s.trigger_tokens and len(tt) > s.keep_last_turns:
            k = len(tt) - s.keep_last_turns
            summary, _ = asyncio.run(summarizer("every_turn")(render(tt[:k]), s.max_summary_tokens))
            prompts["every_turn"] = [{**h[0], "content": f"{h[0]['content']}\n\nSummary: {summary}"}] + \
                [m for tr in tt[k:] for m in tr]
        else:
            prompts["every_turn"] = msgs
        for p, m in prompts.items():
            cur = ids(m)
            sums[p][0] += len(cur)
            sums[p][1] += lcp(cur, prev.get(p, []))
            prev[p] = cur
    if gen is not None:
        gen.close()
    for p, (tokens, hit) in sums.items():
        result[p] = {"prompt_tokens_per_turn": tokens / len(turns), "prefix_hit_share": hit / tokens,
                     "usd_per_1k_turns": 1000 * ((tokens - hit) * PRICE_IN + hit * PRICE_CACHED) / len(turns),
                     "uncached_tokens_per_turn": (tokens - hit) / len(turns),
                     "summary_calls": calls.get(p, 0)}
    return {"turns": len(turns), "trigger_tokens": args.trigger, "summarizer": args.summarizer, "policies": result}


# ---- lint ----------------------------------------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {"type": "object"}}}
         for n, d in (("search", "Search the archive."), ("fetch", "Fetch a document by id."),
                      ("summarize", "Summarize a document."), ("translate", "Translate a text."))]
NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "John"]


def trace(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    data = rows()
    passages = [r["turns"][0].split("\n\n")[1][:600] for r in data if r["task"] == "summarize"]
    users = [t for r in data if r["task"].startswith("chat:") for t in r["turns"]]
    out = []
    t0 = 1764547200
    for i in range(n):
        tenant = ["dated", "tools", "named", "clean"][i % 4]
        base = f"Background for this service: {passages[['dated', 'tools', 'named', 'clean'].index(tenant)]}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + 97 * i))
        name = NAMES[rng.randrange(len(NAMES))]
        system = {"dated": f"Current time: {when}.\n{base}", "named": f"You are assisting {name}. {base}"}.get(
            tenant, base)
        tools = list(TOOLS)
        if tenant == "tools":
            rng.shuffle(tools)
        out.append({"tenant": tenant, "system": system, "tools": tools if tenant == "tools" else None,
                    "user": users[rng.randrange(len(users))],
                    "planted": {"dated": "volatile", "tools": "tools_reordered", "named": "per_request"}.get(tenant),
                    "span": {"dated": when, "named": name}.get(tenant),
                    "value": {"dated": when, "named": name, "tools": json.dumps(tools)}.get(tenant)})
    # A planted span breaks the prefix only when none of the tenant's recent requests (the lint's history, 8)
    # had the same value: the same name or the same tool order twice is a prefix hit, not a break.
    recent: dict[str, list[str]] = {}
    for r in out:
        seen = recent.setdefault(r["tenant"], [])
        r["breaks"] = bool(r["planted"]) and bool(seen) and r["value"] not in seen
        seen.append(r["value"])
        del seen[:-8]
    return out


def advised(req: dict[str, Any]) -> dict[str, Any]:
    """The request laid out as the lint advises: the volatile span at the end, tools in a fixed order."""
    r = dict(req)
    if req["span"]:
        r["system"] = req["system"].replace(f"Current time: {req['span']}.\n", "").replace(
            f"You are assisting {req['span']}. ", "")
        r["user"] = f"{req['user']}\n\n({req['span']})"
    if req["tools"]:
        r["tools"] = sorted(req["tools"], key=lambda t: t["function"]["name"])
    return r


def bench_lint(args: argparse.Namespace) -> dict[str, Any]:
    from tokenomy.engine.tokenizer import Tokenizer
    from tokenomy.engine.vocab import Vocab
    from tokenomy.structured.token_tables import packaged_model_path

    tok = Tokenizer(Vocab(packaged_model_path(), vocab_only=True))
    reqs = trace(args.requests)
    tracker = PrefixTracker()
    planted = found = false_alarms = located = spurious = 0
    by_reason: dict[str, list[int]] = {}
    t_lint = 0.0
    for r in reqs:
        msgs = [{"role": "system", "content": r["system"]}, {"role": "user", "content": r["user"]}]
        t0 = time.perf_counter()
        f = tracker.observe(r["tenant"], "default", segments(msgs, r["tools"]))
        t_lint += time.perf_counter() - t0
        if r["breaks"]:
            planted += 1
            hit = any(b.reason == r["planted"] for b in f.breaks)
            found += hit
            located += hit and (r["span"] is None or any(r["span"] in b.span for b in f.breaks))
            by_reason.setdefault(r["planted"], [0, 0])
            by_reason[r["planted"]][0] += 1
            by_reason[r["planted"]][1] += hit
        elif f.breaks and r["tenant"] == "clean":
            false_alarms += 1
        elif f.breaks:
            spurious += 1

    def hit_share(trace_: list[dict[str, Any]]) -> float:
        recent: dict[str, list[list[int]]] = {}
        total = hit = 0
        for r in trace_:
            msgs = [{"role": "system", "content": r["system"]}, {"role": "user", "content": r["user"]}]
            cur = tok.encode_chat(msgs, r["tools"])
            seen = recent.setdefault(r["tenant"], [])
            total += len(cur)
            hit += max((lcp(cur, p) for p in seen), default=0)
            seen.append(cur)
            del seen[:-8]
        return hit / total

    return {"requests": len(reqs), "planted_breaks": planted, "found": found, "span_located": located,
            "by_reason": {k: {"planted": v[0], "found": v[1]} for k, v in by_reason.items()},
            "false_alarms_on_control": false_alarms, "breaks_reported_without_a_break": spurious,
            "lint_ms_per_request": 1000 * t_lint / len(reqs),
            "prefix_hit_share_before": hit_share(reqs), "prefix_hit_share_after": hit_share([advised(r) for r in reqs])}


# ---- output --------------------------------------------------------------------------------------------------
def show(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=140)
    if "compress" in res:
        c = res["compress"]
        t = Table(title=f"compression on {c['prompts']} grounded prompts, asked {c['ratio_asked']}x")
        for col in ("figure", "uncompressed", "compressed (always)", "auto (pays for itself)"):
            t.add_column(col, justify="right")
        t.add_row("input tokens", f"{c['input_tokens']:,}", f"{c['input_tokens_compressed']:,}",
                  f"{c['auto_compressed']} of {c['prompts']} compressed")
        t.add_row("ROUGE-L vs reference", f"{c['uncompressed_vs_reference']:.3f}",
                  f"{c['compressed_vs_reference']:.3f}", "")
        t.add_row("ROUGE-L vs uncompressed answer", "1", f"{c['agreement_with_uncompressed']:.3f}", "")
        t.add_row("agreement / uncompressed's own (target >= 0.9)", "", f"{c['agreement_share_of_target']:.2f}", "")
        t.add_row("compressor s per 1k tokens read", "", f"{c['compressor_s_per_1k']:.2f}",
                  f"(prefill {c['prefill_s_per_1k']:.2f} s per 1k)")
        t.add_row("end-to-end s per request (embedded)", f"{c['e2e_s_uncompressed']:.2f}",
                  f"{c['e2e_s_always_compress']:.2f}", f"{c['e2e_s_auto']:.2f}")
        t.add_row("priced upstream: cost per answer ratio (target <= 0.6)", "1",
                  f"{c['priced_cost_ratio']:.2f}", "on" if c["priced_decision_on"] else "off")
        con.print(t)
    if "compaction" in res:
        c = res["compaction"]
        t = Table(title=f"compaction, {c['turns']}-turn conversation, trigger {c['trigger_tokens']} tokens, "
                        f"{c['summarizer']} summaries")
        for col in ("policy", "prompt tokens/turn", "prefix-cache hit share", "uncached tokens/turn",
                    "input USD per 1k turns (priced)", "summary calls"):
            t.add_column(col, justify="right")
        for name, label in (("none", "no compaction"), ("cached", "summary, cached (tokenomy)"),
                            ("every_turn", "summary recomputed every turn")):
            p = c["policies"][name]
            t.add_row(label, f"{p['prompt_tokens_per_turn']:.0f}", f"{p['prefix_hit_share']:.1%}",
                      f"{p['uncached_tokens_per_turn']:.0f}", f"{p['usd_per_1k_turns']:.4f}", str(p["summary_calls"]))
        con.print(t)
    if "lint" in res:
        c = res["lint"]
        t = Table(title=f"prompt-layout lint on a {c['requests']}-request trace with planted breaks")
        t.add_column("figure")
        t.add_column("value", justify="right")
        t.add_row("planted breaks found", f"{c['found']} of {c['planted_breaks']} (span shown: {c['span_located']})")
        for k, v in c["by_reason"].items():
            t.add_row(f"  {k}", f"{v['found']} of {v['planted']}")
        t.add_row("false alarms on the clean tenant", str(c["false_alarms_on_control"]))
        t.add_row("breaks reported where the planted value repeated", str(c["breaks_reported_without_a_break"]))
        t.add_row("prefix-hit share before / after the advice",
                  f"{c['prefix_hit_share_before']:.1%} / {c['prefix_hit_share_after']:.1%}")
        t.add_row("lint ms per request", f"{c['lint_ms_per_request']:.2f}")
        con.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--ratio", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--turns", type=int, default=32)
    ap.add_argument("--trigger", type=int, default=1536)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--summarizer", choices=("extractive", "model"), default="extractive")
    ap.add_argument("--only", default="compress,compaction,lint")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not DATA.exists():
        sys.exit(f"{DATA} not found: the grounded set is read from ../shared/data (docs/testing.md)")
    parts = set(args.only.split(","))
    res: dict[str, Any] = {}
    if "lint" in parts:
        res["lint"] = bench_lint(args)
    if "compaction" in parts:
        res["compaction"] = bench_compaction(args)
    if "compress" in parts:
        res["compress"] = bench_compress(args)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        show(res)


if __name__ == "__main__":
    main()
