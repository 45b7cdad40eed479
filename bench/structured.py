"""Structured output: grammar coverage, compile time, mask time, and (with --generate) compliance and TPOT.

For every schema in a JSONSchemaBench file (default: the dev split), per collection:
- declared: the structured-output path compiles it (llguidance, after tokenomy's sound rewrites) within the
  time bound; anything else is refused with a reason (counted per reason); "relaxed" counts the keywords left
  out of a grammar (normalize.relax), whose answers are validated (and repaired under a narrowed schema);
- compile time p50/p95 (ms), with the SmolLM2 tokenizer and the first token mask, cold cache, and the slowest
  answer (grammar or refusal) against the bound; how soon a schema that takes tens of ms to build is refused
  under a 1 ms bound, against its build without one;
- mask time per token (us): Constraint.allowed() along random walks through each compiled grammar
  (Rust bitmask + numpy unpack), and the Rust bitmask alone;
- with --extraction N: a token-saving task, N generated extraction prompts (short biographical sentences written
  by a generator here, ground truth known) answered (a) free-form, asking for JSON in the prompt, parsed,
  validated and retried up to 3 times with the error fed back, and (b) with the schema as a grammar:
  completion tokens per answer (retries included), parse failures, retries, end-to-end seconds, field accuracy;
- with --generate N: the first N schemas of each collection are answered greedily by SmolLM2 under the
  grammar (max --max-tokens tokens); empirical = share of schemas whose finished answer validates against the
  original schema with jsonschema (format checked); compliance = valid among the answers returned. As the server
  does for a strict json_schema (the requests here are strict), an answer that finished but does not validate
  gets one repair, and one that still fails (or was cut) ends in a 422 rather than being returned: counted in
  empirical as a miss, not in compliance as an answer (--no-strict: every answer returned as it is);
  TPOT with the schema vs the same prompt unconstrained, decoding as many tokens (EOS masked), each pair back
  to back; forced-token share and decode calls per token. --separators / --max-string / --max-items /
  --no-loop-breaker override tokenomy's grammar settings for comparisons. With --wrap-up S each answer's soft
  limit is Constraint.plan_wrap_up(max_tokens, S): S * max_tokens, or earlier when the schema's shortest answer
  would not fit after it (--no-fit: always S * max_tokens).

    .venv/bin/python bench/structured.py [--schemas FILE] [--generate N] [--extraction N] [--max-tokens M] [--json]
        [--separators compact|spaced|optional] [--max-string L] [--max-items K] [--no-loop-breaker]
        [--wrap-up S] [--no-fit] [--collections A,B] [--threads T] [--tpot-pairs P]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import statistics
import sys
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tokenomy.models.catalog import DEFAULT_MODEL, PACKAGED  # noqa: E402
from tokenomy.structured import (  # noqa: E402
    Constraint,
    ConstraintError,
    GrammarCompiler,
    NoRoom,
    SchemaError,
    json_schema_format,
    start_constraint,
)
from tokenomy.structured import schema as schema_mod  # noqa: E402
from tokenomy.structured.token_tables import load_tokenizer, packaged_model_path  # noqa: E402
from tokenomy.structured.validate import validate  # noqa: E402

DEFAULT_SCHEMAS = os.path.join(ROOT, "..", "shared", "data", "jsonschema", "dev.jsonl")
PROMPT_SCHEMA_CHARS = 1500  # the schema text shown to the model; the grammar carries the rest
# Best empirical coverage per collection in the JSONSchemaBench paper (Guidance; llama.cpp for WashingtonPost;
# XGrammar for JSONSchemaStore): the targets. Trivial and ultra have no target there.
PAPER_BEST = {"Github_easy": 0.86, "Github_medium": 0.69, "Github_hard": 0.41, "Kubernetes": 0.91, "Snowplow": 0.82,
              "Glaiveai2K": 0.96, "WashingtonPost": 0.94, "JsonSchemaStore": 0.33}
THREADS = 2  # llama.cpp threads (this is a shared 2-core machine)
SEPARATORS = {  # --separators: llguidance item_separator / key_separator
    "compact": (",", ":"),
    "spaced": (", ", ": "),
    "optional": (", ?", ": ?"),  # an optional space: nothing is forced right after "," or ":"
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def compile_all(rows: list[dict], compiler: GrammarCompiler, bounds: dict[str, int | None]) -> list[dict]:
    """Compile every row's schema; ``bounds``: json_schema_format's max_string_length / max_array_items."""
    out = []
    for row in rows:
        t0 = time.perf_counter()
        try:
            fmt = json_schema_format(row["schema"], **bounds)
            grammar = compiler.compile(fmt)
            rec = {"declared": True, "grammar": grammar, "reason": None, "relaxed": fmt.relaxed}
        except SchemaError as e:
            rec = {"declared": False, "grammar": None, "reason": e.reason}
        rec["ms"] = (time.perf_counter() - t0) * 1000
        out.append(rec)
    return out


def repair_grammar(compiler: GrammarCompiler, bounds: dict[str, int | None], row: dict, rec: dict) -> Any:
    """What the server's repair is made under (pipeline/generate.repair_format): the schema narrowed where a
    repeat would break it again, or the answer's own grammar."""
    from tokenomy.structured.normalize import narrow_for_repair

    narrowed = narrow_for_repair(row["schema"])
    if narrowed is None:
        return rec["grammar"]
    try:
        return compiler.compile(json_schema_format(narrowed, **bounds))
    except SchemaError:
        return rec["grammar"]


