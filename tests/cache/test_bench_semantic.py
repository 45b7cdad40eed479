"""The semantic-cache benchmark end to end on tiny files (both input formats)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.bench_module import load_bench

DATA = Path(__file__).parent / "data"
KEYS = {"error_budget", "threshold", "lookups", "hits", "right_hits", "wrong_hits", "duplicate_hit_rate",
        "wrong_hit_share", "lookup_p50_ms", "lookup_p99_ms"}


@pytest.fixture(scope="module")
def bench():
    return load_bench("semantic_cache_qqp.py")


def run_json(bench, capsys, *args: str, defaults: bool = False) -> list[dict]:
    """The sweep's rows (with ``defaults``, also the product-defaults row that comes first)."""
    assert bench.main([*args, "--json", "--index-size", "300", "--latency-sample", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    return rows if defaults else [r for r in rows if not r["defaults"]]


def test_the_product_defaults_come_first_beside_the_sweep(bench, capsys) -> None:
    from tokenomy.config import SemanticCacheSettings

    rows = run_json(bench, capsys, "--data", str(DATA / "gptcache_tiny.json"), "--budgets", "none",
                    "--thresholds", "0.7", "--margins", "0", "--defaults-budget", "0.2", defaults=True)
    d = SemanticCacheSettings()
    assert [r["defaults"] for r in rows] == [True, False]
    assert (rows[0]["error_budget"], rows[0]["threshold"], rows[0]["min_margin"]) == (0.2, d.threshold, d.min_margin)
    assert KEYS <= set(rows[0])


def test_gptcache_format(bench, capsys) -> None:
    rows = run_json(bench, capsys, "--data", str(DATA / "gptcache_tiny.json"), "--budgets", "none,0.05",
                    "--thresholds", "0.7,0.9", "--margins", "0")
    assert len(rows) == 4 and all(KEYS <= set(r) for r in rows)
    for r in rows:
        assert r["lookups"] == 6 and r["hits"] == r["right_hits"] + r["wrong_hits"]
        assert r["duplicate_hit_rate"] == pytest.approx(r["right_hits"] / 6)
        assert r["index_entries"] == 300 and r["lookup_p50_ms"] > 0
    base = {r["threshold"]: r for r in rows if r["error_budget"] is None}
    assert base[0.7]["hits"] >= base[0.9]["hits"] and base[0.7]["right_hits"] >= 4
    verified = {r["threshold"]: r for r in rows if r["error_budget"] is not None}
    assert all(verified[t]["hits"] <= base[t]["hits"] for t in base)  # the verifier only ever removes hits


def test_margin_gate_only_removes_hits(bench, capsys) -> None:
    rows = run_json(bench, capsys, "--data", str(DATA / "gptcache_tiny.json"), "--budgets", "none",
                    "--thresholds", "0.7", "--margins", "0,0.5")
    by_margin = {r["min_margin"]: r for r in rows}
    assert set(by_margin) == {0.0, 0.5}
    assert by_margin[0.5]["hits"] <= by_margin[0.0]["hits"]
    assert by_margin[0.5]["right_hits"] <= by_margin[0.0]["right_hits"]
    # A half-cosine lead is more than any paraphrase here has over its runner-up: the gate must bite.
    assert by_margin[0.5]["hits"] < by_margin[0.0]["hits"]


def test_qqp_format_counts_wrong_hits(bench, capsys, tmp_path: Path) -> None:
    f = tmp_path / "qqp.jsonl"
    rows = [("How do I lose weight without exercise?", "How do I gain weight without exercise?", False),
            ("What is the capital of France?", "What's the capital of France?", True),
            ("How can I improve my English?", "How can I improve my English speaking skills?", True),
            ("Why is the sky blue?", "Why is the ocean blue?", False)]
    f.write_text("".join(json.dumps({"a": a, "b": b, "duplicate": d}) + "\n" for a, b, d in rows))
    out = run_json(bench, capsys, "--data", str(f), "--budgets", "none", "--thresholds", "0.5", "--margins", "0")
    assert out[0]["lookups"] == 4 and out[0]["hits"] == 4  # a low threshold alone serves everything...
    assert out[0]["wrong_hits"] == 2 and out[0]["wrong_hit_share"] == 0.5  # ...including both hard negatives


def test_bad_arguments(bench, capsys, tmp_path: Path) -> None:
    assert bench.main(["--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--data", str(DATA / "gptcache_tiny.json"), "--budgets", "2"])


def test_bad_margin(bench, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--data", str(DATA / "gptcache_tiny.json"), "--margins", "1.5"])
