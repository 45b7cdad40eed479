"""The semantic cache as a user runs it: `tokenomy serve` in front of an upstream whose answer names the question.

    python bench/semantic_cache_server.py [--gptcache FILE] [--qqp FILE] [--pairs 3000] [--set KEY=VALUE ...]
                                          [--in-process | --sweep] [--json]

The gateway runs with ``cache: {semantic: {error_budget: 0.10}}`` and the product's defaults otherwise (``--set
semantic.threshold=0.85`` and the like override a cache setting). The upstream is a stub started by this script:
its answer to a question names the question's group, where duplicate questions (a GPTCache origin and its
paraphrase, a QQP pair labelled duplicate) form one group. So an answer served from the cache is right exactly
when it is the answer the model would have given, and an explore's comparison (exact text) is what a
deterministic model would give.

The stream: each pair's first question, then its second, one request at a time at temperature 0; first
GPTCache's pairs (``--gptcache``, examples/benchmark/mock_data.json of zilliztech/GPTCache, not in this
repository), then ``--pairs`` QQP pairs of the half of ``--qqp`` the verifier was not calibrated on, in file
order, through the same server: the second part is a drift from paraphrase traffic to hard negatives.

Reported per part and per window of ``--window`` requests: semantic hits, right and wrong, their wrong share,
exact hits, explores (``x-tokenomy-cache: explore``: a would-be hit sent to the model and compared), and the
share of duplicate questions served right (by either cache).

``--in-process`` runs the same stream through the gateway's cache settings in this process (an exact map and a
``SemanticCache`` built as the gateway builds it, embeddings read from the calibration's cache under /tmp): the
same decisions without HTTP, for quick checks; the figures to report come from the server. ``--sweep`` runs it
over a grid of settings, the product's defaults first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import free_port, wait_up  # noqa: E402  (bench/servers.py, beside this script)

from tokenomy.cache.key import question_key  # noqa: E402
from tokenomy.tools.cache_calibration.calibrate import Pair, in_calibration_half, load_pairs  # noqa: E402

DEFAULT_QQP = ROOT.parent / "shared/data/semantic-cache/qqp-dev.jsonl"


@dataclass
class Request:
    part: str
    question: str
    duplicate: bool     # the second question of a duplicate pair: serving its group's answer is a saving


@dataclass
class Window:
    requests: int = 0
    hits: int = 0
    wrong: int = 0
    exact: int = 0
    explored: int = 0
    duplicates: int = 0
    duplicates_served: int = 0

    def add(self, other: Window) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def row(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__},
                "right": self.hits - self.wrong,
                "wrong_share": self.wrong / self.hits if self.hits else 0.0,
                "duplicates_served_share": self.duplicates_served / self.duplicates if self.duplicates else 0.0,
                "explore_share": self.explored / self.requests if self.requests else 0.0}


@dataclass
class Part:
    name: str
    windows: list[Window] = field(default_factory=list)


def groups(pairs: list[Pair]) -> dict[str, int]:
    """question_key -> group id: duplicates are one group (union-find over the pairs labelled duplicate)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        a, b = find(question_key(p.a)), find(question_key(p.b))
        if p.duplicate and a != b:
            parent[b] = a
    roots: dict[str, int] = {}
    return {k: roots.setdefault(find(k), len(roots)) for k in list(parent)}


def build(args: argparse.Namespace) -> tuple[list[Request], dict[str, str]]:
    """The request stream and the stub's answers (question_key -> answer text)."""
    parts: list[tuple[str, list[Pair]]] = []
    if args.gptcache:
        parts.append(("gptcache", load_pairs(args.gptcache)))
    if args.qqp and args.pairs:
        held = [p for p in load_pairs(args.qqp) if not in_calibration_half(p.a)]
        if args.shuffle:
            random.Random(args.seed).shuffle(held)
        parts.append(("qqp", held[:args.pairs]))
    group = groups([p for _, ps in parts for p in ps])
    answers = {k: f"The answer to question group {g}." for k, g in group.items()}
    stream = [r for name, ps in parts for p in ps
              for r in (Request(name, p.a, False), Request(name, p.b, p.duplicate))]
    return stream, answers


# ---- the stub upstream -----------------------------------------------------------------------------------------