def time_bound(tokenizer: Any) -> dict[str, float]:
    """A schema of 300 distinct patterns (tens of ms to build) under a 1 ms bound: ms until the caller has its
    refusal, against the build without a bound (the baseline: what a caller would wait without one)."""
    props = {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}-{i}-[0-9A-F]{{4,12}}$"}
             for i in range(300)}
    fmt = json_schema_format({"type": "object", "properties": props, "required": list(props)})
    out = {}
    for name, timeout_s in (("build_ms", 600.0), ("refused_ms", 0.001)):   # the refused build runs on: last
        compiler = GrammarCompiler(tokenizer, timeout_s=timeout_s)
        t0 = time.perf_counter()
        try:
            compiler.compile(fmt)
        except SchemaError:
            pass
        out[name] = round((time.perf_counter() - t0) * 1000, 2)
        compiler.close()
    return out


def mask_walks(grammars: list[Any], steps: int, seed: int = 0) -> tuple[list[float], list[float], int, int]:
    """Random walks: at each step take the forced tokens if any, else a uniformly random allowed token.

    Returns mask times (allowed(), and the Rust bitmask alone) in us, tokens walked, and walks that failed
    (the grammar hit a lexer/parser limit mid-way: a compiled schema that could still fail in generation).
    """
    rng = np.random.default_rng(seed)
    full_us: list[float] = []
    rust_us: list[float] = []
    tokens = failed = 0
    for g in grammars:
        c = Constraint(g)
        try:
            tokens += _walk(c, steps, rng, full_us, rust_us)
        except ConstraintError:
            failed += 1
    return full_us, rust_us, tokens, failed


def _walk(c: Constraint, steps: int, rng: np.random.Generator, full_us: list[float], rust_us: list[float]) -> int:
    tokens = 0
    for _ in range(steps):
        if c.is_done():
            break
        ff = c.forced()
        if ff:
            c.advance(ff)
            tokens += len(ff)
            continue
        # allowed() = Rust bitmask + numpy unpack; timed in two parts because a second mask at the same
        # state would hit llguidance's cache and look cheaper than the first.
        t0 = time.perf_counter()
        bits = c.bitmask()
        t1 = time.perf_counter()
        mask = np.unpackbits(bits.view(np.uint8), count=c.n_vocab, bitorder="little").view(np.bool_)
        t2 = time.perf_counter()
        rust_us.append((t1 - t0) * 1e6)
        full_us.append((t2 - t0) * 1e6)
        ids = np.flatnonzero(mask)
        eos = c.grammar.tokenizer.eos_token
        if len(ids) > 1:
            ids = ids[ids != eos]  # keep walking rather than stopping at the first accepting state
        c.advance([int(rng.choice(ids))])
        tokens += 1
    return tokens


