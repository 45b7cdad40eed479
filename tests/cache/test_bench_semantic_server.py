"""bench/semantic_cache_server.py on a tiny file: through `tokenomy serve` and in process, the same decisions."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.bench_module import load_bench

DATA = Path(__file__).parent / "data"


def run(capsys, *args: str) -> dict:
    bench = load_bench("semantic_cache_server.py")
    assert bench.main(["--gptcache", str(DATA / "gptcache_tiny.json"), "--qqp", "", "--window", "4", "--json",
                       *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_server_and_the_in_process_stage_decide_alike(capsys) -> None:
    served, local = run(capsys), run(capsys, "--in-process")
    pairs = len(json.loads((DATA / "gptcache_tiny.json").read_text()))
    total = served["parts"]["gptcache"]["total"]
    assert total["requests"] == 2 * pairs and total["duplicates"] == pairs
    assert total["hits"] == total["right"] + total["wrong"] and total["right"] >= 1
    assert len(served["parts"]["gptcache"]["windows"]) == (2 * pairs + 3) // 4
    assert served["parts"] == local["parts"]