def stub(port: int, answers: dict[str, str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:   # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            question = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            text = answers.get(question_key(question), f"The answer to: {question}")
            out = json.dumps({"id": "stub", "object": "chat.completion", "created": int(time.time()),
                              "model": body.get("model", "stub"),
                              "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                           "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self) -> None:    # noqa: N802 (the gateway's health probe: /v1/models)
            out = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def config_text(stub_port: int, overrides: list[tuple[str, Any]]) -> str:
    semantic: dict[str, Any] = {"error_budget": 0.10}
    cache: dict[str, Any] = {"semantic": semantic}
    for key, value in overrides:
        section, _, name = key.partition(".")
        cache.setdefault(section, {})[name] = value
    return json.dumps({"models": [{"name": "up", "backend": "openai", "base_url": f"http://127.0.0.1:{stub_port}/v1",
                                   "model": "stub", "tokenizer": "cl100k_base"}],
                       "cache": cache})


# ---- the two ways to ask --------------------------------------------------------------------------------------

class ServerClient:
    """Each question as a chat request to a running gateway: (answer text, x-tokenomy-cache)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=120)

    def ask(self, question: str) -> tuple[str, str]:
        r = self.http.post("/v1/chat/completions", json={"model": "up", "temperature": 0,
                                                         "messages": [{"role": "user", "content": question}]})
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"], r.headers.get("x-tokenomy-cache", "?")


class InProcess:
    """The gateway's cache stage without HTTP: exact map, then the SemanticCache the gateway would build."""

    def __init__(self, overrides: list[tuple[str, Any]], answers: dict[str, str], texts: list[str]) -> None:
        from tokenomy.cache.entry import CacheEntry
        from tokenomy.cache.judge import same_answer
        from tokenomy.cache.semantic import SemanticCache
        from tokenomy.config import CacheSettings
        from tokenomy.tools.cache_calibration.calibrate import embed_cached

        raw: dict[str, Any] = {"semantic": {"error_budget": 0.10}}
        for key, value in overrides:
            section, _, name = key.partition(".")
            raw.setdefault(section, {})[name] = value
        s = CacheSettings.model_validate(raw).semantic
        self.cache = SemanticCache(None, threshold=s.threshold, error_budget=s.error_budget, ttl_s=None,
                                   max_entries=s.max_entries, min_margin=s.min_margin, explore=s.explore,
                                   explore_window=s.explore_window, rng=random.Random(0))
        uniq = sorted(set(texts))
        vecs = embed_cached(uniq, log=False)
        self.vec = dict(zip(uniq, vecs, strict=True))
        self.exact: dict[str, str] = {}
        self.answers, self.entry, self.judge = answers, CacheEntry, same_answer

    def ask(self, question: str) -> tuple[str, str]:
        if question in self.exact:
            return self.exact[question], "exact"
        vec = self.vec[question][None, :]
        d = self.cache.decide("ctx", question, vec)
        if d.hit is not None:
            return d.hit.entry.response["text"], "semantic"
        text = self.answers.get(question_key(question), f"The answer to: {question}")
        if d.explore is not None:
            self.cache.observe(d.explore.entry_id, d.explore.score,
                               self.judge(question, d.explore.entry.response, text))
        self.exact[question] = text
        self.cache.add_text("ctx", question, self.entry(response={"text": text}), vec[0])
        return text, "explore" if d.reason == "explore" else "miss"


def run(args: argparse.Namespace) -> dict[str, Any]:
    stream, answers = build(args)
    overrides = [(k, json.loads(v)) for k, v in (s.split("=", 1) for s in args.set)]
    procs: list[subprocess.Popen] = []
    if args.in_process:
        client: Any = InProcess(overrides, answers, [r.question for r in stream])
    else:
        stub_port, gw_port = free_port(), free_port()
        stub(stub_port, answers)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(config_text(stub_port, overrides))
        env = {**os.environ, "TOKENOMY_HOME": tempfile.mkdtemp(prefix="tokenomy-semcache-bench-")}
        procs.append(subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(gw_port),
                                       "--config", f.name], cwd=ROOT, env=env, stderr=subprocess.DEVNULL))
        wait_up(f"http://127.0.0.1:{gw_port}/health", procs)
        client = ServerClient(f"http://127.0.0.1:{gw_port}")
    parts: dict[str, Part] = {}
    t0 = time.perf_counter()
    try:
        for n, r in enumerate(stream):
            part = parts.setdefault(r.part, Part(r.part))
            if not part.windows or part.windows[-1].requests == args.window:
                part.windows.append(Window())
            w = part.windows[-1]
            text, how = client.ask(r.question)
            right = text == answers.get(question_key(r.question))
            w.requests += 1
            w.duplicates += r.duplicate
            if how == "semantic":
                w.hits += 1
                w.wrong += not right
            elif how == "exact":
                w.exact += 1
            elif how == "explore":
                w.explored += 1
            w.duplicates_served += r.duplicate and right and how in ("semantic", "exact")
            if (n + 1) % 500 == 0:
                print(f"  {n + 1}/{len(stream)} requests ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                      flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    out: dict[str, Any] = {"settings": dict(overrides), "window": args.window, "parts": {}}
    for name, part in parts.items():
        total = Window()
        for w in part.windows:
            total.add(w)
        # a last window shorter than half a window is too small to judge (GPTCache's 1,998 requests: two windows)
        full = [w for w in part.windows if 2 * w.requests >= args.window] or part.windows
        out["parts"][name] = {"windows": [w.row() for w in part.windows], "total": total.row(),
                              "worst_wrong_share": max(w.row()["wrong_share"] for w in full)}
    return out


def print_report(out: dict[str, Any]) -> None:
    print(f"cache settings: error_budget 0.1, defaults otherwise{', ' if out['settings'] else ''}"
          + ", ".join(f"{k}={v}" for k, v in out["settings"].items()))
    for name, part in out["parts"].items():
        print(f"\n{name}: window | requests | semantic hits | right | wrong | wrong share | exact | explored "
              f"| duplicates served")
        for i, w in enumerate(part["windows"] + [part["total"]]):
            label = f"{i + 1:6d}" if i < len(part["windows"]) else "   all"
            print(f"{label} | {w['requests']:5d} | {w['hits']:5d} | {w['right']:5d} | {w['wrong']:4d} | "
                  f"{w['wrong_share']:6.1%} | {w['exact']:4d} | {w['explored']:4d} | "
                  f"{w['duplicates_served_share']:6.1%}")
        print(f"worst window: {part['worst_wrong_share']:.1%} of hits wrong")


SWEEP = ([[]]
         + [["semantic.error_budget=null", f"semantic.threshold={t}", f"semantic.min_margin={m}"]
            for t in (0.8, 0.85, 0.9, 0.95) for m in (0.0, 0.02)]
         + [[f"semantic.error_budget={b}"] for b in (0.15, 0.2)]
         + [["semantic.explore=0.02"], ["semantic.explore=0.02", "semantic.threshold=0.85"]])


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same stream in process over a grid of settings (the first row: the product's defaults at budget 10%):
    the live-stream counterpart of bench/semantic_cache_qqp.py's sweep, which stores every first question before
    looking any second one up and so never asks a new question that merely looks like a stored one."""
    rows = []
    for extra in SWEEP:
        a = argparse.Namespace(**{**vars(args), "set": [*args.set, *extra], "in_process": True})
        out = run(a)
        rows.append({"settings": out["settings"], **{name: {**p["total"], "worst_wrong_share": p["worst_wrong_share"]}
                                                     for name, p in out["parts"].items()}})
        print(f"  {extra or 'defaults'}: " + ", ".join(f"{n} {r['right']} right {r['wrong']} wrong"
                                                       for n, r in rows[-1].items() if n != "settings"),
              file=sys.stderr, flush=True)
    return rows


def print_sweep(rows: list[dict[str, Any]]) -> None:
    names = [n for n in rows[0] if n != "settings"]
    print("settings (error_budget 0.1 unless set) | " + " | ".join(
        f"{n}: right, wrong, wrong share, worst window, explored, duplicates served" for n in names))
    for r in rows:
        label = ", ".join(f"{k.split('.')[1]}={v}" for k, v in r["settings"].items()) or "product defaults"
        print(f"{label} | " + " | ".join(
            f"{r[n]['right']} {r[n]['wrong']} {r[n]['wrong_share']:.1%} {r[n]['worst_wrong_share']:.1%} "
            f"{r[n]['explored']} {r[n]['duplicates_served_share']:.1%}" for n in names))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Semantic cache through `tokenomy serve`: GPTCache pairs, then QQP.")
    ap.add_argument("--gptcache", type=Path, default=None,
                    help="GPTCache's examples/benchmark/mock_data.json (not in this repository; none: QQP only)")
    ap.add_argument("--qqp", type=Path, default=DEFAULT_QQP, help="QQP jsonl ('' to skip)")
    ap.add_argument("--pairs", type=int, default=3000, help="QQP pairs (of the half the verifier did not see)")
    ap.add_argument("--shuffle", action="store_true", help="shuffle the QQP pairs (--seed) instead of file order")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=1000, help="requests per window")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.NAME=JSON",
                    help="a cache setting over the defaults, e.g. semantic.threshold=0.85")
    ap.add_argument("--in-process", action="store_true", help="no server: the cache stage in this process")
    ap.add_argument("--sweep", action="store_true",
                    help="in process, over a grid of settings (product defaults first) instead of one server run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.gptcache = args.gptcache if str(args.gptcache or "") not in ("", ".") else None
    args.qqp = args.qqp if str(args.qqp) not in ("", ".") else None
    try:
        if args.sweep:
            rows = sweep(args)
            print(json.dumps(rows, indent=1)) if args.json else print_sweep(rows)
            return 0
        out = run(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1)) if args.json else print_report(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