def generate(rows: list[dict], recs: list[dict], per_collection: int, max_tokens: int, model: str,
             console: Console, loops: bool = True, only: set[str] | None = None, wrap_up: float = 0.0,
             tpot_pairs: int | None = None, fit: bool = True, strict: bool = True,
             repair_grammar: Any = None) -> dict[str, Any]:
    """``repair_grammar(row, rec)``: the grammar a repair is made under (default: the answer's own)."""
    from tokenomy.pipeline.generate import repair_messages
    from tokenomy.tools.reference_decoding.greedy import GreedyRunner

    runner = GreedyRunner(model, n_ctx=2048 + max_tokens, n_threads=THREADS)
    seen: collections.Counter[str] = collections.Counter()
    paired: collections.Counter[str] = collections.Counter()
    results: dict[str, list[dict]] = collections.defaultdict(list)
    tpot_c: list[float] = []
    tpot_f: list[float] = []
    cpu_c: list[float] = []
    cpu_f: list[float] = []
    for row, rec in zip(rows, recs, strict=True):
        cat = row["category"]
        if seen[cat] >= per_collection or (only and cat not in only):
            continue
        seen[cat] += 1
        if not rec["declared"]:
            results[cat].append({"declared": False, "valid": False})
            continue
        schema_text = json.dumps(row["schema"], separators=(",", ":"))[:PROMPT_SCHEMA_CHARS]
        messages = [{"role": "system", "content": "You answer with JSON only."},
                    {"role": "user", "content": f"Write a short example JSON document for this JSON Schema:\n"
                                                f"{schema_text}"}]
        prompt = runner.render(messages)
        try:  # what the server does: refuse when the shortest answer cannot fit, else plan wrap-up
            c = start_constraint(rec["grammar"], max_tokens, loops, wrap_up if wrap_up > 0 and fit else None)
        except NoRoom as e:
            results[cat].append({"declared": True, "valid": False, "finish": "refused", "need": e.need})
            console.print(f"[dim]{row['id']}: refused ({e})[/dim]")
            continue
        if wrap_up > 0 and not fit:
            c.soft_limit = int(wrap_up * max_tokens)
        gen = runner.generate(prompt, c, max_tokens)
        # An answer cut by max_tokens counts as a failure (it is not a complete document). Validation is
        # against the ORIGINAL schema, not the narrowed one the grammar was built from.
        check = validate(gen.text, row["schema"])
        ok = gen.finish_reason == "stop" and check.ok
        finish, repaired = gen.finish_reason, False
        if strict and not ok:
            # what the server does with a strict json_schema (pipeline/generate.py): a finished answer that does
            # not validate gets one repair; whatever still fails is a 422, not an answer given
            if gen.finish_reason == "stop":
                fix = runner.render(repair_messages(messages, gen.text, "; ".join(check.errors)[:300]))
                g2 = repair_grammar(row, rec) if repair_grammar is not None else rec["grammar"]
                c2 = start_constraint(g2, max_tokens, loops, wrap_up if wrap_up > 0 and fit else None)
                gen = runner.generate(fix, c2, max_tokens)
                ok = gen.finish_reason == "stop" and validate(gen.text, row["schema"]).ok
                repaired = ok
            finish = gen.finish_reason if ok else "error"
        results[cat].append({"declared": True, "valid": ok, "tokens": len(gen.tokens), "calls": gen.decode_calls,
                             "forced": gen.forced, "finish": finish, "loops_broken": c.loops_broken,
                             "wrapups": c.wrapups, "repaired": repaired})
        line = (f"{row['id']}: {gen.finish_reason} valid={ok} tokens={len(gen.tokens)} calls={gen.decode_calls} "
                f"soft_limit={c.soft_limit} "
                f"forced={gen.forced} loops_broken={c.loops_broken} wrapups={c.wrapups} "
                f"mask={gen.mask_seconds * 1e3 / max(c.steps, 1):.2f} ms/step")
        if len(gen.tokens) - gen.first_tokens >= 4 and (tpot_pairs is None or paired[cat] < tpot_pairs):
            paired[cat] += 1
            # The free run decodes exactly as many tokens (EOS masked) from the same prompt, so both cover the
            # same context lengths; one pair is timed back to back, which cancels most load drift.
            free = runner.generate(prompt, None, len(gen.tokens), ignore_eos=True)
            tpot_c.append(gen.tpot_ms)
            tpot_f.append(free.tpot_ms)
            cpu_c.append(gen.tpot_cpu_ms)
            cpu_f.append(free.tpot_cpu_ms)
            line += (f" tpot={gen.tpot_ms:.1f} ms (free {free.tpot_ms:.1f}), cpu {gen.tpot_cpu_ms:.1f} ms "
                     f"(free {free.tpot_cpu_ms:.1f})")
        console.print(f"[dim]{line}[/dim]")
    runner.close()
    return {"per_collection": results, "tpot_c": tpot_c, "tpot_f": tpot_f, "cpu_c": cpu_c, "cpu_f": cpu_f}


