"""MiniLM's ONNX graph built without torch (tokenomy/embedding/bert_onnx.py) against the torch export it replaced: build
time, session load, agreement of the vectors, and throughput side by side, in alternating rounds.

    python bench/embedder_graph.py --old ~/.cache/tokenomy/embedder/model-<hash>.onnx \\
        [--data ../shared/data/semantic-cache/qqp-dev.jsonl] [--texts 512] [--singles 200] [--rounds 5] \\
        [--threads 1] [--json]

`--old`: a graph exported by torch.onnx (tokenomy before issue #36 cached it under ~/.cache/tokenomy/embedder/,
EXPORT_VERSION 1; it needs torch to make, not to run); without it only the new graph is measured.
Throughput: the first `--texts` QQP questions (a, then b) embedded 64 to a batch, sorted by length and padded as
Embedder.embed does (texts/s), and `--singles` of them one at a time as a semantic-cache lookup embeds (p50 ms).
Each round runs old then new on the same texts, so a shared machine's drift hits both; medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenomy.embedding.embedder import _max_seq_length, _run_padded, onnx_session, packaged_model_path  # noqa: E402


def load_texts(path: Path, n: int) -> list[str]:
    texts: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            texts += [row["a"], row["b"]]
        if len(texts) >= n:
            break
    return texts[:n]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="a torch export of the same model (EXPORT_VERSION 1)")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/semantic-cache/qqp-dev.jsonl")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--singles", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    model_path = packaged_model_path()
    started = time.perf_counter()
    from tokenomy.embedding.bert_onnx import build_bert_onnx

    graph = build_bert_onnx(model_path)
    build_s = time.perf_counter() - started  # the onnx import included: what a first start pays
    built = Path(tempfile.mkdtemp()) / "minilm.onnx"
    built.write_bytes(graph)

    sessions = {}
    load_s = {}
    for name, path in (("old", args.old), ("new", built)):
        if path is None:
            continue
        t = time.perf_counter()
        sessions[name] = onnx_session(str(path), args.threads)
        load_s[name] = time.perf_counter() - t

    tok = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    tok.enable_truncation(_max_seq_length(model_path))
    tok.no_padding()
    texts = load_texts(args.data, args.texts)
    rows = [e.ids for e in tok.encode_batch(texts)]

    def embed(session, batch: list[list[int]], batch_size: int = 64) -> np.ndarray:
        return _run_padded(batch, batch_size, lambda ids, mask: session.run(None, {
            "input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0], 0)

    vectors = {name: embed(s, rows) for name, s in sessions.items()}  # also the warm-up
    rates: dict[str, list[float]] = {name: [] for name in sessions}
    singles: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.rounds):
        for name, s in sessions.items():
            t = time.perf_counter()
            embed(s, rows)
            rates[name].append(len(rows) / (time.perf_counter() - t))
            for r in rows[:args.singles]:
                t = time.perf_counter()
                embed(s, [r])
                singles[name].append((time.perf_counter() - t) * 1000)

    out = {
        "texts": len(rows), "threads": args.threads, "rounds": args.rounds, "build_s": build_s,
        "graph_mb": len(graph) / 1e6,
        "encoders": {name: {"load_s": load_s[name], "texts_per_s": statistics.median(rates[name]),
                            "single_p50_ms": statistics.median(singles[name]),
                            "single_p95_ms": sorted(singles[name])[int(0.95 * len(singles[name]))]}
                     for name in sessions},
    }
    if "old" in vectors:
        a, b = vectors["old"], vectors["new"]
        out["agreement"] = {"min_cosine": float((a * b).sum(1).min()), "max_abs_diff": float(np.abs(a - b).max())}
    if args.json:
        print(json.dumps(out, indent=2))
        return out
    print(f"new graph built in {build_s:.2f} s (onnx import included), {out['graph_mb']:.1f} MB; "
          f"{len(rows)} QQP questions, {args.threads} thread(s), median of {args.rounds} alternating rounds")
    print(f"{'graph':<22}{'load':>8}{'texts/s (batch 64)':>20}{'one text p50':>14}{'p95':>9}")
    for name, e in out["encoders"].items():
        label = "torch export (old)" if name == "old" else "built, no torch (new)"
        print(f"{label:<22}{e['load_s']:>7.2f}s{e['texts_per_s']:>20.0f}{e['single_p50_ms']:>12.2f}ms"
              f"{e['single_p95_ms']:>7.2f}ms")
    if "agreement" in out:
        print(f"old vs new: min cosine {out['agreement']['min_cosine']:.7f}, "
              f"max |difference| {out['agreement']['max_abs_diff']:.2e}")
    return out


if __name__ == "__main__":
    main()