FIRST = ["Maria", "John", "Aiko", "Pierre", "Fatima", "Lars", "Chen", "Olga", "Diego", "Amara", "Ines", "Tomas"]
LAST = ["Lopez", "Walker", "Tanaka", "Dubois", "Haddad", "Berg", "Wei", "Petrova", "Ruiz", "Okafor", "Costa"]
JOBS = ["engineer", "baker", "teacher", "nurse", "pilot", "farmer", "lawyer", "painter", "chemist", "librarian"]
CITIES = ["Lisbon", "Oslo", "Lima", "Kyoto", "Nairobi", "Dublin", "Quebec", "Perth", "Seville", "Krakow"]
TEMPLATES = [
    "{first} {last}, a {age}-year-old {job} from {city}, joined the cooperative in {year}.",
    "In {year}, the {job} {first} {last} ({age}) moved to {city} and opened a small workshop.",
    "{city} welcomed {first} {last} in {year}; the {age}-year-old {job} had never lived abroad before.",
    "Records from {year} list {first} {last}, {age}, as the only {job} registered in {city}.",
]
EXTRACT_KEYS = ("name", "age", "job", "city", "year")
EXTRACT_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "job": {"type": "string"},
                   "city": {"type": "string"}, "year": {"type": "integer"}},
    "required": list(EXTRACT_KEYS), "additionalProperties": False,
}


def extraction_tasks(n: int, seed: int = 7) -> list[tuple[str, dict]]:
    """``n`` (sentence, truth) pairs from the templates above, deterministic for a seed."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        truth = {"name": f"{rng.choice(FIRST)} {rng.choice(LAST)}", "age": rng.randint(19, 78),
                 "job": rng.choice(JOBS), "city": rng.choice(CITIES), "year": rng.randint(1950, 2023)}
        first, last = truth["name"].split()
        tasks.append((TEMPLATES[i % len(TEMPLATES)].format(first=first, last=last, **truth), truth))
    return tasks


def _parse_free(text: str) -> tuple[dict | None, str]:
    """The first {...} span of a free-form answer, parsed and validated; (value, error)."""
    m = re.search(r"\{.*\}", text, re.S)
    if not m:
        return None, "no JSON object found"
    result = validate(m.group(0), EXTRACT_SCHEMA)
    return (result.value, "") if result.ok else (None, "; ".join(result.errors[:2]))


def _accuracy(value: dict | None, truth: dict) -> float:
    if value is None:
        return 0.0
    return sum(str(value.get(k, "")).strip().lower() == str(truth[k]).lower() for k in EXTRACT_KEYS) / len(truth)


def extraction(n: int, compiler: GrammarCompiler, model: str, max_tokens: int, console: Console,
               bounds: dict[str, int | None]) -> dict:
    from tokenomy.tools.reference_decoding.greedy import GreedyRunner

    runner = GreedyRunner(model, n_ctx=2048, n_threads=THREADS)
    grammar = compiler.compile(json_schema_format(EXTRACT_SCHEMA, **bounds))
    system = "You extract facts from text."
    ask = "Return a JSON object with the keys name, age, job, city and year. Answer with JSON only."
    out: dict[str, dict] = {}
    for mode in ("free", "schema"):
        tokens, fails, retries, secs, acc = [], 0, 0, [], []
        for text, truth in extraction_tasks(n):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": f"{text}\n{ask}"}]
            t0 = time.perf_counter()
            used = 0
            if mode == "schema":
                gen = runner.generate(runner.render(messages), Constraint(grammar), max_tokens)
                used = len(gen.tokens)
                value, err = _parse_free(gen.text)
            else:
                for attempt in range(4):  # the first try and up to 3 retries
                    gen = runner.generate(runner.render(messages), None, max_tokens)
                    used += len(gen.tokens)
                    value, err = _parse_free(gen.text)
                    if value is not None or attempt == 3:
                        break
                    retries += 1
                    messages += [{"role": "assistant", "content": gen.text},
                                 {"role": "user", "content": f"That is not a valid answer ({err}). {ask}"}]
            secs.append(time.perf_counter() - t0)
            tokens.append(used)
            fails += value is None
            acc.append(_accuracy(value, truth))
        out[mode] = {"prompts": n, "completion_tokens_mean": round(statistics.fmean(tokens), 1),
                     "parse_failures": fails, "retries": retries, "e2e_s_mean": round(statistics.fmean(secs), 3),
                     "field_accuracy": round(statistics.fmean(acc), 3)}
        console.print(f"[dim]extraction {mode}: {out[mode]}[/dim]")
    runner.close()
    return out


def _decode_shares(gen: dict[str, Any]) -> dict[str, Any]:
    """Forced-token share and decode calls per token over all generated answers."""
    made = [r for res in gen["per_collection"].values() for r in res if "tokens" in r]
    tokens = sum(r["tokens"] for r in made)
    return {"generated_tokens": tokens,
            "forced_share": round(sum(r["forced"] for r in made) / tokens, 3) if tokens else None,
            "decode_calls_per_token": round(sum(r["calls"] for r in made) / tokens, 3) if tokens else None,
            "loops_broken": sum(r["loops_broken"] for r in made), "wrapups": sum(r["wrapups"] for r in made)}


def main() -> None:
    global THREADS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", default=DEFAULT_SCHEMAS, help="JSONSchemaBench-style JSONL file")
    ap.add_argument("--model", default=None, help="GGUF path (default: packaged SmolLM2-135M-Instruct)")
    ap.add_argument("--timeout", type=float, default=5.0, help="compile time bound per schema, seconds")
    ap.add_argument("--mask-steps", type=int, default=48, help="random-walk steps per compiled schema")
    ap.add_argument("--generate", type=int, default=0, help="greedy generations per collection (0: none)")
    ap.add_argument("--extraction", type=int, default=0, help="extraction prompts for the token-saving task")
    ap.add_argument("--max-tokens", type=int, default=512,
                    help="cap per generated answer; an answer cut here counts as not valid")
    ap.add_argument("--separators", choices=sorted(SEPARATORS), default=None,
                    help="JSON separators the grammar enforces (default: tokenomy's JSON_OPTIONS)")
    ap.add_argument("--max-string", type=int, default=None,
                    help="default maxLength for free strings (0: off; default: the packaged model's setting)")
    ap.add_argument("--max-items", type=int, default=None,
                    help="default maxItems for unbounded arrays (0: off; default: the packaged model's setting)")
    ap.add_argument("--threads", type=int, default=THREADS, help="llama.cpp threads for generation")
    ap.add_argument("--collections", default=None, help="comma-separated collections to --generate for (default: all)")
    ap.add_argument("--tpot-pairs", type=int, default=None,
                    help="time at most this many free runs per collection for TPOT (default: every answer)")
    ap.add_argument("--wrap-up", type=float, default=None,
                    help="past this share of --max-tokens, keep only closing tokens when allowed (0: off; "
                         "default: the packaged model's setting)")
    ap.add_argument("--no-fit", action="store_true",
                    help="start wrap-up at exactly --wrap-up, not earlier for schemas whose shortest answer is long")
    ap.add_argument("--no-loop-breaker", action="store_true", help="turn the constraint's loop breaker off")
    ap.add_argument("--no-strict", action="store_true",
                    help="return every answer as it is: no repair, no 422 (the server's strict json_schema rule)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 150)

    try:
        with open(args.schemas) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        sys.exit(f"cannot read schemas: {e}")
    THREADS = args.threads
    if args.separators:
        item, key = SEPARATORS[args.separators]
        schema_mod.JSON_OPTIONS = dict(schema_mod.JSON_OPTIONS, item_separator=item, key_separator=key)
    # The product's defaults (the packaged model's `structured` settings) unless a flag overrides one.
    product = PACKAGED[DEFAULT_MODEL].structured if args.model is None else {}
    chosen = {"max_string_length": args.max_string, "max_array_items": args.max_items, "wrap_up": args.wrap_up}
    source = {k: "flag" if v is not None else "product default" if k in product else "off" for k, v in chosen.items()}
    settings = {k: (v if v is not None else product.get(k)) or None for k, v in chosen.items()}
    args.wrap_up = settings["wrap_up"] or 0.0
    bounds = {"max_string_length": settings["max_string_length"], "max_array_items": settings["max_array_items"]}
    console.print("settings: " + ", ".join(f"{k}={settings[k]} ({source[k]})" for k in chosen))
    model = args.model or packaged_model_path()
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(model)
    tok_s = time.perf_counter() - t0
    compiler = GrammarCompiler(tokenizer, timeout_s=args.timeout)
    recs = compile_all(rows, compiler, bounds)
    full_us, rust_us, walked, walk_failed = mask_walks([r["grammar"] for r in recs if r["declared"]], args.mask_steps)
    bound = time_bound(tokenizer)
    gen = (generate(rows, recs, args.generate, args.max_tokens, model, console, loops=not args.no_loop_breaker,
                    only=set(args.collections.split(",")) if args.collections else None, wrap_up=args.wrap_up,
                    tpot_pairs=args.tpot_pairs, fit=not args.no_fit, strict=not args.no_strict,
                    repair_grammar=lambda row, rec: repair_grammar(compiler, bounds, row, rec))
           if args.generate else None)
    extract = extraction(args.extraction, compiler, model, 128, console, bounds) if args.extraction else None

    by_cat: dict[str, list[int]] = collections.defaultdict(list)
    for i, row in enumerate(rows):
        by_cat[row["category"]].append(i)
    report: dict[str, Any] = {"schemas_file": os.path.relpath(args.schemas, ROOT), "collections": {}}
    for cat in sorted(by_cat):
        idx = by_cat[cat]
        ms = [recs[i]["ms"] for i in idx if recs[i]["declared"]]
        entry: dict[str, Any] = {
            "schemas": len(idx),
            "declared": sum(recs[i]["declared"] for i in idx) / len(idx),
            "empirical": None, "compliance": None, "generated": 0,
            "compile_p50_ms": round(pct(ms, 0.5), 2), "compile_p95_ms": round(pct(ms, 0.95), 2),
            "paper_best_empirical": PAPER_BEST.get(cat),
            "refused": dict(collections.Counter(recs[i]["reason"] for i in idx if not recs[i]["declared"])),
            # compiled with keywords left out of the grammar (normalize.relax): their answers are validated
            "relaxed": dict(collections.Counter(k for i in idx for k in recs[i].get("relaxed", ()))),
        }
        if gen is not None:
            res = gen["per_collection"].get(cat, [])
            if res:
                valid = sum(r["valid"] for r in res)
                declared = sum(r["declared"] for r in res)
                finished = [r for r in res if r.get("finish") == "stop"]
                made = [r for r in res if r["declared"] and r.get("finish") not in ("refused", "error")]
                entry.update(generated=len(res), empirical=valid / len(res),
                             # valid among every answer returned (cut ones included: with --no-strict they are
                             # returned); requests refused up front, or ended with strict's 422, apart
                             compliance=valid / len(made) if made else None,
                             strict_errors=sum(r.get("finish") == "error" for r in res),
                             repaired=sum(bool(r.get("repaired")) for r in res),
                             declared_generated=declared,
                             refused_no_room=[r.get("need") for r in res if r.get("finish") == "refused"],
                             cut=sum(r.get("finish") == "length" for r in res),
                             # the grammar's own guarantee: answers that ended by themselves all validate
                             finished=len(finished),
                             valid_when_finished=(sum(r["valid"] for r in finished) / len(finished)
                                                  if finished else None),
                             tokens_mean=round(statistics.fmean(r["tokens"] for r in made), 1) if made else None)
        report["collections"][cat] = entry
    all_ms = [r["ms"] for r in recs if r["declared"]]
    report.update({
        "schemas": len(rows),
        "declared": sum(r["declared"] for r in recs) / len(rows),
        "compile_p50_ms": round(pct(all_ms, 0.5), 2),
        "compile_p95_ms": round(pct(all_ms, 0.95), 2),
        # the slowest answer, a grammar or a refusal, against the bound (--timeout)
        "compile_max_ms": round(max(r["ms"] for r in recs), 2), "timeout_s": args.timeout,
        "time_bound": bound,
        "tokenizer_build_s": round(tok_s, 2),
        "mask_us_per_token": round(statistics.fmean(full_us), 1) if full_us else None,
        "mask_us_p50": round(pct(full_us, 0.5), 1), "mask_us_p95": round(pct(full_us, 0.95), 1),
        "mask_rust_us_per_token": round(statistics.fmean(rust_us), 1) if rust_us else None,
        "mask_steps": len(full_us), "walk_tokens": walked, "walks_failed": walk_failed,
        "tpot_ms_constrained": round(statistics.median(gen["tpot_c"]), 2) if gen and gen["tpot_c"] else None,
        "tpot_ms_free": round(statistics.median(gen["tpot_f"]), 2) if gen and gen["tpot_f"] else None,
        # median over answers of (constrained TPOT / free TPOT), each pair timed back to back
        "tpot_ratio": (round(statistics.median(c / f for c, f in zip(gen["tpot_c"], gen["tpot_f"], strict=True)), 3)
                       if gen and gen["tpot_c"] else None),
        # the same with process CPU time per token, which other tenants of a shared machine disturb less
        "tpot_cpu_ms_constrained": round(statistics.median(gen["cpu_c"]), 2) if gen and gen["cpu_c"] else None,
        "tpot_cpu_ms_free": round(statistics.median(gen["cpu_f"]), 2) if gen and gen["cpu_f"] else None,
        "tpot_cpu_ratio": (round(statistics.median(c / f for c, f in zip(gen["cpu_c"], gen["cpu_f"], strict=True)), 3)
                           if gen and gen["cpu_c"] else None),
        **(_decode_shares(gen) if gen else {}),
        "settings": {"json_options": schema_mod.JSON_OPTIONS, **bounds, "loop_breaker": not args.no_loop_breaker,
                     "wrap_up": args.wrap_up, "wrap_up_fit": not args.no_fit, "source": source,
                     "close_objects": schema_mod.CLOSE_OBJECTS, "threads": THREADS},
        "generate_per_collection": args.generate, "max_tokens": args.max_tokens,
        "extraction": extract,
    })
    if args.json:
        print(json.dumps(report, indent=2))
        return

    table = Table(title=f"structured output on {report['schemas_file']} (llguidance, SmolLM2 tokenizer)")
    for col in ("collection", "schemas", "declared", "generated", "empirical", "paper best", "compliance",
                "422 / repaired", "compile p50 ms", "p95 ms", "refused (top reason)"):
        table.add_column(col, justify="left" if col.startswith(("collection", "refused")) else "right")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for cat, e in report["collections"].items():
        top = max(e["refused"].items(), key=lambda kv: kv[1], default=("", 0))
        table.add_row(cat, str(e["schemas"]), fmt(e["declared"]), str(e["generated"]), fmt(e["empirical"]),
                      fmt(e["paper_best_empirical"]), fmt(e["compliance"]),
                      f"{e.get('strict_errors', '-')} / {e.get('repaired', '-')}",
                      f"{e['compile_p50_ms']:.1f}", f"{e['compile_p95_ms']:.1f}",
                      f"{top[1]}x {top[0][:50]}" if top[1] else "")
    console.print(table)
    reasons: collections.Counter[str] = collections.Counter()
    for e in report["collections"].values():
        for reason, n in e["refused"].items():
            reasons[re.sub(r" while processing .*", "", reason)[:110]] += n
    console.print("refused: " + "; ".join(f"{n}x {r}" for r, n in reasons.most_common(8)))
    console.print(f"declared {report['declared']:.3f} of {len(rows)}; compile p50 {report['compile_p50_ms']} ms, "
                  f"p95 {report['compile_p95_ms']} ms, slowest answer {report['compile_max_ms']} ms (bound "
                  f"{args.timeout:g} s); tokenizer build {tok_s:.2f} s")
    console.print(f"time bound: 300 patterns under a 1 ms bound refused after {bound['refused_ms']} ms; built "
                  f"without a bound in {bound['build_ms']} ms ({bound['refused_ms'] / bound['build_ms']:.2f}x)")
    console.print(f"mask per token: {report['mask_us_per_token']} us mean (p50 {report['mask_us_p50']}, p95 "
                  f"{report['mask_us_p95']}), Rust bitmask alone {report['mask_rust_us_per_token']} us, over "
                  f"{len(full_us)} masked steps ({walked} tokens walked, {walk_failed} walks hit a grammar limit)")
    if extract:
        t = Table(title=f"extraction, {args.extraction} prompts: free-form JSON (parse, up to 3 retries) vs schema")
        for col in ("mode", "completion tokens/answer", "parse failures", "retries", "e2e s/answer",
                    "field accuracy"):
            t.add_column(col, justify="left" if col == "mode" else "right")
        for mode, e in extract.items():
            t.add_row(mode, str(e["completion_tokens_mean"]), str(e["parse_failures"]), str(e["retries"]),
                      f"{e['e2e_s_mean']:.2f}", f"{e['field_accuracy']:.2f}")
        console.print(t)
    if gen:
        fin = [e for e in report["collections"].values() if e.get("finished")]
        n_fin = sum(e["finished"] for e in fin)
        n_ok = sum(round(e["valid_when_finished"] * e["finished"]) for e in fin)
        console.print(f"generation: {n_ok} of {n_fin} answers that ended by themselves validate; the rest of the "
                      f"declared schemas hit max_tokens={args.max_tokens}")
        console.print(f"TPOT: {report['tpot_ms_constrained']} ms constrained vs {report['tpot_ms_free']} ms free "
                      f"(medians; the free run decodes as many tokens from the same prompt); ratio "
                      f"{report['tpot_ratio']} (median of per-answer ratios; CPU time per token: "
                      f"{report['tpot_cpu_ms_constrained']} vs {report['tpot_cpu_ms_free']} ms, ratio "
                      f"{report['tpot_cpu_ratio']}); forced share "
                      f"{report['forced_share']}, decode calls per token {report['decode_calls_per_token']}, "
                      f"loops broken {report['loops_broken']}")


if __name__ == "__main__":
    main()
